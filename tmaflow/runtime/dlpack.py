"""DLPack through ctypes, per the Python array API standard's ``__dlpack__`` protocol.

Export: a DeviceArray as a versioned capsule (``DLManagedTensorVersioned``, DLPack 1.x) when the
consumer's ``max_version`` allows, else as a legacy one, with the consumer's stream ordered
after the array's pending work by an event (never a host sync). Import: anyone's capsule, each
field checked. The stream rules (which stream waits for which) are plain functions, separate
from the driver calls that carry them out.
"""
from __future__ import annotations

import ctypes
import enum
import functools
import math

from ..checks import as_bool, as_int, as_optional_int
from ..dtypes import BY_NAME, DType
from ..errors import TmaflowError
from . import driver
from .device import current_device


class DLPackError(TmaflowError, BufferError):
    """The array cannot be exported as asked (another device, a type the consumer's DLPack
    version has no code for): a ``BufferError``, as the array API standard requires."""


class DLDeviceType(enum.IntEnum):
    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3
    kDLCUDAManaged = 13


CUDA_DEVICES = (DLDeviceType.kDLCUDA, DLDeviceType.kDLCUDAManaged)
IS_COPIED = 2               # DLPACK_FLAG_BITMASK_IS_COPIED
NEWEST = (1, 1)              # the newest DLPack tmaflow reads and writes (1.1 added the fp8 codes)
NO_SYNC, LEGACY_STREAM, PER_THREAD_STREAM = -1, 1, 2  # the standard's stream values for CUDA

_CODE_NAMES = {0: "int", 1: "uint", 2: "float", 3: "opaque handle", 4: "bfloat", 5: "complex",
               6: "bool", 7: "float8_e3m4", 8: "float8_e4m3", 9: "float8_e4m3b11fnuz",
               10: "float8_e4m3fn", 11: "float8_e4m3fnuz", 12: "float8_e5m2",
               13: "float8_e5m2fnuz", 14: "float8_e8m0fnu", 15: "float6_e2m3fn",
               16: "float6_e3m2fn", 17: "float4_e2m1fn"}
_FP8_E4M3FN = 10


# --- the C structs (dlpack.h) -----------------------------------------------------------------

class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
_VersionedDeleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", _Deleter)]
DLManagedTensorVersioned._fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                                     ("deleter", _VersionedDeleter), ("flags", ctypes.c_uint64),
                                     ("dl_tensor", DLTensor)]

LEGACY_NAME, VERSIONED_NAME = b"dltensor", b"dltensor_versioned"
_USED = {LEGACY_NAME: b"used_dltensor", VERSIONED_NAME: b"used_dltensor_versioned"}

# The capsule API, called with the GIL held (PYFUNCTYPE). The destructor gets a bare pointer to
# a capsule being deallocated: it is passed on as a pointer, never wrapped in a Python reference.
_api = ctypes.pythonapi


def _capi(name: str, restype, *argtypes):
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, _api))


_OBJ, _PTR, _STR = ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p
_new_capsule = _capi("PyCapsule_New", _OBJ, _PTR, _STR, _PTR)
_is_valid = _capi("PyCapsule_IsValid", ctypes.c_int, _OBJ, _STR)
_get_name = _capi("PyCapsule_GetName", _STR, _OBJ)
_get_pointer = _capi("PyCapsule_GetPointer", _PTR, _OBJ, _STR)
_set_name = _capi("PyCapsule_SetName", ctypes.c_int, _OBJ, _STR)
_raw_is_valid = _capi("PyCapsule_IsValid", ctypes.c_int, _PTR, _STR)
_raw_get_pointer = _capi("PyCapsule_GetPointer", _PTR, _PTR, _STR)
CapsuleType = type(_new_capsule(1, None, None))


def capsule_name(capsule) -> bytes | None:
    """The name of a capsule (``b"dltensor"``, ``b"used_dltensor_versioned"``, ...)."""
    return _get_name(capsule)


# --- the standard's stream rules --------------------------------------------------------------

def as_spec_stream(handle: int) -> int:
    """A raw ``CUstream`` as the standard spells it: the legacy default stream is 1, not 0
    (the driver's ``CU_STREAM_LEGACY`` and ``CU_STREAM_PER_THREAD`` are 1 and 2 too)."""
    return LEGACY_STREAM if handle == 0 else int(handle)  # a plain int: torch refuses subclasses


def consumer_stream(stream) -> int | None:
    """The stream a consumer passed to ``__dlpack__``, as a raw handle; None for -1 (no sync)."""
    if stream is None:
        return LEGACY_STREAM  # the standard: None means the legacy default stream
    value = as_optional_int("__dlpack__ stream", stream, lo=NO_SYNC, hi=2**64 - 1)
    if value == 0:
        raise TmaflowError("__dlpack__ stream=0 is disallowed for CUDA by the array API standard "
                           "(it could mean None, 1 or 2): pass 1 for the legacy default stream, 2 for "
                           "the per-thread default stream, a stream handle, or -1 for no synchronisation")
    return None if value == NO_SYNC else value


def needs_wait(producer: int, consumer: int | None) -> bool:
    """Whether ``consumer`` must wait for the work queued on ``producer`` (raw handles; consumer
    None: it asked for no synchronisation)."""
    return consumer is not None and as_spec_stream(consumer) != as_spec_stream(producer)


def stream_wait(device, waiter: int, producer: int) -> None:
    """Order ``waiter`` after the work queued on ``producer`` so far: an event recorded on
    ``producer`` and waited for on ``waiter`` (the host does not wait)."""
    cu = driver.cu()
    device.activate()
    event = driver.call("cuEventCreate", cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)
    try:
        driver.call("cuEventRecord", event, producer)
        driver.call("cuStreamWaitEvent", waiter, event, 0)
    finally:
        driver.call("cuEventDestroy", event)  # the driver keeps it until the wait is done


# --- export -----------------------------------------------------------------------------------

def asked_version(max_version) -> tuple[int, int] | None:
    """The capsule version for a consumer's ``max_version``: None (a legacy capsule) when it
    reads no versioned capsule, else the newest both sides know."""
    if max_version is None:
        return None
    if isinstance(max_version, (str, bytes)) or not hasattr(max_version, "__len__") or len(max_version) != 2:
        raise TmaflowError(f"__dlpack__ max_version={max_version!r} must be None or a "
                           "(major, minor) pair of ints")
    major = as_int("__dlpack__ max_version[0]", max_version[0], lo=0)
    minor = as_int("__dlpack__ max_version[1]", max_version[1], lo=0)
    if major < 1:
        return None
    return min((major, minor), NEWEST)


def check_device(dl_device, own: tuple[int, int]) -> None:
    """``dl_device`` must be None or the array's own device: tmaflow copies across none."""
    if dl_device is None:
        return
    if isinstance(dl_device, (str, bytes)) or not hasattr(dl_device, "__len__") or len(dl_device) != 2:
        raise TmaflowError(f"__dlpack__ dl_device={dl_device!r} must be None or a "
                           "(device type, device id) pair like __dlpack_device__() returns")
    asked = (as_int("__dlpack__ dl_device[0]", dl_device[0]), as_int("__dlpack__ dl_device[1]", dl_device[1]))
    own = (int(own[0]), own[1])
    if asked != own:
        raise DLPackError(f"__dlpack__ dl_device={asked} is not the array's device {own} "
                          "(kDLCUDA, ordinal); tmaflow exports arrays only on their own device")


def asked_copy(copy) -> bool:
    """``copy``: True always copies; False and None never need to (same device, any layout)."""
    return False if copy is None else as_bool("__dlpack__ copy", copy)


def dl_dtype(dtype: DType, version: tuple[int, int] | None) -> DLDataType:
    if dtype.name.startswith("float8"):
        if version is None or version < (1, 1):
            raise DLPackError(
                f"{dtype.name} arrays are not exported through DLPack before version 1.1 (its "
                f"type code; the consumer reads max_version={version}); view the bytes as uint8 "
                "or pass the array itself")
        return DLDataType(_FP8_E4M3FN, 8, 1)
    if dtype.name == "bfloat16":
        code = 4
    elif dtype.name == "bool":
        code = 6
    elif dtype.is_float:
        code = 2
    else:
        code = 1 if dtype.numpy_name.startswith("u") else 0
    return DLDataType(code, dtype.itemsize * 8, 1)


# Exported tensors stay here, with what they keep alive, until their consumer calls the deleter
# (or an unconsumed capsule dies): address of the managed struct -> (structs, array, release).
_live: dict[int, tuple] = {}


def _free(addr: int) -> None:
    entry = _live.pop(addr, None)
    if entry is not None and entry[-1] is not None:
        entry[-1]()


@_Deleter
def _delete(managed_ptr):
    _free(ctypes.cast(managed_ptr, ctypes.c_void_p).value)


@_VersionedDeleter
def _delete_versioned(managed_ptr):
    _free(ctypes.cast(managed_ptr, ctypes.c_void_p).value)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(capsule_ptr):
    # Only an unconsumed capsule (still under its unused name) owns its tensor.
    for name in (VERSIONED_NAME, LEGACY_NAME):
        if _raw_is_valid(capsule_ptr, name):
            _free(_raw_get_pointer(capsule_ptr, name))


def make_capsule(array, device: tuple[int, int], dtype: DLDataType, version, flags: int, release):
    """A capsule viewing ``array`` (versioned when ``version`` is a pair, legacy when None);
    ``release()`` runs when the consumer is done with it."""
    ndim = len(array.shape)
    shape = (ctypes.c_int64 * max(ndim, 1))(*array.shape)
    strides = (ctypes.c_int64 * max(ndim, 1))(*(s // array.dtype.itemsize for s in array.strides))
    tensor = DLTensor(array.ptr, DLDevice(*device), ndim, dtype, shape, strides, 0)
    managed: ctypes.Structure
    if version is None:
        managed, name = DLManagedTensor(tensor, None, _delete), LEGACY_NAME
    else:
        managed = DLManagedTensorVersioned(DLPackVersion(*version), None, _delete_versioned,
                                           flags, tensor)
        name = VERSIONED_NAME
    addr = ctypes.addressof(managed)
    _live[addr] = (managed, shape, strides, array, release)
    return _new_capsule(addr, name, ctypes.cast(_capsule_destructor, ctypes.c_void_p))


def export(array, *, stream, max_version, dl_device, copy):
    """``array.__dlpack__(...)`` per the standard, for a DeviceArray (whose
    ``_producer_stream()`` is the raw stream of its pending work, and ``_copy_on(stream)`` a
    copy made in order on a stream)."""
    version = asked_version(max_version)
    own = array.__dlpack_device__()
    check_device(dl_device, own)
    copied = asked_copy(copy)
    consumer = consumer_stream(stream)
    dtype = dl_dtype(array.dtype, version)
    producer = array._producer_stream()
    if copied:
        array = array._copy_on(producer)
    release = None
    if needs_wait(producer, consumer):
        device = array.device or current_device()
        stream_wait(device, consumer, producer)
        release = functools.partial(_producer_waits, device, array, consumer)
    return make_capsule(array, own, dtype, version, IS_COPIED if copied else 0, release)


def _producer_waits(device, array, consumer: int) -> None:
    """Run when the consumer lets go: the array's memory is freed (and reused) in order on its
    producer stream (asked again: a closed tf.Stream hands over to the legacy stream), so that
    stream first waits for the work the consumer queued on its own."""
    try:
        stream_wait(device, array._producer_stream(), consumer)
    except TmaflowError:
        pass  # the context is gone (reset, interpreter exit), and the memory with it


# --- import -----------------------------------------------------------------------------------

def capsule_of(obj, stream: int | None):
    """``obj.__dlpack__`` asked for a versioned capsule ordered on ``stream`` (a raw handle;
    None: no stream is named and the producer keeps its own order), falling back to the
    pre-2023 signature for producers without ``max_version``."""
    what = type(obj).__name__
    if hasattr(obj, "__dlpack_device__"):
        _check_dlpack_device(obj)  # before asking for a capsule, as the standard's consumers do
    order = {} if stream is None else {"stream": as_spec_stream(stream)}
    try:
        try:
            capsule = obj.__dlpack__(**order, max_version=NEWEST)
        except TypeError:
            capsule = obj.__dlpack__(**order)
    except TmaflowError:
        raise
    except Exception as exc:
        raise TmaflowError(f"as_array: __dlpack__ of {what} failed: {type(exc).__name__}: {exc}") from None
    return capsule


def _check_dlpack_device(obj) -> None:
    what = type(obj).__name__
    try:
        device = obj.__dlpack_device__()
    except Exception as exc:
        raise TmaflowError(f"as_array: {what}.__dlpack_device__() failed: "
                           f"{type(exc).__name__}: {exc}") from None
    if not isinstance(device, tuple) or len(device) != 2 or \
            not all(isinstance(v, int) and not isinstance(v, bool) for v in device):
        raise TmaflowError(f"as_array: {what}.__dlpack_device__() returned {device!r}; the "
                            "standard asks for a (device type, device id) pair of ints")
    _check_cuda(what, device[0])


def _check_cuda(what: str, device_type: int) -> None:
    if device_type not in CUDA_DEVICES:
        try:
            name = DLDeviceType(device_type).name
        except ValueError:
            name = "unknown"
        host = " (host memory: copy it to the GPU first, e.g. tf.from_numpy)" \
            if device_type in (DLDeviceType.kDLCPU, DLDeviceType.kDLCUDAHost) else ""
        raise TmaflowError(f"as_array: {what} is on DLPack device_type={device_type} ({name}); "
                           f"kernels need kDLCUDA or kDLCUDAManaged memory{host}")


def _import_dtype(what: str, t: DLTensor) -> DType:
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    kind = _CODE_NAMES.get(code, f"code {code}")
    if code == _FP8_E4M3FN and bits == 8:
        name = "float8_e4m3fn"
    elif code in (0, 1, 2):
        name = f"{kind}{bits}"
    else:
        name = {(4, 16): "bfloat16", (6, 8): "bool"}.get((code, bits), kind)
    if lanes != 1 or name not in BY_NAME:
        raise TmaflowError(f"as_array: {what} has DLPack dtype code={code} ({kind}) bits={bits} "
                           f"lanes={lanes}, which tmaflow has no type for (its types: "
                           f"{', '.join(sorted(BY_NAME))})")
    return BY_NAME[name]


def consume(capsule, what: str = "the capsule"):
    """Take a ``dltensor_versioned`` or ``dltensor`` capsule: (ptr, shape, byte strides, dtype,
    device id, release). The capsule is marked used only once every field passed; until then
    it still owns its tensor (its destructor calls the producer's deleter)."""
    if type(capsule) is not CapsuleType:
        raise TmaflowError(f"as_array: {what} is a {type(capsule).__name__}, not a DLPack capsule")
    name = capsule_name(capsule)
    if name not in _USED or not _is_valid(capsule, name):
        used = name in _USED.values()
        raise TmaflowError(f"as_array: {what} is a capsule named {name!r}, " +
                           ("already consumed (a DLPack capsule can be taken once)" if used else
                            "not a DLPack tensor ('dltensor' or 'dltensor_versioned')"))
    ptr = _get_pointer(capsule, name)
    managed: ctypes.Structure
    if name == VERSIONED_NAME:
        managed = DLManagedTensorVersioned.from_address(ptr)
        version = (managed.version.major, managed.version.minor)
        if version[0] != NEWEST[0]:
            raise TmaflowError(f"as_array: {what} is DLPack version {version[0]}.{version[1]}; "
                               f"tmaflow reads major version {NEWEST[0]}")
    else:
        managed = DLManagedTensor.from_address(ptr)
    deleter, cast = managed.deleter, ctypes.POINTER(type(managed))
    t = managed.dl_tensor
    _check_cuda(what, t.device.device_type)
    dtype = _import_dtype(what, t)
    if t.ndim < 0 or (t.ndim and not t.shape):
        raise TmaflowError(f"as_array: {what} has ndim={t.ndim} and shape={'set' if t.shape else 'NULL'}")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if any(n < 0 for n in shape):
        raise TmaflowError(f"as_array: {what} has shape={shape}; extents must be >= 0")
    if t.strides:
        strides = tuple(t.strides[i] * dtype.itemsize for i in range(t.ndim))
    else:  # NULL strides: compact row-major
        strides = tuple(dtype.itemsize * math.prod(shape[i + 1:]) for i in range(t.ndim))
    data = (t.data or 0) + t.byte_offset
    if not t.data and 0 not in shape:
        raise TmaflowError(f"as_array: {what} has a NULL data pointer for shape={shape} "
                           f"({dtype.name}); only an empty array may have no memory")
    _set_name(capsule, _USED[name])

    def release():
        if deleter:
            deleter(ctypes.cast(ptr, cast))

    return data, shape, strides, dtype, t.device.device_id, release
