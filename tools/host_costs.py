"""Host-side cost of the primitives a launch is built from (µs per call, median of rounds).

Used to budget the launch path: raw cuLaunchKernelEx through cuda.bindings and through
ctypes, torch's data_ptr/get_device/current raw stream, tensor-map encodes, pool allocation.
"""
from __future__ import annotations

import ctypes
import statistics
import time

import tmaflow as tf
from tmaflow import driver
from tmaflow.kernels import source


def per_call(fn, n=20000, rounds=5):
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(out)


def main():
    import torch

    cu = driver.cu()
    dev = tf.current_device()
    k = tf.Kernel(source("probe"), "empty_kernel", filename="probe.cu")
    a = tf.empty((256, 256), "float32")
    ta, tb = tf.TensorMap.tiled(a, (32, 32)), tf.TensorMap.tiled(a, (64, 64))
    bound = k.bind(grid=1, block=32)
    kp = bound.packer.pack((ta, tb, 1, 2.0, 3))
    cfg, fn = bound.config, bound.module.function
    rows = {}
    rows["raw cuLaunchKernelEx (bindings)"] = per_call(lambda: cu.cuLaunchKernelEx(cfg, fn, kp, 0))
    rows["bound launcher"] = per_call(lambda: bound(ta, tb, 1, 2.0, 3))
    # ctypes straight into libcuda with the same CUlaunchConfig struct
    lib = ctypes.CDLL("libcuda.so.1")
    lk = lib.cuLaunchKernelEx
    lk.restype = ctypes.c_int
    lk.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    cfg_ptr, fn_ptr = cfg.getPtr(), int(fn)
    rows["raw cuLaunchKernelEx (ctypes)"] = per_call(lambda: lk(cfg_ptr, fn_ptr, kp, None))
    driver.call("cuCtxSynchronize")
    t = torch.empty(1024, device="cuda")
    rows["torch data_ptr()"] = per_call(t.data_ptr)
    rows["torch get_device()"] = per_call(t.get_device)
    rows["torch is_cuda"] = per_call(lambda: t.is_cuda)
    raw = torch._C._cuda_getCurrentRawStream
    rows["torch current raw stream"] = per_call(lambda: raw(0))
    rows["torch.empty_like 64x1024"] = per_call(lambda: torch.empty((64, 1024), device="cuda"))
    x = torch.randn(64, 1024, device="cuda")
    rows["torch.softmax 64x1024"] = per_call(lambda: torch.softmax(x, -1), n=5000)
    m = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    rows["torch.matmul 256^3 bf16"] = per_call(lambda: torch.matmul(m, m), n=5000)
    rows["torch CAI"] = per_call(lambda: t.__cuda_array_interface__, n=2000)
    rows["tf.as_array(torch)"] = per_call(lambda: tf.as_array(t), n=2000)
    rows["TensorMap.tiled hit"] = per_call(lambda: tf.TensorMap.tiled(a, (32, 32)))
    from tmaflow.tensormap import encode
    rows["driver encode (bindings)"] = per_call(lambda: encode(ta.spec), n=5000)
    spec = ta.spec
    rows["spec validate tiled"] = per_call(
        lambda: tf.TensorMapSpec.tiled("float32", (256, 256), (32, 32), address=a.ptr), n=5000)
    pool = driver.call("cuDeviceGetDefaultMemPool", dev.handle)
    def pool_cycle():
        p = driver.call("cuMemAllocFromPoolAsync", 1 << 20, pool, 0)
        driver.call("cuMemFreeAsync", p, 0)
    rows["pool alloc+free 1 MB (async)"] = per_call(pool_cycle, n=5000)
    def plain_cycle():
        p = driver.call("cuMemAlloc", 1 << 20)
        driver.call("cuMemFree", p)
    rows["cuMemAlloc+cuMemFree 1 MB"] = per_call(plain_cycle, n=500)
    driver.call("cuCtxSynchronize")
    for name, us in rows.items():
        print(f"{name:40s} {us:8.3f} us")


if __name__ == "__main__":
    main()
