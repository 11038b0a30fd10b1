"""One shape of the bf16 GEMM, for a profiler (ncu / nsys): warm-up, then three calls.

    ncu --kernel-name gemm_bf16 --launch-skip 2 --launch-count 1 python tools/experiments/profile_gemm.py M N K
    python tools/experiments/profile_gemm.py M N K --cublas        # torch.matmul instead (its kernel names)
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
    args = p.parse_args()
    a = torch.randn(args.m, args.k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(args.n, args.k, device="cuda", dtype=torch.bfloat16)
    if args.layout == "nn":
        b = b.T.contiguous()
    c = torch.empty(args.m, args.n, device="cuda", dtype=torch.bfloat16)
    given = {f: v for f, v in (("bn", args.bn), ("cluster_m", args.cluster_m), ("split_k", args.split_k)) if v}
    config = GemmConfig(**given) if given else None
    for _ in range(3):
        if args.cublas:
            torch.matmul(a, b.T if args.layout == "nt" else b, out=c)
        else:
            kernels.gemm(a, b, c, layout=args.layout, config=config)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
