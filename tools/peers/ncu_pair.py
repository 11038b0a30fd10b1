"""tmaflow's bf16 GEMM (--fp8: fp8 with per-tensor scales, against torch._scaled_mm) against
cuBLAS under ncu, one launch each, in isolation (the third GEMM launch of tools/experiments/
profile_gemm.py: its operands' kernels are not counted):
    PYTHONPATH=. python3 tools/peers/ncu_pair.py [--shape MxNxK ...] [--cache all|none|both] [--fp8]
ncu serialises launches, so a kernel here runs alone: after an L2 flush (--cache-control all) or
with its inputs left in L2 by the warm-ups (none). Clocks are not locked (--clock-control none).
Back-to-back timings (tools/experiments/bf16_ab.py, CUPTI) and event timings (tools/peers/bench_gemm.py) measure
kernels in a stream instead; where the two disagree, the difference lies between launches, not
in a launch's own work. Prints one column per (shape, kernel, cache mode)."""
import argparse
import csv
import os
import subprocess
import sys

from tmaflow import bench

HERE = os.path.dirname(os.path.abspath(__file__))

METRICS = {
    "gpu__time_duration.sum": "duration (ns)",
    "launch__grid_size": "CTAs",
    "launch__cluster_size": "cluster size",
    "sm__cycles_elapsed.max": "cycles elapsed",
    "sm__pipe_tensor_op_hmma_cycles_active.avg": "tensor pipe cycles",
    "smsp__inst_executed.sum": "instructions",
    "lts__t_bytes.sum": "L2 bytes",
    "lts__t_sector_hit_rate.pct": "L2 hit rate (%)",
    "dram__bytes.sum": "DRAM bytes",
}


# the GEMM kernels' names: tmaflow's gemm_bf16 / gemm_skinny_bf16, cuBLAS's nvjet_* / *xmma* / cutlass*
GEMM_KERNELS = "regex:gemm|nvjet|xmma|cutlass"


def profile(shape, cublas: bool, cache: str, fp8: bool = False) -> dict:
    m, n, k = shape
    cmd = ["ncu", "--cache-control", cache, "--clock-control", "none", "--metrics", ",".join(METRICS),
           "--kernel-name", GEMM_KERNELS, "--launch-skip", "2", "--launch-count", "1", "--csv", "--page", "raw",
           sys.executable, os.path.join(HERE, "..", "experiments", "profile_gemm.py"), str(m), str(n), str(k)]
    if cublas:
        cmd.append("--cublas")
    if fp8:
        cmd.append("--fp8")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300).stdout
    rows = list(csv.reader(line for line in out.splitlines() if line.startswith('"')))
    if len(rows) < 3:
        raise SystemExit(f"ncu gave no kernel row for {shape} ({'cuBLAS' if cublas else 'tmaflow'}):\n{out[-2000:]}")
    header, values = rows[0], rows[2]
    got = {label: values[header.index(metric)] for metric, label in METRICS.items()}
    got["kernel"] = values[header.index("Kernel Name")][:52]
    return got


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", action="append", default=[])
    p.add_argument("--cache", default="both", choices=("all", "none", "both"))
    p.add_argument("--fp8", action="store_true", help="fp8 e4m3, per-tensor scales, against torch._scaled_mm")
    args = p.parse_args()
    shapes = bench.parse_shapes(args.shape, [(2048, 2048, 2048)])
    caches = ("all", "none") if args.cache == "both" else (args.cache,)
    columns = {}
    for shape in shapes:
        for cache in caches:
            for cublas in (False, True):
                name = f"{'x'.join(map(str, shape))} {'cuBLAS' if cublas else 'tmaflow'} {cache}"
                columns[name] = profile(shape, cublas, cache, args.fp8)
    width = max(len(text) for name, col in columns.items() for text in (name, *col.values())) + 2
    print(f"{'':22s}" + "".join(f"{name:>{width}s}" for name in columns))
    for label in ["kernel", *METRICS.values()]:
        print(f"{label:22s}" + "".join(f"{col[label]:>{width}s}" for col in columns.values()))


if __name__ == "__main__":
    main()
