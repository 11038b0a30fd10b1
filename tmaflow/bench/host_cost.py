"""Host cost of the C launch path without a GPU (``tools/experiments/launch_host_cost.py`` is its
command line): ns per call of a launcher's C plan, and of ``Kernel.launch`` around it, for the
argument mixes of ``python -m tmaflow bench --only launch``, with the driver's
``cuLaunchKernelEx`` replaced by a C function that returns 0. The plan's checks, packing,
stream choice and GIL release are timed; only the driver's own work is not.

It runs as a process of its own (it puts torch and cupy stand-ins into ``sys.modules`` and
points ``native.launch_address`` at the stub) against whichever tmaflow is importable, in this
package's layout or the flat one before the subpackages (ae3d113), so ``--against TREE`` runs
this file against another checkout in alternating processes. Each case is timed as the bench
calls it (a lambda around the call), interleaved over rounds; a row is the median ns per call
minus an empty lambda's. ``--instructions`` counts instructions per call under valgrind's
callgrind instead (exact where the host clock of a shared machine is not).
"""
from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any


# (this layout, the flat one before the subpackages): module, attribute
_WHERE = {"native": (("tmaflow.launch.native", None), ("tmaflow.native", None)),
          "LaunchConfig": (("tmaflow.launch.config", "LaunchConfig"), ("tmaflow.launch", "LaunchConfig")),
          "Kernel": (("tmaflow.launch.kernel", "Kernel"), ("tmaflow.kernel", "Kernel")),
          "Launcher": (("tmaflow.launch.launcher", "Launcher"), ("tmaflow.launch", "Launcher")),
          "ArgPacker": (("tmaflow.launch.params", "ArgPacker"), ("tmaflow.params", "ArgPacker")),
          "Param": (("tmaflow.launch.params", "Param"), ("tmaflow.params", "Param")),
          "driver": (("tmaflow.runtime.driver", None), ("tmaflow.driver", None)),
          "memory": (("tmaflow.runtime.memory", None), ("tmaflow.memory", None)),
          "TensorMapSpec": (("tmaflow.tma.spec", "TensorMapSpec"), ("tmaflow.tensormap", "TensorMapSpec")),
          "TensorMap": (("tmaflow.tma.tensormap", "TensorMap"), ("tmaflow.tensormap", "TensorMap"))}


def _find(name: str) -> Any:
    for module, attribute in _WHERE[name]:
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        if attribute is None:
            return found
        if hasattr(found, attribute):
            return getattr(found, attribute)
    raise ImportError(f"no {name} in {importlib.import_module('tmaflow').__file__}")


tmaflow = importlib.import_module("tmaflow")
native, LaunchConfig, Kernel, Launcher = _find("native"), _find("LaunchConfig"), _find("Kernel"), _find("Launcher")
ArgPacker, Param, driver, memory = _find("ArgPacker"), _find("Param"), _find("driver"), _find("memory")
TensorMapSpec, TensorMap = _find("TensorMapSpec"), _find("TensorMap")

STUB = "int stub_launch(const void *config, void *f, void **params, void **extra) { return 0; }\n"
# --instructions: callgrind's client requests around each case's loop (no-ops outside valgrind)
COUNTER = """#include <valgrind/callgrind.h>
void counting(int on) { if (on) CALLGRIND_ZERO_STATS; CALLGRIND_TOGGLE_COLLECT; }
void dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
"""

# the bench's kernels: empty_kernel(CUtensorMap a, CUtensorMap b, int x, float y, int64_t z)
# and axpb_tma(const float* in, float* out, float a, float b, long long n)
MAPS = [Param(0, 0, 128, "tensormap"), Param(1, 128, 128, "tensormap"), Param(2, 256, 4, "int", True),
        Param(3, 260, 4, "float"), Param(4, 264, 8, "int", True)]
POINTERS = [Param(0, 0, 8, "pointer"), Param(1, 8, 8, "pointer"), Param(2, 16, 4, "float"),
            Param(3, 20, 4, "float"), Param(4, 24, 8, "int", True)]


def build(source: str) -> ctypes.CDLL:
    folder = tempfile.mkdtemp(prefix="launch-stub-")
    src, lib = os.path.join(folder, "stub.c"), os.path.join(folder, "stub.so")
    with open(src, "w") as f:
        f.write(source)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", src, "-o", lib], check=True)
    return ctypes.CDLL(lib)


def stub_address() -> tuple[int, object]:
    """The address of a C function with cuLaunchKernelEx's signature that returns 0 (and the
    library, which must stay loaded)."""
    handle = build(STUB)
    return int(ctypes.cast(handle.stub_launch, ctypes.c_void_p).value or 0), handle


class _Device:
    ordinal, generation = 0, 0


class _Module:
    compiled_cluster = (0, 0, 0)
    device = _Device()
    generation = 0
    watch = recorder = None
    function = None


def allocation(ptr: int):
    """A tmaflow allocation as the plan reads it (the real slotted class, no driver)."""
    alloc = object.__new__(memory._Allocation)
    token = memory.live_token(None, 0) if hasattr(memory, "live_token") else True
    alloc.live, alloc.ptr, alloc.generation, alloc.device, alloc.stream = token, ptr, -1, _Device(), 0
    return alloc


def array(ptr: int, alloc=None):
    arr = memory.DeviceArray(ptr, (256, 256), "float32")
    if alloc is not None:
        arr._alloc = alloc
    return arr


def tensor_map(arr, box):
    spec = TensorMapSpec.tiled("float32", (256, 256), box, address=arr.ptr)
    return TensorMap(spec, arr, bytes(range(128)))


def launcher(params, ordinal=0):
    """A Launcher on device ``ordinal`` whose plans call the stub instead of the driver."""
    run = Launcher.__new__(Launcher, None, None, None)
    run.kernel, run.module, run.config = None, _Module(), LaunchConfig(1, 32, smem=0)
    run.generation, run.ordinal = 0, ordinal
    run.packer = ArgPacker(params)
    run._configs = {}
    run._plans, run._function, run._watch, run._recorder = {}, None, None, None
    run._launch = driver.cu().cuLaunchKernelEx  # what makes _native_plan build a real plan
    run._raise = lambda err: None
    run._use(Launcher._checked_call)
    return run


def install(run, args):
    run._install_plan(args)
    assert type(run.func).__name__ == "Plan", (type(run.func), native.status())


class FakeTensor:
    """A CUDA torch tensor as a plan reads it; its methods are C builtins (as torch's are)."""
    __module__ = "torch"

    def __init__(self, ptr):
        self.data_ptr = ptr.__index__
        self.get_device = (0).__index__


class ndarray:  # noqa: N801 - the name cupy's array type has
    __module__ = "cupy"

    def __init__(self, ptr):
        self.data = types.SimpleNamespace(ptr=ptr, device_id=0)


def frameworks(real_torch: bool) -> tuple[Any, int]:
    """torch (real CPU tensors: device -1, or a stand-in on device 0) and a cupy stand-in;
    torch's current-stream getter is a builtin of the ordinal (``abs``), cupy's a lambda, as
    the real ones are. Returns (torch, the ordinal its tensors are on)."""
    torch: Any
    if real_torch:
        torch = importlib.import_module("torch")
        torch._C._cuda_getCurrentRawStream = abs  # a CPU build has no CUDA stream to ask for
        ordinal = -1
    else:
        torch = types.SimpleNamespace(Tensor=FakeTensor, __name__="torch",
                                      _C=types.SimpleNamespace(_cuda_getCurrentRawStream=abs))
        sys.modules["torch"] = torch
        if hasattr(memory, "_TORCH_TYPES"):
            memory._TORCH_TYPES[:] = []
        ordinal = 0
    stream = types.SimpleNamespace(ptr=0x71)
    cupy = types.SimpleNamespace(__name__="cupy", cuda=types.SimpleNamespace(get_current_stream=lambda: stream))
    sys.modules["cupy"] = cupy  # type: ignore[assignment]
    return torch, ordinal


def cases(stub: int, real_torch: bool) -> tuple[dict, list]:
    native.launch_address = lambda: stub
    torch, torch_ordinal = frameworks(real_torch)
    alloc = allocation(0x7000_0000)
    a = array(0x7000_0000, alloc)
    ta, tb = tensor_map(a, (32, 32)), tensor_map(a, (64, 64))
    bound = launcher(MAPS)
    install(bound, (ta, tb, 1, 2.0, 3))
    x, y = array(0x7100_0000, allocation(0x7100_0000)), array(0x7200_0000, allocation(0x7200_0000))
    bound_ptr = launcher(POINTERS)
    install(bound_ptr, (x, y, 2.0, 1.0, 4096))
    k = Kernel.__new__(Kernel)
    k._launchers = {(1, 32, (1, 1, 1), None, None, False, 0, threading.get_ident()): bound}
    kp = Kernel.__new__(Kernel)
    kp._launchers = {(1, 256, (1, 1, 1), None, None, False, 0, threading.get_ident()): bound_ptr}
    if real_torch:
        tx, ty, t2d_owner = torch.empty(4096), torch.empty(4096), torch.empty((256, 256))
    else:
        tx, ty, t2d_owner = FakeTensor(0x7300_0000), FakeTensor(0x7400_0000), FakeTensor(0x7500_0000)
    bound_torch = launcher(POINTERS, torch_ordinal)
    install(bound_torch, (tx, ty, 2.0, 1.0, 4096))
    kpt = Kernel.__new__(Kernel)
    kpt._launchers = {(1, 256, (1, 1, 1), None, None, False, 0, threading.get_ident()): bound_torch}
    t2d = memory.DeviceArray._view(0x7500_0000, (256, 256), a.dtype, a.strides, t2d_owner, None, "torch")
    tta, ttb = tensor_map(t2d, (32, 32)), tensor_map(t2d, (64, 64))
    bound_tmaps = launcher(MAPS, torch_ordinal)
    install(bound_tmaps, (tta, ttb, 1, 2.0, 3))
    kt = Kernel.__new__(Kernel)
    kt._launchers = {(1, 32, (1, 1, 1), None, None, False, 0, threading.get_ident()): bound_tmaps}
    cx, cy = ndarray(0x7600_0000), ndarray(0x7700_0000)
    bound_cupy = launcher(POINTERS)
    install(bound_cupy, (cx, cy, 2.0, 1.0, 4096))
    for kernel in (k, kp, kpt, kt):  # what kernel.launcher() installs (not in older trees)
        getattr(kernel, "_install_entry", lambda: None)()
    return {
        "(empty lambda)": lambda: None,
        "bound, tf arrays": lambda: bound(ta, tb, 1, 2.0, 3),
        "launch, tf arrays": lambda: k.launch(ta, tb, 1, 2.0, 3, grid=1, block=32),
        "bound, tf pointers": lambda: bound_ptr(x, y, 2.0, 1.0, 4096),
        "bound, torch pointers": lambda: bound_torch(tx, ty, 2.0, 1.0, 4096),
        "launch, torch pointers": lambda: kpt.launch(tx, ty, 2.0, 1.0, 4096, grid=1, block=256),
        "bound, torch tensor maps": lambda: bound_tmaps(tta, ttb, 1, 2.0, 3),
        "launch, torch tensor maps": lambda: kt.launch(tta, ttb, 1, 2.0, 3, grid=1, block=32),
        "bound, cupy pointers": lambda: bound_cupy(cx, cy, 2.0, 1.0, 4096),
    }, [bound, bound_ptr, bound_torch, bound_tmaps, bound_cupy]


def per_call_ns(fn, n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n


def measure(opts) -> dict:
    """ns per call of each case in this process: the median over interleaved rounds, minus
    the empty lambda's."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    stub, _keep = stub_address()
    fns, launchers = cases(stub, opts.real_torch)
    fns = {name: fn for name, fn in fns.items() if name.startswith("(") or opts.only in name}
    counted = hasattr(launchers[0].func, "launches")
    before = [r.func.launches for r in launchers] if counted else []
    got: dict = {name: [] for name in fns}
    for fn in fns.values():
        for _ in range(1000):
            fn()
    for _ in range(opts.rounds):
        for name, fn in fns.items():
            got[name].append(per_call_ns(fn, opts.calls))
    if counted and not opts.only:  # the timed calls went through the plans, not a Python path
        assert all(r.func.launches > b for r, b in zip(launchers, before)), "a case left its plan"
    empty = statistics.median(got.pop("(empty lambda)"))
    for r in launchers:  # no live allocation left to free at exit
        r._plans.clear()
    return {name: statistics.median(samples) - empty for name, samples in got.items()}


def _this_file(argv: list[str]) -> list[str]:
    """A command line running this file as a script on the tmaflow ``PYTHONPATH`` names (from a
    neutral folder, so the current one shadows nothing)."""
    return [sys.executable, "-c", "import runpy, sys; sys.argv[0] = sys.argv[1]; del sys.argv[1]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')", str(Path(__file__).resolve()), *argv]


def count_instructions(opts) -> dict:
    """Instructions per call of each case, minus the empty lambda's: this file again under
    valgrind's callgrind, collecting only while a case's loop runs (one dump per case)."""
    if not os.environ.get("LAUNCH_COST_UNDER_VALGRIND"):
        folder = tempfile.mkdtemp(prefix="launch-cg-")
        argv = ["--instructions", "--calls", str(opts.calls), "--only", opts.only] + \
            (["--real-torch"] if opts.real_torch else [])
        subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no",
                        f"--callgrind-out-file={folder}/cg.out", *_this_file(argv)],
                       env=dict(os.environ, LAUNCH_COST_UNDER_VALGRIND="1"), check=True,
                       capture_output=True, cwd=folder)
        got = {}
        dumps = sorted(Path(folder).glob("cg.out.*"), key=lambda p: int(p.suffix[1:]))
        for path in dumps:  # one per case, in the order they ran
            lines = path.read_text().splitlines()
            name = next(ln.split("Client Request: ", 1)[1] for ln in lines if "Client Request: " in ln)
            total = next(int(ln.split()[1]) for ln in lines if ln.startswith(("summary:", "totals:")))
            got[name] = total / opts.calls
        empty = got.pop("(empty lambda)")
        return {name: ir - empty for name, ir in got.items()}
    counter = build(COUNTER)
    stub, _keep = stub_address()
    fns, launchers = cases(stub, opts.real_torch)
    for name, fn in fns.items():
        if not (name.startswith("(") or opts.only in name):
            continue
        for _ in range(100):
            fn()
        counter.counting(1)
        for _ in range(opts.calls):
            fn()
        counter.counting(0)
        counter.dump(name.encode())
    for r in launchers:
        r._plans.clear()
    return {}


def compare(opts) -> None:
    """The tmaflow on ``PYTHONPATH`` against the checkout ``opts.against``, in alternating
    processes; each row is the median over the processes."""
    trees = {"this": str(Path(tmaflow.__file__ or ".").resolve().parents[1]), "other": opts.against}
    runs: dict = {label: [] for label in trees}
    argv = ["--json", "--calls", str(opts.calls), "--rounds", str(opts.rounds), "--only", opts.only] + \
        (["--real-torch"] if opts.real_torch else []) + (["--instructions"] if opts.instructions else [])
    folder = tempfile.mkdtemp(prefix="launch-cost-")
    for _ in range(opts.processes):
        for label, tree in trees.items():
            done = subprocess.run(_this_file(argv), env=dict(os.environ, PYTHONPATH=tree), cwd=folder,
                                  capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"{tree}: {done.stderr[-2000:]}")
            runs[label].append(json.loads(done.stdout.splitlines()[-1]))
    unit = "instructions" if opts.instructions else "ns"
    print(f"this: {trees['this']}\nother: {opts.against}\nPython {sys.version.split()[0]}; {unit} per call, "
          f"median of {opts.processes} alternating processes per tree (each: {opts.calls} calls a case"
          f"{'' if opts.instructions else f', median of {opts.rounds} rounds'}), minus an empty lambda")
    print(f"  {'case':28s} {'this':>8s} {'other':>8s} {'this-other':>10s}")
    for name in runs["this"][0]:
        a = statistics.median(r[name] for r in runs["this"])
        b = statistics.median(r[name] for r in runs["other"])
        print(f"  {name:28s} {a:8.1f} {b:8.1f} {a - b:+10.1f}")


def main() -> None:
    # the processes it starts: numpy's idle BLAS threads spin beside the timing (this one has
    # loaded numpy already, with the package)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", default="", help="time only the cases whose name contains this")
    parser.add_argument("--real-torch", action="store_true",
                        help="CPU torch tensors (a launcher on device -1) instead of a stand-in")
    parser.add_argument("--against", metavar="TREE", help="another checkout to compare with")
    parser.add_argument("--processes", type=int, default=5, help="with --against: processes per tree")
    parser.add_argument("--json", action="store_true", help="print one JSON line (for --against)")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per call under valgrind's callgrind instead of timing")
    opts = parser.parse_args()
    if opts.against:
        return compare(opts)
    got = count_instructions(opts) if opts.instructions else measure(opts)
    if os.environ.get("LAUNCH_COST_UNDER_VALGRIND"):
        return
    if opts.json:
        print(json.dumps(got))
        return
    print(f"{tmaflow.__file__}; Python {sys.version.split()[0]}; {native.status()}")
    if opts.instructions:
        print(f"instructions per call (callgrind, {opts.calls} calls), minus an empty lambda")
    else:
        print(f"ns per call, median of {opts.rounds} rounds of {opts.calls}, minus an empty lambda")
    for name, value in got.items():
        print(f"  {name:28s} {value:7.1f}")


if __name__ == "__main__":
    main()
