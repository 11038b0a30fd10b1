"""Which configuration each bf16 GEMM shape should take, decided by measurement against
torch.matmul (cuBLAS): every configuration the kernels can run (tmaflow.bench.gemm_candidates:
tile widths, clusters, global and cluster K-splits, split tails, the skinny path's choices),
pruned by wave arithmetic, screened by CUPTI kernel time back to back and after an L2 flush
(one profiler session a shape), then the best few and today's default confirmed in interleaved
rounds, cold AND back to back (tmaflow.bench.versus), the default and the best also with PDL.

    PYTHONPATH=. python3 tools/peers/gemm_sweep.py [--suite 30] [--shape MxNxK[:nt|nn] ...]
        [--budget 240] [--calls 20] [--repeats 15] [--finalists 2] [--no-cluster-k]
        [--jobs N] [--json FILE]
    PYTHONPATH=. python3 tools/peers/gemm_sweep.py --precompile [--sms 132] [--jobs N]
    PYTHONPATH=. python3 tools/peers/gemm_sweep.py --summary FILE

Every kernel of the sweep is compiled first, in --jobs processes, into the compile cache
(TMAFLOW_CACHE_DIR): NVRTC only, no device. ``--precompile`` does only that (on a machine
without a GPU too); the cache is keyed on NVRTC's version and the header directories' paths,
so a cache made on another machine is reused only where both match. Each candidate's output is
checked against cuBLAS's (relative error below 1e-2) before it is timed; one that is wrong or
does not plan is listed and skipped. Shapes go smallest first; once --budget seconds have passed
the rest are listed as skipped.

The JSON (``--json``): one row per shape with its features (tiles, k-blocks, SMs), the
default's and the best's configuration (``config``: the GemmConfig / SkinnyConfig fields,
``GemmConfig(**row["best"]["config"])`` rebuilds it) with cold and back-to-back ratios to
cuBLAS and the best's per-round gain over the default, the PDL variants, and the whole screen.
To turn it into heuristics: take the rows whose best beats the default by 2% or more in both
timings (``--summary`` lists them with the fields that changed) and write the rule that
separates them by the features (heuristics.py keeps the evidence in its docstrings).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import multiprocessing
import os
import statistics
import time

import tmaflow as tf
from tmaflow import bench, kernels
from tmaflow.bench.gemm_candidates import candidates
from tmaflow.bench.gemm_shapes import SUITES, describe
from tmaflow.kernels import registry
from tmaflow.kernels.matmul import BK, BM, SkinnyConfig, gemm_plan, skinny_plan
from tmaflow.launch import cache

ARCH = "sm_90a"  # what a Hopper device compiles for (Device.arch)
WRONG = 1e-2  # relative error to cuBLAS's output above which a candidate is not timed
COLUMNS = ["shape", "default_cfg", "default_cold", "default_warm", "best_cfg", "best_cold", "best_warm",
           "gain_cold", "gain_warm", "default_pdl_warm", "best_pdl_warm"]


def kernel_job(m: int, n: int, k: int, layout: str, config, sms: int) -> tuple:
    """(file, kernel name, defines, layout) of the kernel a candidate launches."""
    if isinstance(config, SkinnyConfig):
        plan = skinny_plan(m, n, k, config, sms)
        return "skinny", "gemm_skinny_bf16", plan.defines, plan.layout
    plan = gemm_plan(m, n, k, layout, config)
    return "gemm", "gemm_bf16", plan.defines, plan.layout


def compile_one(job: tuple) -> tuple[str, float]:
    """Compile one kernel into the disk cache (a worker process: no device is touched, the
    arch is given); (where it came from, seconds)."""
    file, name, defines, layout = job
    kernel = tf.Kernel(registry.source(file), name, defines=defines, layout=layout, filename=f"{file}.cu",
                       arch=ARCH)
    program = kernel.program
    return program.cache_hit or "compiled", program.compile_seconds


def shape_candidates(m: int, n: int, k: int, layout: str, sms: int, cluster_k: bool = True) -> list:
    """The candidates of one shape (gemm_candidates), without cluster K-splits if asked."""
    got = candidates(m, n, k, layout, sms)
    return got if cluster_k else [c for c in got if c.default or getattr(c.config, "cluster_k", 1) == 1]


def precompile(shapes, sms: int, jobs: int, cluster_k: bool = True) -> dict:
    """Every distinct kernel of the sweep's candidates, compiled in ``jobs`` processes."""
    todo = {}
    for m, n, k, layout in shapes:
        try:
            cands = shape_candidates(m, n, k, layout, sms, cluster_k)
        except tf.TmaflowError:  # listed as an error when its turn comes
            continue
        for cand in cands:
            file, name, defines, layout_ = kernel_job(m, n, k, layout, cand.config, sms)
            todo.setdefault((file, tuple(sorted(defines.items())), layout_.header()), (file, name, defines, layout_))
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")  # no inherited driver state; workers never touch the device
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=ctx) as pool:
        got = list(pool.map(compile_one, todo.values()))
    where = [w for w, _ in got]
    return {"kernels": len(todo), "compiled": where.count("compiled"), "from_disk": where.count("disk"),
            "compile_seconds": sum(s for _, s in got), "wall_seconds": time.perf_counter() - t0}


def config_fields(config) -> dict:
    """A config as JSON: its type and fields."""
    return {"type": type(config).__name__, **dataclasses.asdict(config)}


def short(config) -> str:
    """describe() without the fields the sweep never varies."""
    return describe(config).replace(" l2256B", "").replace(" smax", "").replace(" g16", "")


def call_budget(flop: float, calls: int) -> int:
    """Calls per screened function: ``calls``, fewer for long products (about 20 ms each)."""
    est = flop / 600e12 + 5e-6
    return max(3, min(calls, int(0.02 / est)))


def median_us(samples) -> float:
    return statistics.median(samples)


def sweep_shape(m: int, n: int, k: int, layout: str, sms: int, args) -> dict:
    """Screen every candidate of one shape, confirm the finalists; the shape's JSON row."""
    import torch  # optional dependency: --help and --precompile work without it

    a, b = bench.nt_operands(m, n, k)
    if layout == "nn":
        b = b.T.contiguous()  # K x N, N contiguous
    bt = b.T if layout == "nt" else b
    c_ref = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

    def peer():
        return torch.matmul(a, bt, out=c_ref)

    peer()
    torch.cuda.synchronize()
    flop = 2.0 * m * n * k
    screen, runs, cands = [], {}, {}
    for i, cand in enumerate(shape_candidates(m, n, k, layout, sms, args.cluster_k)):
        entry = {"name": f"c{i}", "config": config_fields(cand.config), "describe": short(cand.config),
                 "default": cand.default, "model_cost": cand.cost, "family": cand.family}
        try:
            run = kernels.gemm.prepare(a, b, c, layout=layout, config=cand.config)
            err = bench.poisoned_error(run, c, c_ref)
        except tf.TmaflowError as exc:
            entry["status"] = f"refused: {str(exc).splitlines()[0][:160]}"
            screen.append(entry)
            continue
        entry["rel_err"] = err
        entry["status"] = "ok" if err < WRONG else "wrong"
        screen.append(entry)
        if err < WRONG:
            runs[entry["name"]], cands[entry["name"]] = run, cand
    flush = bench.L2Flush()
    calls = call_budget(flop, args.calls)
    fns = {"peer": peer, **runs}
    timed = {**{f"warm {name}": fn for name, fn in fns.items()},
             **{f"cold {name}": (lambda fn=fn: (flush(), fn())) for name, fn in fns.items()}}
    times = bench.call_times(timed, calls)
    peer_us = {mode: median_us(times[f"{mode} peer"]) for mode in ("cold", "warm")}
    for entry in screen:
        if entry["name"] in runs:
            for mode in ("cold", "warm"):
                us = median_us(times[f"{mode} {entry['name']}"])
                entry[f"cupti_{mode}_us"] = us
                entry[f"cupti_{mode}_ratio"] = peer_us[mode] / us
            entry["score"] = min(entry["cupti_cold_ratio"], entry["cupti_warm_ratio"])
    ranked = sorted((e for e in screen if "score" in e), key=lambda e: -e["score"])
    default = next((e for e in screen if e["default"]), None)
    finalists = [e for e in ranked if not e["default"]][:args.finalists]
    for mode in ("cold", "warm"):  # the best of each timing too
        top = max((e for e in ranked if not e["default"]), key=lambda e: e[f"cupti_{mode}_ratio"], default=None)
        if top is not None and top not in finalists:
            finalists.append(top)
    row = {"shape": f"{m}x{n}x{k}", "layout": layout, "m": m, "n": n, "k": k, "flop": flop, "sms": sms,
           "tiles_m": math.ceil(m / BM), "k_blocks": math.ceil(k / BK), "calls": calls,
           "peer_cupti_us": peer_us, "screen": screen}
    if default is None or default["name"] not in runs:
        row["error"] = "the default configuration did not run or was wrong"
        return row
    best_screened = ranked[0]
    sources = {"default": default["name"], **{e["name"]: e["name"] for e in finalists}}  # name -> candidate
    confirm = {name: runs[src] for name, src in sources.items()}
    if args.pdl:
        pdl = {"default+pdl": default["name"]}
        if best_screened is not default:
            pdl["best+pdl"] = best_screened["name"]
        for name, src in pdl.items():
            confirm[name] = kernels.gemm.prepare(a, b, c, layout=layout, config=cands[src].config, pdl=True)
        sources.update(pdl)
    confirm["peer"] = peer
    v = bench.versus(confirm, ours="default", peer="peer", repeats=repeats_for(flop, len(confirm), args.repeats),
                     warmup=2)
    confirmed = {}
    for name, src in sources.items():
        got = {"candidate": src, "describe": short(cands[src].config)}
        for mode in ("cold", "warm"):
            rounds = getattr(v, mode)
            got[f"{mode}_us"] = rounds[name].median * 1e6
            got[f"{mode}_ratio"] = rounds.ratio(name, "peer").median
            got[f"{mode}_vs_default"] = rounds.ratio(name, "default").median
        confirmed[name] = got
    plain = {name: got for name, got in confirmed.items() if "+pdl" not in name}
    best = max(plain, key=lambda name: min(plain[name]["cold_ratio"], plain[name]["warm_ratio"]))
    row["confirmed"] = confirmed
    row["peer_us"] = {mode: getattr(v, mode)["peer"].median * 1e6 for mode in ("cold", "warm")}
    row["default"] = {"config": default["config"], **plain["default"]}
    row["best"] = {"config": next(e["config"] for e in screen if e["name"] == plain[best]["candidate"]),
                   **plain[best]}
    row.update({"default_cfg": row["default"]["describe"], "default_cold": row["default"]["cold_ratio"],
                "default_warm": row["default"]["warm_ratio"], "best_cfg": row["best"]["describe"],
                "best_cold": row["best"]["cold_ratio"], "best_warm": row["best"]["warm_ratio"],
                "gain_cold": row["best"]["cold_vs_default"], "gain_warm": row["best"]["warm_vs_default"],
                "default_pdl_warm": confirmed.get("default+pdl", {}).get("warm_ratio"),
                "best_pdl_warm": confirmed.get("best+pdl", {}).get("warm_ratio")})
    return row


def repeats_for(flop: float, fns: int, repeats: int) -> int:
    """Confirmation rounds: ``repeats``, fewer for long products (about 2 s a shape)."""
    est = flop / 600e12 + 10e-6
    return max(5, min(repeats, int(2.0 / (fns * 12 * est))))


def table(rows) -> str:
    """The short table: per shape, the default and the best with both ratios and the gain."""
    lines = [f"{'shape':>18} {'default':<26} {'cold':>6} {'b2b':>6}   {'best':<30} {'cold':>6} {'b2b':>6} "
             f"{'gain c/b':>11}  pdl b2b (default/best)"]
    for r in rows:
        if "best" not in r:
            lines.append(f"{r['shape']:>18} {r.get('error') or r.get('skipped', '?')}")
            continue
        d, b, conf = r["default"], r["best"], r["confirmed"]
        pdl = "/".join(f"{conf[n]['warm_ratio']:.3f}" for n in ("default+pdl", "best+pdl") if n in conf) or "-"
        lines.append(f"{r['shape']:>18} {d['describe']:<26} {d['cold_ratio']:6.3f} {d['warm_ratio']:6.3f}   "
                     f"{b['describe']:<30} {b['cold_ratio']:6.3f} {b['warm_ratio']:6.3f} "
                     f"{b['cold_vs_default']:5.3f}/{b['warm_vs_default']:5.3f}  {pdl}")
    done = [r for r in rows if "best" in r]
    if done:
        for who in ("default", "best"):
            for mode in ("cold", "warm"):
                got = [r[who][f"{mode}_ratio"] for r in done]
                lines.append(f"{who} {mode}: median ratio {statistics.median(got):.3f}, below 1.0 on "
                             f"{sum(g < 1.0 for g in got)} of {len(got)} shapes")
    return "\n".join(lines)


def changes(row) -> str:
    """The config fields where the best differs from the default."""
    d, b = row["default"]["config"], row["best"]["config"]
    if d["type"] != b["type"]:
        return f"{d['type']} -> {b['type']} ({row['best']['describe']})"
    return ", ".join(f"{key} {d[key]}->{b[key]}" for key in b if key != "type" and d.get(key) != b[key])


def summary(path: str) -> None:
    """--summary: the table of a saved run, then the shapes whose best beats the default by 2%
    or more in both timings, with the fields that changed (the input to a heuristic)."""
    with open(path) as f:
        rows = json.load(f)["rows"]
    print(table(rows))
    print("\nbest >= 1.02x the default in both timings:")
    for r in rows:
        if "best" in r and min(r["best"]["cold_vs_default"], r["best"]["warm_vs_default"]) >= 1.02:
            print(f"  {r['shape']:>18} tiles_m {r['tiles_m']:3d} k_blocks {r['k_blocks']:4d}: {changes(r)}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=sorted(SUITES), default="30", help="which shapes (default: %(default)s)")
    p.add_argument("--shape", action="append", default=[], metavar="MxNxK[:nt|nn]", help="these shapes instead")
    p.add_argument("--budget", type=float, default=240.0, help="seconds for the whole run (default: %(default)s)")
    p.add_argument("--calls", type=int, default=20, help="CUPTI-screened calls a config and timing")
    p.add_argument("--repeats", type=int, default=15, help="interleaved rounds confirming the finalists")
    p.add_argument("--finalists", type=int, default=2, help="screened configs confirmed beside the default")
    p.add_argument("--no-pdl", dest="pdl", action="store_false", help="skip the pdl=True variants")
    p.add_argument("--no-cluster-k", dest="cluster_k", action="store_false",
                   help="leave cluster K-splits (GemmConfig.cluster_k) out of the candidates")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiling processes")
    p.add_argument("--json", help="write the rows (tmaflow.bench.records format)")
    p.add_argument("--precompile", action="store_true", help="only compile every kernel of the sweep (no GPU)")
    p.add_argument("--sms", type=int, default=132, help="with --precompile: the SM count to plan for")
    p.add_argument("--summary", metavar="FILE", help="print the table of a saved --json run")
    args = p.parse_args()
    if args.summary:
        summary(args.summary)
        return
    shapes = SUITES[args.suite]
    if args.shape:
        shapes = [bench.parse_gemm_shape(text) for text in args.shape]
    shapes = sorted(shapes, key=lambda s: s[0] * s[1] * s[2])  # smallest first: the budget ends with the big ones
    t0 = time.perf_counter()
    if args.precompile:
        got = precompile(shapes, args.sms, args.jobs, args.cluster_k)
        info = cache.info()
        print(f"precompiled {got['kernels']} kernels ({got['compiled']} compiled, {got['from_disk']} from disk) "
              f"in {got['wall_seconds']:.1f} s with {args.jobs} processes; cache {info['dir']}: "
              f"{info['entries']} entries, {info['bytes'] / 2**20:.1f} MiB", flush=True)
        return
    import torch  # noqa: F401  (before the driver is touched: torch then shares its context)

    sms = tf.current_device().sm_count
    got = precompile(shapes, sms, args.jobs, args.cluster_k)
    print(f"{got['kernels']} kernels: {got['compiled']} compiled, {got['from_disk']} from the disk cache, "
          f"{got['wall_seconds']:.1f} s with {args.jobs} processes", flush=True)
    rows = []
    for m, n, k, layout in shapes:
        spent = time.perf_counter() - t0
        if spent > args.budget - 10:  # a large shape takes up to about 10 s
            rows.append({"shape": f"{m}x{n}x{k}", "layout": layout, "skipped": f"budget spent ({spent:.0f} s)"})
            continue
        t = time.perf_counter()
        try:
            row = sweep_shape(m, n, k, layout, sms, args)
        except tf.TmaflowError as exc:  # a shape the TMA kernel cannot run as given
            row = {"shape": f"{m}x{n}x{k}", "layout": layout, "error": str(exc).splitlines()[0]}
        row["seconds"] = time.perf_counter() - t
        rows.append(row)
        if "best" in row:
            print(f"{row['shape']:>18} {len(row['screen'])} candidates, {row['seconds']:.1f} s: default "
                  f"{row['default']['describe']} {row['default']['cold_ratio']:.3f}/{row['default']['warm_ratio']:.3f}, "
                  f"best {row['best']['describe']} {row['best']['cold_ratio']:.3f}/{row['best']['warm_ratio']:.3f}",
                  flush=True)
        else:
            print(f"{row['shape']:>18} {row.get('error')}", flush=True)
        if args.json:  # after every shape: a run stopped at its time limit keeps what it measured
            bench.records.write(args.json, "gemm_sweep", "GEMM bf16: default and best configuration per shape",
                                COLUMNS, rows, compile=got, seconds=time.perf_counter() - t0)
    print(table(rows), flush=True)
    print(f"total {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
