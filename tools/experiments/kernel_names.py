"""Which kernels cuBLAS (torch) and tmaflow run for a GEMM, and their device durations
(CUPTI, through torch.profiler: no launch gaps, no event-timer steps):
    PYTHONPATH=. python3 tools/experiments/kernel_names.py [--shape MxNxK ...] [--repeats N] [--sweep]
bf16 (torch.matmul against tmaflow's automatic config, with --sweep also tmaflow.bench.gemm_shapes.SWEEP),
fp8 per-tensor (_scaled_mm) and fp8 block scales (cuBLAS's block-scaled _scaled_mm where torch
has it)."""
import argparse

import torch

from tmaflow import bench, kernels
from tmaflow.bench import gemm_shapes



def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", action="append", default=[])
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--sweep", action="store_true", help="also every bf16 config of tmaflow.bench.gemm_shapes.SWEEP")
    args = p.parse_args()
    shapes = bench.parse_shapes(args.shape, [(2048, 2048, 2048)])
    for m, n, k in shapes:
        a, b = bench.nt_operands(m, n, k)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        c2 = torch.empty_like(c)
        ours = kernels.gemm.prepare(a, b, c)
        fns = {"torch.matmul": lambda: torch.matmul(a, b.T, out=c2), "tmaflow": ours}
        for cfg in gemm_shapes.SWEEP if args.sweep else []:
            if cfg != "dense":
                fns[f"tmaflow {gemm_shapes.describe(cfg)}"] = kernels.gemm.prepare(a, b, c, config=cfg)
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        one = torch.tensor(1.0, device="cuda")
        fns["_scaled_mm"] = lambda: torch._scaled_mm(a8, b8.T, scale_a=one, scale_b=one,
                                                     out_dtype=torch.bfloat16, out=c2)
        fns["tmaflow fp8"] = kernels.gemm.prepare(a8, b8, c, scale_a=1.0, scale_b=1.0)
        sa, sb, _ = bench.block_scales(a8, b8, rows=1)
        block = bench.cublas.block_scaled_mm(a8, b8, sa, sb, c2)
        if block is not None:
            fns["_scaled_mm blocks"] = block
        fns["tmaflow blocks"] = kernels.gemm.prepare(a8, b8, c, scale_a=sa, scale_b=sb)
        flop = 2.0 * m * n * k
        print(f"== {m}x{n}x{k}")
        for label, fn in fns.items():
            for name, t in bench.kernel_times(fn, args.repeats).items():
                calls, us = t.calls, t.mean_us
                print(f"{label:<36s} {us:9.2f} µs {flop / us / 1e6:8.1f} TFLOP/s  x{calls:<4d} {name[:150]}",
                      flush=True)


if __name__ == "__main__":
    main()
