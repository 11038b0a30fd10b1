"""tmaflow's overlapped collectives against the sequential NCCL + cuBLAS program and torch's fused
symmetric-memory ops, on every rank of a torchrun job: milliseconds per call (the slowest
rank's median), cold (L2 flushed before every call) and back to back.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
    PYTHONPATH=. torchrun --nproc-per-node 8 tools/peers/bench_distributed.py \\
        [--m 1024 4096 16384 65536] [--model llama70b deepseekv3] [--repeats N] [--json FILE]

Tensor-parallel shapes per model (hidden size H, FFN size F, W ranks): all-gather + GEMM is the
column-parallel gate/up projection (A: M x H gathered from M/W-row shards, B: 2F/W x H);
GEMM + reduce-scatter the row-parallel down projection (A: M x F/W, B: H x F/W, out M/W x H).
Rows per call: ``all_gather_gemm`` (ours) | NCCL all_gather_into_tensor then torch.matmul
("nccl") | torch.ops.symm_mem.fused_all_gather_matmul ("torch fused", when this torch has it);
likewise ``gemm_reduce_scatter`` | torch.matmul then reduce_scatter_tensor |
fused_matmul_reduce_scatter. ratio = peer ms / our ms (above 1: tmaflow is faster). ``--json``
(rank 0) writes a bench record like tools/peers/bench_gemm.py's.
"""
from __future__ import annotations

import argparse
import os
import statistics

import tmaflow.distributed as tfd  # first: sets the no-multicast environment before NCCL starts
from tmaflow import bench
from tmaflow.bench import records

MODELS = {"llama70b": (8192, 28672), "deepseekv3": (7168, 18432)}  # hidden, dense FFN size
COLUMNS = ["op", "model", "m", "n", "k", "world", "peer", "cold_ours_ms", "cold_peer_ms", "cold_ratio",
           "warm_ours_ms", "warm_peer_ms", "warm_ratio", "rel_err"]


def _time(fn, repeats: int, flush, torch, dist) -> float:
    """Median ms per call of ``fn`` on this rank, all ranks starting each sample together;
    ``flush`` (an L2Flush or None) runs before every call. The slowest rank's median."""
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        dist.barrier()
        if flush is not None:
            flush()
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    med = torch.tensor([statistics.median(samples)], device="cuda")
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return float(med.item())


def _peers(op: str, a, b, group, torch, dist):
    """name -> fn for the sequential NCCL program and torch's fused op (if present)."""
    world = group.size()
    if op == "all_gather_gemm":
        full = a.new_empty((a.shape[0] * world, a.shape[1]))
        fns = {"nccl": lambda: torch.matmul(_gather(full, a, dist, group), b.T)}
        fused = getattr(getattr(torch.ops, "symm_mem", None), "fused_all_gather_matmul", None)
        if fused is not None:
            bt = b.T  # torch's op computes A @ B with B K x N
            fns["torch fused"] = lambda: fused(a, [bt], gather_dim=0, group_name=group.group_name)[1][0]
        return fns
    out = a.new_empty((a.shape[0] // world, b.shape[0]))
    fns = {"nccl": lambda: _scatter(out, torch.matmul(a, b.T), dist, group)}
    fused = getattr(getattr(torch.ops, "symm_mem", None), "fused_matmul_reduce_scatter", None)
    if fused is not None:
        bt = b.T
        fns["torch fused"] = lambda: fused(a, bt, "sum", scatter_dim=0, group_name=group.group_name)
    return fns


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
    p.add_argument("--m", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    p.add_argument("--model", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import torch  # optional dependency: --help works without it
    import torch.distributed as dist  # optional dependency, as above
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    group = dist.group.WORLD
    world, me = group.size(), group.rank()
    flush = bench.L2Flush()
    rows = []
    for op in ("all_gather_gemm", "gemm_reduce_scatter"):
        ours_fn = getattr(tfd, op)
        for model in args.model:
            for m in args.m:
                a, b = _case(op, model, m, world, torch)
                ours = lambda: ours_fn(a, b, group=group)  # noqa: E731
                want = ours().float()
                for peer, fn in _peers(op, a, b, group, torch, dist).items():
                    try:
                        got = fn().float()
                    except (RuntimeError, TypeError) as e:  # a torch without the fused op's form
                        if me == 0:
                            print(f"{op} {model} M={m}: {peer} failed ({type(e).__name__}: {e}); skipped")
                        continue
                    err = (torch.linalg.norm(want - got) / torch.linalg.norm(got)).item()
                    times = {mode: (_time(ours, args.repeats, f, torch, dist),
                                    _time(fn, args.repeats, f, torch, dist))
                             for mode, f in (("cold", flush), ("warm", None))}
                    row = {"op": op, "model": model, "m": m, "n": b.shape[0], "k": b.shape[1],
                           "world": world, "peer": peer, "rel_err": err}
                    for mode, (t_ours, t_peer) in times.items():
                        row.update({f"{mode}_ours_ms": t_ours, f"{mode}_peer_ms": t_peer,
                                    f"{mode}_ratio": t_peer / t_ours})
                    rows.append(row)
                    if me == 0:
                        print(f"{op:20s} {model:10s} M={m:6d} vs {peer:11s} cold {row['cold_ours_ms']:.3f} / "
                              f"{row['cold_peer_ms']:.3f} ms ({row['cold_ratio']:.2f}x)  warm "
                              f"{row['warm_ours_ms']:.3f} / {row['warm_peer_ms']:.3f} ms "
                              f"({row['warm_ratio']:.2f}x)  err {err:.1e}", flush=True)
                del a, b, want
                torch.cuda.empty_cache()
    if me == 0 and args.json:
        records.write(args.json, "distributed", f"tensor-parallel collectives + GEMM, {world} ranks",
                      COLUMNS, rows, world_size=world)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
