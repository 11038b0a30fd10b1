"""One launch through cuda.bindings' cuLaunchKernelEx against the same driver entry points
called through ctypes, interleaved over rounds on one pinned CPU (µs per launch, medians).

    PYTHONPATH=. python3 tools/launch_binding_costs.py
"""
from __future__ import annotations

import ctypes
import os
import statistics
import time

import torch  # noqa: F401  (imported before the driver is touched)

import tmaflow as tf
from tmaflow import driver
from tmaflow.kernels import source


def main(n=20000, rounds=9):
    cu = driver.cu()
    k = tf.Kernel(source("probe"), "empty_kernel", filename="probe.cu")
    a = tf.empty((256, 256), "float32")
    ta, tb = tf.TensorMap.tiled(a, (32, 32)), tf.TensorMap.tiled(a, (64, 64))
    bound = k.bind(grid=1, block=32)
    packer = bound.packer.__class__(bound.module.params)  # owns the buffer kp points into
    kp = packer.pack((ta, tb, 1, 2.0, 3))
    cfg, fn = bound.cu_config(0), bound.module.function
    lib = ctypes.CDLL("libcuda.so.1")
    ex = lib.cuLaunchKernelEx
    ex.restype, ex.argtypes = ctypes.c_int, [ctypes.c_void_p] * 4
    plain = lib.cuLaunchKernel
    plain.restype = ctypes.c_int
    plain.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    cfg_ptr, fn_ptr = cfg.getPtr(), int(fn)
    launch = cu.cuLaunchKernelEx
    cases = {"cuda.bindings cuLaunchKernelEx": lambda: launch(cfg, fn, kp, 0),
             "ctypes cuLaunchKernelEx": lambda: ex(cfg_ptr, fn_ptr, kp, None),
             "ctypes cuLaunchKernel": lambda: plain(fn_ptr, 1, 1, 1, 32, 1, 1, 0, None, kp, None),
             "tmaflow bound launcher": lambda: bound(ta, tb, 1, 2.0, 3)}
    for f in cases.values():
        f()
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    got = {name: [] for name in cases}
    for _ in range(rounds):
        for name, f in cases.items():
            driver.call("cuCtxSynchronize")
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            driver.call("cuCtxSynchronize")
            got[name].append((time.perf_counter() - t0) / n * 1e6)
    os.sched_setaffinity(0, allowed)
    base = got["cuda.bindings cuLaunchKernelEx"]
    for name, v in got.items():
        ratio = statistics.median(x / b for x, b in zip(v, base))
        print(f"{name:34s} {statistics.median(v):7.3f} us  {ratio:6.3f}x")


if __name__ == "__main__":
    main()
