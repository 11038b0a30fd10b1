"""Latency-bound GEMM configurations by a high-repeat A/B (issue 33): per shape, the default
(``choose_config``) and its candidates, every one timed with the peer (cuBLAS through torch; fp8:
torch._scaled_mm, default accumulation) in ONE set of interleaved rounds, cold (L2 flushed
before every call) and then back to back, the order rotated every round:

    PYTHONPATH=. python3 tools/experiments/gemm_latency_ab.py [--shape LABEL ...] [--repeats N] [--jobs J]
    PYTHONPATH=. python3 tools/experiments/gemm_latency_ab.py --precompile   # no GPU: compile, print resources

At microsecond sizes the peer's own rate moves +-10% between rows of one run, so a 10-repeat
ratio cannot decide a 5% question; here the configs of one shape share their rounds, and each
row gives its median us (cold / back to back), the median per-round ratio to the peer (above 1:
faster than the peer) and to the shape's default (above 1: faster than the default). Every
config's output, poisoned with NaN before its first launch, is checked against a float64
product of 256 rows (fp8: of the scaled operands); a wrong one is reported and not timed.
Session 17 call 4 made ``heuristics.m_chunk_config`` and UNIFORM_DESC defaults from this. (The
peer's column there was off: cuBLAS 10-25 us at 512^3-1024^3 against its 5-6 us kernel.) So each
shape also times its default against the peer alone, as tools/peers/bench_gemm.py does (two
functions, not rotated: the acceptance figure), and the summary multiplies that ratio by the best
candidate's gain over the default. ``--uniform`` adds each default with UNIFORM_DESC=0; ``--lean``
times the LEAN rows (gemm.cu's instruction cuts off, alone and together) instead of the candidates."""
from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os

import tmaflow as tf
from tmaflow import bench, kernels
from tmaflow.bench.gemm_shapes import describe
from tmaflow.bench.peers import WARM_BATCH
from tmaflow.kernels import registry
from tmaflow.kernels.matmul import GemmConfig, SkinnyConfig, choose_config, gemm_plan, skinny_plan

BF16, FP8 = "bfloat16", "float8_e4m3fn"
ARCH = "sm_90a"
WRONG = 1e-2  # relative error above which a config is not timed
SA, SB = 0.01, 0.02  # fp8 per-tensor scales
WINS = 1.02  # a candidate's median per-round ratio to the default, cold and back to back, to win

# (label, M, N, K, dtype, candidates besides the default): session 18's rows below 1.0x cold
# (H100 unless said; the default and what the model rejected are in heuristics.py), the three
# furthest below first.
P1 = dict(promote=1, promote_sets=2)  # fp8: promoted every k-block on two accumulator sets
K_TAIL = {"K_TAIL": 1}  # gemm.cu: K's last, partial k-block issues only the k-steps that reach into K
SHAPES = [
    # bn128 ck2 64 CTAs (default) 0.80-0.82x _scaled_mm; cuBLAS: 64x64 tiles, 2x1 clusters, 128 CTAs
    ("fp8 128x4096x4096", 128, 4096, 4096, FP8, [
        GemmConfig(bn=128, cluster_m=1, cluster_k=2, **P1), GemmConfig(bn=128, cluster_m=1, cluster_k=4),
        GemmConfig(bn=128, cluster_m=1, cluster_k=4, **P1),
        GemmConfig(bn=64, cluster_m=1, epi_cols=64, cluster_k=2), GemmConfig(bn=64, cluster_m=1, epi_cols=64, cluster_k=2, **P1),
        SkinnyConfig(split_k=1), SkinnyConfig(split_k=1, promote_sets=2),
        SkinnyConfig(m_halves=2), SkinnyConfig(m_halves=2, promote_sets=2),
        SkinnyConfig(m_rows=64, cluster=2), SkinnyConfig(m_rows=64, cluster=2, promote_sets=2)]),
    # bn64 ck2 64 CTAs (default) 0.901; cuBLAS: 64x48 tiles, 2x4 clusters, 96 CTAs, all of K each
    ("512x512x2048", 512, 512, 2048, BF16, [
        GemmConfig(bn=64, cluster_m=1, epi_cols=64, cluster_k=4), SkinnyConfig(m_rows=48, cluster=2),
        SkinnyConfig(m_rows=48), SkinnyConfig(m_rows=32, cluster=2), SkinnyConfig(m_rows=64, cluster=2, split_k=2)]),
    # bn192 pairs, 128 tiles, 9 k-blocks (default) 0.911; cuBLAS: 200x128 tiles, 1x4 clusters, 120 CTAs.
    # K_TAIL: the 9th k-block (8 of 64 columns in K) issues 1 of its 4 k-steps
    ("1000x3000x520", 1000, 3000, 520, BF16, [
        (GemmConfig(bn=192, cluster_m=2, epi_cols=64), K_TAIL), GemmConfig(bn=192, cluster_m=4, epi_cols=64),
        (GemmConfig(bn=192, cluster_m=4, epi_cols=64), K_TAIL), GemmConfig(bn=256, cluster_m=4),
        GemmConfig(bn=224, cluster_m=2, epi_cols=64), GemmConfig(bn=192, cluster_m=1, epi_cols=64)]),
    # bn128 ck2 (default) 0.98 (H200 0.977); cuBLAS: 128x64 tiles, 1x2 clusters, 128 CTAs
    ("fp8 128x8192x8192", 128, 8192, 8192, FP8, [
        GemmConfig(bn=128, cluster_m=1, cluster_k=2, **P1), SkinnyConfig(split_k=1, promote_sets=2),
        SkinnyConfig(rows=128, m_halves=2), SkinnyConfig(m_rows=64, cluster=2, promote_sets=2)]),
    ("fp8 128x7168x16384", 128, 7168, 16384, FP8, [GemmConfig(bn=128, cluster_m=1, cluster_k=2, **P1),
                                                    SkinnyConfig(split_k=1, promote_sets=2)]),
    # the skinny default (64-row CTAs, K split to fill the SMs, promoted every 4 k-blocks)
    # (unsplit by default: _SKINNY_FP8_MIN_K_BLOCKS; 64 CTAs a 4096-column B). Session 25: the
    # block-scaled kernel (promoted every k-block on two sets) ran 16x4096x4096 faster than the
    # per-tensor one (47.5 against 45.2 TFLOP/s cold, BENCHMARKS.md): two sets, more CTAs,
    # fewer stages (two CTAs an SM), L2 promotion, A shared by pairs.
    # session 32: M in two chunks of 32 rows (128 CTAs), alone or the pair sharing B by multicast
    # and neighbouring N tiles in pairs sharing A by multicast (cuBLAS: clusters of 4, 25% fewer L2 bytes)
    ("fp8 64x4096x4096", 64, 4096, 4096, FP8, [SkinnyConfig(cluster=2), SkinnyConfig(cluster=2, promote_sets=2),
                                               SkinnyConfig(m_rows=32), SkinnyConfig(m_rows=32, m_halves=2),
                                               SkinnyConfig(m_rows=32, m_halves=2, promote_sets=2),
                                               SkinnyConfig(promote_sets=2), SkinnyConfig(split_k=2),
                                               SkinnyConfig(split_k=2, promote_sets=2),
                                               SkinnyConfig(split_k=2, stages=7, promote_sets=2)]),
    ("fp8 16x4096x4096", 16, 4096, 4096, FP8, [SkinnyConfig(m_rows=8, m_halves=2, promote_sets=2),
                                               SkinnyConfig(promote_sets=2), SkinnyConfig(split_k=2),
                                               SkinnyConfig(split_k=2, promote_sets=2),
                                               SkinnyConfig(split_k=2, stages=8, promote_sets=2),
                                               SkinnyConfig(split_k=4, stages=8, promote_sets=2),
                                               SkinnyConfig(stages=8), SkinnyConfig(promote_sets=2, l2_promotion="none"),
                                               SkinnyConfig(promote_sets=2, l2_promotion="128B"),
                                               SkinnyConfig(cluster=2, promote_sets=2)]),
    ("fp8 1x4096x4096", 1, 4096, 4096, FP8, [SkinnyConfig(promote_sets=2), SkinnyConfig(split_k=2, promote_sets=2)]),
    # session 32: two promotion sets over the other per-tensor decode shapes (the skinny path)
    *[(f"fp8 decode {m}x{n}x{k}", m, n, k, FP8, [SkinnyConfig(promote_sets=2)] + [
        SkinnyConfig(m_rows=32), SkinnyConfig(m_rows=32, m_halves=2), SkinnyConfig(cluster=2)] * (m == 64))
      for n, k in ((8192, 8192), (7168, 16384)) for m in (1, 16, 64)],
    # bn64 128 CTAs unclustered (default) 0.977; cuBLAS: 128x64 tiles in pairs
    ("1024^3", 1024, 1024, 1024, BF16, [GemmConfig(bn=64, cluster_m=2, epi_cols=64), GemmConfig(bn=64, cluster_m=4, epi_cols=64),
                                         GemmConfig(bn=128, cluster_m=4)]),
    # bn128 persistent, 648 tiles, unclustered (default before session 20) 0.981; cuBLAS: 128x128 tiles in pairs
    ("2304x4608x1024", 2304, 4608, 1024, BF16, [GemmConfig(bn=128, cluster_m=1), GemmConfig(bn=128, cluster_m=2), GemmConfig(bn=128, cluster_m=4),
                                                 GemmConfig(bn=256, cluster_m=4)]),
    # 128-column tiles over several waves: pairs sharing B (default since session 20 from n >= 2048;
    # H100: 2304x4608x1024 1.039-1.045 / 1.057-1.065 over unclustered; session 19: 1.027 / 0.988)
    ("2048x5120x2048", 2048, 5120, 2048, BF16, [GemmConfig(bn=128, cluster_m=1), GemmConfig(bn=128, cluster_m=2), GemmConfig(bn=256, cluster_m=2)]),
    ("3072x4608x4096", 3072, 4608, 4096, BF16, [GemmConfig(bn=128, cluster_m=1), GemmConfig(bn=128, cluster_m=2), GemmConfig(bn=256, cluster_m=2)]),
    ("6144x1024x1024", 6144, 1024, 1024, BF16, [GemmConfig(bn=128, cluster_m=1), GemmConfig(bn=128, cluster_m=2), GemmConfig(bn=256, cluster_m=2)]),
    # M chunks of 16 / 32 rows (default; H200 0.976 / 0.972): pairs of N tiles sharing A's chunk;
    # cuBLAS: 256^3 64x8 tiles in 1x2 clusters (128 CTAs), 512^3 64x48 in 2x4 (96)
    ("256^3", 256, 256, 256, BF16, [SkinnyConfig(m_rows=16, cluster=2), SkinnyConfig(m_rows=8, m_halves=2),
                                     SkinnyConfig(m_rows=32, cluster=2)]),
    ("512^3", 512, 512, 512, BF16, [SkinnyConfig(m_rows=32, cluster=2), SkinnyConfig(m_rows=48, cluster=2),
                                     SkinnyConfig(m_rows=48)]),
    # 224 64-row tiles of 16 stages, one CTA an SM (default; H200 0.928): a second wave of 92
    # CTAs. Fewer stages fit two or four CTAs an SM; 128-row tiles leave one wave of 112.
    ("16x14336x7168", 16, 14336, 7168, BF16, [SkinnyConfig(), SkinnyConfig(stages=8), SkinnyConfig(stages=5), SkinnyConfig(rows=128),
                                               SkinnyConfig(split_k=2, stages=5), SkinnyConfig(split_k=2, stages=8)]),
    ("32x14336x4096", 32, 14336, 4096, BF16, [SkinnyConfig(), SkinnyConfig(stages=8), SkinnyConfig(stages=5), SkinnyConfig(rows=128)]),
    ("1x14336x4096", 1, 14336, 4096, BF16, [SkinnyConfig(), SkinnyConfig(stages=8), SkinnyConfig(stages=5)]),
    ("fp8 16x14336x7168", 16, 14336, 7168, FP8, [SkinnyConfig(), SkinnyConfig(stages=8), SkinnyConfig(stages=5)]),
    # 64 tiles x 2 splits, one CTA an SM (default; H200 0.988): more splits at two CTAs an SM
    ("16x4096x14336", 16, 4096, 14336, BF16, [SkinnyConfig(split_k=4, stages=8), SkinnyConfig(split_k=3, stages=8),
                                               SkinnyConfig(split_k=2, stages=8)]),
    # bn64 128 CTAs (default; H200 0.974)
    ("128x8192x8192", 128, 8192, 8192, BF16, [SkinnyConfig(rows=128, m_halves=2), SkinnyConfig(split_k=1, cluster=2)]),
]


# --lean (session 19, gemm20): the instruction cuts of gemm.cu's prologue and k-loop start, each
# turned off alone and all together (the kernel before them), against the default that has them;
# EXIT_WAIT_READ (opt-in: the CTA leaves once its last stores read shared memory) and the epilogue
# in one round (epi_cols = bn: no wait for the TMA store to read the buffer between rounds, one
# stage fewer). These rows replace the shape's candidates above.
LEAN_CUTS = ("ACC_OVERWRITE", "UDIV_TILE", "CLUSTER_ARRIVE_RELAXED")  # the first opt-in (session 19: 1% slower)
BEFORE = {key: 0 for key in LEAN_CUTS}
EXIT_READ = {"EXIT_WAIT_READ": 1}
K_TAIL2 = {"K_TAIL": 2}  # K_TAIL's last k-block after the loop, straight-line per k-step count (no C7519 on NVRTC 13.0)
STSM = {"EPI_STMATRIX": 1}  # opt-in: C's boxes written by stmatrix (4 instructions where 16 st.shared)
_BN192, _EPI192 = GemmConfig(bn=192, cluster_m=2, epi_cols=64), GemmConfig(bn=192, cluster_m=2, epi_cols=192)
_CK2 = GemmConfig(bn=64, cluster_m=1, epi_cols=64, cluster_k=2)
LEAN = {
    "1000x3000x520": [(_BN192, BEFORE), (_BN192, {"ACC_OVERWRITE": 1})] + [(_BN192, {key: 0}) for key in LEAN_CUTS[1:]] + [
        (_BN192, EXIT_READ), (_BN192, STSM), (_BN192, {**STSM, **EXIT_READ}), _EPI192, (_EPI192, {**STSM, **EXIT_READ}),
        (_BN192, K_TAIL2), (_BN192, {**K_TAIL2, **STSM, **EXIT_READ})],
    # ACC_OVERWRITE does not apply to cluster K-splits
    "512x512x2048": [(_CK2, BEFORE), (_CK2, {"UDIV_TILE": 0}), (_CK2, {"CLUSTER_ARRIVE_RELAXED": 0}), (_CK2, EXIT_READ),
                     (_CK2, {**STSM, **EXIT_READ})],
}


UNIFORM = {"UNIFORM_DESC": 0}  # gemm.cu / skinny.cu: the k-loop's descriptors per thread (before session 17's default)


def configs(m: int, n: int, k: int, dtype: str, extra: list, sms: int, uniform: bool = False) -> list:
    """(config, extra defines) pairs: the default first (with ``uniform``, then the default with
    UNIFORM_DESC=0), then the candidates that differ from the default. A candidate is a config
    or a (config, defines) pair."""
    auto = choose_config(m, n, k, sms, "nt", dtype)
    got = [(auto, {})] + [(auto, UNIFORM)] * uniform
    for cand in extra:
        cfg, defines = cand if isinstance(cand, tuple) else (cand, {})
        if (cfg, defines) not in got:
            got.append((cfg, defines))
    return got


def name_of(cfg, defines: dict, default: bool) -> str:
    """A row's label: describe() without the fields never varied here, and the extra defines."""
    short = describe(cfg).replace(" l2256B", "").replace(" smax", "").replace(" g16", "").replace(" kauto", "")
    extra = "".join(f" {key}={value}" for key, value in defines.items())
    return ("default " if default else "") + short + extra


def kernel_job(m, n, k, dtype, config, sms, extra: dict) -> tuple:
    """(file, kernel name, defines, layout) of the kernel a config launches."""
    if isinstance(config, SkinnyConfig):
        plan = skinny_plan(m, n, k, config, sms, dtype)
        return "skinny", "gemm_skinny_bf16", {**plan.defines, **extra}, plan.layout
    plan = gemm_plan(m, n, k, "nt", config, dtype)
    return "gemm", "gemm_bf16", {**plan.defines, **extra}, plan.layout


def compile_one(job: tuple) -> str:
    """Compile one kernel into the disk cache (no device touched); its resources in a line."""
    file, name, defines, layout = job
    kernel = tf.Kernel(registry.source(file), name, defines=defines, layout=layout, filename=f"{file}.cu", arch=ARCH)
    r = kernel.resources
    return f"{kernel.program.compile_seconds:5.1f} s  regs {r.registers if r else '?'}  spills {r.spills if r else '?'}"


def precompile(shapes, sms: int, jobs: int, show: bool, uniform: bool = False) -> None:
    """Every distinct kernel of the selected shapes, compiled in ``jobs`` processes."""
    todo, names = {}, {}
    for label, m, n, k, dtype, extra in shapes:
        for i, (cfg, defines) in enumerate(configs(m, n, k, dtype, extra, sms, uniform)):
            try:
                job = kernel_job(m, n, k, dtype, cfg, sms, defines)
            except tf.TmaflowError as exc:  # reported again when the shape is timed
                print(f"  {label}: no kernel for {describe(cfg)}: {str(exc).splitlines()[0]}", flush=True)
                continue
            key = (job[0], tuple(sorted(job[2].items())), job[3].header())
            todo.setdefault(key, job)
            names.setdefault(key, []).append(f"{label} {name_of(cfg, defines, i == 0)}")
    ctx = multiprocessing.get_context("spawn")  # workers never touch the device
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=ctx) as pool:
        done = list(pool.map(compile_one, todo.values()))
    print(f"precompiled {len(todo)} kernels", flush=True)
    if show:
        for key, line in zip(todo, done):
            print(f"  {line}  {'; '.join(names[key])}", flush=True)


def shape_rows(label, m, n, k, dtype, extra, sms, repeats, uniform=False) -> dict:
    """One shape: every config's output checked, then cold and back-to-back rounds (rotated)
    with the peer, then the default against the peer alone as tools/peers/bench_gemm.py times it
    (two functions, bench.versus). Returns the shape's summary."""
    import torch  # optional dependency: --help and --precompile work without it

    torch.manual_seed(0)
    a, b = bench.nt_operands(m, n, k, dtype)
    fp8 = dtype == FP8
    scale = SA * SB if fp8 else 1.0
    ref = scale * (a[:256].double() @ b.double().T)
    c_peer = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    if fp8:
        ta, tb = torch.tensor(SA, device="cuda"), torch.tensor(SB, device="cuda")

        def peer():
            torch._scaled_mm(a, b.t(), scale_a=ta, scale_b=tb, out=c_peer, out_dtype=torch.bfloat16)
    else:
        bt = b.T

        def peer():
            torch.matmul(a, bt, out=c_peer)
    fns, errs, names = {"peer": peer}, {}, []
    scales = dict(scale_a=SA, scale_b=SB) if fp8 else {}
    for i, (cfg, defines) in enumerate(configs(m, n, k, dtype, extra, sms, uniform)):
        name = name_of(cfg, defines, i == 0)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        try:
            with registry.extra_defines(defines):
                run = kernels.gemm.prepare(a, b, c, config=cfg, **scales)
        except tf.TmaflowError as exc:
            print(f"  {label}: skip {name}: {str(exc).splitlines()[0]}", flush=True)
            continue
        errs[name] = bench.poisoned_error(run, c, ref)
        if not errs[name] < WRONG:  # NaN included
            print(f"  {label}: WRONG {name}: rel err {errs[name]:.1e}, not timed", flush=True)
            continue
        fns[name] = run
        names.append(name)
    peer()
    torch.cuda.synchronize()
    peer_err = bench.rel_error(c_peer[:256], ref)
    cold = bench.rounds(fns, repeats=repeats, flush_l2=True, rotate=True)
    warm = bench.rounds(fns, repeats=repeats, rotate=True, batch=WARM_BATCH)
    flop = 2.0 * m * n * k
    default = names[0] if names and names[0].startswith("default") else None
    print(f"== {label} ({'fp8 vs _scaled_mm' if fp8 else 'bf16 vs cuBLAS'}), {repeats} rounds, "
          f"peer {cold['peer'].median * 1e6:.2f} / {warm['peer'].median * 1e6:.2f} us, err {peer_err:.1e}", flush=True)
    print(f"   {'config':<46s} {'cold us':>8s} {'warm us':>8s} {'TFLOP/s':>7s} {'peer/this':>15s} "
          f"{'default/this':>15s}  err", flush=True)
    for name in names:
        c_us, w_us = cold[name].median * 1e6, warm[name].median * 1e6
        to_peer = f"{cold.ratio(name, 'peer').median:.3f}/{warm.ratio(name, 'peer').median:.3f}"
        to_default = (f"{cold.ratio(name, default).median:.3f}/{warm.ratio(name, default).median:.3f}"
                      if default else "-")
        print(f"   {name:<46s} {c_us:8.2f} {w_us:8.2f} {flop / c_us / 1e6:7.1f} {to_peer:>15s} {to_default:>15s}"
              f"  {errs[name]:.1e}", flush=True)
    summary = {"label": label, "best": None}
    if default:
        # the default against the peer alone, as bench_gemm.py times it (not rotated, two functions)
        v = bench.versus({"ours": fns[default], "peer": peer}, ours="ours", peer="peer", repeats=repeats)
        summary["versus"] = (v.ratio("cold").median, v.ratio("warm").median)
        print(f"   default vs peer alone (bench_gemm's way): cold {summary['versus'][0]:.3f} / back to back "
              f"{summary['versus'][1]:.3f}", flush=True)
        # a candidate earns a default by winning both timings
        gains = {name: (cold.ratio(name, default).median, warm.ratio(name, default).median)
                 for name in names if name != default}
        best = max(gains, key=lambda name: min(gains[name]), default=None)
        if best is not None:
            summary["best"], summary["gain"] = best, gains[best]
            cold_best = max(gains, key=lambda name: gains[name][0])
            summary["cold_best"], summary["cold_gain"] = cold_best, gains[cold_best]
        if best is not None and min(gains[best]) >= WINS:
            print(f"   WINNER over the default, cold / back to back {gains[best][0]:.3f} / {gains[best][1]:.3f}: "
                  f"{best}", flush=True)
        else:
            print("   no candidate beats the default by 2% in both timings", flush=True)
    return summary


def report(summaries: list) -> None:
    """Per shape: the default's ratio to the peer (bench_gemm's way), the best candidate's gain
    over the default and the ratio to the peer it implies (the product), cold / back to back."""
    print("== summary: default x peer (alone) | best candidate: over default -> x peer, cold / back to back", flush=True)
    for got in summaries:
        if "versus" not in got:
            continue
        vc, vw = got["versus"]
        line = f"   {got['label']:<20s} default {vc:.3f} / {vw:.3f}"
        if got["best"]:
            gc, gw = got["gain"]
            line += f" | {got['best']:<40s} {gc:.3f} / {gw:.3f} -> {vc * gc:.3f} / {vw * gw:.3f}"
            if got["cold_best"] != got["best"]:
                gc, gw = got["cold_gain"]
                line += f" | cold: {got['cold_best']} {gc:.3f} / {gw:.3f} -> {vc * gc:.3f} / {vw * gw:.3f}"
        print(line, flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", action="append", default=[], help="labels of SHAPES (substring; default: all)")
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    p.add_argument("--sms", type=int, default=132, help="--precompile: the SM count plans assume (H100/H200: 132)")
    p.add_argument("--precompile", action="store_true", help="compile every config (no GPU), print resources, exit")
    p.add_argument("--uniform", action="store_true", help="also each default with UNIFORM_DESC=0 (session 17's A/B)")
    p.add_argument("--lean", action="store_true", help="the LEAN rows instead of the candidates where a shape has them")
    args = p.parse_args()
    shapes = [s for s in SHAPES if not args.shape or any(part in s[0] for part in args.shape)]
    if args.lean:
        shapes = [(*s[:5], LEAN.get(s[0], s[5])) for s in shapes]
    if not shapes:
        p.error(f"--shape {args.shape} matches none of {[s[0] for s in SHAPES]}")
    if args.precompile:
        return precompile(shapes, args.sms, args.jobs, show=True, uniform=args.uniform)
    import torch  # optional dependency, before the driver is touched

    torch.cuda.init()
    sms = tf.current_device().sm_count
    precompile(shapes, sms, args.jobs, show=False, uniform=args.uniform)
    report([shape_rows(*shape, sms, args.repeats, args.uniform) for shape in shapes])


if __name__ == "__main__":
    main()
