"""Grouped (MoE) bf16 GEMM: kernels.grouped_gemm against torch._grouped_mm (cuBLAS / CUTLASS
in torch), same inputs, in interleaved rounds, every row timed cold (L2 flushed before every
call: the experts' weights come from DRAM, as in a model) and back to back; results compared.
Offsets are given on the device to both (the host does not know the group sizes).

    PYTHONPATH=. python3 tools/peers/bench_grouped.py [--grid acceptance|quick|history] [--compare]
        [--add-rows G:NxK:TOKENS[s],...] [--rounds N] [--json FILE]

``--grid acceptance`` (default): issue 33's grid, G in {8, 32, 128} x tokens per expert in
{1, 16, 64, 256, 1024, 4096} x N x K in {4096x7168, 7168x2048, 4096x4096, 2048x7168}, balanced
and skewed (Pareto(1.2) expert loads, same total): 144 rows, any whose operands would pass
~40 GB skipped and named. ``--grid quick`` (``--quick``): 16 of them, every tokens value and
N x K, balanced and skewed (under a minute on an H200). ``--grid history``: session 4's table.
``--compare`` also times the way before issue 33's changes in the same process: the dense
kernel for rows the decode path now takes, the C map patched for every tile on the dense path
(``GemmConfig(patch_full_tiles=True)``); its columns are "old ...". On the dense path it also
times kernels.gemm of one T x N x K product (the same work, expert 0 for every row: what the
grouping costs) against the same torch call, "one-gemm ratio". On the decode path it also times
round 1's decode items ("r1": tile fastest, chunks of the mean group's rows, A in whole boxes,
64-row tiles), the plan at the other tile height ("rows": 64 or 128 rows of an expert an item),
the new items in chunks of the mean group's rows ("mean MP", where that is not 64) and the dense
path (what host offsets showing a group of more than 128 rows now take).
``--add-rows 128:7168x2048:64s,...`` appends rows of the acceptance grid (G, N x K, tokens per
expert, ``s`` skewed) with the acceptance grid's loads, to any grid.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics

import numpy as np

from tmaflow import bench, kernels
from tmaflow.bench.peers import Versus

NK = ((4096, 7168), (7168, 2048), (4096, 4096), (2048, 7168))
PER = (1, 16, 64, 256, 1024, 4096)
LIMIT_BYTES = 40e9  # operands and both outputs; larger rows are skipped

# (G, tokens per expert, N x K, skewed): every tokens value and N x K, balanced and skewed
QUICK = [(8, 1, NK[0], False), (8, 16, NK[1], True), (8, 64, NK[1], False), (8, 256, NK[2], True),
         (8, 1024, NK[2], False), (8, 4096, NK[3], True), (32, 1, NK[3], True), (32, 16, NK[2], False),
         (32, 64, NK[0], True), (32, 256, NK[1], False), (32, 1024, NK[3], False), (32, 4096, NK[0], True),
         (128, 1, NK[1], False), (128, 16, NK[3], True), (128, 64, NK[2], False), (128, 256, NK[0], True)]

COLUMNS = ["G", "N", "K", "tokens/expert", "skew", "path", "cold ours_ms", "cold peer_ms", "cold ratio",
           "warm ours_ms", "warm peer_ms", "warm ratio", "max rel diff"]
OLD_COLUMNS = ["old path", "cold old ratio", "warm old ratio", "cold one-gemm ratio", "warm one-gemm ratio",
               "cold r1 ratio", "warm r1 ratio", "cold mean-mp ratio", "warm mean-mp ratio",
               "cold dense ratio", "warm dense ratio", "cold rows ratio", "warm rows ratio"]


def grid(name: str) -> list[tuple]:
    if name == "quick":
        return QUICK
    if name == "history":
        return [(g, per, nk, skew) for g in (8, 32, 128) for nk in NK[:2] for per in (64, 512, 4096)
                for skew in (False, True)]
    return [(g, per, nk, skew) for g in (8, 32, 128) for nk in NK for per in PER for skew in (False, True)]


def sizes_for(g: int, per: int, skew: bool, rng) -> list[int]:
    if not skew:
        return [per] * g
    w = rng.pareto(1.2, g) + 0.05  # a few hot experts, many cold ones (some nearly empty)
    s = np.floor(w / w.sum() * per * g).astype(int)
    s[0] += per * g - s.sum()
    return s.tolist()


def added_rows(spec: str | None) -> list[tuple]:
    """``--add-rows``: (G, tokens, N x K, skewed, seed) of acceptance-grid rows, seeded as there."""
    if not spec:
        return []
    every = grid("acceptance")
    rows = []
    for item in spec.split(","):
        try:
            g, nk, per = item.split(":")
            n, k = (int(x) for x in nk.split("x"))
            row = (int(g), int(per.rstrip("s")), (n, k), per.endswith("s"))
            rows.append((*row, every.index(row)))
        except ValueError:
            raise SystemExit(f"--add-rows: {item!r} is no acceptance-grid row G:NxK:TOKENS[s] "
                             f"(G in 8, 32, 128; N x K in {NK}; tokens in {PER})")
    return rows


def route(t: int, n: int, k: int, g: int, sm_count: int, config=None) -> str:
    """Which kernel grouped_gemm runs with device offsets (and ``config``), in words."""
    from tmaflow.kernels.matmul.heuristics import grouped_chunk_rows, grouped_config

    config = config or grouped_config(t, n, k, g, sm_count)
    if isinstance(config, kernels.SkinnyConfig):
        order = ", tile fastest" if config.tile_fastest else ""
        return f"decode, {grouped_chunk_rows(None)}-row chunks, {config.rows}-row tiles{order}"
    patch = ", every tile patched" if config.patch_full_tiles else ""
    return f"dense {config.bn} cols x {config.cluster_m}, split {config.split_k}{patch}"


def old_config(t: int, n: int, k: int, g: int, sm_count: int):
    """The configuration grouped_gemm ran before issue 33's changes."""
    from tmaflow.kernels.matmul.heuristics import grouped_dense_config

    return dataclasses.replace(grouped_dense_config(t, n, k, g, sm_count), patch_full_tiles=True)


def decode_variants(a, b, offs, out, t: int, n: int, k: int, g: int, sm_count: int, torch) -> dict:
    """The decode path's alternatives on one row, each into its own output: round 1's items in
    the mean group's chunks (64-row tiles, as then), the plan's items in the mean group's chunks
    (where that is not 64), the dense path, and the plan at the other tile height ("rows": 64
    rows of an expert an item where it takes 128, 128 where it takes 64)."""
    from tmaflow.kernels.matmul.heuristics import grouped_chunk_rows, grouped_config, grouped_dense_config

    config = grouped_config(t, n, k, g, sm_count)
    mean = -(-t // g)
    r1 = dataclasses.replace(config, rows=64, tile_fastest=True)
    variants = {"r1": (r1, mean), "dense": (grouped_dense_config(t, n, k, g, sm_count), None),
                "rows": (dataclasses.replace(config, rows=64 if config.rows == 128 else 128), None)}
    if grouped_chunk_rows(mean) != grouped_chunk_rows(None):
        variants["mean-mp"] = (config, mean)
    fns = {}
    for key, (cfg, hint) in variants.items():
        dst = torch.empty_like(out)
        fns[key] = lambda cfg=cfg, hint=hint, dst=dst: kernels.grouped_gemm(a, b, offs, dst, config=cfg,
                                                                           max_tokens_per_group=hint)
    return fns


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", choices=("acceptance", "quick", "history"), default="acceptance")
    p.add_argument("--quick", action="store_true", help="the same as --grid quick")
    p.add_argument("--compare", action="store_true", help="also time the way before issue 33's changes")
    p.add_argument("--add-rows", help="acceptance-grid rows to append, G:NxK:TOKENS[s],... (s: skewed)")
    p.add_argument("--rounds", type=int, help="rounds a timing (default 7; quick 5)")
    p.add_argument("--json", help="write a bench record (bench/results/gemm_grouped.json)")
    args = p.parse_args()
    name = "quick" if args.quick else args.grid
    rounds = args.rounds or (5 if name == "quick" else 7)
    import torch  # optional dependency, before the driver is touched: --help works without it
    from tmaflow.runtime.device import current_device

    sm_count = current_device().sm_count
    rows, skipped = [], []
    print(f"grid {name}, {rounds} rounds; ratio = torch time / tmaflow time (above 1: tmaflow faster)")
    print(f"{'G':>4s} {'N':>5s} {'K':>5s} {'tokens/expert':>14s} {'skew':>5s}  path / tmaflow vs torch._grouped_mm")
    experts = {}
    rows_to_time = [(*row, i) for i, row in enumerate(grid(name))] + added_rows(args.add_rows)
    added = set()  # ids of the rows --add-rows appended (kept out of the grid's medians)
    for number, (g, per, (n, k), skew, seed) in enumerate(rows_to_time):
        sizes = sizes_for(g, per, skew, np.random.default_rng(seed))
        t = sum(sizes)
        need = 2 * (t * k + g * n * k + 3 * t * n)  # a, b, ours, torch's and the old output
        if need > LIMIT_BYTES:
            skipped.append(f"G={g} {n}x{k} {per} tokens/expert{' skewed' if skew else ''}: {need / 1e9:.0f} GB")
            print(f"{g:4d} {n:5d} {k:5d} {per:14d} {'yes' if skew else 'no':>5s}  skipped: operands {need / 1e9:.0f} GB")
            continue
        if (g, n, k) not in experts:
            experts.clear()  # one set of experts at a time
            experts[(g, n, k)] = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16)
        b = experts[(g, n, k)]
        a = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
        ends = torch.tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
        offs = torch.cat([torch.zeros(1, dtype=torch.int32, device="cuda"), ends])
        out = torch.empty(t, n, device="cuda", dtype=torch.bfloat16)
        fns = {"ours": lambda: kernels.grouped_gemm(a, b, offs, out),
               "peer": lambda: torch._grouped_mm(a, b.transpose(-2, -1), offs=ends)}
        old = old_config(t, n, k, g, sm_count) if args.compare else None
        if old is not None:
            old_out = torch.empty_like(out)
            fns["old"] = lambda: kernels.grouped_gemm(a, b, offs, old_out, config=old)
            if route(t, n, k, g, sm_count).startswith("dense"):
                one_out = torch.empty_like(out)
                fns["one"] = lambda: kernels.gemm(a, b[0], one_out)
            else:
                fns.update(decode_variants(a, b, offs, out, t, n, k, g, sm_count, torch))
        ref = fns["peer"]()
        outs = {key: fn() for key, fn in fns.items() if key not in ("peer", "one")}
        torch.cuda.synchronize()
        scale = ref.float().abs().max()
        diff = ((out.float() - ref.float()).abs().max() / scale).item()
        for key, got_out in outs.items():
            diff = max(diff, ((got_out.float() - ref.float()).abs().max() / scale).item())
        del ref
        warm_batch = 3 if t * n * k > 4e12 else 10  # the largest take tens of ms a call
        v = bench.versus(fns, ours="ours", peer="peer", repeats=rounds, warm_batch=warm_batch)
        got = v.row()
        row = {"G": g, "N": n, "K": k, "tokens/expert": per, "skew": skew, "path": route(t, n, k, g, sm_count),
               "max rel diff": diff, **{f"{mode} {key}": value for mode in got for key, value in got[mode].items()}}
        line = f"{g:4d} {n:5d} {k:5d} {per:14d} {'yes' if skew else 'no':>5s}  {row['path']}: {v.line(2 * t * n * k)}"
        if old is not None:
            was = Versus(v.cold, v.warm, "old", "peer")
            row.update({"old path": route(t, n, k, g, sm_count, old),
                        **{f"{mode} old ratio": was.ratio(mode).median for mode in ("cold", "warm")}})
            line += f" | old ({row['old path']}) cold {row['cold old ratio']:.3f} b2b {row['warm old ratio']:.3f}"
            if "one" in fns:
                one = Versus(v.cold, v.warm, "one", "peer")
                row.update({f"{mode} one-gemm ratio": one.ratio(mode).median for mode in ("cold", "warm")})
                line += f" | one gemm cold {row['cold one-gemm ratio']:.3f} b2b {row['warm one-gemm ratio']:.3f}"
            for key, words in (("r1", "round 1 (tile fastest, mean's chunks)"), ("mean-mp", "mean's chunks"),
                               ("dense", "dense"), ("rows", "the other tile height")):
                if key in fns:
                    other = Versus(v.cold, v.warm, key, "peer")
                    row.update({f"{mode} {key} ratio": other.ratio(mode).median for mode in ("cold", "warm")})
                    line += f" | {words} cold {row[f'cold {key} ratio']:.3f} b2b {row[f'warm {key} ratio']:.3f}"
        rows.append(row)
        if number >= len(grid(name)):
            added.add(id(row))
            line += " | added row"
        print(line + f" | max rel diff {diff:.1e}", flush=True)
        del a, out, offs, ends
    in_grid = [r for r in rows if id(r) not in added]
    for mode in ("cold", "warm"):
        got = [r[f"{mode} ratio"] for r in in_grid]
        below = [f"G={r['G']} {r['N']}x{r['K']} {r['tokens/expert']}{'s' if r['skew'] else ''}"
                 for r in in_grid if r[f"{mode} ratio"] < 1.0]
        print(f"{mode}: median ratio {statistics.median(got):.3f}, min {min(got):.3f} over {len(in_grid)} rows "
              f"of the grid; {len(below)} below 1.0{': ' + ', '.join(below) if below else ''}")
        if args.compare:
            print(f"{mode}, before issue 33's changes: median "
                  f"{statistics.median(r[f'{mode} old ratio'] for r in in_grid):.3f}")
            decode = [r for r in rows if f"{mode} r1 ratio" in r]  # the added rows too
            if decode:
                print(f"{mode}, decode rows ({len(decode)}): median {statistics.median(r[f'{mode} ratio'] for r in decode):.3f}, "
                      f"round 1's items {statistics.median(r[f'{mode} r1 ratio'] for r in decode):.3f}, "
                      f"the other tile height {statistics.median(r[f'{mode} rows ratio'] for r in decode):.3f}, "
                      f"dense {statistics.median(r[f'{mode} dense ratio'] for r in decode):.3f}; skewed: "
                      + ", ".join(f"G={r['G']} {r['N']}x{r['K']} {r['tokens/expert']}s {r[f'{mode} ratio']:.3f} "
                                  f"(r1 {r[f'{mode} r1 ratio']:.3f}, dense {r[f'{mode} dense ratio']:.3f})"
                                  for r in decode if r["skew"]))
    for line in skipped:
        print("skipped (over ~40 GB):", line)
    if args.json:
        bench.records.write(args.json, "gemm_grouped", "Grouped (MoE) bf16 GEMM against torch._grouped_mm",
                            COLUMNS + (OLD_COLUMNS if args.compare else []), rows, rounds=rounds, grid=name,
                            skipped=skipped)


if __name__ == "__main__":
    main()
