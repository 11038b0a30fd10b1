"""tmaflow's overlapped collectives against the sequential NCCL + cuBLAS program and torch's fused
symmetric-memory ops, on every rank of a torchrun job: milliseconds per call (the slowest
rank's median), cold (L2 flushed before every call) and back to back.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
    PYTHONPATH=. torchrun --nproc-per-node 8 tools/peers/bench_distributed.py \\
        [--tokens 4096 8192 16384] [--model llama70b llama8b deepseekv3] [--op ...] [--repeats N]
        [--json FILE]

Tensor-parallel shapes per model (hidden size H, FFN size F, W ranks): all-gather + GEMM is the
column-parallel gate/up projection (A: M x H gathered from M/W-row shards, B: 2F/W x H);
GEMM + reduce-scatter the row-parallel down projection (A: M x F/W, B: H x F/W, out M/W x H).
Timed per call, in interleaved rounds: ``all_gather_gemm`` (ours) | NCCL all_gather_into_tensor
then torch.matmul ("nccl") | torch.ops.symm_mem.fused_all_gather_matmul ("fused", when this torch
has it) | the GEMM alone on the already-gathered operand, tmaflow's ("alone": the perfect-overlap
bound) and torch's; likewise ``gemm_reduce_scatter`` | torch.matmul then reduce_scatter_tensor |
fused_matmul_reduce_scatter | the whole partial product alone. vs_nccl / vs_fused = peer ms /
our ms (above 1: tmaflow is faster); of_bound = alone ms / our ms (1.0: perfect overlap). Ours
is timed as a model calls it, the same operands each call: after its second call a call replays
its CUDA graph (tmaflow.distributed.ops); rel_err checks a replayed call too.
``--json`` (rank 0) writes a bench record like tools/peers/bench_gemm.py's.
"""
from __future__ import annotations

import argparse
import os
import statistics

import tmaflow.distributed as tfd  # first: sets the no-multicast environment before NCCL starts
from tmaflow import bench
from tmaflow.bench import records

MODELS = {"llama70b": (8192, 28672), "deepseekv3": (7168, 18432), "llama8b": (4096, 14336)}  # hidden, FFN
COLUMNS = ["op", "model", "m", "n", "k", "world", "mode", "ours_ms", "nccl_ms", "fused_ms", "alone_ms",
           "alone_torch_ms", "vs_nccl", "vs_fused", "of_bound", "rel_err"]


def _rounds(fns: dict, repeats: int, flush, torch, dist) -> dict:
    """Median ms per call of each of ``fns`` (name -> fn), the slowest rank's: ``repeats``
    rounds, each timing every fn once (in a rotated order), all ranks starting each call
    together; ``flush`` (an L2Flush or None) runs before every call."""
    names = list(fns)
    samples: dict = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            dist.barrier()
            if flush is not None:
                flush()
            start.record()
            fns[name]()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end))
    med = torch.tensor([statistics.median(samples[name]) for name in names], device="cuda")
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return dict(zip(names, med.tolist()))


def _contenders(op: str, a, b, group, torch, dist) -> dict:
    """name -> fn: ours, the sequential NCCL program, torch's fused op (if present) and the
    GEMM alone on the already-gathered operand (tmaflow's and torch's: the perfect-overlap
    bound; for reduce-scatter the whole partial product, no communication)."""
    from tmaflow import kernels

    world = group.size()
    fns = {"ours": lambda: getattr(tfd, op)(a, b, group=group)}
    fused_ops = getattr(torch.ops, "symm_mem", None)
    bt = b.T  # torch's ops take B as K x N
    if op == "all_gather_gemm":
        full = a.new_empty((a.shape[0] * world, a.shape[1]))
        dist.all_gather_into_tensor(full, a, group=group)
        fns["nccl"] = lambda: torch.matmul(_gather(full, a, dist, group), bt)
        fused = getattr(fused_ops, "fused_all_gather_matmul", None)
        if fused is not None:
            fns["fused"] = lambda: fused(a, [bt], gather_dim=0, group_name=group.group_name)[1][0]
        gathered = full.clone()
    else:
        out = a.new_empty((a.shape[0] // world, b.shape[0]))
        fns["nccl"] = lambda: _scatter(out, torch.matmul(a, bt), dist, group)
        fused = getattr(fused_ops, "fused_matmul_reduce_scatter", None)
        if fused is not None:
            fns["fused"] = lambda: fused(a, bt, "sum", scatter_dim=0, group_name=group.group_name)
        gathered = a
    product = torch.empty((gathered.shape[0], b.shape[0]), dtype=torch.bfloat16, device=a.device)
    fns["alone"] = lambda: kernels.gemm(gathered, b, out=product)
    fns["alone_torch"] = lambda: torch.matmul(gathered, bt)
    return fns


def _profile(fn, path: str, show: bool, torch, dist) -> None:
    """A torch.profiler trace of three calls of ``fn`` (after one untimed), saved to ``path``;
    ``show``: print its device events (kernels, copies) with their times."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    prof.export_chrome_trace(path)
    if show:
        print(f"--- {path}")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))
    dist.barrier()


def _gather(full, shard, dist, group):
    dist.all_gather_into_tensor(full, shard, group=group)
    return full


def _scatter(out, partial, dist, group):
    dist.reduce_scatter_tensor(out, partial, group=group)
    return out


def _case(op: str, model: str, m: int, world: int, torch):
    """(a, b) of this rank for one op, model and M (bf16, random)."""
    hidden, ffn = MODELS[model]
    if op == "all_gather_gemm":
        return (torch.randn(m // world, hidden, device="cuda", dtype=torch.bfloat16),
                torch.randn(2 * ffn // world, hidden, device="cuda", dtype=torch.bfloat16))
    return (torch.randn(m, ffn // world, device="cuda", dtype=torch.bfloat16),
            torch.randn(hidden, ffn // world, device="cuda", dtype=torch.bfloat16))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # --tokens, not --m: torchrun's own parser takes an abbreviation of its options (--m)
    p.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--model", nargs="+", choices=sorted(MODELS), default=["llama70b", "llama8b"])
    p.add_argument("--op", nargs="+", choices=["all_gather_gemm", "gemm_reduce_scatter"],
                   default=["all_gather_gemm", "gemm_reduce_scatter"])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--json", default=None)
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="no timing: each rank writes a torch.profiler trace of three calls of ours a case "
                        "to DIR, and rank 0 prints its kernels and copies")
    args = p.parse_args(argv)
    import torch  # optional dependency: --help works without it
    import torch.distributed as dist  # optional dependency, as above
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    group = dist.group.WORLD
    world, me = group.size(), group.rank()
    flush = bench.L2Flush()
    rows = []
    for op in args.op:
        for model in args.model:
            for m in args.tokens:
                a, b = _case(op, model, m, world, torch)
                fns = _contenders(op, a, b, group, torch, dist)
                if args.profile:
                    _profile(fns["ours"], f"{args.profile}/{op}-{model}-{m}-rank{me}.json", me == 0, torch, dist)
                    continue
                want = fns["ours"]().float()
                for name in [n for n in fns if n not in ("ours", "nccl")]:
                    try:
                        fns[name]()
                    except (RuntimeError, TypeError) as e:  # a torch without the fused op's form
                        if me == 0:
                            print(f"{op} {model} M={m}: {name} failed ({type(e).__name__}: {e}); skipped")
                        del fns[name]
                ref = fns["nccl"]().float()
                # the first call runs step by step, the second is captured, later ones (the timed
                # ones) replay the capture: the error is the worse of the first and a replayed call's
                fns["ours"]()
                replayed = fns["ours"]().float()
                err = max((torch.linalg.norm(x - ref) / torch.linalg.norm(ref)).item() for x in (want, replayed))
                for mode, f in (("cold", flush), ("warm", None)):
                    t = _rounds(fns, args.repeats, f, torch, dist)
                    row = {"op": op, "model": model, "m": m, "n": b.shape[0], "k": b.shape[1],
                           "world": world, "mode": mode, "ours_ms": t["ours"], "nccl_ms": t["nccl"],
                           "fused_ms": t.get("fused"), "alone_ms": t["alone"],
                           "alone_torch_ms": t["alone_torch"], "vs_nccl": t["nccl"] / t["ours"],
                           "vs_fused": t["fused"] / t["ours"] if "fused" in t else None,
                           "of_bound": t["alone"] / t["ours"], "rel_err": err}
                    rows.append(row)
                    if me == 0:
                        fused = f"{row['fused_ms']:.3f}" if "fused" in t else "-"
                        vs_fused = f"{row['vs_fused']:.3f}" if "fused" in t else "-"
                        print(f"{op:19s} {model:8s} M={m:6d} N={row['n']:5d} K={row['k']:5d} W={world} {mode}: "
                              f"ours {t['ours']:.3f} nccl {t['nccl']:.3f} fused {fused} alone {t['alone']:.3f} "
                              f"(torch {t['alone_torch']:.3f}) ms | vs nccl {row['vs_nccl']:.3f} vs fused "
                              f"{vs_fused} of bound {row['of_bound']:.3f} | err {err:.1e}", flush=True)
                del a, b, want, fns
                torch.cuda.empty_cache()
    if me == 0 and args.json:
        records.write(args.json, "distributed", f"tensor-parallel collectives + GEMM, {world} ranks",
                      COLUMNS, rows, world_size=world)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
