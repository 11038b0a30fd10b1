"""NVRTC to CUBIN (never PTX for loading), with headers found through cuda-pathfinder."""
from __future__ import annotations

import functools
import hashlib
import logging
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

from .. import checks
from ..errors import CompileError, CudaError, TmaflowError
from ..runtime import driver
from ..version import __version__
from . import cache

log = logging.getLogger("tmaflow.compiler")

INCLUDE_DIR = Path(__file__).resolve().parent.parent / "include"  # the device library: <tmaflow.cuh>
SHIM_DIR = INCLUDE_DIR / "shim"                               # <cuda.h> under NVRTC
DEFAULT_ARCH = "sm_90a"
LAYOUT_HEADER = "tmaflow_layout.cuh"  # generated from a Kernel's layout= (SharedLayout.header)


@dataclass(frozen=True)
class Resources:
    """What ptxas reported for one kernel."""

    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    static_smem: int
    constant_bytes: int = 0

    @property
    def spills(self) -> int:
        """Spill stores plus spill loads, in bytes."""
        return self.spill_stores + self.spill_loads


@dataclass
class Program:
    cubin: bytes
    ptx: str
    log: str
    lowered_name: str
    resources: Resources | None
    cache_hit: str = ""           # "", "memory" or "disk"
    compile_seconds: float = 0.0
    key: str = ""


# Header directories of the NVIDIA wheels, by the CUDA major version they belong to.
_WHEEL_HEADERS = {13: {"cccl": "nvidia/cu13/include/cccl", "cudart": "nvidia/cu13/include"},
                  12: {"cccl": "nvidia/cuda_cccl/include", "cudart": "nvidia/cuda_runtime/include"}}


def _wheel_header_dirs() -> dict[str, str]:
    """Headers from the wheels that match the NVRTC in use (CCCL must not be newer than it)."""
    import sys

    try:
        major = nvrtc_version()[0]
    except Exception:  # NVRTC missing: compilation will say so
        return {}
    found = {}
    for lib, rel in _WHEEL_HEADERS.get(major, {}).items():
        for base in sys.path:
            path = Path(base) / rel
            if path.is_dir():
                found[lib] = str(path)
                break
    return found


@functools.lru_cache(maxsize=1)
def include_dirs() -> tuple[str, ...]:
    """The shim (``<cuda.h>`` under NVRTC) first, tmaflow's headers, then CCCL and cudart:
    from the wheels matching NVRTC's version, else wherever cuda-pathfinder finds them."""
    dirs = [str(SHIM_DIR), str(INCLUDE_DIR)]
    wheels = _wheel_header_dirs()
    if len(wheels) == 2:
        return tuple(dirs + [wheels["cccl"], wheels["cudart"]])
    try:
        import cuda.pathfinder as pf
    except ImportError:
        pf = None
        log.warning("cuda-pathfinder is missing: looking for headers under CUDA_HOME only")
    import os

    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    fallback = {"cccl": os.path.join(home, "include", "cccl"), "cudart": os.path.join(home, "include")}
    for lib in ("cccl", "cudart"):
        found = None
        if pf is not None:
            try:
                found = pf.find_nvidia_header_directory(lib)
            except Exception:  # pathfinder's own not-found errors
                found = None
        if not found and os.path.isdir(fallback[lib]):
            found = fallback[lib]
        if found:
            dirs.append(str(found))
        else:
            log.warning("headers of %s not found: <cuda/...> / <cooperative_groups.h> will fail", lib)
    return tuple(dirs)


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> tuple[int, int]:
    try:
        result = driver.nvrtc().nvrtcVersion()  # the first NVRTC call loads the library
    except Exception as exc:  # ImportError, or cuda-pathfinder's not-found error
        raise TmaflowError(
            f"NVRTC could not be loaded ({exc}). Install a CUDA stack: "
            "pip install 'tmaflow[cu13]' (or 'tmaflow[cu12]' for CUDA 12 drivers)") from None
    return tuple(driver.check("nvrtcVersion", result))


@functools.lru_cache(maxsize=1)
def _headers_digest() -> str:
    """Hash of every tmaflow header, so a header edit invalidates every cached kernel."""
    h = hashlib.sha256()
    for path in sorted(INCLUDE_DIR.rglob("*")):
        if path.suffix in (".cuh", ".h") and path.is_file():
            h.update(str(path.relative_to(INCLUDE_DIR)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def cache_key(source: str, name: str, options: tuple[str, ...], arch: str,
              headers: dict[str, str]) -> str:
    h = hashlib.sha256()
    for part in (__version__, repr(nvrtc_version()), arch, name, _headers_digest(),
                 repr(options), repr(sorted(headers.items())), source):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


_RES_RE = re.compile(r"Used (\d+) registers")
_SPILL_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM_RE = re.compile(r"(\d+) bytes smem")
_CMEM_RE = re.compile(r"(\d+) bytes cmem\[0\]")


# CUDA 13 says "wgmma.wait_group is injected", CUDA 12 "warpgroup.wait is injected".
_WGMMA_NOTES = re.compile(r"^ptxas info\s*:\s*\((C75\d\d)\)\s*(.*(?:wgmma|warpgroup|GMMA).*)$", re.MULTILINE)


def wgmma_pipeline_notes(ptxas_log: str) -> list[str]:
    """ptxas's notes that it serialized wgmma or injected waits the source did not ask for
    (C75xx "Potential Performance Loss", "wait ... is injected"): the tensor cores
    then wait for each MMA, typically because code reads or writes an accumulator while its
    wgmma may still be in flight, or accumulators are chosen at run time."""
    return [f"({code}) {text.strip()}" for code, text in _WGMMA_NOTES.findall(ptxas_log)]


def parse_resources(ptxas_log: str, lowered_name: str) -> Resources | None:
    """Pick the ptxas ``-v`` block of ``lowered_name`` out of the log."""
    blocks = re.split(r"ptxas info\s*: Compiling entry function ", ptxas_log)
    for block in blocks[1:]:
        if not block.startswith(f"'{lowered_name}'"):
            continue
        regs = _RES_RE.search(block)
        spill = _SPILL_RE.search(block)
        smem = _SMEM_RE.search(block)
        cmem = _CMEM_RE.search(block)
        return Resources(
            registers=int(regs.group(1)) if regs else 0,
            stack_frame=int(spill.group(1)) if spill else 0,
            spill_stores=int(spill.group(2)) if spill else 0,
            spill_loads=int(spill.group(3)) if spill else 0,
            static_smem=int(smem.group(1)) if smem else 0,
            constant_bytes=int(cmem.group(1)) if cmem else 0)
    return None


def _excerpt(source: str, log_text: str, filename: str, context: int = 2) -> str:
    """The source lines NVRTC complained about, with line numbers and a marker."""
    lines = source.splitlines()
    wanted = sorted({int(m) for m in re.findall(rf"{re.escape(filename)}\((\d+)\): error", log_text)})
    out = []
    for n in wanted[:5]:
        lo, hi = max(1, n - context), min(len(lines), n + context)
        for i in range(lo, hi + 1):
            out.append(f"{'>>' if i == n else '  '} {i:5d} | {lines[i - 1]}")
        out.append("")
    return "\n".join(out).rstrip()


_GLOBAL_RE = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+"
                        r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")


def kernel_names(source: str) -> list[str]:
    return _GLOBAL_RE.findall(source)


_MACRO = re.compile(r"[A-Za-z_]\w*")


def check_defines(defines) -> dict:
    """``defines`` as a dict of macro name -> value (None: defined without a value), each name
    a C identifier and each value one line of text (it becomes a ``-D`` option)."""
    if defines is None:
        return {}
    if not isinstance(defines, dict):
        raise TmaflowError(f"Kernel: defines={defines!r} must be a dict of macro name -> value")
    out = {}
    for key, value in defines.items():
        if not isinstance(key, str) or not _MACRO.fullmatch(key):
            raise TmaflowError(f"Kernel: defines key {key!r} must be a C identifier (a macro name)")
        if value is not None:
            if isinstance(value, bool):
                value = int(value)
            if not isinstance(value, (str, int, float)):
                raise TmaflowError(f"Kernel: defines[{key!r}]={value!r} must be a str, int, float "
                                   "or None")
            if any(c in str(value) for c in "\n\r\0"):
                raise TmaflowError(f"Kernel: defines[{key!r}]={value!r} must be one line (no "
                                   "newline or NUL)")
            if isinstance(value, float) and not math.isfinite(value):
                raise TmaflowError(f"Kernel: defines[{key!r}]={value!r} must be finite (C has no "
                                   "literal for it)")
            checks.as_text(f"Kernel: defines[{key!r}]", str(value))
        out[key] = value
    return out


def check_options(options) -> tuple[str, ...]:
    """NVRTC options as a tuple of strings (a single string is a mistake worth naming; None
    is none)."""
    if options is None:
        return ()
    if isinstance(options, (str, bytes, dict)):
        raise TmaflowError(f"Kernel: options={options!r} must be a list or tuple of strings, "
                           f"e.g. ({options!r},)")
    try:
        options = tuple(options)
    except TypeError:
        raise TmaflowError(f"Kernel: options={options!r} must be a list or tuple of strings") from None
    for opt in options:
        if not isinstance(opt, str) or not opt or any(c in opt for c in "\n\r\0"):
            raise TmaflowError(f"Kernel: option {opt!r} must be a non-empty one-line string")
        checks.as_text("Kernel: option", opt)
        if opt in ("-dlto", "--dlto") or opt.startswith(("-ptx", "--ptx", "-dc")):
            raise TmaflowError(f"Kernel: option {opt!r} makes NVRTC emit no CUBIN (LTO IR or "
                               "relocatable code); tmaflow loads CUBIN")
    return options


def nvrtc_output(nv, getter: str, prog) -> bytes:
    """What NVRTC's ``getter`` (``nvrtcGetProgramLog``, ``nvrtcGetCUBIN``, ``nvrtcGetPTX``)
    writes, read through a fresh ``bytearray``. Never through a ``bytes`` buffer: NVRTC writes
    into the object it is given, and ``b" " * 1`` (an empty log is one byte, its NUL) is
    CPython's shared one-byte ``b" "``, whose byte the NUL zeroed for the whole process: every
    later ``b" "`` (numpy's .npy header padding, a one-byte ``tobytes()`` of a space) read as
    ``b"\\0"``. Seen on the GPU machine as archives with null bytes and a wrong store-model byte."""
    size = driver.check(f"{getter}Size", getattr(nv, f"{getter}Size")(prog))
    buf = bytearray(size)
    driver.check(getter, getattr(nv, getter)(prog, buf))
    return bytes(buf)


def compile_program(source: str, name: str, *, options: tuple[str, ...] = (),
                    arch: str = DEFAULT_ARCH, headers: dict[str, str] | None = None,
                    filename: str = "kernel.cu") -> Program:
    """Compile ``source`` and return the CUBIN for kernel ``name`` (a name expression)."""
    headers = dict(headers or {})
    full_opts = (f"--gpu-architecture={arch}", "-std=c++17", "--ptxas-options=-v",
                 *(f"-I{d}" for d in include_dirs()), *options)
    key = cache_key(source, name, full_opts, arch, headers)
    hit = cache.load(key)
    program = _cached_program(hit, key) if hit is not None else None
    if program is not None:
        return program

    nv = driver.nvrtc()
    t0 = time.perf_counter()
    hdr_names = list(headers)
    prog = driver.check("nvrtcCreateProgram", nv.nvrtcCreateProgram(
        source.encode(), filename.encode(), len(hdr_names),
        [headers[h].encode() for h in hdr_names], [h.encode() for h in hdr_names]))
    try:
        driver.check("nvrtcAddNameExpression", nv.nvrtcAddNameExpression(prog, name.encode()))
        opts = [o.encode() for o in full_opts]
        (err,) = nv.nvrtcCompileProgram(prog, len(opts), opts)
        log_text = nvrtc_output(nv, "nvrtcGetProgramLog", prog).rstrip(b"\0 ").decode(errors="replace")
        if int(err) != 0:
            raise _compile_error(source, name, log_text, filename, headers)
        try:
            lowered = driver.check("nvrtcGetLoweredName", nv.nvrtcGetLoweredName(prog, name.encode()))
        except CudaError:
            raise _compile_error(source, name, log_text, filename, headers) from None
        lowered = lowered.decode() if isinstance(lowered, bytes) else lowered
        size = driver.check("nvrtcGetCUBINSize", nv.nvrtcGetCUBINSize(prog))
        if not size:
            raise CompileError(f"NVRTC compiled {filename} but produced no CUBIN (options "
                               f"{list(options)}); an option asked for another output", log=log_text)
        cubin = nvrtc_output(nv, "nvrtcGetCUBIN", prog)
        ptx = nvrtc_output(nv, "nvrtcGetPTX", prog)
    finally:
        nv.nvrtcDestroyProgram(prog)
    seconds = time.perf_counter() - t0
    ptx = ptx.rstrip(b"\0")
    resources = parse_resources(log_text, lowered)
    meta = {"log": log_text, "lowered_name": lowered,
            "resources": resources.__dict__ if resources else None}
    cache.store(key, meta, {"cubin": cubin, "ptx": ptx})
    log.info("compiled %s for %s in %.2f s", name, arch, seconds)
    return Program(cubin, ptx.decode(), log_text, lowered, resources, compile_seconds=seconds, key=key)


def _cached_resources(res) -> Resources | None:
    """The Resources of a cache entry's meta (TypeError when they are not what ptxas gave)."""
    if res is None:
        return None
    if not isinstance(res, dict) or any(type(v) is not int or v < 0 for v in res.values()):
        raise TypeError(f"resources {res!r}")
    return Resources(**res)


def _cached_program(hit: tuple, key: str) -> Program | None:
    """The Program of a cache entry, or None (a miss: it is rebuilt and overwritten) when the
    entry, intact by its checksum, does not hold what this version stores."""
    meta, blobs, where = hit
    try:
        program = Program(blobs["cubin"], blobs["ptx"].decode(), meta["log"], meta["lowered_name"],
                          _cached_resources(meta["resources"]), cache_hit=where, key=key)
    except (KeyError, TypeError, UnicodeDecodeError):
        program = None
    if program is None or not program.cubin or not isinstance(program.log, str) or \
            not isinstance(program.lowered_name, str) or not program.lowered_name:
        log.warning("cache entry %s does not hold a compiled kernel: rebuilding", key)
        return None
    return program


def _compile_error(source: str, name: str, log_text: str, filename: str,
                   headers: dict[str, str]) -> CompileError:
    found = kernel_names(source)
    source_errors = len(re.findall(rf"{re.escape(filename)}\(\d+\): (?:catastrophic )?error", log_text))
    if not source_errors and name.split("<")[0].split("::")[-1] not in found:
        msg = (f"kernel name={name!r} is not a __global__ function of {filename}; "
               f"kernels found: {', '.join(found) or 'none'}")
    else:
        n = source_errors or len(re.findall(r": error", log_text))
        msg = f"NVRTC failed to compile {filename} ({n} error{'s' if n != 1 else ''})"
        # errors before any source line: an option or a define (the log names it)
        fatal = re.findall(r"nvrtc: error: (.*)", log_text)
        if not source_errors and (fatal or not n):
            msg = (f"NVRTC refused the compile options of {filename}: "
                   f"{'; '.join(fatal) if fatal else log_text.strip() or 'no log'}")
    if f'cannot open source file "{LAYOUT_HEADER}"' in log_text and LAYOUT_HEADER not in headers:
        msg += (f"; {LAYOUT_HEADER} is generated from a shared-memory plan: pass "
                "layout=tf.SharedLayout([...]) to tf.Kernel")
    return CompileError(msg, log=log_text, excerpt=_excerpt(source, log_text, filename))
