"""A/B of fp8 GEMM kernel variants in one run, each paired with torch._scaled_mm:
    PYTHONPATH=. python3 tools/fp8_ab.py [--shape MxNxK ...] [--repeats N]
A variant is a GemmConfig, per-tensor or block scales, and extra compile-time defines (for
trying a kernel change before it becomes a config). Errors are against float64 of the
dequantised operands on 256 rows."""
import argparse
import os
import statistics
import sys

import torch

from tmaflow import kernels
from tmaflow.kernels import matmul
from tmaflow.kernels.entry import STATES
from tmaflow.kernels.matmul import GemmConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gemm import block_scales, rel, timed_rounds  # noqa: E402  (tools/ is not a package)

EXTRA: dict = {}
_get_kernel = matmul.get_kernel


def _with_extra(*args, defines=None, **kw):
    return _get_kernel(*args, defines=dict(defines or {}, **EXTRA), **kw)


matmul.get_kernel = _with_extra

VARIANTS = [  # (label, block scales, config fields or None for the automatic choice, extra defines)
    ("block scales, auto", True, None, {}),
    ("block scales, clusters of 2", True, dict(bn=128, cluster_m=2, epi_cols=64, promote=1), {}),
    ("per-tensor, auto", False, None, {}),
    ("per-tensor, bn128 promote 1", False, dict(bn=128, cluster_m=1, promote=1), {}),
]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", action="append", default=[])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--only", default="", help="substring of the variant labels to run")
    args = p.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shape] or [(4096, 7168, 16384), (8192, 8192, 8192)]
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for m, n, k in shapes:
        torch.manual_seed(0)
        a = (torch.randn(m, k, device="cuda") * 40).to(torch.float8_e4m3fn)
        b = (torch.randn(n, k, device="cuda") * 40).to(torch.float8_e4m3fn)
        sa, sb, ref_block = block_scales(a, b)
        one = torch.tensor(0.01, device="cuda")
        ref_tensor = (a[:256].double() @ b.double().T) * 1e-4
        fns, errs = {}, {}
        peer_out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        fns["_scaled_mm"] = lambda: torch._scaled_mm(a, b.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                                     out=peer_out)
        for label, block, fields, extra in VARIANTS:
            if args.only not in label:
                continue
            EXTRA.clear()
            EXTRA.update(extra)
            STATES.clear()
            c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            cfg = GemmConfig(**fields) if fields is not None else None
            if block:
                run = kernels.gemm.prepare(a, b, c, scale_a=sa, scale_b=sb, config=cfg)
            else:
                run = kernels.gemm.prepare(a, b, c, scale_a=0.01, scale_b=0.01, config=cfg)
            c.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            ref = ref_block if block else ref_tensor
            errs[label] = rel(c[:256], ref)
            fns[label] = run
        times = timed_rounds(fns, flush, args.repeats)
        flop = 2.0 * m * n * k
        print(f"== {m}x{n}x{k}")
        for name, ts in times.items():
            ms = statistics.median(ts)
            ratio = statistics.median(p / o for p, o in zip(times["_scaled_mm"], ts))
            print(f"{name:<28s} {flop / ms / 1e9:8.1f} TFLOP/s  {ms:7.3f} ms  vs _scaled_mm {ratio:.3f}"
                  f"  err {errs.get(name, float('nan')):.1e}", flush=True)


if __name__ == "__main__":
    main()
