"""The Hopper attention backward's schedules in one run, beside cuDNN: "new" (what a call plans:
head dim 128 dQ through shared memory and bulk reductions, DQ_BULK, issued between dV and dK,
DQ_EARLY, its stores while dK runs, into two dQ buffers with rows packed, DQ_PACK, and two Q /
dO stages, outside the deterministic mode; head dim 64 128-row steps, BLOCK_M=128, dQ added with
red.global, also between dV and dK). "tile" (session 17, both head dims): the dQ accumulator in
tiles of the shared dQ buffer's layout, a step's dQ one bulk reduction (DQ_TILE, FA3's; head
dim 64 on the bulk path, DQ_BULK=1, with two stages); head dim 64 also "bulk" (that bulk path
with rows, DQ_TILE=0: the tile's lever apart). At the ``--deterministic-seqs`` the "det"
variants (the deterministic mode, against their default-mode selves). Session 16's rows (head
dim 128 "1buf", "dvf", "both", "rot"; head dim 64 "r2", "late") are in docs/history.md. The
benchmark's shapes (16k tokens a batch: head dim 64 x 32 heads, 128 x 16); interleaved rounds,
every call after an L2 flush; TFLOP/s (backward = 2.5 x the forward's FLOPs) and, in
parentheses, the median per-round ratio to cuDNN. Every variant's dq, dk, dv are checked
against cuDNN's (relative error below 2e-2). Recorded in docs/history.md, session 16.

    PYTHONPATH=. python3 tools/experiments/attention_backward_ab.py [--dims 128 64]
        [--seqs 1024 4096 16384] [--deterministic-seqs 4096] [--repeats N]
    PYTHONPATH=. python3 tools/experiments/attention_backward_ab.py --precompile

``--precompile`` (no GPU needed) compiles into the kernel cache, in parallel processes, every
variant of the sm90 backward's three kernels that the GPU tests (head dims 64 and 128, causal,
deterministic, fp16; 64-row steps at head dim 64; the dQ tiles) and these rows use, then exits.
"""
from __future__ import annotations

import argparse
import itertools
import multiprocessing

from tmaflow import bench, kernels
from tmaflow.kernels.attention_backward_sm90 import DQ_TILE_DEFINES, main_defines
from tmaflow.kernels.registry import extra_defines, get_kernel

# (label, deterministic, defines over the plan's, the default-mode label a deterministic one is against)
BULK_64 = {"DQ_BULK": 1, "STAGES": 2}  # head dim 64's bulk path in rows, the tile row's schedule
DEFAULT = {128: [("new", False, {}, None), ("tile", False, DQ_TILE_DEFINES[128], None)],
           64: [("new", False, {}, None), ("bulk", False, BULK_64, None), ("tile", False, DQ_TILE_DEFINES[64], None)]}
DETERMINISTIC = {128: [("det new", True, {}, "new"), ("det tile", True, DQ_TILE_DEFINES[128], "tile")],
                 64: [("det new", True, {}, "new"), ("det tile", True, DQ_TILE_DEFINES[64], "tile")]}


def row(torch, d: int, seq: int, causal: bool, deterministic: bool, repeats: int):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    heads, batch = {64: 32, 128: 16}[d], max(1, 16384 // seq)
    q, k, v, dout = (torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True)
    fns, grads = {}, {}
    variants = DEFAULT[d] + (DETERMINISTIC[d] if deterministic else [])
    for label, det, defines, _ in variants:
        grads[label] = [torch.empty_like(x) for x in (q, k, v)]
        with extra_defines(defines):
            fns[label] = kernels.attention_backward.prepare(q, k, v, out, dout, lse, causal=causal, deterministic=det,
                                                            dq=grads[label][0], dk=grads[label][1],
                                                            dv=grads[label][2])
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
    fns["cudnn"] = lambda: torch.autograd.grad(o, leaves, dout, retain_graph=True)
    for fn in fns.values():
        fn()
    ref = [g.float() for g in fns["cudnn"]()]
    torch.cuda.synchronize()
    errs = {label: max((torch.linalg.norm(g.float() - r) / torch.linalg.norm(r)).item() for g, r in zip(gs, ref))
            for label, gs in grads.items()}
    flop = 2.5 * 4.0 * batch * heads * seq * seq * d / (2 if causal else 1)
    got = bench.rounds(fns, repeats=repeats, warmup=2, flush_l2=True)
    cells = [f"cudnn {flop / got['cudnn'].median / 1e12:5.0f}"]
    cells += [f"{label} {flop / got[label].median / 1e12:5.0f} ({got.ratio(label, 'cudnn').median:.3f})" for label in grads]
    if deterministic:
        cells.append("det/default " + " ".join(f"{label[4:]} {got.ratio(label, base).median:.3f}"
                                               for label, _, _, base in DETERMINISTIC[d]))
    print(f"bwd d{d:<4d} seq {seq:5d} b{batch:<3d} {'causal' if causal else 'full  '} cold " + " ".join(cells) +
          "  TFLOP/s (x cuDNN)  err " + " ".join(f"{e:.1e}" for e in errs.values()), flush=True)
    worst = max(errs.values())
    assert worst < 2e-2, f"d{d} seq {seq} causal={causal}: relative error {worst:.2e} against cuDNN"


def _compile(job: tuple) -> str:
    extra, d, causal, det, fp16 = job
    det = int(det)
    fp = {"FP16": 1} if fp16 else {}
    defines = {"HEAD_DIM": d, "DETERMINISTIC": det, **fp}
    with extra_defines(extra):
        for name, defs, file in (("attention_bwd_sm90_prep", defines, "attention_backward_sm90"),
                                 ("attention_bwd_sm90", main_defines(d, causal, det, fp16), "attention_backward_sm90"),
                                 ("attention_bwd_dq", fp, "attention_backward"),
                                 ("attention_bwd_sm90_dq_tile", main_defines(d, causal, det, fp16),
                                  "attention_backward_sm90")):
            if name != "attention_bwd_sm90_dq_tile" or extra.get("DQ_TILE"):
                get_kernel(name, None, defines=defs, file=file).program
    return f"{extra} d{d} causal {causal} det {det} fp16 {fp16}"


def precompile():
    jobs = [({}, d, c, det, fp16) for d, c, det, fp16 in itertools.product((64, 128), (0, 1), (0, 1), (0, 1))]
    jobs += [({"BLOCK_M": 64}, 64, c, det, 0) for c, det in itertools.product((0, 1), (0, 1))]  # a GPU test's
    jobs += [(extra, d, c, det, 0) for d in (64, 128) for _, det, extra, _ in DEFAULT[d] + DETERMINISTIC[d]
             if extra and extra != {"BLOCK_M": 64} for c in (0, 1)]
    jobs += [(DQ_TILE_DEFINES[d], d, c, 0, 1) for d in (64, 128) for c in (0, 1)]  # the tile GPU test's fp16
    with multiprocessing.get_context("fork").Pool(min(16, len(jobs))) as pool:
        done = pool.map(_compile, jobs)
    print(f"precompiled {len(done)} variants", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dims", type=int, nargs="+", default=[128, 64])
    p.add_argument("--seqs", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--deterministic-seqs", type=int, nargs="*", default=[4096],
                   help="rows at these lengths also time the deterministic variants")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--precompile", action="store_true", help="compile the variants (no GPU needed) and exit")
    args = p.parse_args()
    if args.precompile:
        return precompile()
    import torch  # optional dependency (--help works without it), before the driver is touched

    for d in args.dims:
        for seq in args.seqs:
            for causal in (False, True):
                row(torch, d, seq, causal, seq in args.deterministic_seqs, args.repeats)


if __name__ == "__main__":
    main()
