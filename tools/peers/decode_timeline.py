"""Where one short kernels.attention_decode call spends its time: a trace build (trace="all")
of the call's own kernel, launched right after an L2 flush (cold), its marks and copies read
per CTA (decode.cu's marks: 1 entry, 2 the producer has the block table, 3 Q in shared memory,
4 the tiles read, 9 every warp at the warps' merge, 10 the warps' O in their slices, 7 the warps
merged, 11 the partials stored, 8 the split counted (counter merges), 5 the splits' merge begins,
12 the pieces in shared memory (slice merge), 6 the output written).

    PYTHONPATH=. python3 tools/peers/decode_timeline.py [--repeats N] [--only-8k]

Per shape and plan (batch 1, 8 kv heads, head dim 128, GQA 8:1, page 16 at 1k and 8k; the
plan's merge and the other one), microseconds from the first CTA's entry: each step's
earliest / median / latest CTA, cold (after an L2 flush: code, table, pages and counters in
DRAM) and warm (right after the same call). The recorder costs time of its own (each event a
few stores): the gaps between steps, not the totals, are the numbers to read; a gap that
does no memory access yet grows cold points at instruction fetches through a flushed L2.
The plain call's cold time is printed beside it (median of --repeats). A third mode, "code":
the L2 flushed, then the same kernel on another cache of the same shape, then the call: its
code (and the counters) in L2 and in the SMs' instruction caches, its cache and table not (the
cold tail's share that is instruction fetch through a flushed L2)."""
from __future__ import annotations

import argparse

import numpy as np

from tmaflow import bench, kernels
from tmaflow.debug.trace import KIND
from tmaflow.debug.trace import last as last_trace
from tmaflow.kernels.decode_entry import THREADS
from tmaflow.kernels.decode_plan import decode_plan
from tmaflow.kernels.registry import get_kernel

STEPS = (("entry", "mark", 1), ("table", "mark", 2), ("first copy", "TMA load", None), ("Q", "mark", 3),
         ("first tile", "wait", None), ("tiles read", "mark", 4), ("at merge", "mark", 9), ("O slices", "mark", 10),
         ("warps merged", "mark", 7), ("partials", "mark", 11), ("counted", "mark", 8), ("merge", "mark", 5),
         ("pieces", "mark", 12), ("out", "mark", 6))


def _steps(trace) -> dict:
    """step -> per-CTA times (µs from the first entry): each CTA's earliest such event (the
    first tile: the end of its consumers' first wait; marks 4-6: the latest warp's)."""
    ev = trace.events
    t_min = int(ev["t0"][ev["kind"] == KIND["mark"]].min())
    got = {}
    for name, kind, mark in STEPS:
        sel = ev[ev["kind"] == KIND[kind]]
        if mark is not None:
            sel = sel[sel["value"] == mark]
        if name == "first tile":
            sel = sel[sel["warp"] < 4]
        if not len(sel):
            continue
        ends = sel["t0"].astype(np.int64) + (sel["dur"].astype(np.int64) if kind == "wait" else 0)
        per_cta = {}
        late = mark is not None and mark >= 4
        for b, t in zip(sel["block"].tolist(), ends.tolist()):
            per_cta[b] = max(per_cta.get(b, t), t) if late else min(per_cta.get(b, t), t)
        got[name] = (np.array(list(per_cta.values())) - t_min) / 1e3
    return got


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--only-8k", action="store_true", help="the 8k rows alone (a short GPU run)")
    args = p.parse_args()
    import torch  # optional dependency, as in the benches
    dt, d, heads_kv, group, page = torch.bfloat16, 128, 8, 8, 16
    flush = bench.L2Flush()
    for ctx in (8192,) if args.only_8k else (1024, 8192):
        pages = ctx // page
        k_cache, v_cache = (torch.randn(pages, page, heads_kv, d, device="cuda", dtype=dt) for _ in "kv")
        table = torch.randperm(pages, device="cuda", dtype=torch.int32).view(1, pages)
        lens = torch.full((1,), ctx, device="cuda", dtype=torch.int32)
        q = torch.randn(1, heads_kv * group, d, device="cuda", dtype=dt)
        other = [torch.randn_like(k_cache), torch.randn_like(v_cache), table.clone(), lens.clone(), q.clone()]
        plans: dict = {"plan": {}}  # 1k: 8 splits in clusters; 8k: 32 splits merged by slices
        for name, options in (("counter s8", {"num_splits": 8, "cluster_merge": False}),
                              ("counter s32", {"num_splits": 32, "cluster_merge": False, "slice_merge": False}),
                              ("cluster s8", {"num_splits": 8, "cluster_merge": True}),
                              ("cluster s16", {"num_splits": 16, "cluster_merge": True}),
                              ("slice s32", {"num_splits": 32, "cluster_merge": False, "slice_merge": True})):
            if ctx // options["num_splits"] >= 128 and not (ctx == 1024 and name == "cluster s8"):
                plans[name] = options
        fns = {name: kernels.attention_decode.prepare(q, k_cache, v_cache, table, lens, **options,
                                                      out=torch.empty_like(q))
               for name, options in plans.items()}
        cold = bench.rounds(fns, repeats=args.repeats, warmup=2, flush_l2=True)
        for name in plans:
            prepared = fns[name]
            launcher = prepared.launcher
            launcher = getattr(launcher, "launcher", launcher)  # the counter merge's wraps its workspace
            config = launcher.config
            splits = config.grid[0]
            cluster = config.cluster != (1, 1, 1)
            _, layout, _ = decode_plan(d, page)
            defines = dict(launcher.kernel.defines)  # the plan's own (merge, L2 priority), traced
            traced = get_kernel("attention_decode", layout, defines=defines, file="decode", trace="all")
            run = traced.launcher(grid=config.grid, block=THREADS, cluster=config.cluster,
                                  cooperative=config.cooperative)
            run(*prepared.args)  # compile and warm the code path
            slices = int("SLICE_MERGE" in defines)
            print(f"b1 ctx {ctx:5d} {name:11s} s{splits:<2d} cl{int(cluster)} sl{slices} plain call cold "
                  f"{cold[name].median * 1e6:6.1f} us; traced, µs from the first entry (min/median/max CTA):")
            # the same call on the other cache: the launch's arguments with the cache's maps replaced
            other_fn = kernels.attention_decode.prepare(other[4], other[0], other[1], other[2], other[3], **plans[name],
                                                        out=torch.empty_like(q))
            for mode in ("cold", "code", "warm"):  # warm: right after the same call (code and data in L2)
                if mode != "warm":
                    flush()
                if mode == "code":
                    run(*other_fn.args)
                run(*prepared.args)
                steps = _steps(last_trace())
                print(f"  {mode} " + " ".join(f"{step} {t.min():.1f}/{np.median(t):.1f}/{t.max():.1f}"
                                             for step, t in steps.items()), flush=True)


if __name__ == "__main__":
    main()
