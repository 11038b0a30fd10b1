"""tmaflow's GEMMs against cuBLAS through torch in the same run: TFLOP/s and ratios, every row
timed twice, cold (L2 flushed before every call) and back to back, side by side.

    PYTHONPATH=. python3 tools/peers/bench_gemm.py [--suite default|extra|skinny|30|unaligned]
        [--shape MxNxK[:nt|nn] ...] [--sweep] [--chunks] [--repeats N] [--json FILE]
    PYTHONPATH=. python3 tools/peers/bench_gemm.py --fp8 [--skinny] [--fp8-shape MxNxK ...] [--sweep]
        [--no-fast-accum] [--json FILE]

Both sides compute the same product (layout "nt": C = A @ B^T; "nn": C = A @ B) from the same
random inputs into preallocated outputs, in interleaved rounds (tmaflow.bench.versus): CUDA
events around each call, medians, and the median of per-round ratios (peer time / ours: above 1
means tmaflow is faster). Every row checks tmaflow's output against the peer's. ``--suite 30``
is issue 33's 30 bf16 shapes, ``--suite unaligned`` issue 29's shapes whose N or K is not a
multiple of 8; ``--sweep`` also times every tile configuration per shape; ``--chunks`` (bf16)
also the skinny kernel with M in chunks (``CHUNK_SWEEP``; 65-128 rows: its M halves,
``HALVES_SWEEP``) where its CTAs fill a third of the SMs to one wave. ``--json`` writes a
bench record (tools/docs/benchmarks_page.py renders bench/results/*.json into BENCHMARKS.md).
"""
from __future__ import annotations

import argparse
import math
import statistics

import tmaflow as tf
from tmaflow import bench, kernels
from tmaflow.bench.gemm_shapes import SKINNY, SKINNY_SWEEP, SUITES, SWEEP, describe
from tmaflow.kernels.matmul import (SKINNY_FP8_PROMOTE, GemmConfig, SkinnyConfig, block_scale_config,
                                    block_scale_default, choose_config, dense_config, fp8_config, skinny_plan)

COLUMNS = ["shape", "layout", "dtype", "config", "peer", "cold_ours_tflops", "cold_peer_tflops", "cold_ratio",
           "warm_ours_tflops", "warm_peer_tflops", "warm_ratio", "rel_err"]


# issue 16's fp8 shapes (M x N x K): per-tensor scales against torch._scaled_mm (cuBLAS fp8)
FP8_SHAPES = [(8192, 8192, 8192), (4096, 7168, 16384), (4096, 2112, 7168), (64, 7168, 16384), (2048, 2048, 2048)]
# --fp8 --skinny --sweep: the skinny path's choices and the dense kernel ("dense": fp8_config's)
FP8_SKINNY_SWEEP = [SkinnyConfig(), SkinnyConfig(split_k=1), SkinnyConfig(rows=128), SkinnyConfig(cluster=2), "dense",
                    # one M tile in dense tiles, K split inside a cluster (as bf16's one_m_tile_config)
                    GemmConfig(bn=128, cluster_m=1, cluster_k=2), GemmConfig(bn=128, cluster_m=1, cluster_k=4),
                    GemmConfig(bn=192, cluster_m=1, epi_cols=64, cluster_k=2),
                    # 65-128 rows: 64-row halves of M sharing B (cuBLAS's 64x64 2x1 at 128x4096x4096);
                    # pairs of N tiles sharing A, K split (cuBLAS's 128x64 1x2 at 128x8192x8192 is cluster=2)
                    SkinnyConfig(m_halves=2), SkinnyConfig(rows=128, m_halves=2), SkinnyConfig(m_halves=2, split_k=2),
                    SkinnyConfig(cluster=2, split_k=2),
                    # session 28: two accumulator sets promoted in turn, deeper K splits, 64-column
                    # dense tiles of one M tile split in clusters of two or four
                    SkinnyConfig(promote_sets=2), SkinnyConfig(split_k=3), SkinnyConfig(split_k=4),
                    GemmConfig(bn=64, cluster_m=1, epi_cols=64, cluster_k=2),
                    GemmConfig(bn=64, cluster_m=1, epi_cols=64, cluster_k=4)]
# --chunks (bf16): the skinny kernel with M in chunks of m_rows rows (a CTA each, pairs sharing B
# with m_halves), as cuBLAS runs 256^3 / 512^3 in ~100-128 CTAs of 64x8 / 64x48 tiles
CHUNK_SWEEP = [SkinnyConfig(m_rows=8), SkinnyConfig(m_rows=16), SkinnyConfig(m_rows=32),
               SkinnyConfig(m_rows=8, m_halves=2), SkinnyConfig(m_rows=16, m_halves=2),
               SkinnyConfig(m_rows=32, m_halves=2), SkinnyConfig(m_rows=64, m_halves=2),
               SkinnyConfig(rows=128, m_rows=64, m_halves=2)]
HALVES_SWEEP = [SkinnyConfig(m_halves=2), SkinnyConfig(rows=128, m_halves=2)]  # --chunks, 65-128 rows
FP8_SWEEP = [GemmConfig(bn=256, cluster_m=2, promote=0), GemmConfig(bn=128, cluster_m=2, promote=8),
             GemmConfig(bn=128, cluster_m=2, promote=0), GemmConfig(bn=192, cluster_m=2, epi_cols=64),
             GemmConfig(bn=192, cluster_m=1, epi_cols=64)]


def flat(v: bench.Versus, flop: float, **fields) -> dict:
    """One JSON row: ``fields``, then both timings' medians, TFLOP/s and ratios."""
    row = dict(fields)
    for mode, got in v.row().items():
        row.update({f"{mode}_ours_ms": got["ours_ms"], f"{mode}_peer_ms": got["peer_ms"],
                    f"{mode}_ours_tflops": flop / got["ours_ms"] / 1e9,
                    f"{mode}_peer_tflops": flop / got["peer_ms"] / 1e9,
                    f"{mode}_ratio": got["ratio"], f"{mode}_ratio_p20": got["ratio_p20"],
                    f"{mode}_ratio_p80": got["ratio_p80"]})
    return row


def fp8_rows(args, sms) -> list[dict]:
    """tmaflow's fp8 GEMM (per-tensor scales) against torch._scaled_mm with and without cuBLAS's
    fast accumulation, each paired with ours; errors against a float64 product of the
    dequantised operands on 256 rows."""
    rows = []
    import torch  # optional dependency: --help works without it

    shapes = bench.parse_shapes(args.fp8_shape, [s[:3] for s in SKINNY] if args.skinny else FP8_SHAPES)
    for m, n, k in shapes:
        a, b = bench.nt_operands(m, n, k, "float8_e4m3fn")
        sa, sb = 0.01, 0.02
        ta, tb = torch.tensor(sa, device="cuda"), torch.tensor(sb, device="cuda")
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        c_ref = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ref = sa * sb * (a[:256].double() @ b.double().T)
        peers = {fast: (lambda fast=fast: torch._scaled_mm(a, b.t(), scale_a=ta, scale_b=tb, out=c_ref,
                                                          out_dtype=torch.bfloat16, use_fast_accum=fast))
                 for fast in (False, True)}
        auto = choose_config(m, n, k, sms, "nt", "float8_e4m3fn")
        sweep = [fp8_config(m, n, k, sms) if cfg == "dense" else cfg
                 for cfg in (FP8_SKINNY_SWEEP if m <= 128 else FP8_SWEEP)]
        configs = [auto] + ([cfg for cfg in sweep if cfg != auto] if args.sweep else [])
        flop = 2.0 * m * n * k
        for cfg in configs:
            try:
                run = kernels.gemm.prepare(a, b, c, config=cfg, scale_a=sa, scale_b=sb)
            except tf.TmaflowError as exc:  # e.g. M halves for M <= 64
                print(f"  skip {describe(cfg)}: {str(exc).splitlines()[0]}", flush=True)
                continue
            err = bench.poisoned_error(run, c, ref)
            for fast, peer in peers.items():
                if fast and args.no_fast_accum:
                    continue
                peer()
                torch.cuda.synchronize()
                v = bench.versus({"ours": run, "peer": peer}, ours="ours", peer="peer", repeats=args.repeats)
                promote = cfg.promote if isinstance(cfg, GemmConfig) else SKINNY_FP8_PROMOTE
                promote = 1 if cfg.promote_sets > 1 else promote  # (every k-block, on two sets)
                row = flat(v, flop, shape=f"{m}x{n}x{k}", layout="nt", dtype="fp8 e4m3",
                           config=describe(cfg) + f" p{promote}", auto=cfg == auto,
                           peer=f"_scaled_mm fast_accum={fast}", rel_err=err,
                           peer_rel_err=bench.rel_error(c_ref[:256], ref))
                rows.append(row)
                print(f"{row['shape']:>18s} fp8 {row['config']:<40s}{'*' if row['auto'] else ' '} "
                      f"{row['peer']:27s} {v.line(flop)}  err {err:.1e} (peer {row['peer_rel_err']:.1e})", flush=True)
        if (m, n, k) in BLOCK_SHAPES or args.skinny:
            rows += block_rows(a, b, c, m, n, k, peers[False], args.repeats)
    autos = [r["cold_ratio"] for r in rows if r.get("auto") and r["peer"] == "_scaled_mm fast_accum=False"]
    if autos:
        print(f"median cold ratio to _scaled_mm (default accumulation), automatic configs: "
              f"{statistics.median(autos):.3f} over {len(autos)} shapes", flush=True)
    blocks = [r["cold_ratio"] for r in rows if r["auto"] and r["dtype"].endswith("scale_a M-major")
              and r["peer"] == "_scaled_mm block scales"]
    if blocks:
        print(f"block scales, M-major scale_a: median ratio to cuBLAS's block-scaled _scaled_mm "
              f"{statistics.median(blocks):.3f} over {len(blocks)} shapes", flush=True)
    return rows


BLOCK_SHAPES = [(8192, 8192, 8192), (4096, 7168, 16384)]


def block_rows(a, b, c, m, n, k, per_tensor, repeats) -> list:
    """DeepSeek-style block scales (1 x 128 for a, 128 x 128 for b), scale_a row-major and
    M-major, each timed beside cuBLAS's block-scaled _scaled_mm (per-tensor _scaled_mm where
    there is none); errors against float64 of the dequantised operands on 256 rows."""
    import torch  # optional dependency: --help works without it

    sa, sb, ref = bench.block_scales(a, b)
    c_peer = torch.empty_like(c)
    peer, peer_name = bench.cublas.block_scaled_mm(a, b, sa, sb, c_peer), "_scaled_mm block scales"
    if peer is None:
        peer, peer_name, peer_err = per_tensor, "_scaled_mm per-tensor fast_accum=False", float("nan")
    else:
        peer_err = bench.rel_error(c_peer[:256], ref)  # block_scaled_mm ran it once and synchronised
    flop = 2.0 * m * n * k
    rows = []
    sa_m = sa.t().contiguous().t()
    variants = [("row-major", sa, None), ("M-major", sa_m, None)]
    if m <= 128:  # the skinny path's M: the other kernel beside the default
        sms = tf.current_device().sm_count
        for layout, scale_a in (("M-major", sa_m), ("row-major", sa)):
            auto = block_scale_default(m, n, k, "nt", "m_major" if scale_a is sa_m else "row_major", scale_a, sms)
            other = block_scale_config(m, n, k, sms) if isinstance(auto, SkinnyConfig) else SkinnyConfig()
            variants.append((f"{layout}, {'skinny' if isinstance(other, SkinnyConfig) else 'dense'}", scale_a, other))
    for layout, scale_a, cfg in variants:
        try:
            run = kernels.gemm.prepare(a, b, c, scale_a=scale_a, scale_b=sb, config=cfg)
        except tf.TmaflowError as exc:  # (row-major scales the skinny kernel's map cannot read)
            print(f"{m}x{n}x{k} fp8 block scales, {layout}: skipped: {str(exc).splitlines()[0]}", flush=True)
            continue
        err = bench.poisoned_error(run, c, ref)
        v = bench.versus({"ours": run, "peer": peer}, ours="ours", peer="peer", repeats=repeats)
        row = flat(v, flop, shape=f"{m}x{n}x{k}", layout="nt", dtype=f"fp8 e4m3, block scales, scale_a {layout}",
                   config=describe(cfg), auto=cfg is None, peer=peer_name, rel_err=err, peer_rel_err=peer_err)
        rows.append(row)
        print(f"{row['shape']:>18s} fp8 block scales, {layout:<14s} {peer_name:27s} {v.line(flop)}  "
              f"err {err:.1e} (peer {peer_err:.1e})", flush=True)
    return rows


def bf16_rows(args, sms) -> list[dict]:
    """tmaflow's bf16 GEMM (automatic config, with --sweep every config) against torch.matmul
    on the same tensors, both timings."""
    import torch  # optional dependency: --help works without it

    shapes = SUITES[args.suite]
    if args.shape:
        shapes = [bench.parse_gemm_shape(text) for text in args.shape]
    if args.only_skinny:
        shapes = [s for s in shapes if s[0] <= 128]
    rows = []
    for m, n, k, layout in shapes:
        a, b = bench.nt_operands(m, n, k)
        if layout == "nn":
            b = b.T.contiguous()  # K x N, N contiguous
        c_ref = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        bt = b.T if layout == "nt" else b
        cublas = lambda: torch.matmul(a, bt, out=c_ref)  # noqa: E731
        cublas()
        flop = 2.0 * m * n * k
        aligned = n % 8 == 0 and k % 8 == 0
        auto = choose_config(m, n, k, sms, layout) if aligned else None
        sweep = [dense_config(m, n, k, sms) if cfg == "dense" else cfg for cfg in (SKINNY_SWEEP if m <= 128 else SWEEP)]
        configs = [auto] + ([cfg for cfg in sweep if cfg != auto] if args.sweep and aligned else [])
        if args.chunks and aligned:  # 65-128 rows: the halves; more: the chunks filling a third of the SMs or more
            chunked = HALVES_SWEEP if 64 < m <= 128 else CHUNK_SWEEP
            configs += [cfg for cfg in chunked
                        if cfg not in configs and sms // 3 <= chunk_ctas(m, n, k, cfg, sms) <= sms]
        for cfg in configs:
            try:
                run = kernels.gemm.prepare(a, b, c, layout=layout, config=cfg)
                err = bench.poisoned_error(run, c, c_ref)
                v = bench.versus({"ours": run, "peer": cublas}, ours="ours", peer="peer", repeats=args.repeats)
            except tf.TmaflowError as exc:
                print(f"  skip {describe(cfg)}: {exc}", flush=True)
                continue
            row = flat(v, flop, shape=f"{m}x{n}x{k}", layout=layout, dtype="bf16", config=describe(cfg),
                       auto=cfg == auto, peer="torch.matmul", rel_err=err, ctas=run_ctas(run))
            rows.append(row)
            print(f"{row['shape']:>18s} {layout}  {row['config']:<40s}{'*' if row['auto'] else ' '} "
                  f"{v.line(flop)}  err {err:.1e} ctas {row['ctas']}", flush=True)
    for mode in ("cold", "warm"):
        autos = [r[f"{mode}_ratio"] for r in rows if r["auto"]]
        if autos:
            print(f"median {mode} ratio to cuBLAS, automatic configs: {statistics.median(autos):.3f} "
                  f"over {len(autos)} shapes; below 1.0: {sum(r < 1.0 for r in autos)}")
    return rows


def chunk_ctas(m: int, n: int, k: int, cfg: SkinnyConfig, sms: int) -> int:
    """CTAs of a skinny launch with M in chunks (N tiles x M chunks x K splits); a huge count
    for a config the plan refuses."""
    try:
        plan = skinny_plan(m, n, k, cfg, sms)
    except tf.TmaflowError:
        return 1 << 30
    return math.ceil(n / cfg.rows) * cfg.m_halves * plan.grid_z * (plan.config.split_k or 1)


def run_ctas(run) -> int | str:
    """The grid's CTAs of a prepared GEMM ('?' where the launcher hides them)."""
    launcher = getattr(run.launcher, "launcher", run.launcher)  # split-K wraps the launcher
    grid = getattr(getattr(launcher, "config", None), "grid", None)
    return math.prod(grid) if isinstance(grid, tuple) else "?"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write a bench record (bench/results/<area>.json)")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--suite", choices=sorted(SUITES), default="default", help="which shapes (default: %(default)s)")
    p.add_argument("--only-skinny", action="store_true", help="only shapes with M <= 128")
    p.add_argument("--skinny", action="store_true", help="issue 16's decode shapes (M <= 128): --suite skinny")
    p.add_argument("--shape", action="append", default=[], metavar="MxNxK[:nt|nn]", help="these shapes instead")
    p.add_argument("--fp8", action="store_true", help="the fp8 shapes against torch._scaled_mm instead")
    p.add_argument("--fp8-shape", action="append", default=[], metavar="MxNxK", help="with --fp8: these shapes instead")
    p.add_argument("--no-fast-accum", action="store_true", help="with --fp8: only _scaled_mm's default accumulation")
    p.add_argument("--chunks", action="store_true", help="bf16: also the skinny kernel with M in chunks (CHUNK_SWEEP)")
    args = p.parse_args()
    import torch  # noqa: F401  (before the driver is touched: torch then shares its context)

    if args.skinny and not args.fp8:
        args.suite = "skinny"
    sms = tf.current_device().sm_count
    rows = fp8_rows(args, sms) if args.fp8 else bf16_rows(args, sms)
    if args.json:
        area = "gemm_fp8" if args.fp8 else {"unaligned": "gemm_unaligned", "skinny": "gemm_skinny"}.get(args.suite, "gemm_bf16")
        bench.records.write(args.json, area, f"GEMM {'fp8' if args.fp8 else 'bf16'} against cuBLAS ({args.suite})",
                            COLUMNS, rows, repeats=args.repeats)


if __name__ == "__main__":
    main()
