"""SM clock and board power while fp8 GEMMs run back to back, to tell a kernel that does less per
clock from one that runs at lower clocks (H200 fp8 GEMMs run at the power limit):
    PYTHONPATH=. python3 tools/experiments/gemm_clocks.py [--shape MxNxK] [--seconds S]
Each function runs for S seconds while `nvidia-smi` samples every 50 ms; reported: TFLOP/s over
the run, the median SM clock and power of the samples, and TFLOP/s per GHz of SM clock. L2 is
not flushed (the operands are far larger than L2)."""
import argparse
import statistics
import subprocess
import time

import torch

from tmaflow import bench, kernels
from tmaflow.kernels.matmul import GemmConfig



def sampled(fn, seconds: float) -> tuple:
    """(calls per second, [(sm MHz, watts)]) of ``fn`` run back to back for ``seconds``."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    calls, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            fn()
        calls += 20
        torch.cuda.synchronize()
    rate = calls / (time.perf_counter() - t0)
    smi.terminate()
    out = smi.communicate()[0]
    samples = []
    for line in out.splitlines()[2:]:  # the first samples may predate the load
        try:
            mhz, watts = (float(x) for x in line.split(","))
        except ValueError:
            continue
        samples.append((mhz, watts))
    return rate, samples


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", action="append", default=[])
    p.add_argument("--seconds", type=float, default=2.0)
    args = p.parse_args()
    for m, n, k in bench.parse_shapes(args.shape, [(4096, 7168, 16384)]):
        torch.manual_seed(0)
        a, b = bench.nt_operands(m, n, k, "float8_e4m3fn")
        sa, sb, _ = bench.block_scales(a, b)
        sa_m = sa.t().contiguous().t()
        one = torch.tensor(1.0, device="cuda")
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        fns = {
            "_scaled_mm per-tensor": lambda: torch._scaled_mm(a, b.T, scale_a=one, scale_b=one,
                                                               out_dtype=torch.bfloat16, out=c),
            "_scaled_mm block scales": bench.cublas.block_scaled_mm(a, b, sa, sb, c),
            "tmaflow block scales, M-major": kernels.gemm.prepare(a, b, c, scale_a=sa_m, scale_b=sb),
            "tmaflow per-tensor, auto": kernels.gemm.prepare(a, b, c, scale_a=1.0, scale_b=1.0),
        }
        for label, promote in (("promoted every k-block", 1), ("never promoted", 0)):
            cfg = GemmConfig(bn=128, cluster_m=2, epi_cols=64, promote=promote)
            fns[f"tmaflow per-tensor bn128 c2, {label}"] = kernels.gemm.prepare(a, b, c, scale_a=1.0, scale_b=1.0,
                                                                                   config=cfg)
        flop = 2.0 * m * n * k
        print(f"== {m}x{n}x{k}, {args.seconds:.1f} s each")
        print(f"{'':<50s} {'TFLOP/s':>8s} {'SM MHz':>7s} {'W':>6s} {'TFLOP/s/GHz':>12s}")
        for name, fn in fns.items():
            if fn is None:
                continue
            rate, samples = sampled(fn, args.seconds)
            mhz = statistics.median(s[0] for s in samples) if samples else float("nan")
            watts = statistics.median(s[1] for s in samples) if samples else float("nan")
            tflops = flop * rate / 1e12
            print(f"{name:<50s} {tflops:8.1f} {mhz:7.0f} {watts:6.0f} {tflops / (mhz / 1000):12.1f}", flush=True)


if __name__ == "__main__":
    main()
