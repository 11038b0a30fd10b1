"""Host-side cost of the pieces a launch is built from (µs per call, median of rounds): raw
``cuLaunchKernelEx`` against tmaflow's generated path for two kernels, and each step an
entry point takes for torch tensors. Prints the generated launch code it measured.

    PYTHONPATH=. python3 tools/experiments/host_costs.py
"""
from __future__ import annotations

import statistics
import time

import torch  # before the driver is touched (see bench.main)

import tmaflow as tf
from tmaflow import bench
from tmaflow.bench.internals import native
from tmaflow.kernels import examples as ex
from tmaflow.kernels import source


def per_call(fn, n=20000, rounds=5):
    out = []
    for _ in range(rounds):
        bench.cuda_call("cuCtxSynchronize")
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        bench.cuda_call("cuCtxSynchronize")
        out.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(out)


def main():
    cu = bench.cuda_driver()
    rows = {}
    k = tf.Kernel(source("bench"), "empty_kernel", filename="bench.cu")
    a = tf.empty((256, 256), "float32")
    ta, tb = tf.TensorMap.tiled(a, (32, 32)), tf.TensorMap.tiled(a, (64, 64))
    bound = k.bind(grid=1, block=32)
    packer = bound.packer.__class__(bound.module.params)  # owns the buffer kp points into
    kp = packer.pack((ta, tb, 1, 2.0, 3))
    cfg, fn = bound.cu_config(0), bound.module.function
    launch_ex = cu.cuLaunchKernelEx
    rows["maps: raw"] = per_call(lambda: launch_ex(cfg, fn, kp, 0))

    def wrapper(self, a, b, c, d, e):
        launch_ex(cfg, fn, kp, 0)

    class Wrapped:
        __call__ = wrapper

    import functools
    w, part = Wrapped(), functools.partial(wrapper, None)
    rows["maps: raw inside a function"] = per_call(lambda: wrapper(None, ta, tb, 1, 2.0, 3))
    rows["maps: raw inside an instance __call__"] = per_call(lambda: w(ta, tb, 1, 2.0, 3))
    rows["maps: raw inside a partial"] = per_call(lambda: part(ta, tb, 1, 2.0, 3))
    c = bound.config
    rows["maps: raw cuLaunchKernel (no Ex)"] = per_call(
        lambda: cu.cuLaunchKernel(fn, *c.grid, *c.block, 0, 0, kp, 0))
    import ctypes  # the same driver entry point without cuda.bindings (measured: no faster)
    lib_ex = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    lib_ex.restype, lib_ex.argtypes = ctypes.c_int, [ctypes.c_void_p] * 4
    cfg_ptr, fn_ptr = cfg.getPtr(), int(fn)
    rows["maps: raw cuLaunchKernelEx via ctypes"] = per_call(lambda: lib_ex(cfg_ptr, fn_ptr, kp, None))
    rows["maps: bound"] = per_call(lambda: bound(ta, tb, 1, 2.0, 3))
    rows["maps: bound.packer.pack (checked)"] = per_call(lambda: bound.packer.pack((ta, tb, 1, 2.0, 3)), n=5000)
    rows["maps: launch"] = per_call(lambda: k.launch(ta, tb, 1, 2.0, 3, grid=1, block=32))
    src = getattr(bound.func, "source", native.status())
    kx = tf.Kernel(source("bench"), "cluster_probe", filename="bench.cu")
    out = tf.empty(64, "uint32")
    bx = kx.bind(grid=1, block=32)
    packer_x = bx.packer.__class__(bx.module.params)
    kpx = packer_x.pack((out,))
    cfgx, fnx = bx.cu_config(0), bx.module.function
    rows["pointer: raw"] = per_call(lambda: cu.cuLaunchKernelEx(cfgx, fnx, kpx, 0))
    rows["pointer: bound"] = per_call(lambda: bx(out))
    srcx = getattr(bx.func, "source", native.status())
    t = torch.empty(64, device="cuda", dtype=torch.int32)
    rows["pointer: bound torch"] = per_call(lambda: bx(t))
    srct = getattr(bx.func, "source", native.status())
    x = torch.randn(64, 1024, device="cuda")
    y = torch.empty_like(x)
    rows["as_array(torch)"] = per_call(lambda: tf.as_array(x))
    rows["x.new_empty"] = per_call(lambda: x.new_empty((64, 1024)))
    rows["torch.empty_like"] = per_call(lambda: torch.empty_like(x))
    rows["softmax.prepare(x, y)"] = per_call(lambda: ex.softmax.prepare(x, y), n=5000)
    rows["softmax(x, y)"] = per_call(lambda: ex.softmax(x, y), n=5000)
    rows["softmax(x)"] = per_call(lambda: ex.softmax(x), n=5000)
    rows["torch.softmax(x)"] = per_call(lambda: torch.softmax(x, -1), n=5000)
    p = ex.softmax.prepare(x, y)
    rows["prepared softmax()"] = per_call(p, n=5000)
    for name, us in rows.items():
        print(f"{name:40s} {us:8.3f} us")
    print(src, srcx, srct, sep="\n")


if __name__ == "__main__":
    main()
