"""The launch fast path in C (``_launch.c``), built on first use with the system C compiler.

A launcher's call costs what its Python does around the driver's own ``cuLaunchKernelEx``;
for torch tensors that was 1.23x a raw launch from Python (per tensor ``get_device()`` and
``data_ptr()``, the current stream, the bytecode between). A ``Plan`` does the same checks and
packing in C and calls the driver directly. It is compiled once per machine and Python version
into tmaflow's cache directory; where no compiler or Python headers exist, or with
``TMAFLOW_NATIVE=0``, launches take the generated Python path (same checks, same results) and
``status()`` says why.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

from . import env
from .cache import cache_dir

SOURCE = Path(__file__).with_name("_launch.c")
KINDS = {"array": 0, "map": 1, "torch": 2, "cupy": 3, "signed": 4, "unsigned": 5, "float": 6,
         "none": 7}

_lock = threading.Lock()
_state: dict = {}  # "module" or "reason", and "launch" (the driver's entry point address)


def _build(target: Path) -> None:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    cc = cc.split()[0]
    if shutil.which(cc) is None:
        raise RuntimeError(f"no C compiler ({cc!r} not found)")
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise RuntimeError(f"no Python headers ({include}/Python.h missing)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, "-O2", "-shared", "-fPIC", f"-I{include}", str(SOURCE), "-o", tmp],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[:500]}")
        os.replace(tmp, target)  # concurrent builders leave one complete file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load():
    if not env.flag("TMAFLOW_NATIVE", True):
        raise RuntimeError("TMAFLOW_NATIVE=0")
    source = SOURCE.read_bytes()
    tag = hashlib.sha256(source + sys.version.encode()).hexdigest()[:16]
    target = cache_dir() / "native" / f"launch-{sys.implementation.cache_tag}-{tag}.so"
    if not target.exists():
        _build(target)
    loader = importlib.machinery.ExtensionFileLoader("tmaflow_launch", str(target))
    spec = importlib.util.spec_from_file_location("tmaflow_launch", str(target), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def module():
    """The compiled module, or None (``status()`` says why)."""
    if "module" not in _state and "reason" not in _state:
        with _lock:
            if "module" not in _state and "reason" not in _state:
                try:
                    _state["module"] = _load()
                except Exception as exc:  # no compiler, no headers, a failed build: Python path
                    _state["reason"] = str(exc) or type(exc).__name__
    return _state.get("module")


def status() -> str:
    """One line: whether launches take the C path, and if not, why."""
    if module() is not None:
        return "C launch path (tmaflow/_launch.c)"
    return f"generated Python launch path ({_state['reason']})"


def launch_address() -> int:
    """The address of the driver's ``cuLaunchKernelEx``, with the default-stream semantics
    cuda.bindings uses (per-thread when ``CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM`` is set)."""
    address = _state.get("launch")
    if address is None:
        from . import driver

        cu = driver.cu()
        flags = cu.CUdriverProcAddress_flags
        per_thread = os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0") not in ("", "0")
        flag = flags.CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM if per_thread else \
            flags.CU_GET_PROC_ADDRESS_LEGACY_STREAM
        pfn, _status = driver.call("cuGetProcAddress", b"cuLaunchKernelEx", 12000, flag)
        address = _state["launch"] = int(pfn)
    return address


def plan(fields: tuple, *, launch: int, function: int, kernel_params: int, buffer: int, config: int,
         current_stream, ordinal: int, capturing, on_error, keep):
    """A ``Plan`` (see ``_launch.c``); ``launch=0`` makes a dry plan that packs and chooses
    the stream but launches nothing (the CPU tests)."""
    return module().Plan(launch, function, kernel_params, buffer, config, fields, current_stream,
                         ordinal, capturing, on_error, keep)
