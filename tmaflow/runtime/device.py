"""Devices, their primary contexts, and streams from any library."""
from __future__ import annotations

import operator
import sys
import threading
import weakref
from contextlib import contextmanager

from ..checks import is_int
from ..errors import KernelFaultError, LaunchError, TmaflowError, TmaflowWarning
from . import driver, faults
from .pool import MemoryPool

_devices: dict[int, "Device"] = {}
_lock = threading.Lock()


class Device:
    """A GPU and its retained primary context. ``tf.Device(i)`` returns one shared object per i."""

    def __new__(cls, ordinal: int = 0):
        if not is_int(ordinal):  # refused before the driver is asked how many there are
            raise TmaflowError(f"Device(ordinal={ordinal!r}): must be an int (a device ordinal; "
                               f"got {type(ordinal).__name__})")
        ordinal = operator.index(ordinal)
        driver.init()
        count = driver.call("cuDeviceGetCount")
        if not 0 <= ordinal < count:
            raise TmaflowError(f"Device(ordinal={ordinal!r}): must be an int in [0, {count - 1}]")
        with _lock:
            dev = _devices.get(ordinal)
            if dev is None:
                dev = super().__new__(cls)
                dev._setup(ordinal)
                _devices[ordinal] = dev
        return dev

    def _setup(self, ordinal: int) -> None:
        cu = driver.cu()
        self.ordinal = ordinal
        self.handle = driver.call("cuDeviceGet", ordinal)
        self.context = driver.call("cuDevicePrimaryCtxRetain", self.handle)
        self.context_value = int(self.context)  # what driver.current_context() answers when it is current
        name = driver.call("cuDeviceGetName", 256, self.handle)
        self.name = name.split(b"\0", 1)[0].decode()
        attr = cu.CUdevice_attribute
        get = lambda a: driver.call("cuDeviceGetAttribute", a, self.handle)  # noqa: E731
        self.compute_capability = (get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                                   get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
        self.sm_count = get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        # Opt-in maximum: what a block may have once the kernel attribute is raised.
        self.max_smem_per_block = get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        self.l2_bytes = get(attr.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
        self.total_memory = driver.call("cuDeviceTotalMem", self.handle)
        self.generation = 0  # bumped by reset(): modules and allocations of older ones are gone
        self._pool: MemoryPool | None = None
        self._allocations: weakref.WeakSet = weakref.WeakSet()

    # --- memory: tmaflow's pool on this device (pool.py) ----------------------------------
    def memory_pool(self):
        """tmaflow's :class:`~tmaflow.runtime.pool.MemoryPool` on this device (made on first use)."""
        if self._pool is None:
            driver.init()
            self._pool = MemoryPool(self)
        return self._pool

    def allocate(self, size: int, stream: int = 0) -> int:
        """A device pointer of ``size`` bytes (a ``pool.rounded`` size), ordered on ``stream``."""
        return self.memory_pool().allocate(size, stream)

    def release(self, ptr: int, size: int, stream: int = 0, thread: object = None,
                owner: object = None) -> None:
        """Give an ``allocate``d block back to this device's pool, ordered on ``stream``
        (``thread``: the allocating thread, for the per-thread default stream; ``owner``: the
        stream object ``stream`` came from, kept while the block is cached)."""
        self.memory_pool().release(ptr, size, stream, thread, owner)

    def track(self, allocation) -> None:
        """Remember a live allocation of this device (weakly), so ``reset`` can invalidate it."""
        self._allocations.add(allocation)

    def trim_memory(self) -> None:
        """Return cached blocks and the pool's unused memory to the device (synchronises)."""
        if self._pool is not None:
            self._pool.trim()

    def reset(self) -> None:
        """Recover from a sticky error (a faulted kernel, ``KernelFaultError``): reset the
        primary context, and forget the fault and the record of launches before it.

        Every allocation and loaded module of this device is invalid afterwards; tmaflow
        reloads its modules on the next launch and reports old arrays as freed. torch and
        cupy share the primary context but cannot be told: their tensors, streams and
        caching allocators are dead too, so this warns when one of them has initialised CUDA.
        """
        users = _framework_cuda_users()
        if users:
            import warnings

            warnings.warn(f"Device({self.ordinal}).reset(): {' and '.join(users)} initialised CUDA in "
                          "this process and share the primary context being reset; their tensors, "
                          "streams and allocator are invalid from now on (restart the process "
                          "before using them on this device again)", TmaflowWarning, stacklevel=2)
        driver.call("cuDevicePrimaryCtxReset", self.handle)
        self.generation += 1
        for forget in _reset_listeners:
            forget()
        for allocation in list(self._allocations):
            allocation.live = False
        self._allocations = weakref.WeakSet()
        self._pool = None  # destroyed with the context
        # The reset destroyed the context our handle named: retain the fresh one.
        try:
            self.context = driver.call("cuDevicePrimaryCtxRetain", self.handle)
            self.context_value = int(self.context)
        except KernelFaultError as e:
            # Measured on an H100 (driver 580): an illegal address (700) outlives the reset;
            # a trap (the watchdog's) does not. The driver documents these as process-fatal.
            raise KernelFaultError(e.call, e.code, e.name, e.detail, e.kernels, message=(
                f"Device({self.ordinal}).reset() could not recover: the driver keeps this fault "
                "after the reset, and only restarting the process clears it.\n" + str(e))) from None
        self.activate()
        faults.forget(self.ordinal)  # calls refused since the fault may run again

    @property
    def arch(self) -> str:
        """The NVRTC target of this device: ``sm_90a`` on Hopper, else ``sm_<major><minor>``."""
        major, minor = self.compute_capability
        # Hopper gets the arch-specific target so wgmma/setmaxnreg are available.
        return "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"

    @property
    def is_hopper(self) -> bool:
        """Whether this device is Hopper (compute capability 9.0)."""
        return self.compute_capability == (9, 0)

    def activate(self) -> "Device":
        """Make this device's primary context current on the calling thread, if it is not
        (``cuCtxSetCurrent`` is a driver call on every allocation otherwise). Another library
        may have made another context current, so the driver is asked, not a cache of ours."""
        if driver.current_context() != self.context_value:
            driver.check("cuCtxSetCurrent", driver.cu().cuCtxSetCurrent(self.context))
        return self

    def synchronize(self) -> None:
        """Wait for all work on this device's context (``cuCtxSynchronize``); the context
        current before (torch's current device, say) is current again after."""
        with context_of(self):
            driver.call("cuCtxSynchronize")

    def __repr__(self) -> str:
        major, minor = self.compute_capability
        return (f"Device({self.ordinal}, name={self.name!r}, cc={major}.{minor}, "
                f"sms={self.sm_count}, max_smem_per_block={self.max_smem_per_block})")


_thread = threading.local()
_reset_listeners: list = []


def _framework_cuda_users() -> list[str]:
    import sys

    users = []
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "cuda", None) is not None and torch.cuda.is_initialized():
        users.append("torch")
    if "cupy" in sys.modules:  # cupy cannot say whether it has touched the device: assume so
        users.append("cupy")
    return users


def on_reset(forget) -> None:
    """Call ``forget()`` whenever a device's context is reset (caches of launchers, whose
    function handles died with it)."""
    _reset_listeners.append(forget)


def as_device(device, who: str | None = None) -> Device:
    """The device a public function's ``device=`` names, made current: None (the current
    device), a :class:`Device` or its ordinal. ``who`` prefixes the refusal."""
    if device is None:
        return current_device()
    return named_device(device, who).activate()


def named_device(device, who: str | None = None) -> Device:
    """The :class:`Device` a ``device=`` other than None names (checked; not made current)."""
    if isinstance(device, Device):
        return device
    prefix = f"{who}: " if who else ""
    if not is_int(device):
        raise TmaflowError(f"{prefix}device={device!r} must be None, a tf.Device or a device "
                           f"ordinal (int; got {type(device).__name__})")
    try:
        return Device(device)
    except TmaflowError as exc:
        raise TmaflowError(f"{prefix}device={device!r}: {exc}") from None


def device_of(ordinal: int) -> Device:
    """``Device(ordinal)`` without the driver round trip once it exists (hot interop path)."""
    dev = _devices.get(ordinal)
    return dev if dev is not None else Device(ordinal)


def current_device() -> Device:
    """The device set by :func:`set_device` on this thread (activated). A thread that never set
    one takes, once, the device of the context current on it, as another library left it
    (after ``torch.cuda.set_device(1)`` tmaflow runs on device 1; a later switch is not
    followed), else device 0."""
    dev = getattr(_thread, "device", None)
    if dev is None:
        dev = Device(context_ordinal())
        if dev.ordinal != 0:
            _switched[0] = True
        _thread.device = dev
    return dev.activate()


def context_ordinal() -> int:
    """The device of the CUDA context current on this thread; 0 when none is."""
    driver.init()
    cu = driver.cu()
    err, context = cu.cuCtxGetCurrent()
    if err or not int(context):
        return 0
    err, device = cu.cuCtxGetDevice()
    return 0 if err else int(device)


_switched = [False]  # has any thread ever taken a device other than 0? (Kernel.launch's C key)


def thread_device() -> Device | None:
    """The device this thread has set or taken (None before its first use)."""
    return getattr(_thread, "device", None)


def current_ordinal() -> int:
    """The ordinal current_device() returns, without touching the driver once this thread
    has a device (the launch hot path); 0 where no driver is usable (compile-only machines)."""
    dev = getattr(_thread, "device", None)
    if dev is None:
        if not driver.driver_available():
            return 0
        dev = current_device()
    return dev.ordinal


def set_device(ordinal: int) -> Device:
    """Make device ``ordinal`` this thread's current device (and its context current); return it."""
    dev = Device(ordinal)
    if dev.ordinal != 0:
        _switched[0] = True
    _thread.device = dev
    return dev.activate()


def _make_current(context: int) -> None:
    """Make the context ``context`` (an int, 0: none) current again, if it is not."""
    if driver.current_context() != context:
        cu = driver.cu()
        cu.cuCtxSetCurrent(cu.CUcontext(context))


@contextmanager
def context_of(device: Device):
    """``device``'s context current for the block, the one current before it (torch's current
    device, say) current again after."""
    before = driver.current_context()
    device.activate()
    try:
        yield device
    finally:
        _make_current(before)


def usable(ordinal: int) -> bool:
    """Is ``ordinal`` a device of this machine the driver can run on?"""
    return driver.driver_available() and 0 <= ordinal < driver.call("cuDeviceGetCount")


@contextmanager
def using(ordinal: int):
    """``set_device(ordinal)`` for the block, as torch's device guard: after it, the thread's
    device (or none yet) and the context current on the thread (torch's current device) are
    what they were."""
    previous = getattr(_thread, "device", None)
    before = driver.current_context()
    try:
        yield set_device(ordinal)
    finally:
        _thread.device = previous
        _make_current(before)


class Stream:
    """A non-blocking CUDA stream owned by tmaflow. ``close()`` destroys it."""

    def __init__(self, device: Device | None = None):
        self.device = as_device(device, "Stream")
        cu = driver.cu()
        self._handle = driver.call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
        self.handle = int(self._handle)

    def synchronize(self) -> None:
        """Wait for the work queued on this stream (``cuStreamSynchronize``)."""
        driver.call("cuStreamSynchronize", self._handle)

    def __cuda_stream__(self):
        return (0, self.handle)

    def close(self) -> None:
        """Synchronise, then destroy the stream (arrays allocated on it are freed in order on
        the legacy default stream from then on)."""
        if getattr(self, "_handle", None) is not None:
            driver.call("cuStreamSynchronize", self._handle)
            if self.device._pool is not None:
                self.device._pool.forget_stream(self.handle)
            driver.call("cuStreamDestroy", self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"Stream(handle=0x{self.handle:x}, device={self.device.ordinal})"


MAX_HANDLE = 2**64 - 1  # a CUstream is a pointer


class StreamHandle(int):
    """A stream resolved from a stream object: its raw ``CUstream`` value (an int, as cache
    keys and the driver take it) keeping the object alive while the handle is in use."""

    owner: object

    def __new__(cls, handle: int, owner):
        self = super().__new__(cls, handle)
        self.owner = owner
        return self


def _checked_handle(stream, value, source: str | None = None) -> int:
    """``value``, which ``source`` of ``stream`` gave (None: ``stream`` itself), as a handle."""
    handle = operator.index(value) if is_int(value) else None
    if handle is not None and 0 <= handle <= MAX_HANDLE:
        return handle
    given = f"stream={stream!r}" if source is None else f"stream={stream!r}: {source} is {value!r}"
    if handle is None:
        raise LaunchError(f"{given} ({type(value).__name__}); a stream handle is an int in "
                          "[0, 2^64 - 1]")
    raise LaunchError(f"{given}: a stream handle is an int in [0, 2^64 - 1]")


def _not_a_stream(stream) -> LaunchError:
    return LaunchError(
        f"stream={stream!r} ({type(stream).__name__}) is not a stream: pass None, tf.Stream, "
        "an int handle in [0, 2^64 - 1], a cuda.core Stream, a torch.cuda.Stream or a cupy Stream")


def _protocol_handle(stream, proto) -> int:
    """The handle of a ``__cuda_stream__`` object (cuda.core's protocol: ``(0, handle)``)."""
    try:
        value = proto() if callable(proto) else proto
    except Exception as exc:  # a broken object: refused, never a crash
        raise LaunchError(f"stream={stream!r}: its __cuda_stream__ raised {exc!r}; it must return "
                          "(0, handle)") from None
    if type(value) is not tuple or len(value) != 2 or not is_int(value[0]) or value[0] != 0:
        raise LaunchError(f"stream={stream!r}: its __cuda_stream__ returned {value!r}; the protocol "
                          "(version 0) is a tuple (0, handle)")
    return _checked_handle(stream, value[1], "its __cuda_stream__ handle")


_MISSING = object()


def stream_handle(stream) -> int:
    """The raw ``CUstream`` value of anything tmaflow accepts as a stream, checked: a stream
    object gives a :class:`StreamHandle` that keeps it alive.

    Accepted: ``None`` (the legacy default stream), a :class:`Stream`, an int handle in
    [0, 2^64 - 1], a cuda-python ``CUstream``, an object with ``__cuda_stream__`` (cuda.core),
    torch streams (``.cuda_stream``) and cupy streams (``.ptr``).
    """
    if stream is None:
        return 0
    if type(stream) is int and 0 <= stream <= MAX_HANDLE or type(stream) is StreamHandle:
        return stream
    if isinstance(stream, Stream):
        if stream._handle is None:
            raise LaunchError(f"stream={stream!r} was closed; create a new tf.Stream()")
        return StreamHandle(stream.handle, stream)
    if is_int(stream):
        return _checked_handle(stream, stream)
    if isinstance(stream, (bool, float, str, bytes)) or type(stream).__module__ == "numpy":
        raise _not_a_stream(stream)
    if type(stream).__name__ == "CUstream":  # cuda-python's handle type
        return StreamHandle(_checked_handle(stream, int(stream), "int(stream)"), stream)
    for attr in ("__cuda_stream__", "cuda_stream", "ptr"):  # cuda.core, torch, cupy
        try:
            value = getattr(stream, attr, _MISSING)
        except Exception as exc:
            raise LaunchError(f"stream={stream!r}: reading .{attr} raised {exc!r}") from None
        if value is _MISSING:
            continue
        if attr == "__cuda_stream__":
            return StreamHandle(_protocol_handle(stream, value), stream)
        return StreamHandle(_checked_handle(stream, value, f".{attr}"), stream)
    raise _not_a_stream(stream)


_CURRENT: dict = {}  # "torch" / "cupy" -> (its module, current(ordinal) -> handle)


def _getter(framework: str):
    """``current(ordinal) -> stream handle`` of ``framework`` ("torch" or "cupy"), made once
    per module object (a module replaced in sys.modules gets its own)."""
    module = sys.modules[framework]
    known = _CURRENT.get(framework)
    if known is not None and known[0] is module:
        return known[1]
    if framework == "torch":
        current = getattr(module._C, "_cuda_getCurrentRawStream", None) or \
            (lambda ordinal: module.cuda.current_stream(ordinal).cuda_stream)
    else:
        get = module.cuda.get_current_stream

        def current(ordinal):  # the stream object kept with its handle (see _pinned)
            stream = get()
            return _pinned(stream.ptr, stream)
    _CURRENT[framework] = (module, current)
    return current


def _pinned(handle, owner):
    """``handle`` keeping ``owner``, the stream object it came from, alive while tmaflow keeps
    anything for it (states, workspaces, cached blocks): a destroyed stream's handle can be
    recycled for a new stream while the old one's work is still queued, and the new stream
    must not get scratch that work still uses. Legacy and per-thread handles stay ints."""
    return handle if handle <= 2 else StreamHandle(handle, owner)


def _current_stream(frameworks):
    """``current(ordinal) -> stream handle`` for ``stream=None`` with arrays of these
    frameworks, or None for the legacy default stream."""
    if "torch" in frameworks:
        return _getter("torch")
    if "cupy" in frameworks:
        return _getter("cupy")
    return None


def current_stream(frameworks, ordinal: int) -> int:
    """The handle ``stream=None`` means for arrays of these frameworks on device ``ordinal``."""
    current = _current_stream(frameworks)
    return 0 if current is None else current(ordinal)


def framework_stream(framework: str, ordinal: int) -> int:
    """``current_stream`` for the arrays of one framework ("torch" or "cupy"): the entry
    points' per-call path."""
    return _getter(framework)(ordinal)
