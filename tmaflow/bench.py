"""Benchmarks behind ``python -m tmaflow bench`` and ``tools/``: every figure is a median over
repeats, reported with its ratio to a ceiling or peer measured in the same run."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap
import time

import numpy as np

from .runtime import driver
from .runtime.device import current_device
from .runtime.memory import empty, from_numpy

GiB = 1 << 30


class Timer:
    """CUDA events around a region on the default stream."""

    def __init__(self):
        cu = driver.cu()
        current_device()  # the events belong to the current device's context
        self.start = driver.call("cuEventCreate", 0)
        self.stop = driver.call("cuEventCreate", 0)
        self._cu = cu

    def time(self, fn, repeats: int = 10, warmup: int = 2, batch: int = 1) -> float:
        """Median seconds of ``fn()`` over ``repeats``. With ``batch`` > 1 each sample times that
        many calls back to back, so host work between calls overlaps the GPU's as in a loop."""
        for _ in range(warmup):
            fn()
        driver.call("cuCtxSynchronize")
        samples = []
        for _ in range(repeats):
            driver.call("cuEventRecord", self.start, 0)
            for _ in range(batch):
                fn()
            driver.call("cuEventRecord", self.stop, 0)
            driver.call("cuEventSynchronize", self.stop)
            samples.append(driver.call("cuEventElapsedTime", self.start, self.stop) / 1e3 / batch)
        return statistics.median(samples)

    def close(self) -> None:
        """Destroy the two events."""
        for event in (self.start, self.stop):
            if event is not None:
                driver.call("cuEventDestroy", event)
        self.start = self.stop = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def paired(self, fns: dict, repeats: int = 10, batch: int = 1, warmup: int = 3) -> dict:
        """Seconds per call of each function, sampled in turns (one sample of each per round,
        so clock drift hits all alike). Each sample follows ``warmup`` untimed calls of the same
        function: it starts from that function's own steady state (caches, allocations), not
        from the previous function's dirty L2 lines (a copy timed right after a 1 GiB memcpy
        measured 3% slower than in a loop of its own).

        The order rotates every round, so each function takes each place in the round equally
        often; neighbours stay neighbours. A case can depend on its predecessor (a 1 GiB copy
        right after memcpys into another block measured 3% slower, H200,
        ``tools/copy_offset_probe.py --bench-like``), so list each reference right before its
        case."""
        got = {name: [] for name in fns}
        names = list(fns)
        for r in range(repeats):
            shift = r % len(names) if names else 0
            for name in names[shift:] + names[:shift]:
                got[name].append(self.time(fns[name], repeats=1, warmup=warmup, batch=batch))
        return got


def _same_block(out, block: int) -> None:
    if out.ptr != block:  # the reference memcpy would be writing somewhere else
        raise RuntimeError(f"the allocating copy got block {out.ptr:#x}, not the cached {block:#x}")


def _random_device(shape, dtype):
    rng = np.random.default_rng()
    if dtype == "float32":
        return from_numpy(rng.standard_normal(shape, dtype=np.float32))
    return from_numpy(rng.integers(0, 2**16, size=shape, dtype=np.uint16), dtype=dtype)


def memcpy_bandwidth(nbytes: int, timer: Timer, repeats: int) -> float:
    a, b = empty(nbytes, "uint8").fill_bytes(1), empty(nbytes, "uint8")
    t = timer.time(lambda: driver.call("cuMemcpyDtoDAsync", b.ptr, a.ptr, nbytes, 0), repeats)
    a.free(), b.free()
    return 2 * nbytes / t  # bytes read + written


def bandwidth_suite(repeats: int = 10, quick: bool = False) -> list[dict]:
    with Timer() as timer:
        return _bandwidth_rows(timer, repeats, quick)


def _bandwidth_rows(timer: "Timer", repeats: int, quick: bool) -> list[dict]:
    from .kernels import examples as ex

    size = GiB // (8 if quick else 1)
    rows = []
    ceiling = memcpy_bandwidth(size, timer, repeats)
    rows.append({"kernel": "cuMemcpyDtoD", "shape": f"{size >> 20} MiB", "GB/s": ceiling / 1e9,
                 "ratio": 1.0, "ok": True})

    def add(name, shape, seconds, nbytes, ok=True, **extra):
        bw = nbytes / seconds
        rows.append({"kernel": name, "shape": shape, "GB/s": bw / 1e9, "ratio": bw / ceiling,
                     "ok": ok, **extra})

    for dtype in ("float32", "bfloat16"):
        item = 4 if dtype == "float32" else 2
        n = int(np.sqrt(size // item)) // 256 * 256
        shape = (n, n)
        src, dst = _random_device(shape, dtype), empty(shape, dtype)
        best = None
        rows_32k = 32 * 4 // item  # rows of a 32 KB box
        for box, stages, per_sm, l2, stores in (((rows_32k, 256), 6, 1, "none", 1),
                                                ((rows_32k, 256), 6, 1, "none", 2),
                                                ((rows_32k, 256), 6, 1, "none", 3),
                                                ((2 * rows_32k, 256), 3, 1, "none", 1),
                                                ((2 * rows_32k, 256), 3, 1, "none", 2),
                                                ((rows_32k, 256), 3, 2, "none", 1),
                                                ((2 * rows_32k, 256), 3, 1, "256B", 1)):
            for flatten, evict in ((False, False), (True, False), (False, True), (True, True)):
                run = ex.copy.prepare(src, dst, box=box, stages=stages, ctas_per_sm=per_sm,
                                            l2_promotion=l2, flatten=flatten, evict_first=evict,
                                            stores=stores)
                t = timer.time(run, repeats)
                if best is None or t < best[0]:
                    best = (t, f"box {box} x {stages} stages, {stores} store(s) in flight, "
                               f"{per_sm} CTA/SM, L2 promotion {l2}"
                               f"{', flattened' if flatten else ''}{', evict-first' if evict else ''}")
        step = max(1, n // 64)
        ok = np.array_equal(dst.numpy()[::step].view(np.uint8), src.numpy()[::step].view(np.uint8))
        add(f"tile_copy {dtype}", f"{n}x{n}", best[0], 2 * n * n * item, ok, config=best[1])
        # what a user gets: kernels.copy(x) with every argument left at its default, the
        # output allocated by the call (from the pool) and dropped after it. Each case takes
        # turns with a memcpy of the same bytes into the same destination, right before it: a
        # copy into a block other than the memcpy's measured 0.93-0.94 for the 19 calls after
        # the memcpys and 0.965 later (tools/copy_offset_probe.py --bench-like), whichever way
        # the block was allocated. The allocating call gets the same block back every time
        # (the pool's block cache), so its reference memcpy writes that block.
        dst.fill_bytes(0)
        nbytes = n * n * item
        y = ex.copy(src)
        block = y.ptr
        alloc_ok = np.array_equal(y.numpy()[::step].view(np.uint8), src.numpy()[::step].view(np.uint8))
        del y  # back to the block cache: the next allocating call gets it
        got = timer.paired({"memcpy": lambda: driver.call("cuMemcpyDtoDAsync", dst.ptr, src.ptr, nbytes, 0),
                            "into": lambda: ex.copy(src, dst),
                            "memcpy to the allocated block": lambda: driver.call(
                                "cuMemcpyDtoDAsync", block, src.ptr, nbytes, 0),
                            "alloc": lambda: _same_block(ex.copy(src), block)},
                           repeats=repeats, batch=16)
        ok = np.array_equal(dst.numpy()[::step].view(np.uint8), src.numpy()[::step].view(np.uint8))
        for label, name, ref, good in (
                (f"kernels.copy(x) {dtype}, defaults", "alloc", "memcpy to the allocated block", alloc_ok),
                (f"kernels.copy(x, out) {dtype}, defaults", "into", "memcpy", ok)):
            secs = statistics.median(got[name])
            ratio = statistics.median(m / t for m, t in zip(got[ref], got[name]))
            rows.append({"kernel": label, "shape": f"{n}x{n}", "GB/s": 2 * nbytes / secs / 1e9,
                         "ratio": ratio, "ok": good,
                         "note": "ratio to cuMemcpyDtoD into the same destination: paired samples "
                                 "of 16 calls, each after 3 of its own"})
        src.free(), dst.free()

    n = int(np.sqrt(size // 4)) // 128 * 128
    a, o = _random_device((n, n), "float32"), empty((n, n), "float32")
    run = ex.transpose.prepare(a, o)
    t = timer.time(run, repeats)
    ok = np.array_equal(o.numpy()[:64, :64], a.numpy()[:64, :64].T)
    add("transpose fp32 (128B swizzle)", f"{n}x{n}", t, 2 * n * n * 4, ok)
    a.free(), o.free()

    cols = 4096
    m = size // (cols * 4)
    x, y = _random_device((m, cols), "float32"), empty((m, cols), "float32")
    run = ex.softmax.prepare(x, y)
    t = timer.time(run, repeats)
    xs = x.numpy()[:8].astype(np.float64)
    ref = np.exp(xs - xs.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    ok = bool(np.allclose(y.numpy()[:8], ref, rtol=1e-4, atol=1e-7))
    add("softmax fp32 (TMA rows)", f"{m}x{cols}", t, 2 * m * cols * 4, ok)
    x.free(), y.free()

    n = size // 4 // 4096 * 4096
    x, y = _random_device((n,), "float32"), empty((n,), "float32")
    for method in ("ldgsts", "tma"):
        run = ex.axpb.prepare(x, 2.0, 1.0, y, method=method)
        t = timer.time(run, repeats)
        ok = bool(np.allclose(y.numpy()[:4096], 2.0 * x.numpy()[:4096] + 1.0))
        add(f"axpb ({method})", f"{n}", t, 2 * n * 4, ok)
    x.free(), y.free()

    # Broadcast-heavy: CTAs read the same tiles. "all": every CTA reads one 8 MB w (the L2
    # serves identical lines to every SM at once); "pairs"/"quads": each group of 2 / 4 CTAs
    # cycles through 256 KB of its own (33 MB in all, L2-resident), as GEMM operands are
    # shared. Multicast (cluster = group) loads each tile once per cluster; each figure is
    # compared with cluster=1 of the same data and configuration.
    dev = current_device()
    from .kernels.examples import broadcast_reference

    blocks = dev.sm_count // 4 * 4 * 2
    xb = _random_device((blocks * 32, 256), "float32")
    for label, group, wtiles, sparse in (("all", None, 256, 1), ("pairs", 2, blocks // 2 * 8, 1),
                                         ("all, 1/8 read", None, 256, 8),
                                         ("pairs, 1/8 read", 2, blocks // 2 * 8, 8),
                                         ("quads, 1/8 read", 4, blocks // 4 * 8, 8)):
        wb = _random_device((wtiles * 32, 256), "float32")
        ob = empty((blocks * 32, 256), "float32")
        iters = 256
        best = {}
        for stages in (4, 6):
            base_t = None
            for cluster in sorted({1, group or 2, 4 if group is None else group}):
                run = (ex.broadcast_scale.prepare(xb, wb, ob, cluster=cluster, stages=stages,
                                                       group_size=group, iters=iters,
                                                       sparse=sparse))
                t = timer.time(run, repeats)
                base_t = base_t or t
                if cluster not in best or base_t / t > best[cluster][0]:
                    best[cluster] = (base_t / t, t, stages)
        ref = broadcast_reference(xb.numpy(), wb.numpy(), group_size=group, iters=iters, only=4,
                                  sparse=sparse)
        ok = bool(np.allclose(ob.numpy()[:32 * 4], ref, rtol=1e-4, atol=1e-2))
        logical = blocks * iters * 32 * 256 * 4
        for cluster, (ratio, t, stages) in sorted(best.items()):
            rows.append({"kernel": f"broadcast {label} cluster={cluster}", "shape": f"{blocks} CTAs",
                         "GB/s": logical / t / 1e9, "ratio": ratio, "ok": ok,
                         "config": f"{stages} stages", "note": "ratio = speed-up over cluster=1"})
        wb.free(), ob.free()
    xb.free()
    return rows


def _per_call(fn, n: int) -> float:
    """Seconds per call of ``fn`` over ``n`` calls, the queued GPU work included (host-bound
    when the work is small: what a user's loop sees)."""
    driver.call("cuCtxSynchronize")
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    driver.call("cuCtxSynchronize")
    return (time.perf_counter() - t0) / n


def _interleaved(cases: dict, n: int, rounds: int) -> dict:
    """Seconds per call of each case in every round, the cases taking turns in each round
    (so drift in clocks or load hits them alike). The process is pinned to one CPU meanwhile:
    host-bound timings otherwise move with scheduler migrations."""
    samples = {name: [] for name in cases}
    for name, fn in cases.items():  # warm up: compile, plan, generate the fast paths
        for _ in range(3):
            fn()
    pinned = hasattr(os, "sched_setaffinity")
    if pinned:
        allowed = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(allowed)})
    try:
        for _ in range(rounds):
            for name, fn in cases.items():
                samples[name].append(_per_call(fn, n))
    finally:
        if pinned:
            os.sched_setaffinity(0, allowed)
    return samples


def _row(path: str, samples: dict, name: str, ref: str, label: str | None = None) -> dict:
    """Median time of ``name`` and the median of its per-round ratios to ``ref``."""
    ratios = [a / b for a, b in zip(samples[name], samples[ref])]
    return {"path": path, "us": statistics.median(samples[name]) * 1e6,
            "ref": label or f"{ref} {statistics.median(samples[ref]) * 1e6:.2f} us",
            "ratio": statistics.median(ratios)}


def launch_paths(n: int = 5000, rounds: int = 15) -> list[dict]:
    """Host cost per launch on every path users take, each against its reference in the same
    interleaved rounds: raw ``cuLaunchKernelEx`` with pre-packed arguments for the launch
    paths (same kernel: two tensor maps and three scalars, or three pointers and two scalars),
    the torch operation for the entry points."""
    from .launch.kernel import Kernel
    from .kernels import examples as ex
    from .kernels import gemm
    from .kernels import source
    from .tma.tensormap import TensorMap

    rows = []
    cu = driver.cu()
    k = Kernel(source("bench"), "empty_kernel", filename="bench.cu")
    a = empty((256, 256), "float32")
    ta, tb = TensorMap.tiled(a, (32, 32)), TensorMap.tiled(a, (64, 64))
    bound = k.bind(grid=1, block=32)
    raw_params = bound.packer.__class__(bound.module.params)  # owns the buffer: keep it
    kp = raw_params.pack((ta, tb, 1, 2.0, 3))
    cfg, fn, launch = bound.cu_config(0), bound.module.function, cu.cuLaunchKernelEx
    raw = lambda: launch(cfg, fn, kp, 0)  # noqa: E731

    def after_free():
        tmp = empty((64,), "float32")
        tmp.free()
        bound(ta, tb, 1, 2.0, 3)

    def free_only():
        tmp = empty((64,), "float32")
        tmp.free()

    def raw_after_free():
        tmp = empty((64,), "float32")
        tmp.free()
        launch(cfg, fn, kp, 0)

    cases = {"raw": raw, "bound, tf arrays": lambda: bound(ta, tb, 1, 2.0, 3),
             "launch, tf arrays": lambda: k.launch(ta, tb, 1, 2.0, 3, grid=1, block=32),
             "bound after a free": after_free, "(raw after a free)": raw_after_free,
             "(alloc + free alone)": free_only}
    # pointers: the axpb kernel takes (x, out, a, b, n)
    kp_ptr = Kernel(source("axpb"), "axpb_tma", filename="axpb.cu")
    x, y = empty((4096,), "float32"), empty((4096,), "float32")
    bound_ptr = kp_ptr.bind(grid=1, block=256)
    ptr_params = bound_ptr.packer.__class__(bound_ptr.module.params)  # owns the buffer: keep it
    packed = ptr_params.pack((x, y, 2.0, 1.0, 4096))
    cfg_p, fn_p = bound_ptr.cu_config(0), bound_ptr.module.function
    cases["raw (pointers)"] = lambda: launch(cfg_p, fn_p, packed, 0)
    cases["bound, tf pointers"] = lambda: bound_ptr(x, y, 2.0, 1.0, 4096)
    torch = cupy = None
    try:
        import torch
    except ImportError:
        pass
    if torch is not None:
        tx, tyy = torch.empty(4096, device="cuda"), torch.empty(4096, device="cuda")
        t2d = torch.empty((256, 256), device="cuda")
        tta, ttb = TensorMap.tiled(t2d, (32, 32)), TensorMap.tiled(t2d, (64, 64))
        cases["bound, torch pointers"] = lambda: bound_ptr(tx, tyy, 2.0, 1.0, 4096)
        cases["launch, torch pointers"] = lambda: kp_ptr.launch(tx, tyy, 2.0, 1.0, 4096, grid=1, block=256)
        cases["bound, torch tensor maps"] = lambda: bound(tta, ttb, 1, 2.0, 3)
        cases["launch, torch tensor maps"] = lambda: k.launch(tta, ttb, 1, 2.0, 3, grid=1, block=32)
    try:
        import cupy
    except ImportError:
        pass
    if cupy is not None:
        cx, cy = cupy.empty(4096, dtype=cupy.float32), cupy.empty(4096, dtype=cupy.float32)
        cases["bound, cupy pointers"] = lambda: bound_ptr(cx, cy, 2.0, 1.0, 4096)
    got = _interleaved(cases, n, rounds)
    for name in cases:
        if name.startswith("(") or name.startswith("raw") or name == "bound after a free":
            continue
        rows.append(_row(name, got, name, "raw (pointers)" if "pointers" in name else "raw"))
    # a launch right after a free: (alloc + free + launch) - (alloc + free), per round, against
    # raw launches timed the same way (the driver's own launch is slower right after a free)
    free = got["(alloc + free alone)"]
    got["bound right after a free"] = [a - f for a, f in zip(got["bound after a free"], free)]
    got["raw right after a free"] = [a - f for a, f in zip(got["(raw after a free)"], free)]
    rows.append(_row("bound right after a free", got, "bound right after a free", "raw"))
    rows.append(_row("bound right after a free", got, "bound right after a free",
                     "raw right after a free"))
    if torch is None:
        return rows

    # entry points against their torch counterparts, small problems where the host dominates
    xs = torch.randn(64, 1024, device="cuda")
    ys = torch.empty_like(xs)
    big = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    cbig = torch.empty(256, 256, device="cuda", dtype=torch.bfloat16)
    xtf, ytf = from_numpy(np.random.default_rng().standard_normal((64, 1024), dtype=np.float32)), empty((64, 1024))
    pairs = {
        "softmax 64x1024 torch, allocating": (lambda: ex.softmax(xs), lambda: torch.softmax(xs, -1)),
        "softmax 64x1024 torch, out given": (lambda: ex.softmax(xs, ys), lambda: torch.softmax(xs, -1)),
        "softmax 64x1024 tf arrays, allocating": (lambda: ex.softmax(xtf), lambda: torch.softmax(xs, -1)),
        "softmax 64x1024 tf arrays, out given": (lambda: ex.softmax(xtf, ytf), lambda: torch.softmax(xs, -1)),
        "copy 64x1024 torch, allocating": (lambda: ex.copy(xs), lambda: xs.clone()),
        "copy 64x1024 torch, out given": (lambda: ex.copy(xs, ys), lambda: ys.copy_(xs)),
        "gemm 256^3 torch, allocating": (lambda: gemm(big, big), lambda: torch.matmul(big, big.T)),
        "gemm 256^3 torch, out given": (lambda: gemm(big, big, cbig), lambda: torch.matmul(big, big.T, out=cbig)),
    }
    cases = {}
    for name, (ours, theirs) in pairs.items():
        cases[name] = ours
        cases[name + " [torch]"] = theirs
    got = _interleaved(cases, max(1, n // 5), rounds)
    for name in pairs:
        rows.append(_row(name, got, name, name + " [torch]",
                         f"torch {statistics.median(got[name + ' [torch]']) * 1e6:.2f} us"))
    return rows


def format_launch(rows: list[dict]) -> str:
    from .launch import native

    lines = [f"launches take the {native.status()}",
             f"{'launch path (ratio: median of per-round ratios)':40s} {'us/call':>8s} {'ratio':>7s}  reference"]
    for r in rows:
        lines.append(f"{r['path']:40s} {r['us']:8.2f} {r['ratio']:7.3f}  {r['ref']}")
    return "\n".join(lines)


def dependent_chains(repeats: int = 30) -> list[dict]:
    """Chains of small dependent kernels with programmatic dependent launch against without,
    in the same rounds: eight 1 MB copies (x0 -> x1 -> ... -> x8) and four decode-sized
    softmax -> gemm pairs. Each chain is timed on the GPU alone: queued behind a spin kernel
    (the host enqueues it meanwhile), launched eagerly and as a replayed tf.Graph."""
    from .runtime.graph import Graph
    from .launch.kernel import Kernel
    from .kernels import examples as ex
    from .kernels import gemm
    from .kernels import source

    spin = Kernel(source("bench"), "spin", filename="bench.cu").bind(grid=1, block=32)
    rng = np.random.default_rng()
    xs = [from_numpy(rng.standard_normal((512, 512), dtype=np.float32))]
    xs += [empty((512, 512), "float32") for _ in range(8)]
    sx = from_numpy(rng.standard_normal((16, 4096), dtype=np.float32))
    sy = empty((16, 4096), "float32")
    a = from_numpy(rng.integers(0, 2**16, (16, 4096), dtype=np.uint16) & 0x3FFF, "bfloat16")
    b = from_numpy(rng.integers(0, 2**16, (4096, 4096), dtype=np.uint16) & 0x3FFF, "bfloat16")
    cs = [empty((16, 4096), "bfloat16") for _ in range(4)]

    def copies(pdl):
        for i in range(8):
            ex.copy(xs[i], xs[i + 1], pdl=pdl)

    def decode(pdl):
        for c in cs:
            ex.softmax(sx, sy, pdl=pdl)
            gemm(a, b, c, pdl=pdl)

    chains = {"8 copies of 1 MB": (copies, lambda: (xs[8].numpy(), xs[0].numpy())),
              "4 x (softmax 16x4096 -> gemm 16x4096x4096)": (decode, lambda: (sy.numpy(), cs[3].numpy()))}
    start, stop = driver.call("cuEventCreate", 0), driver.call("cuEventCreate", 0)

    def queued(run):  # seconds of GPU time for one run, enqueued during a 400 us spin
        spin(400_000)
        driver.call("cuEventRecord", start, 0)
        run()
        driver.call("cuEventRecord", stop, 0)
        driver.call("cuEventSynchronize", stop)
        return driver.call("cuEventElapsedTime", start, stop) / 1e3

    rows = []
    for name, (chain, result) in chains.items():
        outputs, graphs, cases = {}, {}, {}
        for pdl in (False, True):
            chain(pdl)  # warm: compiled, prepared, workspaces made
            driver.call("cuCtxSynchronize")
            outputs[pdl] = result()
            g = graphs[pdl] = Graph()
            with g.capture():
                chain(pdl)
            cases[("eager", pdl)] = lambda pdl=pdl: chain(pdl)
            cases[("graph", pdl)] = g.replay
        got = {key: [] for key in cases}
        for _ in range(repeats):
            for key, run in cases.items():
                got[key].append(queued(run))
        same = all(np.array_equal(x, y) for x, y in zip(outputs[False], outputs[True]))
        if name.startswith("8 copies"):  # and the chain copied x0 through
            same = same and np.array_equal(outputs[True][0], outputs[True][1])
        for how in ("eager", "graph"):
            plain, pdl = got[(how, False)], got[(how, True)]
            rows.append({"chain": name, "how": how, "plain_us": statistics.median(plain) * 1e6,
                         "pdl_us": statistics.median(pdl) * 1e6,
                         "speedup": statistics.median(p / q for p, q in zip(plain, pdl)),
                         "identical": bool(same)})
        for g in graphs.values():
            g.close()
    for event in (start, stop):
        driver.call("cuEventDestroy", event)
    return rows


def format_chains(rows: list[dict]) -> str:
    lines = [f"{'dependent chain (GPU time, behind a spin)':46s} {'how':6s} {'plain us':>9s} "
             f"{'pdl us':>8s} {'speed-up':>8s}  identical"]
    for r in rows:
        lines.append(f"{r['chain']:46s} {r['how']:6s} {r['plain_us']:9.1f} {r['pdl_us']:8.1f} "
                     f"{r['speedup']:8.3f}  {'yes' if r['identical'] else 'NO'}")
    return "\n".join(lines)


def encode_cost(n: int = 50000) -> dict:
    from .tma.tensormap import TensorMap, encode

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
    from .launch.kernel import Kernel
    from .kernels import source

    os.environ["TMAFLOW_CACHE_DIR"] = tmpdir
    Kernel(source("bench"), "cluster_probe", options=(tag,)).cubin
    t0 = time.perf_counter()
    Kernel(source("bench"), "cluster_probe", options=(tag,)).cubin
    mem = time.perf_counter() - t0
    return {"cold_s": cold, "cold_was": how_cold, "disk_hit_new_process_s": disk,
            "disk_was": how_disk, "memory_hit_ms": mem * 1e3}


def format_table(rows: list[dict]) -> str:
    lines = [f"{'kernel':34s} {'shape':24s} {'GB/s':>9s} {'ratio':>7s}  ok"]
    for r in rows:
        lines.append(f"{r['kernel']:34s} {r['shape']:24s} {r['GB/s']:9.1f} {r['ratio']:7.3f}  "
                     f"{'yes' if r['ok'] else 'NO'}" + (f"  ({r['config']})" if r.get("config") else "")
                     + (f"  [{r['note']}]" if r.get("note") else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse
    import tempfile

    p = argparse.ArgumentParser(prog="tmaflow bench")
    p.add_argument("--json", help="write all results to this file")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="128 MiB problems instead of 1 GiB")
    p.add_argument("--only", choices=["bandwidth", "launch", "chains", "encode", "compile"], nargs="*")
    args = p.parse_args(argv)
    try:  # torch (the peer of several rows) imports cleanly only before the driver is touched
        import torch  # noqa: F401
    except Exception:
        pass
    if not driver.driver_available():
        print("tmaflow bench: no CUDA driver here; benchmarks need a Hopper GPU.")
        return 1
    dev = current_device()
    only = set(args.only or ["bandwidth", "launch", "chains", "encode", "compile"])
    report = {"device": dev.name, "driver": driver.call("cuDriverGetVersion"),
              "sms": dev.sm_count}
    if "launch" in only:
        report["launch"] = launch_paths()
        print(format_launch(report["launch"]))
    if "chains" in only:
        report["chains"] = dependent_chains()
        print(format_chains(report["chains"]))
    if "encode" in only:
        report["encode"] = encode_cost()
        print("tensor map encode:", json.dumps(report["encode"]))
    if "compile" in only:
        with tempfile.TemporaryDirectory() as tmp:
            report["compile"] = compile_times(tmp)
        print("compile:", json.dumps(report["compile"]))
    if "bandwidth" in only:
        report["bandwidth"] = bandwidth_suite(args.repeats, args.quick)
        print(format_table(report["bandwidth"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0
