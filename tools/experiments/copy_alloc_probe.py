"""Where does an allocating ``kernels.copy(x)`` lose against ``copy(x, out)`` on 1 GiB?

Times (CUDA events, batches of 16, paired rounds) the same tile copy with its output given in
several ways, against cuMemcpyDtoD, so the allocation path, the output's address and the
working set can be told apart. Also times torch's allocating peer (``x.clone()``).

    PYTHONPATH=. python3 tools/experiments/copy_alloc_probe.py
"""
from __future__ import annotations

import statistics

try:
    import torch  # before the driver is touched (see bench.main)
except ImportError:
    torch = None

import tmaflow as tf
from tmaflow import bench
from tmaflow.kernels import examples as ex


def main(n: int = 16384, repeats: int = 12):
    src = bench.random_array((n, n), "float32")
    dst, other = tf.empty((n, n), "float32"), tf.empty((n, n), "float32")
    nbytes = n * n * 4
    kept = []

    def alternating():  # two outputs alive at once, as in ``y = copy(x)`` in a loop
        kept.append(ex.copy(src))
        if len(kept) > 1:
            kept.pop(0)

    prepared = ex.copy.prepare(src, dst)
    fns = {"memcpy": lambda: bench.cuda_call("cuMemcpyDtoDAsync", dst.ptr, src.ptr, nbytes, 0),
           "memcpy into other": lambda: bench.cuda_call("cuMemcpyDtoDAsync", other.ptr, src.ptr, nbytes, 0),
           "copy(x, dst)": lambda: ex.copy(src, dst),
           "copy(x, other)": lambda: ex.copy(src, other),
           "prepared(x, dst)": prepared,
           "copy(x)": lambda: ex.copy(src),
           "copy(x) two alive": alternating,
           "tf.empty alone": lambda: tf.empty((n, n), "float32")}
    if torch is not None:
        tx = torch.randn(n, n, device="cuda")
        ty = torch.empty_like(tx)
        fns["torch clone"] = lambda: tx.clone()
        fns["torch copy_"] = lambda: ty.copy_(tx)
        fns["copy(torch x)"] = lambda: ex.copy(tx)
        fns["copy(torch x, y)"] = lambda: ex.copy(tx, ty)
    # The same cases in three orders and with more warm-up: is a case slow because of what
    # was timed just before it (the SMs idle while the copy engine runs cuMemcpyDtoD)?
    names = list(fns)
    orders = {"as listed, warmup 3": (names, 3), "reversed, warmup 3": (names[:1] + names[:0:-1], 3),
              "as listed, warmup 12": (names, 12)}
    for title, (order, warmup) in orders.items():
        got = bench.rounds({k: fns[k] for k in order}, repeats=repeats, batch=16, warmup=0, settle=warmup, rotate=True).samples
        base = got["memcpy"]
        print(f"-- {title}")
        print(f"{'case':24s} {'us/call':>9s} {'GB/s':>8s} {'vs memcpy':>9s}")
        for name, samples in got.items():
            secs = statistics.median(samples)
            ratio = statistics.median(m / t for m, t in zip(base, samples))
            print(f"{name:24s} {secs * 1e6:9.1f} {2 * nbytes / secs / 1e9:8.1f} {ratio:9.3f}")
    print("addresses: dst", hex(dst.ptr), "other", hex(other.ptr), "copy(x) out", hex(ex.copy(src).ptr))


if __name__ == "__main__":
    main()
