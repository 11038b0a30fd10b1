"""tmaflow's bf16 GEMM against torch.matmul (cuBLAS) in the same run: TFLOP/s and ratio.

    python tools/bench_gemm.py [--json FILE] [--sweep] [--repeats N]

Both sides compute the same product (layout "nt": C = A @ B^T; "nn": C = A @ B) from the
same random bf16 inputs into a preallocated C. They run alternately, each timed repeat
preceded by a 256 MB write that evicts L2, so neither side reuses the other's cached operands
and clock drift hits both; times are CUDA events around the GEMM alone, medians after
warm-up; the ratio is the median of per-repeat ratios. Every row also checks tmaflow's output
against cuBLAS's. ``--sweep`` also times every tile configuration per shape.
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

import tmaflow as tf
from tmaflow import kernels
from tmaflow.kernels.matmul import (SKINNY_FP8_PROMOTE, GemmConfig, SkinnyConfig, block_scale_config,
                                    choose_config, dense_config, fp8_config)

SHAPES = [(8192, 8192, 8192, "nt"), (4096, 4096, 4096, "nt"), (2048, 2048, 2048, "nt"),
          (4096, 14336, 4096, "nt"), (8192, 4096, 14336, "nt"), (16, 4096, 4096, "nt"),
          (8192, 8192, 8192, "nn"), (4096, 4096, 4096, "nn"),
          # shapes no config was tuned on: partial last waves, short K, ragged edges
          (1024, 1024, 1024, "nt"), (3072, 3072, 3072, "nt"), (2304, 4608, 1024, "nt"), (1000, 3000, 520, "nt"),
          (512, 512, 2048, "nt")]
EXTRA = [(128, 4096, 4096, "nt"), (64, 4096, 4096, "nt"), (16, 4096, 16384, "nt")]  # --extra: skinny probes
SWEEP = [GemmConfig(bn=256, cluster_m=2), GemmConfig(bn=256, cluster_m=2, group_m=8),
         GemmConfig(bn=256, cluster_m=2, group_m=32), GemmConfig(bn=256, cluster_m=2, epi_cols=256, stages=3),
         GemmConfig(bn=256, cluster_m=1), GemmConfig(bn=128, cluster_m=1),
         GemmConfig(bn=256, cluster_m=2, l2_promotion="none"), GemmConfig(bn=128, cluster_m=1, l2_promotion="none"),
         GemmConfig(bn=128, cluster_m=1, epi_cols=64), GemmConfig(bn=128, cluster_m=2),
         GemmConfig(bn=128, cluster_m=1, group_m=4), GemmConfig(bn=128, cluster_m=1, stages=4),
         GemmConfig(bn=192, cluster_m=1, epi_cols=64), GemmConfig(bn=192, cluster_m=2, epi_cols=64),
         GemmConfig(bn=64, cluster_m=1, epi_cols=64), GemmConfig(bn=64, cluster_m=2, epi_cols=64)]
# issue 16's decode shapes: M in {1, 16, 64, 128} x (N x K) in {4096 x 4096, 8192 x 8192, 7168 x 16384}
SKINNY = [(m, n, k, "nt") for n, k in ((4096, 4096), (8192, 8192), (7168, 16384)) for m in (1, 16, 64, 128)]
SKINNY_SWEEP = [SkinnyConfig(), SkinnyConfig(cluster=2), SkinnyConfig(rows=128, cluster=2), SkinnyConfig(stages=6),
                SkinnyConfig(split_k=1), SkinnyConfig(cluster=2, stages=6), "dense",
                GemmConfig(bn=64, cluster_m=1, epi_cols=64), GemmConfig(bn=64, cluster_m=1, epi_cols=64, split_k=2)]


# issue 16's fp8 shapes (M x N x K): per-tensor scales against torch._scaled_mm (cuBLAS fp8)
FP8_SHAPES = [(8192, 8192, 8192), (4096, 7168, 16384), (4096, 2112, 7168), (64, 7168, 16384), (2048, 2048, 2048)]
# --fp8 --skinny --sweep: the skinny path's choices and the dense kernel ("dense": fp8_config's)
FP8_SKINNY_SWEEP = [SkinnyConfig(), SkinnyConfig(split_k=1), SkinnyConfig(rows=128), SkinnyConfig(cluster=2), "dense"]
FP8_SWEEP = [GemmConfig(bn=256, cluster_m=2, promote=0), GemmConfig(bn=128, cluster_m=2, promote=8),
             GemmConfig(bn=128, cluster_m=2, promote=0), GemmConfig(bn=192, cluster_m=2, epi_cols=64),
             GemmConfig(bn=192, cluster_m=1, epi_cols=64)]


def nt_operands(m: int, n: int, k: int, dtype: str = "bfloat16"):
    """Random "nt" operands on the GPU: A (m, k) and B (n, k), bf16 or fp8 e4m3 (normal x 40,
    spread over e4m3's range)."""
    if dtype == "float8_e4m3fn":
        return tuple((torch.randn(r, k, device="cuda") * 40).to(torch.float8_e4m3fn) for r in (m, n))
    return tuple(torch.randn(r, k, device="cuda", dtype=torch.bfloat16) for r in (m, n))


def parse_shapes(texts: list[str], default: list) -> list[tuple[int, int, int]]:
    """--shape MxNxK arguments as (m, n, k) tuples, or ``default`` when none were given."""
    return [tuple(int(x) for x in text.split("x")) for text in texts] or default


def fp8_rows(args, flush, sms) -> list[dict]:
    """tmaflow's fp8 GEMM (per-tensor scales) against torch._scaled_mm with and without cuBLAS's
    fast accumulation, each paired with ours; errors against a float64 product of the
    dequantised operands on 256 rows."""
    rows = []
    shapes = parse_shapes(args.fp8_shape, [s[:3] for s in SKINNY] if args.skinny else FP8_SHAPES)
    for m, n, k in shapes:
        a, b = nt_operands(m, n, k, "float8_e4m3fn")
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
            run = kernels.gemm.prepare(a, b, c, config=cfg, scale_a=sa, scale_b=sb)
            c.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            err = rel(c[:256], ref)
            for fast, peer in peers.items():
                peer()
                torch.cuda.synchronize()
                t, t_peer, ratio = paired_ms(run, peer, flush, args.repeats)
                promote = cfg.promote if isinstance(cfg, GemmConfig) else SKINNY_FP8_PROMOTE
                row = {"shape": f"{m}x{n}x{k}", "dtype": "fp8 e4m3", "config": describe(cfg) + f" p{promote}",
                       "auto": cfg == auto, "peer": f"_scaled_mm fast_accum={fast}", "tmaflow_ms": t,
                       "peer_ms": t_peer, "tmaflow_tflops": flop / t / 1e9, "peer_tflops": flop / t_peer / 1e9,
                       "ratio": ratio, "rel_err_vs_float64": err, "peer_rel_err": rel(c_ref[:256], ref)}
                rows.append(row)
                print(f"{row['shape']:>18s} fp8 {row['config']:<40s}{'*' if row['auto'] else ' '} "
                      f"tmaflow {row['tmaflow_tflops']:7.1f}  {row['peer']:27s} {row['peer_tflops']:7.1f} TFLOP/s  "
                      f"ratio {ratio:.3f}  err {err:.1e} (peer {row['peer_rel_err']:.1e})", flush=True)
        if (m, n, k) in BLOCK_SHAPES or args.skinny:
            rows += block_rows(a, b, c, m, n, k, peers[False], flush, args.repeats)
    autos = [r["ratio"] for r in rows if r.get("auto") and r["peer"] == "_scaled_mm fast_accum=False"]
    if autos:
        print(f"median ratio to _scaled_mm (default accumulation), automatic configs: "
              f"{statistics.median(autos):.3f} over {len(autos)} shapes", flush=True)
    blocks = [r["ratio"] for r in rows if r["auto"] and r["dtype"].endswith("scale_a M-major")
              and r["peer"] == "_scaled_mm block scales"]
    if blocks:
        print(f"block scales, M-major scale_a: median ratio to cuBLAS's block-scaled _scaled_mm "
              f"{statistics.median(blocks):.3f} over {len(blocks)} shapes", flush=True)
    return rows


BLOCK_SHAPES = [(8192, 8192, 8192), (4096, 7168, 16384)]


def cublas_block_scaled(a, b, sa, sb, out):
    """torch._scaled_mm with the same 1 x 128 / 128 x 128 block scales (cuBLAS 12.9+ on
    sm_90), which takes scale_a M-major and scale_b as b.T's (K/128, N/128) view: a function,
    or None where this torch or cuBLAS has no such path."""
    sa_m, sb_t = sa.t().contiguous().t(), sb.t()

    def fn():
        return torch._scaled_mm(a, b.T, scale_a=sa_m, scale_b=sb_t, out_dtype=torch.bfloat16, out=out)
    try:
        fn()
        torch.cuda.synchronize()
    except (RuntimeError, ValueError) as exc:
        print(f"  no block-scaled _scaled_mm here: {str(exc).splitlines()[0][:160]}", flush=True)
        return None
    return fn


def block_rows(a, b, c, m, n, k, per_tensor, flush, repeats) -> list:
    """DeepSeek-style block scales (1 x 128 for a, 128 x 128 for b), scale_a row-major and
    M-major, each timed beside cuBLAS's block-scaled _scaled_mm (per-tensor _scaled_mm where
    there is none); errors against float64 of the dequantised operands on 256 rows."""
    sa, sb, ref = block_scales(a, b)
    c_peer = torch.empty_like(c)
    peer, peer_name = cublas_block_scaled(a, b, sa, sb, c_peer), "_scaled_mm block scales"
    if peer is None:
        peer, peer_name, peer_err = per_tensor, "_scaled_mm per-tensor fast_accum=False", float("nan")
    else:
        peer_err = rel(c_peer[:256], ref)  # cublas_block_scaled ran it once and synchronised
    flop = 2.0 * m * n * k
    rows = []
    sa_m = sa.t().contiguous().t()
    variants = [("row-major", sa, None), ("M-major", sa_m, None)]
    if m <= 128:  # M-major scales take the skinny path there; the dense kernel for comparison
        variants.append(("M-major, dense", sa_m, block_scale_config(m, n, k, tf.current_device().sm_count)))
    for layout, scale_a, cfg in variants:
        run = kernels.gemm.prepare(a, b, c, scale_a=scale_a, scale_b=sb, config=cfg)
        c.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        err = rel(c[:256], ref)
        t, t_peer, ratio = paired_ms(run, peer, flush, repeats)
        row = {"shape": f"{m}x{n}x{k}", "dtype": f"fp8 e4m3, block scales, scale_a {layout}",
               "config": describe(cfg) if cfg else "auto", "auto": cfg is None, "peer": peer_name,
               "tmaflow_ms": t, "peer_ms": t_peer, "tmaflow_tflops": flop / t / 1e9,
               "peer_tflops": flop / t_peer / 1e9, "ratio": ratio, "rel_err_vs_float64": err,
               "peer_rel_err": peer_err}
        rows.append(row)
        print(f"{row['shape']:>18s} fp8 block scales, {layout:<14s} {'':<9s} tmaflow {row['tmaflow_tflops']:7.1f}  "
              f"{peer_name:27s} {row['peer_tflops']:7.1f} TFLOP/s  ratio {ratio:.3f}  err {err:.1e} "
              f"(peer {peer_err:.1e})", flush=True)
    return rows


def block_scales(a, b, rows: int = 256):
    """Random block scales for fp8 a (M x K) and b (N x K): (scale_a, scale_b, the float64
    product of the dequantised operands on a's first ``rows`` rows)."""
    (m, k), n = a.shape, b.shape[0]
    kb = -(-k // 128)
    sa = torch.rand(m, kb, device="cuda") * 0.01 + 0.001
    sb = torch.rand(-(-n // 128), kb, device="cuda") * 0.01 + 0.001
    cols = torch.arange(k, device="cuda") // 128
    a_deq = a[:rows].double() * sa[:rows][:, cols].double()
    b_deq = b.double() * sb[torch.arange(n, device="cuda")[:, None] // 128, cols[None, :]].double()
    return sa, sb, a_deq @ b_deq.T


def describe(cfg) -> str:
    if isinstance(cfg, SkinnyConfig):
        return (f"skinny rows{cfg.rows} c{cfg.cluster} s{cfg.stages or 'max'} k{cfg.split_k or 'auto'} "
                f"l2{cfg.l2_promotion}")
    return (f"bn{cfg.bn} c{cfg.cluster_m} e{cfg.epi_cols} s{cfg.stages or 'max'} g{cfg.group_m} "
            f"k{cfg.split_k} l2{cfg.l2_promotion}")


def timed_rounds(fns: dict, flush, repeats: int, warmup: int = 3) -> dict:
    """Milliseconds of each call, in rounds that take every function in turn, each call right
    after an L2-evicting write (so clock and power drift hits all alike)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times[name].append(s.elapsed_time(e))
    return times


def paired_ms(ours, peer, flush, repeats):
    """Median times of both sides and the median of per-repeat ratios peer/ours."""
    got = timed_rounds({"peer": peer, "ours": ours}, flush, repeats)
    ratio = statistics.median(p / o for p, o in zip(got["peer"], got["ours"]))
    return statistics.median(got["ours"]), statistics.median(got["peer"]), ratio


def rel(x, ref):
    return (torch.linalg.norm(x.float() - ref.float()) / torch.linalg.norm(ref.float())).item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--extra", action="store_true", help="also the EXTRA shapes")
    p.add_argument("--only-skinny", action="store_true", help="only shapes with M <= 128")
    p.add_argument("--skinny", action="store_true", help="issue 16's decode shapes (M <= 128) instead")
    p.add_argument("--shape", action="append", default=[], metavar="MxNxK[:nt|nn]", help="these shapes instead")
    p.add_argument("--fp8", action="store_true", help="the fp8 shapes against torch._scaled_mm instead")
    p.add_argument("--fp8-shape", action="append", default=[], metavar="MxNxK", help="with --fp8: these shapes instead")
    args = p.parse_args()
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    sms = tf.current_device().sm_count
    rows = []
    if args.fp8:
        rows = fp8_rows(args, flush, sms)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": tf.current_device().name, "torch": torch.__version__,
                           "repeats": args.repeats, "rows": rows}, f, indent=1)
        return
    shapes = SKINNY if args.skinny else SHAPES + (EXTRA if args.extra else [])
    if args.shape:
        shapes = [(*map(int, text.split(":")[0].split("x")), (text.split(":") + ["nt"])[1]) for text in args.shape]
    if args.only_skinny:
        shapes = [s for s in shapes if s[0] <= 128]
    for m, n, k, layout in shapes:
        a, b = nt_operands(m, n, k)
        if layout == "nn":
            b = b.T.contiguous()  # K x N, N contiguous
        c_ref = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        bt = b.T if layout == "nt" else b
        cublas = lambda: torch.matmul(a, bt, out=c_ref)  # noqa: E731
        cublas()
        flop = 2.0 * m * n * k
        auto = choose_config(m, n, k, sms, layout)
        sweep = SKINNY_SWEEP if m <= 128 else SWEEP
        sweep = [dense_config(m, n, k, sms) if cfg == "dense" else cfg for cfg in sweep]
        configs = [auto] + ([cfg for cfg in sweep if cfg != auto] if args.sweep else [])
        for cfg in configs:
            try:
                run = kernels.gemm.prepare(a, b, c, layout=layout, config=cfg)
                c.fill_(float("nan"))
                run()
                torch.cuda.synchronize()
                err = rel(c, c_ref)
                t, t_cublas, ratio = paired_ms(run, cublas, flush, args.repeats)
            except tf.TmaflowError as exc:
                print(f"  skip {cfg}: {exc}", flush=True)
                continue
            row = {"shape": f"{m}x{n}x{k}", "layout": layout, "auto": cfg == auto,
                   "config": describe(cfg),
                   "tmaflow_ms": t, "cublas_ms": t_cublas, "tmaflow_tflops": flop / t / 1e9,
                   "cublas_tflops": flop / t_cublas / 1e9, "ratio": ratio, "rel_err_vs_cublas": err}
            rows.append(row)
            print(f"{row['shape']:>18s} {layout}  {row['config']:<34s}{'*' if row['auto'] else ' '} "
                  f"tmaflow {row['tmaflow_tflops']:6.1f}  cuBLAS {row['cublas_tflops']:6.1f} TFLOP/s  "
                  f"ratio {row['ratio']:.3f}  err {err:.1e}", flush=True)
    autos = [r["ratio"] for r in rows if r["auto"]]
    skinny = [r["ratio"] for r in rows if r["auto"] and int(r["shape"].split("x")[0]) <= 128]
    if autos:
        print(f"median ratio to cuBLAS, automatic configs: {statistics.median(autos):.3f} over {len(autos)} shapes"
              + (f"; M <= 128: {statistics.median(skinny):.3f} over {len(skinny)}" if skinny else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": tf.current_device().name, "torch": torch.__version__,
                       "repeats": args.repeats, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
