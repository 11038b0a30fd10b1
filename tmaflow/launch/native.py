"""The launch fast path in C (``_launch.c``), built on first use with the system C compiler.

A launcher's call costs what its Python does around the driver's own ``cuLaunchKernelEx``;
for torch tensors that was 1.23x a raw launch from Python (per tensor ``get_device()`` and
``data_ptr()``, the current stream, the bytecode between). A ``Plan`` does the same checks and
packing in C and calls the driver directly. It is compiled once per machine, Python and
compiler into tmaflow's cache directory, under a name that carries the checksum of its bytes
(a truncated or emptied file is found out before it is loaded, removed and rebuilt once);
where no compiler or Python headers exist, the driver gives no ``cuLaunchKernelEx``, or with
``TMAFLOW_NATIVE=0``, launches take the generated Python path (same checks, same results)
and ``status()`` says why.

Interface for other modules: ``plan.launches`` (read-only, a uint64) counts the calls of one
plan whose ``cuLaunchKernelEx`` succeeded (a dry plan, ``plan.dry``, counts the calls that
reached the launch). A launcher's current plan is ``launcher.func`` when its type name is
``Plan``; comparing the counts of a launcher's plans before and after tells which kernels the
C path launched in between (launches on the Python paths are not counted here).
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import types
from pathlib import Path

from .. import env
from ..errors import CudaError
from ..runtime import driver
from . import cache
from .args import PLAN_ATTRIBUTES

log = logging.getLogger("tmaflow.native")

SOURCE = Path(__file__).with_name("_launch.c")
SOURCES = (SOURCE, SOURCE.with_name("_launch_entry.c"))  # the second is #included by the first
ABI = 5  # _launch.c's ABI: a build that reports another number is rebuilt

_lock = threading.Lock()
# "module" or "reason"; "rebuilt" (why a cached build was replaced); "launch" (the driver's
# entry point address) or "launch_reason"
_state: dict = {}


class _BadBuild(Exception):
    """A cached or fresh build that must not be loaded."""


def _compiler() -> list[str]:
    """The C compiler command: ``CC`` (a command line, e.g. ``ccache gcc``), else Python's."""
    raw = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    command = shlex.split(raw)
    if not command or shutil.which(command[0]) is None:
        raise RuntimeError(f"no C compiler ({raw!r} not found)")
    return command


def _tag(command: list[str]) -> str:
    """What a build depends on: the source, the ABI, Python, the machine, the compiler."""
    parts = (*(path.read_bytes() for path in SOURCES), str(ABI).encode(), sys.version.encode(), platform.machine().encode(),
             (sysconfig.get_config_var("EXT_SUFFIX") or "").encode(), repr(command).encode())
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _problem(path: Path) -> str | None:
    """Why ``path`` (``launch-...-<checksum>.so``) must not be loaded, or None: a shared
    object whose bytes match the checksum in its name (a truncated one would kill the
    process with SIGBUS when loaded, an empty one never load)."""
    try:
        data = cache.read_regular(path)
    except OSError as exc:
        return str(exc)
    if not data:
        return "it is empty"
    if sys.platform.startswith("linux") and not data.startswith(b"\x7fELF"):
        return "it is not an ELF shared object"
    if _digest(data) != path.stem.rsplit("-", 1)[-1]:
        return f"its {len(data)} bytes do not match its checksum (truncated or overwritten)"
    return None


def _find(folder: Path, prefix: str, rebuilt: list[str]) -> Path | None:
    """A sound build named ``<prefix>-<checksum>.so``; unsound ones are removed (and noted)."""
    for path in sorted(folder.glob(f"{prefix}-*.so")):
        problem = _problem(path)
        if problem is None:
            return path
        rebuilt.append(f"{path.name}: {problem}")
        _remove(path)
    return None


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _build(command: list[str], folder: Path, prefix: str) -> Path:
    """Compile into a private directory, check and flush the output, publish it by rename."""
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise RuntimeError(f"no Python headers ({include}/Python.h missing)")
    folder.mkdir(parents=True, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".build-", dir=folder)
    try:
        out = os.path.join(work, "launch.so")  # the linker creates it: the umask decides its mode
        done = subprocess.run([*command, "-O2", "-shared", "-fPIC", f"-I{include}", str(SOURCE), "-o", out],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(command)} failed: {done.stderr.strip()[:500]}")
        try:
            data = cache.read_regular(Path(out))
        except OSError:
            data = b""
        if not data or sys.platform.startswith("linux") and not data.startswith(b"\x7fELF"):
            raise RuntimeError(f"{shlex.join(command)} reported success but wrote no shared object")
        with open(out, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(out, os.stat(out).st_mode & 0o666)  # a library is read and mapped, not run
        target = folder / f"{prefix}-{_digest(data)}.so"
        os.replace(out, target)  # concurrent builders leave complete files only
        _sync_dir(folder)
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _sync_dir(folder: Path) -> None:
    """Flush a rename to the disk (where directories can be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _import(path: Path):
    loader = importlib.machinery.ExtensionFileLoader("tmaflow_launch", str(path))
    spec = importlib.util.spec_from_file_location("tmaflow_launch", str(path), loader=loader)
    if spec is None:
        raise _BadBuild("importlib made no module spec for it")
    try:
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except ImportError as exc:
        raise _BadBuild(f"it does not load ({exc})") from None
    if getattr(module, "ABI", None) != ABI:
        raise _BadBuild(f"its ABI is {getattr(module, 'ABI', None)}, not {ABI}")
    if getattr(module, "ATTRIBUTES", None) != PLAN_ATTRIBUTES:
        raise _BadBuild(f"it reads the attributes {getattr(module, 'ATTRIBUTES', None)}, not "
                        f"args.PLAN_ATTRIBUTES {PLAN_ATTRIBUTES}")
    return module


def _load(rebuilt: list[str]):
    command = _compiler()
    folder = cache.usable_dir() / "native"
    prefix = f"launch-{sys.implementation.cache_tag}-{_tag(command)}"
    path = _find(folder, prefix, rebuilt) if folder.is_dir() else None
    if path is not None:
        try:
            return _import(path)
        except _BadBuild as exc:  # sound bytes that still do not fit: build afresh, once
            rebuilt.append(f"{path.name}: {exc}")
            _remove(path)
    path = _build(command, folder, prefix)
    try:
        return _import(path)
    except _BadBuild as exc:
        _remove(path)
        raise RuntimeError(f"the fresh build {path.name} is unusable: {exc}") from None


def module() -> types.ModuleType | None:
    """The compiled module, or None (``status()`` says why). A ``TMAFLOW_NATIVE`` that is not
    a boolean spelling is refused (a TmaflowError) rather than read as either."""
    if not env.flag("TMAFLOW_NATIVE", True):
        return None
    if "module" not in _state and "reason" not in _state:
        with _lock:
            if "module" not in _state and "reason" not in _state:
                rebuilt: list[str] = []
                try:
                    _state["module"] = _load(rebuilt)
                except Exception as exc:  # no compiler, no headers, a failed build: Python path
                    _state["reason"] = str(exc) or type(exc).__name__
                if rebuilt:
                    log.warning("rebuilt the C launch path: %s", "; ".join(rebuilt))
                    _state["rebuilt"] = rebuilt
    return _state.get("module")


def status() -> str:
    """One line: whether launches take the C path, and if not, why (and whether a cached
    build was unsound and rebuilt)."""
    if module() is None:
        reason = _state.get("reason", f"TMAFLOW_NATIVE={os.environ.get('TMAFLOW_NATIVE')}")
    else:
        reason = _state.get("launch_reason")
    line = "C launch path (tmaflow/launch/_launch.c)" if reason is None else \
        f"generated Python launch path ({reason})"
    if _state.get("rebuilt"):
        line += f"; rebuilt an unsound cached build ({'; '.join(_state['rebuilt'])})"
    return line


def _resolve_launch() -> tuple[int, str | None]:
    """(address of cuLaunchKernelEx, None) or (0, why there is none)."""
    cu = driver.cu()
    flags = cu.CUdriverProcAddress_flags
    per_thread = os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0") not in ("", "0")
    flag = flags.CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM if per_thread else \
        flags.CU_GET_PROC_ADDRESS_LEGACY_STREAM
    try:
        pfn, found = driver.call("cuGetProcAddress", b"cuLaunchKernelEx", 12000, flag)
    except CudaError as exc:
        return 0, str(exc)
    # CUDA_SUCCESS with a NULL address is the driver's answer for a symbol it does not have
    if int(found) != int(cu.CUdriverProcAddressQueryResult.CU_GET_PROC_ADDRESS_SUCCESS) or not int(pfn):
        return 0, f"cuGetProcAddress gave no cuLaunchKernelEx (address {int(pfn):#x}, {found!r})"
    return int(pfn), None


def launch_address() -> int | None:
    """The address of the driver's ``cuLaunchKernelEx``, with the default-stream semantics
    cuda.bindings uses (per-thread when ``CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM`` is set);
    None (``status()`` says why) when the driver gives none."""
    if "launch" not in _state and "launch_reason" not in _state:
        address, reason = _resolve_launch()
        if reason is None:
            _state["launch"] = address
        else:
            _state["launch_reason"] = reason
    return _state.get("launch")


def plan(fields: tuple, *, dry: bool, function: int, size: int, config: int, current_stream,
         ordinal: int, capturing, on_error, keep):
    """A ``Plan`` (see ``_launch.c``) writing ``fields`` into ``size`` bytes of parameters, or
    None where the C path is not available (``status()`` says why). ``dry=True`` makes a plan
    that packs and chooses the stream, records both (``last_params``, ``last_stream``) and
    launches nothing (the CPU tests)."""
    built = module()
    if built is None:
        return None
    launch = 0 if dry else launch_address()
    if launch is None:
        return None
    return built.Plan(dry, launch, function, config, size, fields, current_stream, ordinal,
                      capturing, on_error, keep)
