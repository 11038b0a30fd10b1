"""Grouped (MoE) bf16 GEMM: kernels.grouped_gemm against torch._grouped_mm (cuBLAS / CUTLASS
in torch), same inputs, alternating in paired rounds, CUDA events; results compared.

    PYTHONPATH=. python3 tools/bench_grouped.py [--quick]
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch  # before the driver is touched (see bench.main)

from tmaflow import kernels


def sizes_for(g: int, per: int, skew: bool, rng) -> list[int]:
    if not skew:
        return [per] * g
    w = rng.pareto(1.2, g) + 0.05  # a few hot experts, many cold ones (some nearly empty)
    s = np.floor(w / w.sum() * per * g).astype(int)
    s[0] += per * g - s.sum()
    return s.tolist()


def timed(fn, reps: int = 10) -> float:
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / reps / 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    shapes = [(g, n, k) for g in ((8, 32) if args.quick else (8, 32, 128))
              for n, k in ((4096, 7168), (7168, 2048))]
    pers = [256, 2048] if args.quick else [64, 512, 4096]
    print(f"{'G':>4s} {'N':>5s} {'K':>5s} {'tokens/expert':>14s} {'skew':>5s} {'tmaflow us':>11s} "
          f"{'torch us':>9s} {'ratio':>6s} {'TFLOP/s':>8s}  max rel diff")
    for g, n, k in shapes:
        b = torch.randn(g, n, k, device="cuda").to(torch.bfloat16)
        for per in pers:
            for skew in (False, True):
                sizes = sizes_for(g, per, skew, rng)
                t = sum(sizes)
                a = torch.randn(t, k, device="cuda").to(torch.bfloat16)
                ends = torch.tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
                offs = torch.cat([torch.zeros(1, dtype=torch.int32, device="cuda"), ends])
                out = torch.empty(t, n, device="cuda", dtype=torch.bfloat16)
                ours = lambda: kernels.grouped_gemm(a, b, offs, out)  # noqa: E731
                theirs = lambda: torch._grouped_mm(a, b.transpose(-2, -1), offs=ends)  # noqa: E731
                ref = theirs()
                ours()
                torch.cuda.synchronize()
                diff = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                ratios, mine, peer = [], [], []
                reps = 3 if t * n * k > 4e12 else 10  # the largest take tens of ms a call
                for _ in range(args.rounds):
                    x, y = timed(ours, reps), timed(theirs, reps)
                    mine.append(x), peer.append(y), ratios.append(y / x)
                flops = 2 * t * n * k
                del ref
                print(f"{g:4d} {n:5d} {k:5d} {per:14d} {'yes' if skew else 'no':>5s} "
                      f"{statistics.median(mine) * 1e6:11.1f} {statistics.median(peer) * 1e6:9.1f} "
                      f"{statistics.median(ratios):6.3f} {flops / statistics.median(mine) / 1e12:8.0f}  {diff:.1e}")


if __name__ == "__main__":
    main()
