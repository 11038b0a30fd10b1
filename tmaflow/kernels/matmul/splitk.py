"""The split-K workspace: per-device, per-stream counters and fp32 partials that eager split-K
launches share, zeroed on the stream that uses them; a captured launch's own (``call_scratch``)."""
from __future__ import annotations

import threading
from contextlib import contextmanager

from ...dtypes import as_dtype
from ...errors import TmaflowError
from ...launch.launcher import ContextMoved
from ...runtime import driver
from ...runtime.graph import ACTIVE as CAPTURING, capturing
from ...runtime.memory import DeviceArray, empty
from .. import tile_counters
from ..entry import scratch

FLOAT32 = as_dtype("float32")


def _with_split_k(launcher, partials: bool, device, stream: int) -> tuple:
    """(launcher, workspace): where pieces of tiles meet in fp32 partials (split-K, split tails),
    the launch guarded by the workspace of the stream it launches on (resolved)."""
    if not partials:
        return launcher, None
    ws = _workspace(device, stream)
    return _SplitK(launcher, ws), ws


_ASK = object()  # _split_k_buffers' captured: not known yet


def _split_k_buffers(st, like=None, like_arr: DeviceArray | None = None, captured=_ASK) -> tuple:
    """(partials, counters) of a split-K state, fetched per call ((0, 0) without split-K): the
    stream's workspace for an eager call (a failed launch discards it); for a captured call
    whose graph can own scratch (``call_scratch``), partials of its own from the capture's pool
    and counters taken for it alone (``tile_counters``). ``like``: the call's first operand
    (its kind decides where scratch comes from); ``captured``: ``call_scratch``'s answer where
    the caller asked already."""
    ws = st.workspace
    if ws is None:
        return 0, 0
    if captured is _ASK:
        captured = call_scratch(ws.stream, like_arr)
    if captured and like_arr is not None:
        counters, floats = st.workspace_sizes
        taken = tile_counters.take(ws.device, counters)
        if taken is not None:
            return scratch(like, like_arr, (max(floats, 1),), FLOAT32, ws.stream), taken
    buffers = _stream_buffers(st)
    if captured is not None:  # in a graph that owns nothing of ours: it keeps the workspace's buffer
        ws.keep()
    return buffers


def _stream_buffers(st) -> tuple:
    """(partials, counters) from the stream's workspace (an eager call's)."""
    counters, partials = st.workspace.views(*st.workspace_sizes)
    return partials, counters


def call_scratch(stream: int, like_arr: DeviceArray | None) -> bool | None:
    """Whether a call on ``stream`` is captured into a graph: None if not (eager); True if the
    graph can own the call's scratch (a tf.Graph capturing on ``stream``; torch.cuda.graph's
    capture of torch arrays, whose scratch torch allocates from the capture's pool), False if
    not (another library's capture of other arrays). A captured launch must not use the
    stream's workspace where it can help it: the graph may replay on any stream beside other
    graphs captured on the same stream and eager calls there, and after the workspace was
    replaced and freed. (A launch on another stream inside a tf.Graph capture runs eagerly.
    Torch arrays in a capture that is not torch's own are taken for torch's: torch's allocator
    would then hand the scratch out again after the call; capture them with torch.cuda.graph.)"""
    if CAPTURING:
        graph = capturing()
        if graph is not None and stream == graph.stream.handle:
            return True
    if not driver.stream_capturing(stream):
        return None
    if getattr(_serial, "on", False):
        return False
    return like_arr is not None and like_arr._origin == "torch"


_serial = threading.local()


@contextmanager
def serial_capture():
    """Inside, this thread's captures are of graphs replayed one at a time and never beside
    eager calls on their capture stream (the collectives' own captures, on a plan's side stream,
    ordered by its turns): captured calls use that stream's workspace (kept for the process)
    rather than taking counters for good at every capture. A plan that recaptures its calls as
    they cycle through more addresses than it keeps graphs would otherwise grow without bound."""
    _serial.on = True
    try:
        yield
    finally:
        _serial.on = False


class _Workspace:
    """Split-K scratch for one (thread, device, stream): per-tile counters, zero between
    launches (each tile's last split resets its own), then the fp32 partial sums. Allocated,
    zeroed and freed in order on its stream, so a replaced buffer goes back to the pool only
    after the launches that used it."""

    def __init__(self, device, stream: int):
        self.device, self.stream = device, stream
        self._views: tuple[DeviceArray, DeviceArray] | None = None  # views of one buffer
        self._buffer: DeviceArray | None = None
        self.counters = self.floats = 0

    def views(self, counters: int, floats: int) -> tuple[DeviceArray, DeviceArray]:
        """(counters, partials) views holding at least the sizes asked for."""
        views = self._views
        if views is None or not views[0].alive or counters > self.counters or floats > self.floats:
            self.counters = max(self.counters, -(-counters // 64) * 64, 4096)
            self.floats = max(self.floats, floats, 1 << 20)
            _refuse_foreign_capture(self.stream, "its split-K workspace")
            buf = self._buffer = _zeroed_now(empty((self.counters + self.floats,), "float32", self.device,
                                                   stream=self.stream), self.stream)
            views = self._views = (
                DeviceArray(buf.ptr, (self.counters,), "uint32", owner=buf, device=self.device),
                DeviceArray(buf.ptr + 4 * self.counters, (self.floats,), "float32", owner=buf,
                            device=self.device))
        return views

    def keep(self) -> None:
        """The current buffer outlives this workspace (its growth, a discard, the thread's end):
        a graph captured by another library with it replays at any time."""
        if self._buffer is not None:
            keep_for_graphs(self._buffer)

    def discard(self) -> None:
        """After a failed launch (a watchdog abort, say) counters may be left mid-count."""
        self._views = None


def _zeroed_now(buf: DeviceArray, stream: int) -> DeviceArray:
    """``buf`` zeroed before the first launch on ``stream`` reads it: in order on ``stream``, or
    while a tf.Graph captures, eagerly on the graph's allocation stream (a captured memset would
    leave the workspace dirty until the first replay; the capture waits for that stream)."""
    graph = capturing()
    driver.call("cuMemsetD8Async", buf.ptr, 0, buf.nbytes,
                stream if graph is None else graph.alloc_stream.handle)
    return buf


def _foreign_capture(stream: int) -> bool:
    """Is ``stream`` being captured into another library's graph (torch.cuda.graph)? Memory
    allocated on it there would become a node of that graph."""
    if capturing() is not None:
        return False  # a tf.Graph: allocations go to its own stream, eagerly
    return driver.stream_capturing(stream)


def _refuse_foreign_capture(stream: int, what: str) -> None:
    """Per-stream memory is made once per stream, outside captures."""
    if _foreign_capture(stream):
        raise TmaflowError(
            f"a call on stream 0x{int(stream):x} needs {what}, made once per stream, but the stream "
            "is being captured into a CUDA graph; make the same call once on that stream before the "
            "capture (with torch: warm up on a stream s, then torch.cuda.graph(g, stream=s))")


class _SplitK:
    """The split-K launch; a failed launch drops the workspace so its counters start clean."""

    def __init__(self, launcher, workspace: _Workspace):
        self.launcher, self.workspace = launcher, workspace

    def __call__(self, *args) -> None:
        try:
            self.launcher(*args)
        except ContextMoved:  # nothing ran: the counters are as they were
            raise
        except BaseException:
            self.workspace.discard()
            raise


_workspaces = threading.local()
STREAMS_KEPT = 32  # workspaces a thread keeps (stream objects stay alive while theirs is kept)
_KEPT: dict[int, DeviceArray] = {}  # memory other libraries' graphs captured, by id: kept for the process


def keep_for_graphs(arr: DeviceArray) -> None:
    """Keep ``arr`` alive for the process: a graph that another library captured uses it."""
    _KEPT.setdefault(id(arr), arr)


def _workspace(device, stream: int) -> _Workspace:
    """The workspace of this thread's launches on ``stream`` (resolved): launches on one stream
    run in order, so they may share one; other streams and threads get their own."""
    key = (device.ordinal, stream)
    cache: dict = _workspaces.__dict__  # this thread's, keyed by (ordinal, stream)
    ws = cache.get(key)
    if ws is None:
        if len(cache) >= STREAMS_KEPT:  # the oldest goes: its buffers are freed in its stream's order
            del cache[next(iter(cache))]
        ws = cache[key] = _Workspace(device, stream)
    return ws
