"""Launch-path suite of ``python -m tmaflow bench``: host cost per launch on every path users
take, each against its reference (raw ``cuLaunchKernelEx``, or the torch operation) in the same
interleaved rounds."""
from __future__ import annotations

import importlib
import statistics
import types

import numpy as np

from ..kernels import examples
from ..kernels.matmul.dense import gemm
from ..kernels.registry import source
from ..launch.kernel import Kernel
from ..runtime.memory import empty, from_numpy
from ..tma.tensormap import TensorMap
from .internals import cuda_driver, native
from .timing import host_rounds


def _optional(name: str) -> types.ModuleType | None:
    """The module ``name``, or None where it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


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
    rows = []
    k = Kernel(source("bench"), "empty_kernel", filename="bench.cu")
    a = empty((256, 256), "float32")
    ta, tb = TensorMap.tiled(a, (32, 32)), TensorMap.tiled(a, (64, 64))
    bound = k.bind(grid=1, block=32)
    raw_params = bound.packer.__class__(bound.module.params)  # owns the buffer: keep it
    kp = raw_params.pack((ta, tb, 1, 2.0, 3))
    cfg, fn, launch = bound.cu_config(0), bound.module.function, cuda_driver().cuLaunchKernelEx
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
    torch = _optional("torch")
    if torch is not None:
        tx, tyy = torch.empty(4096, device="cuda"), torch.empty(4096, device="cuda")
        t2d = torch.empty((256, 256), device="cuda")
        tta, ttb = TensorMap.tiled(t2d, (32, 32)), TensorMap.tiled(t2d, (64, 64))
        cases["bound, torch pointers"] = lambda: bound_ptr(tx, tyy, 2.0, 1.0, 4096)
        cases["launch, torch pointers"] = lambda: kp_ptr.launch(tx, tyy, 2.0, 1.0, 4096, grid=1, block=256)
        cases["bound, torch tensor maps"] = lambda: bound(tta, ttb, 1, 2.0, 3)
        cases["launch, torch tensor maps"] = lambda: k.launch(tta, ttb, 1, 2.0, 3, grid=1, block=32)
    cupy = _optional("cupy")
    if cupy is not None:
        cx, cy = cupy.empty(4096, dtype=cupy.float32), cupy.empty(4096, dtype=cupy.float32)
        cases["bound, cupy pointers"] = lambda: bound_ptr(cx, cy, 2.0, 1.0, 4096)
    got = host_rounds(cases, calls=n, repeats=rounds).samples
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
        "softmax 64x1024 torch, allocating": (lambda: examples.softmax(xs), lambda: torch.softmax(xs, -1)),
        "softmax 64x1024 torch, out given": (lambda: examples.softmax(xs, ys), lambda: torch.softmax(xs, -1)),
        "softmax 64x1024 tf arrays, allocating": (lambda: examples.softmax(xtf), lambda: torch.softmax(xs, -1)),
        "softmax 64x1024 tf arrays, out given": (lambda: examples.softmax(xtf, ytf), lambda: torch.softmax(xs, -1)),
        "copy 64x1024 torch, allocating": (lambda: examples.copy(xs), lambda: xs.clone()),
        "copy 64x1024 torch, out given": (lambda: examples.copy(xs, ys), lambda: ys.copy_(xs)),
        "gemm 256^3 torch, allocating": (lambda: gemm(big, big), lambda: torch.matmul(big, big.T)),
        "gemm 256^3 torch, out given": (lambda: gemm(big, big, cbig), lambda: torch.matmul(big, big.T, out=cbig)),
    }
    cases = {}
    for name, (ours, theirs) in pairs.items():
        cases[name] = ours
        cases[name + " [torch]"] = theirs
    got = host_rounds(cases, calls=max(1, n // 5), repeats=rounds).samples
    for name in pairs:
        rows.append(_row(name, got, name, name + " [torch]",
                         f"torch {statistics.median(got[name + ' [torch]']) * 1e6:.2f} us"))
    return rows


def format_launch(rows: list[dict]) -> str:
    lines = [f"launches take the {native.status()}",
             f"{'launch path (ratio: median of per-round ratios)':40s} {'us/call':>8s} {'ratio':>7s}  reference"]
    for r in rows:
        lines.append(f"{r['path']:40s} {r['us']:8.2f} {r['ratio']:7.3f}  {r['ref']}")
    return "\n".join(lines)
