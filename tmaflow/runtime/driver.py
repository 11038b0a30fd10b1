"""The one door to the CUDA driver and NVRTC: lazy import, lazy ``cuInit``, checked calls.

cuda-python returns ``(err, *values)`` tuples; :func:`check` unpacks them and raises
:class:`CudaError` naming the call, or for a code that leaves the context unusable (a faulted
kernel) the one :class:`KernelFaultError` of ``faults.py``, which :func:`call` then raises up
front for every later call on that context. Nothing here touches the driver at import time.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any

from ..errors import CudaError, DriverNotFoundError
from . import faults

_lock = threading.RLock()
_init_state: dict[str, Any] = {}


def cu():
    """The ``cuda.bindings.driver`` module (imported on first use)."""
    from cuda.bindings import driver

    return driver


def nvrtc():
    from cuda.bindings import nvrtc as _nvrtc

    return _nvrtc


def _error_name(err) -> str:
    mod = type(err).__module__ or ""
    try:
        if "nvrtc" in mod:
            return nvrtc().nvrtcGetErrorString(err)[1].decode()
        res, name = cu().cuGetErrorName(err)
        if int(res) == 0:
            return name.decode()
    except Exception:  # the name is a courtesy; never mask the real failure
        pass
    return getattr(err, "name", str(err))


CAPTURE_HINT = ("a CUDA graph capture is in progress: this call cannot be captured, or broke "
                "the capture (a synchronous copy, memset or allocation, or a launch on the legacy "
                "stream while another stream captures). Run it once before capturing (warm-up), "
                "or launch on the capturing stream")


def check(call: str, result, detail: str = ""):
    """Unpack a cuda-python result tuple; raise ``CudaError(call, code, name)`` on failure."""
    if isinstance(result, tuple):
        err, values = result[0], result[1:]
    else:
        err, values = result, ()
    if int(err) != 0:
        if int(err) in faults.STICKY:
            raise faults.fault(call, int(err), _error_name(err))
        if 900 <= int(err) <= 908:  # CUDA_ERROR_STREAM_CAPTURE_*
            detail = (detail + "; " if detail else "") + CAPTURE_HINT
        raise CudaError(call, int(err), _error_name(err), detail)
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def call(name: str, *args, detail: str = ""):
    """``check(name, cuda.bindings.driver.<name>(*args))`` after making sure the driver is up
    and the current context has not faulted (else its KernelFaultError, before the call)."""
    init()
    if faults.faulted:
        faults.refuse(name)
    result = check(name, getattr(cu(), name)(*args), detail)
    if name in faults.SYNCHRONIZE:
        faults.synchronized(name, args)
    return result


_is_capturing: list = []  # [the ctypes cuStreamIsCapturing, or None where libcuda has none]


def stream_capturing(stream: int) -> bool:
    """Is ``stream`` being captured into a CUDA graph (by any library)? An error in asking
    counts as yes: a launch there must not be taken for an eager one. Asked once a call by the
    entry points that keep per-stream scratch: through ctypes (cuda.bindings' call and its
    enum took 2.8 us on an H200 host)."""
    if not _is_capturing:
        init()
        _is_capturing.append(_libcuda_function("cuStreamIsCapturing", [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]))
    fn = _is_capturing[0]
    if fn is not None:
        status = ctypes.c_int(-1)
        return bool(fn(stream, ctypes.byref(status))) or status.value != 0  # 0: CU_STREAM_CAPTURE_STATUS_NONE
    err, status = cu().cuStreamIsCapturing(stream)
    return bool(int(err)) or status != cu().CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


_get_context: list = []  # [the ctypes cuCtxGetCurrent, or None where libcuda has none]
_answers = threading.local()  # each thread's buffer for cuCtxGetCurrent's answer, and a reference to it


def current_context() -> int:
    """The CUcontext current on this thread, as an int (0: none, or the driver could not say).
    Through ctypes: asked on every activation, where cuda.bindings builds a CUcontext object a
    call. Called with a reference made once per thread and no argtypes to convert it through
    (0.34 us a call where a fresh buffer and argtypes took 1.13)."""
    if not _get_context:
        _get_context.append(_libcuda_function("cuCtxGetCurrent", None))
    fn = _get_context[0]
    if fn is not None:
        try:
            answer, ref = _answers.context
        except AttributeError:
            answer = ctypes.c_void_p()
            ref = ctypes.byref(answer)
            _answers.context = (answer, ref)
        return (answer.value or 0) if fn(ref) == 0 else 0
    err, context = cu().cuCtxGetCurrent()
    return 0 if int(err) else int(context)


def _libcuda_function(name: str, argtypes: list | None):
    """libcuda's ``name`` as a ctypes function returning the CUresult, or None where libcuda
    cannot be loaded or has no such function."""
    try:
        fn = getattr(ctypes.CDLL("libcuda.so.1"), name)
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = argtypes
    return fn


def module_global(module, name: bytes) -> int | None:
    """The device address of the global ``name`` of a loaded module, or None if it has none."""
    err, ptr, _size = cu().cuModuleGetGlobal(module, name)
    return int(ptr) if int(err) == 0 else None


def mapped_host(nbytes: int) -> tuple[int, int]:
    """Zeroed pinned host memory the device reads and writes directly: (host address, device
    address). It outlives a fault until the context is reset; free it with cuMemFreeHost."""
    flags = getattr(cu(), "CU_MEMHOSTALLOC_DEVICEMAP", 2)
    host = int(call("cuMemHostAlloc", nbytes, flags))
    ctypes.memset(host, 0, nbytes)
    return host, int(call("cuMemHostGetDevicePointer", host, 0))


_encode_tiled: list = []  # [the ctypes function, or None where libcuda has none]


def encode_tiled_function():
    """The driver's ``cuTensorMapEncodeTiled`` as a ctypes function (the tensor-map encoder's
    fast path: no cuda.bindings list conversions), or None where libcuda cannot be loaded.
    Arguments: (out, dtype, rank, address, dims, strides, box, element strides, interleave,
    swizzle, L2 promotion, OOB fill); returns the CUresult."""
    if not _encode_tiled:
        p64, p32 = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
        _encode_tiled.append(_libcuda_function("cuTensorMapEncodeTiled", [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, p64, p64, p32, p32, ctypes.c_int,
            ctypes.c_int, ctypes.c_int, ctypes.c_int]))
    return _encode_tiled[0]


def _try_init() -> str | None:
    """Run ``cuInit`` once; return ``None`` on success or the reason it failed."""
    if "reason" in _init_state:  # decided: no lock (current_ordinal asks on every call without a GPU)
        return _init_state["reason"]
    with _lock:
        if "reason" in _init_state:
            return _init_state["reason"]
        reason = None
        try:
            driver = cu()
            err, = driver.cuInit(0)
            if int(err) != 0:
                reason = f"cuInit returned {_error_name(err)}"
            else:
                err, count = driver.cuDeviceGetCount()
                if int(err) != 0 or count == 0:
                    reason = "the CUDA driver reports no devices"
        except ImportError as exc:
            reason = f"cuda-bindings is not installed ({exc})"
        except Exception as exc:  # libcuda.so missing: cuda-pathfinder raises its own type
            reason = f"the CUDA driver library could not be loaded ({exc})"
        _init_state["reason"] = reason
        return reason


def driver_available() -> bool:
    """True when a CUDA driver with at least one device is usable. Never raises."""
    try:
        return _try_init() is None
    except Exception:
        return False


def init() -> None:
    """Initialise the driver or raise :class:`DriverNotFoundError` with the reason."""
    if "reason" in _init_state and _init_state["reason"] is None:
        return
    reason = _try_init()
    if reason is not None:
        raise DriverNotFoundError(
            f"no usable CUDA driver: {reason}. This call needs a GPU; compilation "
            "(Kernel.cubin / .ptx / .resources), TensorMapSpec and tf.reference work without one."
        )
