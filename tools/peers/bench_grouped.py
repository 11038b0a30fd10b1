"""Grouped (MoE) bf16 GEMM: kernels.grouped_gemm against torch._grouped_mm (cuBLAS / CUTLASS
in torch), same inputs, in interleaved rounds, every row timed cold (L2 flushed before every
call: the experts' weights come from DRAM, as in a model) and back to back; results compared.

    PYTHONPATH=. python3 tools/peers/bench_grouped.py [--quick] [--rounds N] [--json FILE]
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np

from tmaflow import bench, kernels

COLUMNS = ["G", "N", "K", "tokens/expert", "skew", "cold ours_ms", "cold peer_ms", "cold ratio",
           "warm ours_ms", "warm peer_ms", "warm ratio", "max rel diff"]


def sizes_for(g: int, per: int, skew: bool, rng) -> list[int]:
    if not skew:
        return [per] * g
    w = rng.pareto(1.2, g) + 0.05  # a few hot experts, many cold ones (some nearly empty)
    s = np.floor(w / w.sum() * per * g).astype(int)
    s[0] += per * g - s.sum()
    return s.tolist()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", help="write a bench record (bench/results/gemm_grouped.json)")
    args = p.parse_args()
    import torch  # optional dependency, before the driver is touched: --help works without it

    rng = np.random.default_rng(0)
    shapes = [(g, n, k) for g in ((8, 32) if args.quick else (8, 32, 128))
              for n, k in ((4096, 7168), (7168, 2048))]
    pers = [256, 2048] if args.quick else [64, 512, 4096]
    print(f"{'G':>4s} {'N':>5s} {'K':>5s} {'tokens/expert':>14s} {'skew':>5s}  tmaflow vs torch._grouped_mm")
    rows = []
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
                del ref
                warm_batch = 3 if t * n * k > 4e12 else 10  # the largest take tens of ms a call
                v = bench.versus({"ours": ours, "peer": theirs}, ours="ours", peer="peer", repeats=args.rounds,
                                 warm_batch=warm_batch)
                flops = 2 * t * n * k
                got = v.row()
                rows.append({"G": g, "N": n, "K": k, "tokens/expert": per, "skew": skew, "max rel diff": diff,
                             **{f"{mode} {key}": value for mode in got for key, value in got[mode].items()}})
                print(f"{g:4d} {n:5d} {k:5d} {per:14d} {'yes' if skew else 'no':>5s}  {v.line(flops)}  "
                      f"max rel diff {diff:.1e}", flush=True)
    for mode in ("cold", "warm"):
        print(f"median {mode} ratio: {statistics.median(r[f'{mode} ratio'] for r in rows):.3f} over {len(rows)} rows")
    if args.json:
        bench.records.write(args.json, "gemm_grouped", "Grouped (MoE) bf16 GEMM against torch._grouped_mm",
                            COLUMNS, rows, rounds=args.rounds)


if __name__ == "__main__":
    main()
