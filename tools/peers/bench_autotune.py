"""The autotuner's choice against the hand-picked default, on GEMM shapes the default's
heuristics were not tuned on: for each shape ``tf.autotune.entry(kernels.gemm, configs=...)``
tunes the config (checked against the default's output), then the tuned and the default
config run in interleaved rounds, cold (L2 flushed before every call) and back to back,
beside torch.matmul.

    PYTHONPATH=. python3 tools/peers/bench_autotune.py [--shape MxNxK ...] [--repeats N] [--json FILE]
"""
from __future__ import annotations

import argparse
import math

import tmaflow as tf
from tmaflow import bench, kernels
from tmaflow.bench.gemm_shapes import SWEEP, describe

UNTUNED = [(1000, 3000, 520), (2304, 4608, 1024), (512, 512, 2048), (1536, 1536, 1536), (3000, 2000, 1000),
           (6144, 2048, 3072)]
COLUMNS = ["shape", "chosen", "cold tuned/default", "warm tuned/default", "cold torch/tuned", "warm torch/tuned",
           "tuning s"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", action="append", default=[], metavar="MxNxK")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--json", help="write a bench record (bench/results/autotune.json)")
    args = p.parse_args()
    import time

    import torch  # optional dependency, before the driver is touched: --help works without it

    rows = []
    for m, n, k in bench.parse_shapes(args.shape, UNTUNED):
        a, b = bench.nt_operands(m, n, k)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        peer = torch.empty_like(c)
        tuner = tf.autotune.entry(kernels.gemm, configs=SWEEP, tolerance=(2e-2, 0.02 * math.sqrt(k)),
                                  flush_l2=True, repeats=args.repeats)
        started = time.perf_counter()
        tuner(a, b, c)
        tuning = time.perf_counter() - started
        chosen = tuner.chosen()
        fns = {"tuned": kernels.gemm.prepare(a, b, c, config=chosen), "default": kernels.gemm.prepare(a, b, c),
               "torch": lambda: torch.matmul(a, b.T, out=peer)}
        v = bench.versus(fns, ours="tuned", peer="default", repeats=args.repeats)
        row = {"shape": f"{m}x{n}x{k}", "chosen": describe(chosen), "tuning s": tuning,
               "cold tuned/default": v.ratio("cold").median, "warm tuned/default": v.ratio("warm").median,
               "cold torch/tuned": v.cold.ratio("tuned", "torch").median,
               "warm torch/tuned": v.warm.ratio("tuned", "torch").median}
        rows.append(row)
        print(f"{row['shape']:>16s} {row['chosen']:<36s} tuned vs default: {v.line(2.0 * m * n * k)}  "
              f"vs torch cold {row['cold torch/tuned']:.3f} warm {row['warm torch/tuned']:.3f}  "
              f"(tuned in {tuning:.1f} s)", flush=True)
    if args.json:
        bench.records.write(args.json, "autotune", "Autotuned GEMM config against the default, shapes not tuned on",
                            COLUMNS, rows, repeats=args.repeats)


if __name__ == "__main__":
    main()
