"""Encoded tensor maps: ``TensorMap`` encodes a ``TensorMapSpec`` with the driver for a concrete
array it keeps alive; ``MapTemplate`` re-encodes one spec at changing addresses."""
from __future__ import annotations

import ctypes
import math
import warnings

from ..dtypes import DType, as_dtype
from ..errors import LaunchError, TensorMapError, TmaflowWarning
from ..runtime import driver
from ..runtime.memory import DeviceArray, as_array
from .spec import TensorMapSpec, _ints

# The descriptor bytes are a pure function of the key (address included), so entries never go
# stale; liveness is a property of the array, checked on every use.
_encode_cache: dict[tuple, tuple] = {}
_ENCODE_CACHE_MAX = 4096


class TensorMap:
    """An encoded tensor map bound to an array it keeps alive. ``bytes(tmap)`` = 128 bytes.

    Re-creating a map for the same array and options is a dictionary lookup keyed on the
    array's address, shape, strides and dtype plus the options. A map of a tmaflow array that
    was freed refuses to be used (``to_bytes``, launches).
    """

    __slots__ = ("spec", "array", "_bytes", "_storage", "_alloc", "_origin", "__weakref__")

    def __init__(self, spec: TensorMapSpec, array, raw: bytes):
        self.spec = spec
        self.array = array
        self._bytes = raw
        self._storage: tuple[ctypes.Array[ctypes.c_char], int] | None = None
        self._alloc, self._origin = array._alloc, array._origin  # array: a DeviceArray

    @classmethod
    def tiled(cls, array, box, *, dtype=None, access: str = "any", **options) -> "TensorMap":
        """The map of ``array`` (any array kind) with box ``box`` (row-major) and the
        ``TensorMapSpec.tiled`` options. ``access`` says how the kernel uses it: "load",
        "store" or "any" (default). A store map whose rows are not a multiple of 16 bytes
        spills past each row (``spec.store_spill_bytes``): "store" refuses it, "any" warns
        (``tf.TmaflowWarning``), "load" is silent."""
        if not isinstance(access, str) or access not in ("any", "load", "store"):
            raise TensorMapError(f"access={access!r} must be 'any', 'load' or 'store'")
        arr = array if type(array) is DeviceArray else _device_view(array)
        if not arr._alloc.live:
            raise TensorMapError(f"array {arr!r} was freed; a tensor map needs live memory")
        if type(box) is not tuple:
            box = _ints("box", box)  # once: a generator is spent by the first read
        key: tuple | None  # None: an option is unhashable and the map is not cached
        key = ("tiled", arr.ptr, arr.shape, arr.strides, arr.dtype.name, dtype, box,
               *options.items())
        try:
            hit = _encode_cache.get(key)
        except TypeError:  # an unhashable option value: validation below names it
            hit, key = None, None
        if hit is not None:
            if access != "load" and hit[0].store_spill_bytes:
                _spill(hit[0], access)
            return cls(hit[0], arr, hit[1])
        arr = _device_view(arr)
        spec = TensorMapSpec.tiled(_view_dtype(arr, dtype), arr.shape, box, strides=arr.strides,
                                   address=arr.ptr, **options)
        if access != "load" and spec.store_spill_bytes:
            _spill(spec, access)
        return cls._encoded(key, spec, arr)

    @classmethod
    def im2col(cls, array, *, dtype=None, **options) -> "TensorMap":
        """An im2col map of ``array``, encoded once per array and options; ``options`` are those of
        ``TensorMapSpec.im2col`` (corners, ``channels_per_pixel``, ``pixels_per_column``, ...)."""
        arr = _device_view(array)
        key: tuple | None
        key = ("im2col", arr.ptr, arr.shape, arr.strides, arr.dtype.name, dtype,
               *((k, tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in options.items()))
        try:
            hit = _encode_cache.get(key)
        except TypeError:
            hit, key = None, None
        if hit is not None:
            return cls(hit[0], arr, hit[1])
        spec = TensorMapSpec.im2col(_view_dtype(arr, dtype), arr.shape, strides=arr.strides,
                                    address=arr.ptr, **options)
        return cls._encoded(key, spec, arr)

    @classmethod
    def _encoded(cls, key: tuple | None, spec: TensorMapSpec, arr) -> "TensorMap":
        encoder = _Encoder.of(spec)
        raw = encoder(spec.address or 0) if encoder is not None else encode(spec)
        if key is not None:
            if len(_encode_cache) >= _ENCODE_CACHE_MAX:
                _encode_cache.clear()
            _encode_cache[key] = (spec, raw)
        return cls(spec, arr, raw)

    def replace_address(self, array) -> None:
        """Point the map at another array of the same shape, strides and dtype (re-validated)."""
        arr = _device_view(array)
        if (arr.shape, arr.strides, arr.dtype.itemsize) != (self.spec.shape, self.spec.strides,
                                                             self.spec.dtype.itemsize):
            raise TensorMapError(
                f"replace_address: array shape={arr.shape} strides={arr.strides} "
                f"{arr.dtype.name} differs from the map's shape={self.spec.shape} "
                f"strides={self.spec.strides} {self.spec.dtype.name}; encode a new TensorMap")
        spec = self.spec.with_address(arr.ptr)
        self.spec, self.array = spec, arr
        self._alloc, self._origin = arr._alloc, arr._origin
        self._bytes = encode(spec)
        self._storage = None

    def to_bytes(self) -> bytes:
        """The 128-byte encoded ``CUtensorMap`` (a LaunchError once its array is freed)."""
        if not self._alloc.live:
            raise LaunchError(f"{self!r}: its array was freed; encode a map for a live array")
        return self._bytes

    def __bytes__(self) -> bytes:
        return self.to_bytes()

    @property
    def address(self) -> int:
        """Host address of a 128-byte-aligned copy of the descriptor (made on first use)."""
        if self._storage is None:
            self._storage = _aligned_storage(self._bytes)
        return ctypes.addressof(self._storage[0]) + self._storage[1]

    def __repr__(self) -> str:
        return f"TensorMap({self.spec!r}, address=0x{self.spec.address or 0:x})"


class MapTemplate:
    """Tensor maps of one validated spec at changing addresses: what an entry point keeps per
    shape, so a call with new buffers costs a dictionary lookup or one driver encode, not a
    re-validation. ``bind(array)`` needs an array of exactly the template's shape, strides
    and element size (the caller's cache key guarantees it)."""

    def __init__(self, spec: TensorMapSpec, access: str = "load"):
        if access == "store" and spec.store_spill_bytes:
            _spill(spec, "store")
        self.spec = spec
        self._maps: dict[int, tuple] = {}   # address -> (spec with address, 128 bytes)
        self._encoder = _Encoder.of(spec)

    def bind(self, arr: DeviceArray) -> TensorMap:
        hit = self._maps.get(arr.ptr)
        if hit is None:
            spec = self.spec.with_address(arr.ptr)  # the address rules, checked once
            raw = self._encoder(arr.ptr) if self._encoder is not None else encode(spec)
            if len(self._maps) >= 256:
                self._maps.clear()
            hit = self._maps[arr.ptr] = (spec, raw)
        if not arr._alloc.live:
            raise TensorMapError(f"array {arr!r} was freed; a tensor map needs live memory")
        return TensorMap(hit[0], arr, hit[1])

    def __repr__(self) -> str:
        return f"MapTemplate({self.spec!r}, {len(self._maps)} addresses)"


def _spill(spec: TensorMapSpec, access: str) -> None:
    n, item = spec.shape[-1], spec.dtype.itemsize
    extra = spec.store_spill_bytes // item
    text = (f"rows of {n} x {item} B = {n * item} B are not a multiple of 16 B: a TMA store "
            f"through this map writes {spec.store_spill_bytes} B past the end of every row "
            f"(elements {n}..{n + extra - 1} of the underlying rows get overwritten). Use rows of a "
            f"multiple of {16 // math.gcd(16, item)} elements")
    if access == "store":
        raise TensorMapError(text)
    warnings.warn(TmaflowWarning(text + "; pass access='load' for a map that is only loaded"),
                  stacklevel=3)


def _aligned_storage(raw: bytes) -> tuple[ctypes.Array[ctypes.c_char], int]:
    buf = ctypes.create_string_buffer(128 + 127)
    pad = (-ctypes.addressof(buf)) % 128
    ctypes.memmove(ctypes.addressof(buf) + pad, raw, 128)
    return buf, pad


def _device_view(array):
    arr = as_array(array)
    if not arr._alloc.live:
        raise TensorMapError(f"array {arr!r} was freed; a tensor map needs live memory")
    if arr.size == 0:
        raise TensorMapError(f"array shape={arr.shape} is empty; a tensor map needs every extent >= 1")
    return arr


def _view_dtype(arr, dtype) -> DType:
    if dtype is None:
        return arr.dtype
    dt = as_dtype(dtype)
    if dt.itemsize != arr.dtype.itemsize:
        raise TensorMapError(f"dtype={dt.name} ({dt.itemsize} B) cannot view a {arr.dtype.name} "
                             f"array ({arr.dtype.itemsize} B elements)")
    return dt


def encode(spec: TensorMapSpec) -> bytes:
    """Run the driver's encode for a validated spec; return the 128 descriptor bytes."""
    cu = driver.cu()
    d = spec.driver_order()
    addr = spec.address or 0
    u64 = lambda vs: [cu.cuuint64_t(v) for v in vs]  # noqa: E731
    u32 = lambda vs: [cu.cuuint32_t(v) for v in vs]  # noqa: E731
    strides = d["global_strides"]
    if not strides:  # rank 1: the driver wants a stride array anyway (measured: NULL is rejected)
        strides = (-(-spec.shape[0] * spec.dtype.itemsize // 16) * 16,)
    common = (cu.CUtensorMapDataType(d["dtype"]), d["rank"], addr, u64(d["global_dim"]),
              u64(strides))
    tail = (u32(d["element_strides"]), cu.CUtensorMapInterleave(d["interleave"]),
            cu.CUtensorMapSwizzle(d["swizzle"]), cu.CUtensorMapL2promotion(d["l2_promotion"]),
            cu.CUtensorMapFloatOOBfill(d["oob_fill"]))
    if spec.kind == "tiled":
        tmap = driver.call("cuTensorMapEncodeTiled", *common, u32(d["box"]), *tail,
                           detail=spec.describe())
    else:
        tmap = driver.call("cuTensorMapEncodeIm2col", *common, list(d["lower_corner"]),
                           list(d["upper_corner"]), cu.cuuint32_t(d["channels_per_pixel"]),
                           cu.cuuint32_t(d["pixels_per_column"]), *tail, detail=spec.describe())
    return ctypes.string_at(tmap.getPtr(), 128)


class _Encoder:
    """``cuTensorMapEncodeTiled`` through ctypes (``driver.encode_tiled_function``) with every
    argument but the address built once: about 1 us a call where the cuda.bindings wrapper,
    converting its lists, takes 25 us (measured on an H100 host). Falls back to :func:`encode`
    (which names the failure)."""

    @classmethod
    def of(cls, spec: TensorMapSpec):
        if spec.kind != "tiled" or driver.encode_tiled_function() is None:
            return None
        return cls(spec)

    def __init__(self, spec: TensorMapSpec):
        d = spec.driver_order()
        strides = d["global_strides"] or (-(-spec.shape[0] * spec.dtype.itemsize // 16) * 16,)
        u64, u32 = ctypes.c_uint64, ctypes.c_uint32
        self.spec = spec
        self._fn = driver.encode_tiled_function()
        self._arrays = ((u64 * d["rank"])(*d["global_dim"]), (u64 * len(strides))(*strides),
                        (u32 * d["rank"])(*d["box"]), (u32 * d["rank"])(*d["element_strides"]))
        self._head = (d["dtype"], d["rank"])
        self._tail = (d["interleave"], d["swizzle"], d["l2_promotion"], d["oob_fill"])
        self._out = ctypes.create_string_buffer(128 + 64)
        self._out_ptr = ctypes.addressof(self._out) + (-ctypes.addressof(self._out)) % 64

    def __call__(self, address: int) -> bytes:
        err = self._fn(self._out_ptr, *self._head, address, *self._arrays, *self._tail)
        if err:
            return encode(self.spec.with_address(address))  # raises the named CudaError
        return ctypes.string_at(self._out_ptr, 128)
