"""One skinny bf16 GEMM (default 16x4096x4096, C = A B^T) by tmaflow and by torch.matmul,
each launched a few times, for ncu to compare (duration, DRAM throughput, grid, stalls):

    ncu --section SpeedOfLight --section LaunchStats --section WarpStateStats \\
        python3 tools/experiments/skinny_probe.py 16 4096 4096
"""
from __future__ import annotations

import sys

import torch  # before the driver is touched

from tmaflow import kernels


def main(m=16, n=4096, k=4096, calls=3):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(calls):
        kernels.gemm(a, b, c)
        torch.matmul(a, b.T, out=c)
    torch.cuda.synchronize()
    ref = (a.float() @ b.float().T)
    kernels.gemm(a, b, c)
    print("max rel error", float((c.float() - ref).abs().max() / ref.abs().max()))


if __name__ == "__main__":
    main(*(int(x) for x in sys.argv[1:4]))
