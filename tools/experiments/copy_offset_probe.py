"""Is the 1 GiB tile copy's speed a property of where its buffers lie? (the copy measured 0.93
or 0.96 of cuMemcpyDtoD depending on which buffers it was given, not on warm-up.)

Carves the source and the destination out of one 3 GiB block at offsets that step by 2 MB and
by powers of two, and times ``kernels.copy`` and cuMemcpyDtoD on each pair in turns.

    PYTHONPATH=. python3 tools/experiments/copy_offset_probe.py [--host-walls | --bench-like | --allocating | --destinations] [--torch]
"""
from __future__ import annotations

import statistics
import sys

import numpy as np

import tmaflow as tf
from tmaflow import bench
from tmaflow.kernels import examples as ex

MB = 1 << 20


def main(n: int = 16384, repeats: int = 5, random_data: bool = False):
    nbytes = n * n * 4
    block = tf.empty(3 * 1024 * MB + 64 * MB, "uint8").fill_bytes(7)
    base = (block.ptr + 2 * MB - 1) // (2 * MB) * (2 * MB)

    def view(off):
        return tf.DeviceArray(base + off, (n, n), "float32", owner=block)

    src = view(0)
    if random_data:  # the bench's input: random floats, not one repeated byte
        src.copy_from(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32))
    gaps = [1024 * MB + k * 2 * MB for k in range(0, 9)] + [1024 * MB + (1 << s) for s in range(21, 30)]
    print(f"src {hex(src.ptr)}; dst = src + gap")
    print(f"{'gap (MB)':>10s} {'copy us':>9s} {'memcpy us':>10s} {'ratio':>7s}")
    for gap in sorted(set(gaps)):
        dst = view(gap)
        fns = {"memcpy": lambda: bench.cuda_call("cuMemcpyDtoDAsync", dst.ptr, src.ptr, nbytes, 0),
               "copy": lambda: ex.copy(src, dst)}
        got = bench.rounds(fns, repeats=repeats, batch=8, warmup=0, settle=2, rotate=True).samples
        ratio = statistics.median(m / t for m, t in zip(got["memcpy"], got["copy"]))
        print(f"{gap / MB:10.1f} {statistics.median(got['copy']) * 1e6:9.1f} "
              f"{statistics.median(got['memcpy']) * 1e6:10.1f} {ratio:7.3f}", flush=True)




def pairs(n: int = 16384, count: int = 5, repeats: int = 5):
    """Every (source, destination) pair among ``count`` separately allocated 1 GiB arrays."""
    nbytes = n * n * 4
    rng = np.random.default_rng(0)
    arrays = [tf.from_numpy(rng.standard_normal((n, n), dtype=np.float32)) for _ in range(count)]
    print("arrays:", " ".join(hex(a.ptr) for a in arrays))
    print("ratio to cuMemcpyDtoD, row = source, column = destination")
    for i, src in enumerate(arrays):
        row = []
        for j, dst in enumerate(arrays):
            if i == j:
                row.append("   -  ")
                continue
            fns = {"memcpy": lambda: bench.cuda_call("cuMemcpyDtoDAsync", dst.ptr, src.ptr, nbytes, 0),
                   "copy": lambda: ex.copy(src, dst)}
            got = bench.rounds(fns, repeats=repeats, batch=8, warmup=0, settle=2, rotate=True).samples
            row.append(f"{statistics.median(m / t for m, t in zip(got['memcpy'], got['copy'])):6.3f}")
        fns = {"memcpy": lambda: bench.cuda_call("cuMemcpyDtoDAsync", arrays[i - 1].ptr, src.ptr, nbytes, 0),
               "copy(x)": lambda: ex.copy(src)}
        got = bench.rounds(fns, repeats=repeats, batch=8, warmup=0, settle=2, rotate=True).samples
        row.append(f" alloc {statistics.median(m / t for m, t in zip(got['memcpy'], got['copy(x)'])):6.3f}")
        print(f"{i}: " + " ".join(row), flush=True)


def destinations(n: int = 16384, count: int = 10, repeats: int = 5):
    """One source, ``count`` separately allocated destinations in allocation order; the same
    destination's memcpy is the reference, so a slow block is slow for the kernel alone."""
    nbytes = n * n * 4
    src = tf.from_numpy(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32))
    dsts = [tf.empty((n, n), "float32") for _ in range(count)]
    for j, dst in enumerate(dsts):
        fns = {"memcpy": lambda: bench.cuda_call("cuMemcpyDtoDAsync", dst.ptr, src.ptr, nbytes, 0),
               "copy": lambda: ex.copy(src, dst)}
        got = bench.rounds(fns, repeats=repeats, batch=8, warmup=0, settle=2, rotate=True).samples
        print(f"dst {j} {hex(dst.ptr)} memcpy {statistics.median(got['memcpy']) * 1e6:7.1f} us  copy "
              f"{statistics.median(got['copy']) * 1e6:7.1f} us  ratio "
              f"{statistics.median(m / t for m, t in zip(got['memcpy'], got['copy'])):6.3f}", flush=True)


def allocating(n: int = 16384, repeats: int = 7):
    """The allocating call against the same kernel into a given output, and the steps between."""
    nbytes = n * n * 4
    src = tf.from_numpy(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32))
    dst = tf.empty((n, n), "float32")
    pool = tf.current_device().memory_pool()
    calls = {"alloc": 0}
    real = pool.allocate

    def counting(size, stream):
        calls["alloc"] += 1
        return real(size, stream)

    pool.allocate = counting
    prepared = ex.copy.prepare(src)
    fns = {"memcpy": lambda: bench.cuda_call("cuMemcpyDtoDAsync", dst.ptr, src.ptr, nbytes, 0),
           "copy(x, dst)": lambda: ex.copy(src, dst),
           "copy(x)": lambda: ex.copy(src),
           "copy(x, tf.empty())": lambda: ex.copy(src, tf.empty((n, n), "float32")),
           "prepared copy(x)": prepared}
    for batch in (1, 8):
        got = bench.rounds(fns, repeats=repeats, batch=batch, warmup=0, settle=2, rotate=True).samples
        for name, samples in got.items():
            print(f"batch {batch} {name:22s} {statistics.median(samples) * 1e6:7.1f} us  ratio "
                  f"{statistics.median(m / t for m, t in zip(got['memcpy'], samples)):6.3f}", flush=True)
    print("allocations:", calls, "cached bytes", pool.cached_bytes, "dst", hex(dst.ptr),
          "allocated", hex(ex.copy(src).ptr), "prepared", hex(prepared.out.ptr))


def bench_like(n: int = 16384, repeats: int = 10):
    """The bench's order: a memcpy measured on two 1 GiB blocks that are then freed, the source
    and destination drawn from the block cache, the allocating call's output from the pool."""

    nbytes = n * n * 4
    bench.memcpy_bandwidth(nbytes, 3)
    src = tf.from_numpy(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32))
    dst = tf.empty((n, n), "float32")
    prepared = ex.copy.prepare(src)
    turn, state = (dst, prepared.out), [0]

    def flip():
        state[0] ^= 1
        return state[0]
    cases = {"memcpy": lambda: bench.cuda_call("cuMemcpyDtoDAsync", dst.ptr, src.ptr, nbytes, 0),
             "into": lambda: ex.copy(src, dst), "alloc": lambda: ex.copy(src),
             "into prepared.out": lambda: ex.copy(src, prepared.out),
             "into dst, other alternating": lambda: ex.copy(src, turn[0] if flip() else turn[1])}
    # The same cases in rotated orders: is a case slow because of its place in the round
    # (right after the memcpys, while the SMs were idle)?
    names = list(cases)[1:]
    for shift in range(len(names)):
        order = ["memcpy"] + names[shift:] + names[:shift]
        got = bench.rounds({k: cases[k] for k in order}, repeats=repeats, batch=16, warmup=0, settle=3, rotate=True).samples
        print("order:", " | ".join(
            f"{k} {statistics.median(m / t for m, t in zip(got['memcpy'], got[k])):.3f}"
            for k in order[1:]), flush=True)
    print("allocating outputs in turn:", [hex(ex.copy(src).ptr) for _ in range(4)])
    print("src", hex(src.ptr), "dst", hex(dst.ptr), "allocated", hex(ex.copy(src).ptr),
          "prepared", hex(prepared.out.ptr))


def host_walls(n: int = 16384):
    """Host wall time of each call in a loop without synchronising: a call that waits for the
    GPU shows the kernel's time instead of microseconds."""
    import time

    bench.memcpy_bandwidth(n * n * 4, 3)
    src = tf.from_numpy(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32))
    dst = tf.empty((n, n), "float32")
    cu = bench.cuda_driver()
    counts: dict = {}
    for fname in [f for f in dir(cu) if f.startswith("cu") and not isinstance(getattr(cu, f), type) and callable(getattr(cu, f))]:
        real = getattr(cu, fname)

        def counted(*a, _real=real, _name=fname):
            counts[_name] = counts.get(_name, 0) + 1
            return _real(*a)
        setattr(cu, fname, counted)
    for name, fn in (("into", lambda: ex.copy(src, dst)), ("alloc", lambda: ex.copy(src))):
        fn()
        bench.cuda_call("cuCtxSynchronize")
        walls = []
        counts.clear()
        for _ in range(12):
            t0 = time.perf_counter()
            fn()
            walls.append((time.perf_counter() - t0) * 1e6)
        print(name, "driver calls in 12 calls:", counts)
        bench.cuda_call("cuCtxSynchronize")
        print(name, "host us per call:", " ".join(f"{w:.0f}" for w in walls), flush=True)


if __name__ == "__main__":
    if "--torch" in sys.argv:
        import torch  # noqa: F401 - as the bench process has it (before the driver is touched)
    if "--host-walls" in sys.argv:
        host_walls()
    elif "--bench-like" in sys.argv:
        bench_like()
    elif "--allocating" in sys.argv:
        allocating()
    elif "--destinations" in sys.argv:
        destinations()
    elif "--pairs" in sys.argv:
        pairs()
    else:
        main(random_data="--random" in sys.argv)
