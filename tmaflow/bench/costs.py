"""Host-cost suites of ``python -m tmaflow bench``: tensor-map encoding and compiling (cold,
from the disk cache in a new process, from memory)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

from ..kernels.registry import source
from ..launch.kernel import Kernel
from ..runtime.memory import empty
from ..tma.tensormap import TensorMap
from .internals import encode


def encode_cost(n: int = 50000) -> dict:
    """Microseconds to re-encode an identical tensor map (a cache hit) and to encode one in the driver."""
    a = empty((4096, 4096), "bfloat16")
    first = TensorMap.tiled(a, (64, 64), swizzle="128B")
    t0 = time.perf_counter()
    for _ in range(n):
        TensorMap.tiled(a, (64, 64), swizzle="128B")
    cached = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n // 10):
        encode(first.spec)
    driver_only = (time.perf_counter() - t0) / (n // 10)
    return {"reencode_identical_us": cached * 1e6, "driver_encode_us": driver_only * 1e6}


_COMPILE_SCRIPT = textwrap.dedent("""
    import sys, time
    t0 = time.perf_counter()
    import tmaflow as tf
    from tmaflow.kernels import source
    k = tf.Kernel(source("bench"), "cluster_probe", options=(sys.argv[1],))
    k.cubin
    print(time.perf_counter() - t0, k.program.cache_hit or "compiled")
""")


def compile_times(tmpdir: str) -> dict:
    """Cold compile, a new process hitting the disk cache, an in-process hit."""
    env = dict(os.environ, TMAFLOW_CACHE_DIR=tmpdir, TMAFLOW_CACHE="1")
    tag = f"-DTMAFLOW_BENCH_TAG={time.time_ns()}"

    def run():
        out = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT, tag], env=env,
                             capture_output=True, text=True, check=True).stdout.split()
        return float(out[0]), out[1]

    cold, how_cold = run()
    disk, how_disk = run()
    os.environ["TMAFLOW_CACHE_DIR"] = tmpdir
    Kernel(source("bench"), "cluster_probe", options=(tag,)).cubin
    t0 = time.perf_counter()
    Kernel(source("bench"), "cluster_probe", options=(tag,)).cubin
    mem = time.perf_counter() - t0
    return {"cold_s": cold, "cold_was": how_cold, "disk_hit_new_process_s": disk,
            "disk_was": how_disk, "memory_hit_ms": mem * 1e3}
