"""Two fp8 GEMM launches (8192^3, promote 0 and 4) for ncu to compare: PYTHONPATH=. ncu ... python3 tools/experiments/fp8_probe.py"""
import torch
from tmaflow import kernels
from tmaflow.kernels.matmul import GemmConfig
m = n = k = 8192
a = (torch.randn(m, k, device="cuda") * 40).to(torch.float8_e4m3fn)
b = (torch.randn(n, k, device="cuda") * 40).to(torch.float8_e4m3fn)
c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
for p in (0, 4):
    run = kernels.gemm.prepare(a, b, c, config=GemmConfig(bn=128, cluster_m=2, promote=p), scale_a=0.01, scale_b=0.01)
    run(); torch.cuda.synchronize()
    run(); torch.cuda.synchronize()
