"""Where a GEMM launch's time goes, CTA by CTA, from the flight recorder (``trace=True``):
    PYTHONPATH=. python3 tools/experiments/gemm_timeline.py [--shape MxNxK ...] [--block]
For each config: the traced launch's span, and the median over CTAs of when the CTA started
(after the kernel's first CTA), how long its first stage took to arrive, its k-loops and
epilogues (trace marks 1 and 2 in gemm.cu), its tail (last stores to exit), and the time its
consumer warps spent waiting for data (full barriers) against its producer waiting for free
stages (empty barriers). Consumers waiting means the loads are late; the producer waiting
means the math is the bottleneck. Tracing slows a launch; compare configs with each other,
not with untraced times."""
import argparse
import os
import statistics

import numpy as np
import torch

import tmaflow as tf
from tmaflow import bench, kernels
from tmaflow.kernels.matmul import GemmConfig


BF16_CONFIGS = [None, GemmConfig(bn=256, cluster_m=2), GemmConfig(bn=128, cluster_m=1),
                GemmConfig(bn=128, cluster_m=2)]
BLOCK_CONFIGS = [None, GemmConfig(bn=128, cluster_m=2, epi_cols=64, promote=1)]


def per_cta(trace) -> dict:
    """{name: [value per CTA]} in µs."""
    ev = trace.events
    t_kernel = int(ev["t0"].min())
    out = {k: [] for k in ("start", "first data", "k-loops", "epilogues", "tail", "consumer waits",
                           "producer waits", "end")}
    for block in np.unique(ev["block"]):
        e = ev[ev["block"] == block]
        ends = e["t0"].astype(np.int64) + e["dur"]
        start, end = int(e["t0"].min()), int(ends.max())
        waits = e["kind"] == tf.trace.KIND["wait"]
        consumer = waits & (e["warp"] >= 4)
        producer = waits & (e["warp"] == 0)
        marks = e[e["kind"] == tf.trace.KIND["mark"]]
        first_data = int(ends[consumer].min()) if consumer.any() else start
        out["start"].append(start - t_kernel)
        out["first data"].append(first_data - start)
        out["end"].append(end - t_kernel)
        # each consumer warp marks 1 and 2 once a tile; a tile's k-loop runs from the previous
        # tile's mark 2 (or the first data) to its mark 1
        w = int(np.unique(e["warp"][e["warp"] >= 4])[0]) if (e["warp"] >= 4).any() else -1
        mine1 = np.sort(marks[(marks["value"] == 1) & (marks["warp"] == w)]["t0"].astype(np.int64))
        mine2 = np.sort(marks[(marks["value"] == 2) & (marks["warp"] == w)]["t0"].astype(np.int64))
        if len(mine1) and len(mine1) == len(mine2):
            begins = np.concatenate([[first_data], mine2[:-1]])
            out["k-loops"].append(int((mine1 - begins).sum()))
            out["epilogues"].append(int((mine2 - mine1).sum()))
            out["tail"].append(end - int(mine2[-1]))
        consumers = max(1, len(np.unique(e["warp"][consumer])))
        out["consumer waits"].append(int(e["dur"][consumer].sum()) / consumers)
        out["producer waits"].append(int(e["dur"][producer].sum()))
    return {k: [x / 1e3 for x in v] for k, v in out.items()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", action="append", default=[])
    p.add_argument("--block", action="store_true", help="fp8 with M-major block scales instead of bf16")
    p.add_argument("--save", default="", help="a folder to keep each trace in (.npz, Trace.load)")
    args = p.parse_args()
    shapes = bench.parse_shapes(args.shape, [(2048, 2048, 2048)])
    for m, n, k in shapes:
        if args.block:
            a, b = bench.nt_operands(m, n, k, "float8_e4m3fn")
            sa, sb, _ = bench.block_scales(a, b, rows=1)
            extra, configs = dict(scale_a=sa.t().contiguous().t(), scale_b=sb), BLOCK_CONFIGS
        else:
            a, b = bench.nt_operands(m, n, k)
            extra, configs = {}, BF16_CONFIGS
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        print(f"== {m}x{n}x{k} {'fp8 block scales' if args.block else 'bf16'}")
        for cfg in configs:
            run = kernels.gemm.prepare(a, b, c, config=cfg, trace=True, **extra)
            run()
            run()  # the second traced launch: warm caches and clocks
            torch.cuda.synchronize()
            tr = tf.trace.last()
            rows = per_cta(tr)
            if args.save:
                os.makedirs(args.save, exist_ok=True)
                tr.save(os.path.join(args.save, f"{m}x{n}x{k}_{'block' if args.block else 'bf16'}_"
                                     f"{'auto' if cfg is None else f'bn{cfg.bn}c{cfg.cluster_m}'}.npz"))
            span = max(rows["end"])
            med = {key: statistics.median(v) if v else float("nan") for key, v in rows.items()}
            label = "auto" if cfg is None else f"bn{cfg.bn} c{cfg.cluster_m}"
            print(f"{label:<10s} span {span:7.1f} µs, {len(rows['end'])} CTAs, {tr.wrapped} rings wrapped; "
                  "median CTA: " + ", ".join(f"{key} {v:.1f}" for key, v in med.items() if key != "end"),
                  flush=True)


if __name__ == "__main__":
    main()
