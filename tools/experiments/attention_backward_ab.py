"""The Hopper attention backward's dQ paths in one run, beside cuDNN: "bulk" (dQ through shared
memory and per-row bulk reductions by a producer warp, DQ_BULK: what a call plans at head dim
128), "red" (each consumer thread adds its dQ with red.global.add.v2.f32: what head dim 64
plans), and at the
``--deterministic-seqs`` the same in that mode ("det bulk", "det red": the per-warp chain; both
with causal key blocks run last first and chained in that order, SPT; "det old": round 1's
chain, key-block order, one thread between two barriers). The benchmark's shapes (16k tokens a
batch: head dim 64 x 32 heads, 128 x 16); interleaved rounds, every call after an L2 flush;
TFLOP/s (backward = 2.5 x the forward's FLOPs) and, in parentheses, the median per-round ratio
to cuDNN; the deterministic variants also against "bulk" (the default mode's plan). Every
variant's dq, dk, dv are checked against cuDNN's (relative error below 2e-2). Recorded in
docs/history.md, session 16.

    PYTHONPATH=. python3 tools/experiments/attention_backward_ab.py [--dims 128 64]
        [--seqs 1024 4096 16384] [--deterministic-seqs 4096] [--repeats N]
    PYTHONPATH=. python3 tools/experiments/attention_backward_ab.py --precompile

``--precompile`` (no GPU needed) compiles into the kernel cache, in parallel processes, every
variant of the sm90 backward's three kernels that the GPU tests (head dims 64 and 128, causal,
deterministic, fp16) and these rows use, then exits.
"""
from __future__ import annotations

import argparse
import itertools
import multiprocessing

from tmaflow import bench, kernels
from tmaflow.kernels.registry import extra_defines, get_kernel

DEFAULT = [("bulk", False, {"DQ_BULK": 1}), ("red", False, {"DQ_BULK": 0})]
DETERMINISTIC = [("det bulk", True, {"DQ_BULK": 1}), ("det red", True, {"DQ_BULK": 0}),
                 ("det old", True, {"DQ_BULK": 0, "SPT": 0, "WARP_CHAIN": 0})]


def row(torch, d: int, seq: int, causal: bool, deterministic: bool, repeats: int):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    heads, batch = {64: 32, 128: 16}[d], max(1, 16384 // seq)
    q, k, v, dout = (torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True)
    fns, grads = {}, {}
    for label, det, defines in DEFAULT + (DETERMINISTIC if deterministic else []):
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
        cells.append("det/bulk " + " ".join(f"{label[4:]} {got.ratio(label, 'bulk').median:.3f}"
                                            for label, _, _ in DETERMINISTIC))
    print(f"bwd d{d:<4d} seq {seq:5d} b{batch:<3d} {'causal' if causal else 'full  '} cold " + " ".join(cells) +
          "  TFLOP/s (x cuDNN)  err " + " ".join(f"{e:.1e}" for e in errs.values()), flush=True)
    worst = max(errs.values())
    assert worst < 2e-2, f"d{d} seq {seq} causal={causal}: relative error {worst:.2e} against cuDNN"


def _compile(job: tuple) -> str:
    extra, d, causal, det, fp16 = job
    fp = {"FP16": 1} if fp16 else {}
    defines = {"HEAD_DIM": d, "DETERMINISTIC": det, **fp}
    with extra_defines(extra):
        for name, defs, file in (("attention_bwd_sm90_prep", defines, "attention_backward_sm90"),
                                 ("attention_bwd_sm90", {**defines, "CAUSAL": causal, "STAGES": 3},
                                  "attention_backward_sm90"),
                                 ("attention_bwd_dq", fp, "attention_backward")):
            get_kernel(name, None, defines=defs, file=file).program
    return f"{extra} d{d} causal {causal} det {det} fp16 {fp16}"


def precompile():
    jobs = [({}, d, c, det, fp16) for d, c, det, fp16 in itertools.product((64, 128), (0, 1), (0, 1), (0, 1))]
    jobs += [(extra, d, c, det, 0) for extra, det in ((DEFAULT[1][2], 0), (DEFAULT[1][2], 1), (DETERMINISTIC[2][2], 1))
             for d, c in itertools.product((64, 128), (0, 1))]
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
