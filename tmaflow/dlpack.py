"""DLPack through ctypes: export a DeviceArray as a capsule, import anyone's capsule."""
from __future__ import annotations

import ctypes

from .dtypes import BY_NAME, DType
from .errors import TmaflowError

K_DL_CUDA = 2
_CODES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 6: "bool"}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", _Deleter)]

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int

# Exported tensors stay here until their consumer calls the deleter.
_live: dict[int, tuple] = {}


@_Deleter
def _delete(managed_ptr):
    _live.pop(ctypes.cast(managed_ptr, ctypes.c_void_p).value, None)


_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@_CapsuleDestructor
def _capsule_destructor(capsule_ptr):
    # Only an unconsumed capsule (still named "dltensor") owns its tensor.
    capsule = ctypes.cast(capsule_ptr, ctypes.py_object)
    if _api.PyCapsule_IsValid(capsule, b"dltensor"):
        ptr = _api.PyCapsule_GetPointer(capsule, b"dltensor")
        _live.pop(ptr, None)


def _dl_dtype(dtype: DType) -> DLDataType:
    if dtype.name.startswith("float8"):
        raise TmaflowError(f"{dtype.name} arrays are not exported through DLPack (its fp8 type "
                           "codes are not settled); view the bytes as uint8 or pass the array itself")
    if dtype.name == "bfloat16":
        code = 4
    elif dtype.name == "bool":
        code = 6
    elif dtype.is_float:
        code = 2
    else:
        code = 1 if dtype.numpy_name.startswith("u") else 0
    return DLDataType(code, dtype.itemsize * 8, 1)


def export(array, device_id: int):
    """A ``dltensor`` capsule viewing ``array`` (a DeviceArray); keeps it alive until consumed."""
    ndim = len(array.shape)
    shape = (ctypes.c_int64 * max(ndim, 1))(*array.shape)
    strides = (ctypes.c_int64 * max(ndim, 1))(*(s // array.dtype.itemsize for s in array.strides))
    managed = DLManagedTensor()
    managed.dl_tensor = DLTensor(array.ptr, DLDevice(K_DL_CUDA, device_id), ndim,
                                 _dl_dtype(array.dtype), shape, strides, 0)
    managed.deleter = _delete
    addr = ctypes.addressof(managed)
    _live[addr] = (managed, shape, strides, array)
    return _api.PyCapsule_New(addr, b"dltensor", ctypes.cast(_capsule_destructor, ctypes.c_void_p))


def consume(capsule) -> tuple[int, tuple, tuple, DType, int, object]:
    """Take a ``dltensor`` capsule: (ptr, shape, byte strides, dtype, device id, release)."""
    ptr = _api.PyCapsule_GetPointer(capsule, b"dltensor")
    managed = DLManagedTensor.from_address(ptr)
    t = managed.dl_tensor
    if t.device.device_type not in (K_DL_CUDA, 13):  # CUDA or CUDA managed
        raise TmaflowError(f"DLPack device_type={t.device.device_type} is not a CUDA device")
    kind = _CODES.get(t.dtype.code)
    if kind is None or t.dtype.lanes != 1:
        raise TmaflowError(f"DLPack dtype code={t.dtype.code} lanes={t.dtype.lanes} unsupported")
    name = {"bfloat": "bfloat16", "bool": "bool"}.get(kind, f"{kind}{t.dtype.bits}")
    dtype = BY_NAME[name]
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        strides = tuple(t.strides[i] * dtype.itemsize for i in range(t.ndim))
    else:
        strides, acc = [], dtype.itemsize
        for n in reversed(shape):
            strides.insert(0, acc)
            acc *= n
        strides = tuple(strides)
    _api.PyCapsule_SetName(capsule, b"used_dltensor")
    deleter = managed.deleter

    def release():
        if deleter:
            deleter(ctypes.cast(ptr, ctypes.POINTER(DLManagedTensor)))

    return (t.data or 0) + t.byte_offset, shape, strides, dtype, t.device.device_id, release
