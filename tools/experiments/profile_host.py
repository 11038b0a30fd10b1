"""cProfile of the host path of an entry point called with torch tensors (what a user's loop
pays per call), sorted by own time.   PYTHONPATH=. python3 tools/experiments/profile_host.py [n]"""
import cProfile
import pstats
import sys

import torch  # before the driver is touched

from tmaflow.kernels import examples as ex
from tmaflow.kernels import gemm

n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
x = torch.randn(64, 1024, device="cuda")
y = torch.empty_like(x)
b = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
for _ in range(10):
    ex.softmax(x), ex.softmax(x, y), gemm(b, b)
torch.cuda.synchronize()
for label, fn in (("softmax(x, y)", lambda: ex.softmax(x, y)), ("softmax(x)", lambda: ex.softmax(x)),
                  ("gemm(b, b)", lambda: gemm(b, b))):
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    print(f"===== {label}")
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)
