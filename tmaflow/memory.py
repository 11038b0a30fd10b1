"""tmaflow's minimal device array, and zero-copy views of anyone else's."""
from __future__ import annotations

import math
import weakref

import numpy as np

from . import dlpack, driver
from .device import Device, current_device
from .dtypes import DType, as_dtype
from .errors import TmaflowError


def _contiguous_strides(shape: tuple, itemsize: int) -> tuple:
    strides, acc = [], itemsize
    for n in reversed(shape):
        strides.insert(0, acc)
        acc *= max(n, 1)
    return tuple(strides)


class _Allocation:
    """Owns one ``cuMemAlloc`` block; freed by ``free()`` or when the last view dies."""

    def __init__(self, nbytes: int, device: Device):
        self.device = device.activate()
        self.nbytes = nbytes
        self.ptr = int(driver.call("cuMemAlloc", max(nbytes, 1)))
        self.generation = device.generation
        self._finalizer = weakref.finalize(self, _free, self.ptr, device, self.generation)

    def free(self) -> None:
        self._finalizer()

    @property
    def alive(self) -> bool:
        return self._finalizer.alive and self.generation == self.device.generation


# Bumped whenever tmaflow memory may have died (a free, a context reset). Hot paths that
# validated their arrays at epoch E skip re-checking liveness while the epoch is still E.
free_epoch = [0]


def _free(ptr: int, device: Device, generation: int) -> None:
    free_epoch[0] += 1
    if generation != device.generation:
        return  # the context was reset: the memory is already gone
    try:
        driver.cu().cuMemFree(ptr)
    except Exception:  # interpreter shutdown: the driver may already be gone
        pass


class DeviceArray:
    """A strided view of device memory: ``ptr``, ``shape``, ``strides`` (bytes), ``dtype``.

    ``owner`` keeps the memory alive (a tmaflow allocation or the foreign object viewed).
    """

    def __init__(self, ptr: int, shape, dtype, strides=None, owner=None, device: Device | None = None):
        self.dtype: DType = as_dtype(dtype)
        self.shape = tuple(int(n) for n in shape)
        self.strides = tuple(int(s) for s in strides) if strides is not None else \
            _contiguous_strides(self.shape, self.dtype.itemsize)
        self.ptr = int(ptr)
        self.owner = owner
        self.device = device

    # --- properties ---------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def is_contiguous(self) -> bool:
        return self.strides == _contiguous_strides(self.shape, self.dtype.itemsize)

    @property
    def alive(self) -> bool:
        """False once the tmaflow allocation behind this view was freed."""
        return not isinstance(self.owner, _Allocation) or self.owner.alive

    def reshape(self, *shape) -> "DeviceArray":
        """A view with another shape (contiguous arrays only; one extent may be -1)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        if not self.is_contiguous:
            raise TmaflowError(f"reshape: strides={self.strides} are not contiguous")
        if shape.count(-1) == 1:
            known = math.prod(n for n in shape if n != -1)
            shape = tuple(self.size // known if n == -1 else n for n in shape)
        if math.prod(shape) != self.size:
            raise TmaflowError(f"reshape: shape {tuple(shape)} does not hold {self.size} elements")
        return DeviceArray(self.ptr, shape, self.dtype, owner=self.owner, device=self.device)

    def free(self) -> None:
        """Release tmaflow-owned memory now (views of it become dead)."""
        if isinstance(self.owner, _Allocation):
            self.owner.free()

    # --- host transfers ---------------------------------------------------------
    def _require_alive(self, what: str) -> None:
        if not self.alive:
            raise TmaflowError(f"{what}: the array at 0x{self.ptr:x} was freed")

    def numpy(self) -> np.ndarray:
        """Copy to a new host array (contiguous arrays only)."""
        self._require_alive("DeviceArray.numpy()")
        if not self.is_contiguous:
            raise TmaflowError(f"DeviceArray.numpy(): strides={self.strides} are not contiguous")
        out = np.empty(self.shape, dtype=self.dtype.numpy)
        if self.nbytes:
            (self.device or current_device()).activate()
            driver.call("cuMemcpyDtoH", out.ctypes.data, self.ptr, self.nbytes)
        return out

    def copy_from(self, host: np.ndarray) -> "DeviceArray":
        self._require_alive("DeviceArray.copy_from()")
        host = np.ascontiguousarray(host)
        if host.nbytes != self.nbytes or not self.is_contiguous:
            raise TmaflowError(f"copy_from: host array of {host.nbytes} B does not fit "
                               f"{self!r} ({self.nbytes} B, contiguous={self.is_contiguous})")
        if self.nbytes:
            (self.device or current_device()).activate()
            driver.call("cuMemcpyHtoD", self.ptr, host.ctypes.data, self.nbytes)
        return self

    def fill_bytes(self, value: int) -> "DeviceArray":
        """Set every byte to ``value`` (poisoning outputs before a launch, zeroing)."""
        self._require_alive("DeviceArray.fill_bytes()")
        if self.nbytes:
            if not self.is_contiguous:
                raise TmaflowError("fill_bytes needs a contiguous array")
            (self.device or current_device()).activate()
            driver.call("cuMemsetD8", self.ptr, value & 0xFF, self.nbytes)
        return self

    # --- interop ------------------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict:
        if self.dtype.name == "bfloat16":
            typestr = "<V2"  # CAI has no bfloat16: consumers see raw 2-byte elements
        else:
            typestr = self.dtype.numpy.str
        return {"shape": self.shape, "typestr": typestr, "data": (self.ptr, False),
                "version": 3, "strides": None if self.is_contiguous else self.strides,
                "stream": None}

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return dlpack.export(self, self.device.ordinal if self.device else 0)

    def __dlpack_device__(self):
        return (dlpack.K_DL_CUDA, self.device.ordinal if self.device else 0)

    def __repr__(self) -> str:
        return (f"DeviceArray(shape={self.shape}, dtype={self.dtype}, ptr=0x{self.ptr:x}, "
                f"strides={self.strides}{'' if self.alive else ', FREED'})")


def empty(shape, dtype="float32", device: Device | None = None) -> DeviceArray:
    if isinstance(shape, int):
        shape = (shape,)
    dt = as_dtype(dtype)
    if any((not isinstance(n, (int, np.integer))) or n < 0 for n in shape):
        raise TmaflowError(f"shape={tuple(shape)!r}: every extent must be a non-negative int")
    dev = device or current_device()
    alloc = _Allocation(math.prod(shape) * dt.itemsize, dev)
    return DeviceArray(alloc.ptr, shape, dt, owner=alloc, device=dev)


def zeros(shape, dtype="float32", device: Device | None = None) -> DeviceArray:
    return empty(shape, dtype, device).fill_bytes(0)


def from_numpy(host: np.ndarray, dtype=None, device: Device | None = None) -> DeviceArray:
    host = np.asarray(host)
    dt = as_dtype(dtype if dtype is not None else host.dtype)
    if host.dtype.itemsize != dt.itemsize:
        raise TmaflowError(f"from_numpy: host dtype {host.dtype} ({host.dtype.itemsize} B) "
                           f"cannot hold {dt.name} ({dt.itemsize} B)")
    return empty(host.shape, dt, device).copy_from(host)


_CAI_TYPES = {"<f2": "float16", "<f4": "float32", "<f8": "float64", "|u1": "uint8",
              "|i1": "int8", "<u2": "uint16", "<i2": "int16", "<u4": "uint32", "<i4": "int32",
              "<u8": "uint64", "<i8": "int64", "|b1": "bool", "<V2": "bfloat16"}


def as_array(obj, dtype=None) -> DeviceArray:
    """A zero-copy DeviceArray view of a tmaflow, torch, cupy or jax array (or any object with
    ``__cuda_array_interface__`` or ``__dlpack__``). The view keeps ``obj`` alive."""
    if isinstance(obj, DeviceArray):
        return obj
    if isinstance(obj, np.ndarray):
        raise TmaflowError(
            f"as_array: got a host numpy array of shape {obj.shape}; kernels need device memory. "
            "Copy it with tf.from_numpy(array)")
    cai = None
    try:
        cai = obj.__cuda_array_interface__
    except Exception:  # torch raises for bfloat16; fall through to DLPack
        cai = None
    if cai is not None:
        typestr = cai["typestr"]
        name = _CAI_TYPES.get(typestr.replace("=", "<").replace(">", "<") if typestr[0] != "|" else typestr)
        if name is None:
            raise TmaflowError(f"as_array: __cuda_array_interface__ typestr={typestr!r} unsupported")
        dt = as_dtype(dtype or _torch_dtype_name(obj) or name)
        shape = tuple(cai["shape"])
        strides = cai.get("strides") or _contiguous_strides(shape, dt.itemsize)
        return DeviceArray(cai["data"][0] or 0, shape, dt, strides, owner=obj)
    if hasattr(obj, "__dlpack__"):
        ptr, shape, strides, dt, _, release = dlpack.consume(obj.__dlpack__())
        return DeviceArray(ptr, shape, as_dtype(dtype) if dtype else dt, strides,
                           owner=_DLPackOwner(obj, release))
    raise TmaflowError(
        f"as_array: {type(obj).__name__} is not a device array (no __cuda_array_interface__ "
        "or __dlpack__); pass a tf.DeviceArray, torch/cupy/jax array, or use tf.from_numpy")


def _torch_dtype_name(obj) -> str | None:
    dt = getattr(obj, "dtype", None)
    if dt is not None and type(dt).__module__.startswith("torch"):
        return str(dt).split(".")[-1]
    return None


class _DLPackOwner:
    def __init__(self, obj, release):
        self.obj = obj
        self._finalizer = weakref.finalize(self, release)
