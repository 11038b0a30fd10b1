"""Where the launch path's time goes: raw cuLaunchKernelEx with one pre-packed buffer, with two
alternating buffers, through the generated path, and with the GPU kept busy, per kernel."""
import statistics
import time

import torch  # noqa: F401  (before the driver)

import tmaflow as tf
from tmaflow import driver
from tmaflow.kernels import source


def per_call(fn, n=20000, rounds=7, sync=True):
    out = []
    for _ in range(rounds):
        driver.call("cuCtxSynchronize")
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        driver.call("cuCtxSynchronize")
        t2 = time.perf_counter()
        out.append(((t2 if sync else t1) - t0) / n * 1e6)
    return statistics.median(out)


cu = driver.cu()
launch = cu.cuLaunchKernelEx
for fname, kname, make in (
        ("probe", "cluster_probe", lambda: (tf.empty(64, "uint32"),)),
        ("probe", "empty_kernel", lambda: (tf.TensorMap.tiled(tf.empty((64, 64)), (8, 8)),
                                           tf.TensorMap.tiled(tf.empty((64, 64)), (16, 16)), 1, 2.0, 3)),
        ("axpb", "axpb_tma", lambda: (tf.empty(4096), tf.empty(4096), 2.0, 1.0, 4096))):
    k = tf.Kernel(source(fname), kname, filename=f"{fname}.cu")
    b = k.bind(grid=1, block=256 if fname == "axpb" else 32)
    args1, args2 = make(), make()
    P = b.packer.__class__
    p1 = P(b.module.params)  # the packers own the buffers the pointers point into
    kp1 = p1.pack(args1)
    p2 = P(b.module.params)
    kp2 = p2.pack(args2)
    cfg, fn = b.cu_config(0), b.module.function
    flip = [kp1, kp2]
    i = [0]

    def alternating():
        i[0] ^= 1
        launch(cfg, fn, flip[i[0]], 0)

    b(*args1)
    rows = {"raw, one buffer": lambda: launch(cfg, fn, kp1, 0),
            "raw, two buffers alternating": alternating,
            "generated path": lambda: b(*args1),
            "generated path, two arg sets": (lambda: b(*(args1 if i.__setitem__(0, i[0] ^ 1) or i[0] else args2)))}
    for name, f in rows.items():
        print(f"{kname:14s} {name:32s} {per_call(f):7.3f} us   host only {per_call(f, sync=False):7.3f} us")
