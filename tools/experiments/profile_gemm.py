"""One shape of the bf16 GEMM (--fp8: fp8 e4m3 with per-tensor scales), for a profiler (ncu /
nsys): three calls.

    ncu --kernel-name gemm_bf16 --launch-skip 2 --launch-count 1 python tools/experiments/profile_gemm.py M N K
    python tools/experiments/profile_gemm.py M N K --cublas        # torch.matmul instead (its kernel names)
    python tools/experiments/profile_gemm.py M N K --fp8 --cublas  # torch._scaled_mm
Options: --layout nt|nn, --bn, --cluster-m, --split-k (a GemmConfig; default: the automatic one).
"""
from __future__ import annotations

import argparse

import torch

from tmaflow import kernels
from tmaflow.kernels.matmul import GemmConfig


def main():
    p = argparse.ArgumentParser()
    p.add_argument("m", type=int)
    p.add_argument("n", type=int)
    p.add_argument("k", type=int)
    p.add_argument("--layout", default="nt")
    p.add_argument("--bn", type=int)
    p.add_argument("--cluster-m", type=int)
    p.add_argument("--split-k", type=int)
    p.add_argument("--cublas", action="store_true")
    p.add_argument("--fp8", action="store_true", help="e4m3 operands, per-tensor scales (layout nt)")
    args = p.parse_args()
    a = torch.randn(args.m, args.k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(args.n, args.k, device="cuda", dtype=torch.bfloat16)
    if args.fp8:
        a, b = ((x * 40).to(torch.float8_e4m3fn) for x in (a, b))
    if args.layout == "nn":
        b = b.T.contiguous()
    c = torch.empty(args.m, args.n, device="cuda", dtype=torch.bfloat16)
    given = {f: v for f, v in (("bn", args.bn), ("cluster_m", args.cluster_m), ("split_k", args.split_k)) if v}
    config = GemmConfig(**given) if given else None
    one = torch.tensor(0.01, device="cuda")
    for _ in range(3):
        if args.cublas and args.fp8:
            torch._scaled_mm(a, b.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, out=c)
        elif args.cublas:
            torch.matmul(a, b.T if args.layout == "nt" else b, out=c)
        elif args.fp8:
            kernels.gemm(a, b, c, config=config, scale_a=0.01, scale_b=0.01)
        else:
            kernels.gemm(a, b, c, layout=args.layout, config=config)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
