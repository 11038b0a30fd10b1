"""tmaflow's minimal device array, and zero-copy views of anyone else's."""
from __future__ import annotations

import functools
import math
import sys
import weakref

import numpy as np

from .. import checks, env
from ..dtypes import DType, as_dtype
from ..errors import TmaflowError
from . import dlpack, driver
from .device import (Device, as_device, context_of, current_device, current_ordinal, current_stream, device_of,
                     named_device, stream_handle, thread_device)
from .graph import ACTIVE as CAPTURING, capturing
from .pool import PER_THREAD, rounded, thread_token


@functools.lru_cache(maxsize=256)
def _contiguous_strides(shape: tuple, itemsize: int) -> tuple:
    strides: list[int] = []
    acc = itemsize
    for n in reversed(shape):
        strides.insert(0, acc)
        acc *= max(n, 1)
    return tuple(strides)


def gather_copies(shape: tuple, strides: tuple, itemsize: int) -> list[tuple]:
    """The 2-D copies (source offset, destination offset, row bytes, rows, source pitch), all in
    bytes, that gather a strided layout into a compact row-major one. Dimensions contiguous in
    each other merge first, so a compact array is one copy."""
    if 0 in shape:
        return []
    dims: list[list[int]] = []  # [extent, stride], outermost first
    for n, stride in zip(shape, strides):
        if n == 1:
            continue
        if stride <= 0:
            raise TmaflowError(f"copy of shape={shape} strides={strides}: every dimension of extent "
                               "> 1 needs a positive stride (broadcast and reversed views are not copied)")
        if dims and dims[-1][1] == n * stride:
            dims[-1] = [dims[-1][0] * n, stride]
        else:
            dims.append([n, stride])
    width = dims.pop()[0] * itemsize if dims and dims[-1][1] == itemsize else itemsize
    rows, pitch = dims.pop() if dims else (1, width)
    if pitch < width:
        raise TmaflowError(f"copy of shape={shape} strides={strides}: rows of {width} B overlap at a "
                           f"pitch of {pitch} B; overlapping views are not copied")
    copies, dst = [], 0
    for index in np.ndindex(*(n for n, _ in dims)):
        src = sum(i * stride for i, (_, stride) in zip(index, dims))
        copies.append((src, dst, width, rows, pitch))
        dst += width * rows
    return copies


class LiveToken:
    """What ``_alloc.live`` holds while memory may be used: one object per (origin, device
    ordinal), so the launch fast paths test liveness, origin and device in one identity
    comparison. Truthy; a freed allocation's ``live`` is False."""

    __slots__ = ("origin", "ordinal")

    def __init__(self, origin: str | None, ordinal: int | None):
        self.origin, self.ordinal = origin, ordinal

    def __repr__(self) -> str:
        where = "an unknown device" if self.ordinal is None else f"device {self.ordinal}"
        return f"LiveToken({self.origin or 'tmaflow'} memory on {where})"


_TOKENS: dict = {}


def live_token(origin: str | None, ordinal: int | None) -> LiveToken:
    """The one token of memory of ``origin`` ("torch", "cupy", None) on device ``ordinal``
    (None: unknown)."""
    token = _TOKENS.get((origin, ordinal))
    if token is None:
        token = _TOKENS.setdefault((origin, ordinal), LiveToken(origin, ordinal))
    return token


def live_tokens(origin: str | None, ordinal: int) -> tuple[LiveToken, LiveToken]:
    """The ``live`` values a launch on device ``ordinal`` takes for arrays of ``origin``: memory
    on that device, or on a device nobody named (the checked path takes both)."""
    return live_token(origin, ordinal), live_token(origin, None)


class _Unowned:
    """Memory tmaflow does not own (a foreign array's, a raw pointer): always live to us, kept
    alive by the object viewed. ``live`` is the token of its origin and device."""

    __slots__ = ("live",)

    def __init__(self, live: LiveToken):
        self.live = live


FOREIGN: dict = {origin: {} for origin in (None, "torch", "cupy")}  # origin -> ordinal -> _Unowned


def _unowned(origin: str | None, device) -> _Unowned:
    """The interned _Unowned of memory of ``origin`` on ``device`` (None: unknown)."""
    ordinal = None if device is None else device.ordinal
    unowned = FOREIGN[origin].get(ordinal)
    if unowned is None:
        unowned = FOREIGN[origin].setdefault(ordinal, _Unowned(live_token(origin, ordinal)))
    return unowned


class _Allocation:
    """One block from the device's stream-ordered pool; freed by ``free()`` (ordered on the
    stream it was allocated on) or when the last view dies. ``live`` is read by the launch
    fast path: it turns False at the free, or when the device's context is reset."""

    __slots__ = ("device", "size", "ptr", "live", "stream", "thread", "generation", "_stream_owner",
                 "__weakref__")

    def __init__(self, nbytes: int, device: Device, stream=None):
        """``device`` must be current (``empty`` made it so)."""
        self.live: LiveToken | bool = False  # until the pointer exists (a failed allocation frees nothing)
        self.device = device
        # the stream object (a tf.Stream: closed or not at the free) stays referenced until the free
        self._stream_owner = getattr(stream, "owner", stream)
        self.stream = int(stream_handle(stream))
        self.thread = thread_token() if self.stream == PER_THREAD else None  # its stream's owner
        self.generation = device.generation
        self.size = rounded(nbytes)
        self.ptr = device.allocate(self.size, self.stream)
        self.live = live_token(None, device.ordinal)
        device.track(self)

    def free(self) -> None:
        """Return the block to the pool, once; later uses of its views are refused."""
        if not self.live:
            return
        self.live = False
        device, stream = self.device, self.stream
        if self.generation != device.generation:
            return  # the context was reset: the memory is already gone
        owner = self._stream_owner
        if getattr(owner, "_handle", 0) is None:
            stream, owner = 0, None  # its tf.Stream was closed (and synchronised by close())
        try:
            device.release(self.ptr, self.size, stream, self.thread, owner)
        except Exception:  # interpreter shutdown: the driver may already be gone
            pass

    __del__ = free  # the last view died (CPython frees at once; no finalizer registry)


class DeviceArray:
    """A strided view of device memory: ``ptr``, ``shape``, ``strides`` (bytes), ``dtype``.

    ``owner`` keeps the memory alive (a tmaflow allocation or the foreign object viewed).
    """

    # Slots: the launch plans (_launch.c) read ``_alloc`` and ``ptr`` in place, not by name
    __slots__ = ("dtype", "shape", "strides", "ptr", "owner", "device", "_origin", "_alloc",
                 "__weakref__")

    def __init__(self, ptr: int, shape, dtype, strides=None, owner=None, device: Device | None = None):
        self.dtype: DType = as_dtype(dtype)
        self.shape = tuple(int(n) for n in shape)
        self.strides = tuple(int(s) for s in strides) if strides is not None else \
            _contiguous_strides(self.shape, self.dtype.itemsize)
        self.ptr = int(ptr)
        self.owner = owner
        self.device = device
        self._origin = _origin_of(owner)
        owned = getattr(owner, "_alloc", None) if isinstance(owner, DeviceArray) else owner
        self._alloc = owned if isinstance(owned, _Allocation) else _unowned(self._origin, device)

    @classmethod
    def _view(cls, ptr: int, shape: tuple, dtype: DType, strides: tuple, owner, device, origin,
              alloc=None):
        """A view from already-normalised parts (the fast interop path)."""
        a = object.__new__(cls)
        a.dtype, a.shape, a.strides, a.ptr, a.owner, a.device = dtype, shape, strides, ptr, owner, device
        a._alloc, a._origin = alloc or _unowned(origin, device), origin
        return a

    def _as(self, shape: tuple, strides: tuple) -> "DeviceArray":
        """The same memory under another (already checked) layout: the entry points' reshape."""
        return DeviceArray._view(self.ptr, shape, self.dtype, strides, self.owner, self.device,
                                 self._origin, self._alloc)

    # --- properties ---------------------------------------------------------
    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """The bytes of its elements (``size`` x itemsize)."""
        return self.size * self.dtype.itemsize

    @property
    def is_contiguous(self) -> bool:
        """Whether its strides are the row-major ones of its shape."""
        return self.strides == _contiguous_strides(self.shape, self.dtype.itemsize)

    @property
    def alive(self) -> bool:
        """False once the tmaflow allocation behind this view was freed."""
        return bool(self._alloc.live)

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
        shape = tuple(int(n) for n in shape)
        return self._as(shape, _contiguous_strides(shape, self.dtype.itemsize))

    def free(self) -> None:
        """Release tmaflow-owned memory now (views of it become dead). The free is ordered on
        the stream the array was allocated on, so work already queued there finishes first."""
        if isinstance(self._alloc, _Allocation):
            self._alloc.free()

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
            with context_of(self.device or current_device()):
                driver.call("cuMemcpyDtoH", out.ctypes.data, self.ptr, self.nbytes)
        return out

    def copy_from(self, host: np.ndarray) -> "DeviceArray":
        """Copy a host array of the same byte size into this contiguous array (synchronous); returns self."""
        self._require_alive("DeviceArray.copy_from()")
        host = np.ascontiguousarray(host)
        if host.nbytes != self.nbytes or not self.is_contiguous:
            raise TmaflowError(f"copy_from: host array of {host.nbytes} B does not fit "
                               f"{self!r} ({self.nbytes} B, contiguous={self.is_contiguous})")
        if self.nbytes:
            with context_of(self.device or current_device()):
                driver.call("cuMemcpyHtoD", self.ptr, host.ctypes.data, self.nbytes)
        return self

    def fill_bytes(self, value: int) -> "DeviceArray":
        """Set every byte to ``value``, done when this returns (poisoning outputs before a
        launch on any stream, zeroing); inside a capturing tf.Graph, a memset node."""
        self._require_alive("DeviceArray.fill_bytes()")
        if self.nbytes:
            if not self.is_contiguous:
                raise TmaflowError("fill_bytes needs a contiguous array")
            with context_of(self.device or current_device()):
                graph = capturing() if CAPTURING else None
                if graph is not None:  # part of the graph: it runs at every replay
                    driver.call("cuMemsetD8Async", self.ptr, value & 0xFF, self.nbytes, graph.stream.handle)
                else:
                    # after the work the memory is ordered on, and finished before returning: a
                    # plain cuMemsetD8 may still run when a kernel on a non-blocking stream starts
                    stream = self._producer_stream()
                    driver.call("cuMemsetD8Async", self.ptr, value & 0xFF, self.nbytes, stream)
                    driver.call("cuStreamSynchronize", stream)
        return self

    # --- interop ------------------------------------------------------------
    def _producer_stream(self) -> int:
        """The raw stream this array's pending work is ordered on: its allocation's stream for
        tmaflow memory; for a torch or cupy view, that library's current stream (where its own
        work and tmaflow's ``stream=None`` launches on the view go); else the legacy default."""
        alloc = self._alloc
        if isinstance(alloc, _Allocation):
            closed = getattr(alloc._stream_owner, "_handle", 0) is None  # synchronised by close()
            return 0 if closed else alloc.stream
        ordinal = self.device.ordinal if self.device is not None else current_ordinal()
        return current_stream((self._origin,), ordinal)

    def _copy_on(self, stream: int) -> "DeviceArray":
        """A compact copy, allocated and copied in order on ``stream`` (a raw handle)."""
        out = empty(self.shape, self.dtype, self.device, stream=stream)
        cu = driver.cu()
        for src, dst, width, rows, pitch in gather_copies(self.shape, self.strides, self.dtype.itemsize):
            copy = cu.CUDA_MEMCPY2D()
            copy.srcMemoryType = copy.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
            copy.srcDevice, copy.srcPitch = self.ptr + src, pitch
            copy.dstDevice, copy.dstPitch = out.ptr + dst, width
            copy.WidthInBytes, copy.Height = width, rows
            driver.call("cuMemcpy2DAsync", copy, stream)
        return out

    @property
    def __cuda_array_interface__(self) -> dict:
        """CUDA array interface v3; ``stream`` names the stream this array's pending work is
        on, so a consumer on another stream orders itself after it."""
        if self.dtype.name == "bfloat16":
            typestr = "<V2"  # CAI has no bfloat16: consumers see raw 2-byte elements
        else:
            typestr = self.dtype.numpy.str
        return {"shape": self.shape, "typestr": typestr, "data": (self.ptr, False),
                "version": 3, "strides": None if self.is_contiguous else self.strides,
                "stream": dlpack.as_spec_stream(self._producer_stream())}

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of this array, per the array API standard: versioned (DLPack 1.x)
        when ``max_version`` allows, else legacy; the consumer's ``stream`` (None: the legacy
        default stream, -1: no ordering) waits for this array's pending work by an event;
        ``copy=True`` exports a copy (flagged as one), ``copy=False`` and None never copy;
        ``dl_device`` other than this array's device raises a ``BufferError``."""
        self._require_alive("__dlpack__")
        return dlpack.export(self, stream=stream, max_version=max_version, dl_device=dl_device,
                             copy=copy)

    def __dlpack_device__(self) -> tuple:
        return (dlpack.DLDeviceType.kDLCUDA, self.device.ordinal if self.device is not None
                else current_ordinal())

    def __repr__(self) -> str:
        return (f"DeviceArray(shape={self.shape}, dtype={self.dtype}, ptr=0x{self.ptr:x}, "
                f"strides={self.strides}{'' if self.alive else ', FREED'})")


def empty(shape, dtype="float32", device: Device | None = None, stream=None) -> DeviceArray:
    """An uninitialised array from the device's stream-ordered pool, allocated (and later
    freed) in order on ``stream`` (default: the legacy default stream). Using it on another
    stream is fine once that stream is ordered after the allocation; free it only after the
    work on other streams finished (as with torch's caching allocator)."""
    shape = checks.as_ints("shape", shape, lo=0)
    dt = as_dtype(dtype)
    if math.prod(shape) * dt.itemsize >= 1 << 63:
        raise TmaflowError(f"shape={shape} of {dt.name} needs {math.prod(shape) * dt.itemsize} B, "
                           "beyond any device's memory")
    if device is None or device is thread_device():  # made current: stream 0 is its legacy stream
        return _empty_on(current_device(), shape, dt, stream)
    with context_of(named_device(device)) as dev:  # another device: its context for the call only
        return _empty_on(dev, shape, dt, stream)


def _empty_on(dev: Device, shape: tuple, dt: DType, stream) -> DeviceArray:
    graph = capturing() if CAPTURING else None
    if graph is not None:
        stream = graph.alloc_stream  # eager: an allocation is no node of the graph
    alloc = _Allocation(math.prod(shape) * dt.itemsize, dev, stream)
    if graph is not None:
        graph.own(alloc)  # kept for the replays that write it
    return DeviceArray._view(alloc.ptr, shape, dt, _contiguous_strides(shape, dt.itemsize), alloc,
                             dev, None, alloc)


def unowned_block(nbytes: int, device: Device | None = None, stream=None) -> DeviceArray:
    """``nbytes`` uint8 from the pool in order on ``stream`` that no tf.Graph owns, even while
    this thread captures one: memory that launches of several graphs share (counter slabs) must
    outlive each of them."""
    dev = as_device(device)
    alloc = _Allocation(nbytes, dev, stream)
    return DeviceArray._view(alloc.ptr, (nbytes,), as_dtype("uint8"), (1,), alloc, dev, None, alloc)


def zeros(shape, dtype="float32", device: Device | None = None) -> DeviceArray:
    """``empty(shape, dtype, device)`` with every byte zero."""
    return empty(shape, dtype, device).fill_bytes(0)


def from_numpy(host: np.ndarray, dtype=None, device: Device | None = None) -> DeviceArray:
    """A new device array holding a copy of ``host`` (``dtype`` reinterprets its bytes, e.g.
    uint16 bits as ``"bfloat16"``; the item sizes must match)."""
    given, host = host, np.asarray(host)
    if host.dtype == object:
        raise TmaflowError(f"from_numpy: host of type {type(given).__name__} holds Python objects; "
                           "give a numpy array (or nested lists) of numbers")
    dt = as_dtype(dtype if dtype is not None else host.dtype)
    if host.dtype.itemsize != dt.itemsize:
        raise TmaflowError(f"from_numpy: host dtype {host.dtype} ({host.dtype.itemsize} B) "
                           f"cannot hold {dt.name} ({dt.itemsize} B)")
    return empty(host.shape, dt, device).copy_from(host)


_CAI_TYPES = {"<f2": "float16", "<f4": "float32", "<f8": "float64", "|u1": "uint8",
              "|i1": "int8", "<u2": "uint16", "<i2": "int16", "<u4": "uint32", "<i4": "int32",
              "<u8": "uint64", "<i8": "int64", "|b1": "bool", "<V2": "bfloat16"}


# --- foreign arrays: fast views of the libraries we know, protocols for the rest ---------------

def _origin_of(obj) -> str | None:
    """"torch" / "cupy" when ``obj`` (or the array a view or tensor map is of, or a DLPack
    capsule's exporter) belongs to that library."""
    if isinstance(obj, _DLPackOwner):
        obj = obj.obj
    if hasattr(obj, "_origin"):  # DeviceArray, TensorMap
        return obj._origin
    mod = type(obj).__module__ or ""
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("cupy"):
        return "cupy"
    return None


_TORCH_TYPES: list = []


def _torch_types():
    if not _TORCH_TYPES:
        torch = sys.modules.get("torch")
        if torch is None:
            return ()
        _TORCH_TYPES.append(torch.Tensor)
    return _TORCH_TYPES[0]


_TORCH_EXACT: set = set()  # the exact types found to be torch tensors: one set lookup each call
_TORCH_DTYPES: dict = {}
_TORCH_PLACES: dict = {}  # ordinal -> (Device, _Unowned) of torch memory there


def _torch_view(t) -> DeviceArray:
    ordinal = t.get_device()
    place = _TORCH_PLACES.get(ordinal)
    if place is None:
        if ordinal < 0:
            raise TmaflowError(f"as_array: the torch tensor of shape {tuple(t.shape)} is on "
                               f"{t.device}; kernels need a CUDA tensor (use .cuda())")
        device = device_of(ordinal)
        place = _TORCH_PLACES[ordinal] = (device, _unowned("torch", device))
    dt = _TORCH_DTYPES.get(t.dtype)
    if dt is None:
        dt = _TORCH_DTYPES[t.dtype] = as_dtype(t.dtype)
    item = dt.itemsize
    return DeviceArray._view(t.data_ptr(), t.shape, dt, tuple([s * item for s in t.stride()]), t,
                             place[0], "torch", place[1])


def _cupy_view(a) -> DeviceArray:
    return DeviceArray._view(a.data.ptr, a.shape, as_dtype(a.dtype), a.strides, a,
                             device_of(a.data.device_id), "cupy")


def as_array(obj, dtype=None, stream=None) -> DeviceArray:
    """A zero-copy DeviceArray view of a tmaflow, torch, cupy or jax array (or any object with
    ``__cuda_array_interface__`` or ``__dlpack__``). The view keeps ``obj`` alive.

    ``stream`` is where the view will be used. Given, an array reached through a protocol is
    ordered before it: DLPack producers are passed it as ``__dlpack__(stream=...)``, and a CAI
    v3 ``stream`` is waited for by an event. None (what launches use: they run on the stream
    the caller's framework has current, as Triton does) orders nothing. torch and cupy arrays
    follow their current stream."""
    t = type(obj)
    if t is DeviceArray:
        return obj
    if t in _TORCH_EXACT and dtype is None:
        return _torch_view(obj)
    mod = t.__module__
    if dtype is None and mod.startswith("torch") and isinstance(obj, _torch_types()):
        _TORCH_EXACT.add(t)
        return _torch_view(obj)
    if dtype is None and mod.startswith("cupy") and t.__name__ == "ndarray" and obj.dtype.kind != "V":
        return _cupy_view(obj)
    if isinstance(obj, DeviceArray):
        return obj
    if isinstance(obj, np.ndarray):
        raise TmaflowError(
            f"as_array: got a host numpy array of shape {obj.shape}; kernels need device memory. "
            "Copy it with tf.from_numpy(array)")
    target = None if stream is None else stream_handle(stream)
    asked = as_dtype(dtype) if dtype is not None else None
    cai, cai_failure = None, None
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        pass
    except Exception as exc:  # torch raises for bfloat16; fall through to DLPack
        cai_failure = exc
    if cai is not None:
        return _from_cai(obj, cai, asked, target)
    if hasattr(obj, "__dlpack__"):
        capsule = dlpack.capsule_of(obj, target)
        ptr, shape, strides, dt, _, release = dlpack.consume(
            capsule, f"the __dlpack__() result of {type(obj).__name__}")
        return DeviceArray(ptr, shape, asked or dt, strides, owner=_DLPackOwner(obj, release))
    if cai_failure is not None:
        raise TmaflowError(f"as_array: {type(obj).__name__}.__cuda_array_interface__ failed: "
                           f"{type(cai_failure).__name__}: {cai_failure}")
    raise TmaflowError(
        f"as_array: {type(obj).__name__} is not a device array (no __cuda_array_interface__ "
        "or __dlpack__); pass a tf.DeviceArray, torch/cupy/jax array, or use tf.from_numpy")


def _is_index(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _from_cai(obj, cai, dtype: DType | None, stream: int | None) -> DeviceArray:
    """A view described by ``__cuda_array_interface__`` (v2/v3), every field checked; a v3
    ``stream`` with pending work is waited for on ``stream`` (a raw handle)."""
    def bad(why):
        return TmaflowError(f"as_array: {type(obj).__name__}.__cuda_array_interface__ {why}")

    if not isinstance(cai, dict):
        raise bad(f"is a {type(cai).__name__}, not a dict")
    for key in ("shape", "typestr", "data"):
        if key not in cai:
            raise bad(f"has no {key!r}")
    if cai.get("mask") is not None:
        raise bad("has a mask; masked arrays are not supported")
    typestr, shape, data = cai["typestr"], cai["shape"], cai["data"]
    if not isinstance(typestr, str) or len(typestr) < 3:
        raise bad(f"typestr={typestr!r} is not a numpy type string")
    name = _CAI_TYPES.get(typestr.replace("=", "<").replace(">", "<") if typestr[0] != "|" else typestr)
    if name is None:
        raise bad(f"typestr={typestr!r} unsupported (tmaflow types: {', '.join(sorted(_CAI_TYPES))})")
    if not isinstance(shape, (tuple, list)) or any(not _is_index(n) or n < 0 for n in shape):
        raise bad(f"shape={shape!r} must be a tuple of non-negative ints")
    if not isinstance(data, (tuple, list)) or len(data) != 2 or \
            not (data[0] is None or _is_index(data[0]) and 0 <= data[0] < 2**64) or \
            not isinstance(data[1], (bool, np.bool_)):
        raise bad(f"data={data!r} must be a (pointer, read_only) pair: an int in [0, 2**64) "
                  "and a bool")
    shape = tuple(int(n) for n in shape)
    ptr = int(data[0] or 0)
    if ptr == 0 and 0 not in shape:
        raise bad(f"data={data!r} is a NULL pointer for shape={shape}; only an empty array may "
                  "have no memory")
    dt = dtype or as_dtype(_torch_dtype_name(obj) or name)
    strides = cai.get("strides")
    if strides is not None and (not isinstance(strides, (tuple, list)) or len(strides) != len(shape)
                                or not all(_is_index(s) for s in strides)):
        raise bad(f"strides={strides!r} must be {len(shape)} ints (or None)")
    strides = tuple(int(s) for s in strides) if strides else _contiguous_strides(shape, dt.itemsize)
    producer = cai.get("stream")
    if producer is not None and (not _is_index(producer) or not 0 < producer < 2**64):
        raise bad(f"stream={producer!r} must be None or a stream handle > 0 (1: the legacy "
                  "default stream, 2: per-thread; 0 is disallowed as ambiguous)")
    if producer is not None and stream is not None and dlpack.needs_wait(int(producer), stream):
        dlpack.stream_wait(current_device(), stream, int(producer))
    return DeviceArray(ptr, shape, dt, strides, owner=obj)


def _torch_dtype_name(obj) -> str | None:
    dt = getattr(obj, "dtype", None)
    if dt is not None and type(dt).__module__.startswith("torch"):
        return str(dt).split(".")[-1]
    return None


class _DLPackOwner:
    def __init__(self, obj, release):
        self.obj = obj
        self._finalizer = weakref.finalize(self, release)


# compute-sanitizer's initcheck counts neither TMA stores nor tensormap-proxy writes as
# initialising memory, and (seen on an H100) not every stream-ordered memset either: with
# TMAFLOW_ZERO_SCRATCH=1 (tools/sanitize.sh sets it) scratch the library makes is zeroed by a
# synchronous memset, after the allocation's stream and before any later work.
ZERO_SCRATCH = env.flag("TMAFLOW_ZERO_SCRATCH", False)


def zero_for_sanitizer(arr: DeviceArray, stream: int) -> None:
    """Zero ``arr`` synchronously when TMAFLOW_ZERO_SCRATCH is set; nothing otherwise, and
    nothing while ``stream`` is being captured into a graph (a synchronisation would end the
    capture; a graph's memory is the graph's)."""
    if ZERO_SCRATCH and arr.nbytes:
        if driver.stream_capturing(stream):
            return
        driver.call("cuStreamSynchronize", stream)
        driver.call("cuMemsetD8", arr.ptr, 0, arr.nbytes)
        driver.call("cuCtxSynchronize")
