"""A/B of bf16 GEMM kernel variants in one run, by device time (CUPTI), beside cuBLAS:
    PYTHONPATH=. python3 tools/experiments/bf16_ab.py [--shape MxNxK ...] [--rounds N]
A variant is a GemmConfig (None: the automatic choice) and extra compile-time defines, for
trying a kernel change before it becomes a config. Rounds take every variant in turn; each
round times 40 back-to-back calls per variant (inputs stay in L2: this measures the kernels,
fixed costs included, not DRAM). Each variant's output is checked against float32 torch."""
import argparse
import statistics

from fp8_ab import selected  # this script's directory: python puts it first on the path

from tmaflow import bench, kernels
from tmaflow.kernels.matmul import GemmConfig
from tmaflow.kernels.registry import extra_defines

# Measured with it (H200, session 9) and dropped: C stored straight from registers (16 bytes a
# lane after a quad transpose) instead of through shared memory and the TMA, 0.8 us slower a
# launch; no epilogue at all (a bound, not a kernel): 2048^3 22.06 against 23.62 us.
# Session 12 (H200, CUPTI; the first two on branch exp/epilogue-reuse): a CTA's last tile
# stored through its idle stages in one round, 2048^3 0.976 against 0.988x cuBLAS,
# 2048x2048x64 0.884 against 0.938; epilogue rounds rotated per warpgroup, 0.989 against 0.988
# and 0.898 against 0.938; the first work item found before the first barrier, no change;
# clusters of two launched for unclustered code (dispatch only), no change; the second
# warpgroup held one or two k-blocks behind the first on a CTA's first tile (its epilogue then
# overlaps the other's last k-blocks): 2048x2048x64 4.37 against 4.55 us, but 2304x4608x1024
# 30.43 against 30.15 and 2048^3 unchanged.
VARIANTS = [  # (label, GemmConfig or None, extra defines)
    ("auto", None, {}),
    ("bn256 c2", GemmConfig(bn=256, cluster_m=2), {}),
    ("bn128 c1", GemmConfig(bn=128, cluster_m=1), {}),
    ("bn256 c2 tail split", GemmConfig(bn=256, cluster_m=2, split_tail=True), {}),
    ("bn192 c1 e64", GemmConfig(bn=192, cluster_m=1, epi_cols=64), {}),
    ("bn192 c1 e64 tail split", GemmConfig(bn=192, cluster_m=1, epi_cols=64, split_tail=True), {}),
    ("bn128 c1 tail split", GemmConfig(bn=128, cluster_m=1, split_tail=True), {}),
]


def main():
    import torch  # optional dependency: --help works without it

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", action="append", default=[])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", default="", help="substrings (| between) of the variant labels to run")
    args = p.parse_args()
    shapes = bench.parse_shapes(args.shape, [(2048, 2048, 2048)])
    for m, n, k in shapes:
        a, b = bench.nt_operands(m, n, k)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        peer = torch.empty_like(c)
        ref = a.float() @ b.float().T
        fns, errs = {"cuBLAS": lambda: torch.matmul(a, b.T, out=peer)}, {}
        for label, cfg, extra in VARIANTS:
            if not selected(label, args.only):
                continue
            with extra_defines(extra):
                run = kernels.gemm.prepare(a, b, c, config=cfg)
            c.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            errs[label] = ((c.float() - ref).abs().max() / ref.abs().max()).item()
            fns[label] = run
        times = {label: [] for label in fns}
        for _ in range(args.rounds):
            for label, fn in fns.items():
                times[label].append(sum(t.calls * t.mean_us for t in bench.kernel_times(fn, 40).values()) / 40)
        base = statistics.median(times["cuBLAS"])
        print(f"== {m}x{n}x{k}")
        for label, ts in times.items():
            us = statistics.median(ts)
            print(f"{label:<28s} {us:8.2f} us  {2.0 * m * n * k / us / 1e6:7.1f} TFLOP/s  cuBLAS/this "
                  f"{base / us:.3f}  err {errs.get(label, 0.0):.1e}", flush=True)


if __name__ == "__main__":
    main()
