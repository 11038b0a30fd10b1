"""tmaflow's bf16 GEMM against torch.matmul (cuBLAS) in the same run: TFLOP/s and ratio.

    python tools/bench_gemm.py [--json FILE]
Shapes: 8192^3, 4096^3, 2048^3 and LLM-like ones. Inputs are random (never zeros), both sides
time the same C = A @ B^T; medians of CUDA-event timings after warm-up.
"""
from __future__ import annotations

import argparse
import json

import torch

import tmaflow as tf
from tmaflow import kernels

SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 2048, 2048),
          (4096, 14336, 4096), (8192, 4096, 14336), (16, 4096, 4096)]


def median_ms(fn, repeats=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)[len(times) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    args = p.parse_args()
    rows = []
    for m, n, k in SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        launcher, largs, _ = kernels.gemm(a, b, c, launch=False)
        t_ours = median_ms(lambda: launcher(*largs))
        t_cublas = median_ms(lambda: torch.matmul(a, b.t(), out=c))
        flop = 2.0 * m * n * k
        rows.append({"shape": f"{m}x{n}x{k}", "tmaflow_tflops": flop / t_ours / 1e9,
                     "cublas_tflops": flop / t_cublas / 1e9, "ratio": t_cublas / t_ours})
        print(f"{rows[-1]['shape']:>18s}  tmaflow {rows[-1]['tmaflow_tflops']:7.1f}  "
              f"cuBLAS {rows[-1]['cublas_tflops']:7.1f}  ratio {rows[-1]['ratio']:.3f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": tf.current_device().name, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
