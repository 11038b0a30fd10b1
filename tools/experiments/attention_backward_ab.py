"""The Hopper attention backward's schedules in one run, beside cuDNN: "new" (what a call plans:
head dim 128 dQ through shared memory and bulk reductions, DQ_BULK, issued between dV and dK,
DQ_EARLY, its stores while dK runs, into two dQ buffers with rows packed, DQ_PACK, and two Q /
dO stages, outside the deterministic mode; head dim 64 128-row steps, BLOCK_M=128, dQ added with
red.global, also between dV and dK). Head dim 128 (round 4): "1buf" (round 3's plan: one dQ
buffer, three stages), "det 2buf" (the two buffers in the deterministic mode, which plans
one), "dvf" (dV issued before dP is waited for,
DV_FIRST, 240 registers a consumer), "both", "rot" (each CTA starts its walk over the query
blocks at its own one, ROTATE: full attention only, a causal row runs "new" again). Head dim 64: "r2" (round 2's plan: 64-row steps,
step t - 1's dQ after step t's S and dP, OVERLAP) and "late" (128-row steps, dQ after dK: the
two levers apart). At the ``--deterministic-seqs`` the "det" variants (the deterministic mode,
against their default-mode selves). The
benchmark's shapes (16k tokens a batch: head dim 64 x 32 heads, 128 x 16); interleaved rounds,
every call after an L2 flush; TFLOP/s (backward = 2.5 x the forward's FLOPs) and, in
parentheses, the median per-round ratio to cuDNN. Every variant's dq, dk, dv are checked
against cuDNN's (relative error below 2e-2). Recorded in docs/history.md, session 16.

    PYTHONPATH=. python3 tools/experiments/attention_backward_ab.py [--dims 128 64]
        [--seqs 1024 4096 16384] [--deterministic-seqs 4096] [--repeats N]
    PYTHONPATH=. python3 tools/experiments/attention_backward_ab.py --precompile

``--precompile`` (no GPU needed) compiles into the kernel cache, in parallel processes, every
variant of the sm90 backward's three kernels that the GPU tests (head dims 64 and 128, causal,
deterministic, fp16; 64-row steps at head dim 64) and these rows use, then exits.
"""
from __future__ import annotations

import argparse
import itertools
import multiprocessing

from tmaflow import bench, kernels
from tmaflow.kernels.attention_backward_sm90 import main_defines
from tmaflow.kernels.registry import extra_defines, get_kernel

# Head dim 128's round-4 levers: two dQ buffers (packed rows) with two Q / dO stages; dV issued
# before dP is waited for, at 240 registers a consumer (24 the producer).
TWO_BUF = {"STAGES": 2, "DQ_BUFS": 2, "DQ_PACK": 1}
DV_FIRST = {"DV_FIRST": 1, "CONSUMER_REGS": 240}
# (label, deterministic, defines over the plan's, the default-mode label a deterministic one is against)
ONE_BUF = {"STAGES": 3, "DQ_BUFS": 1, "DQ_PACK": 0}  # round 3's plan, before TWO_BUF became the default
DEFAULT = {128: [("new", False, {}, None), ("1buf", False, ONE_BUF, None), ("dvf", False, DV_FIRST, None),
                 ("both", False, {**TWO_BUF, **DV_FIRST}, None), ("rot", False, {"ROTATE": 1}, None)],
           64: [("new", False, {}, None), ("r2", False, {"BLOCK_M": 64}, None),
                ("late", False, {"DQ_EARLY": 0}, None)]}
DETERMINISTIC = {128: [("det new", True, {}, "new"), ("det 2buf", True, TWO_BUF, "new"),
                       ("det dvf", True, DV_FIRST, "dvf")],
                 64: [("det new", True, {}, "new"), ("det r2", True, {"BLOCK_M": 64}, "r2")]}


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
                                 ("attention_bwd_dq", fp, "attention_backward")):
            get_kernel(name, None, defines=defs, file=file).program
    return f"{extra} d{d} causal {causal} det {det} fp16 {fp16}"


def precompile():
    jobs = [({}, d, c, det, fp16) for d, c, det, fp16 in itertools.product((64, 128), (0, 1), (0, 1), (0, 1))]
    jobs += [({"BLOCK_M": 64}, 64, c, det, 0) for c, det in itertools.product((0, 1), (0, 1))]  # a GPU test's
    jobs += [(extra, d, c, det, 0) for d in (64, 128) for _, det, extra, _ in DEFAULT[d] + DETERMINISTIC[d]
             if extra and extra != {"BLOCK_M": 64} for c in (0, 1)]
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
