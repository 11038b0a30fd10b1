"""CUDA graphs of tmaflow launches: capture once, replay many times, update in place.

    g = tf.Graph()
    with g.capture():                 # launches with stream=None are captured
        y = kernels.softmax(x)        # outputs allocated here belong to the graph
    g.replay()                        # on the legacy default stream (or replay(stream=...))

Rules a kernel author meets (all checked):

- Captured launches keep their arguments alive, and a replay refuses to run when a tmaflow
  array one of them used (directly or through a TensorMap) was freed since.
- Tensor maps are ``__grid_constant__`` parameters: their 128 bytes, with the address in
  them, are baked into the graph at capture. To replay with new buffers, capture again
  (``with g.capture():`` on the same graph): the new launches update the instantiated graph
  in place through ``cuGraphExecUpdate`` (no re-instantiation when only parameters changed).
- Capture runs on the graph's own non-blocking stream in relaxed mode. ``stream=None``
  launches are captured; a launch on an explicit other (non-blocking) stream runs eagerly.
  Outputs allocated during the capture come from the pool on the graph's ``alloc_stream``
  and belong to the graph; ``fill_bytes`` (``zeros``, ``poison``) becomes a memset node of
  the graph. Other work in the block (``copy_from``, ``numpy()``, launches on an explicit
  other stream) runs eagerly, as it would outside.
- Debug (watchdog) builds synchronise after each launch and cannot be captured.
"""
from __future__ import annotations

import contextlib
from threading import get_ident

from ..errors import CudaError, LaunchError, TmaflowError
from . import driver
from .device import Device, Stream, as_device, stream_handle

# Graphs capturing now (any thread). Launchers test this list's truth on every call; a
# non-empty list sends launches to the checked path, which asks ``capturing()``.
ACTIVE: list["Graph"] = []


def capturing() -> "Graph | None":
    """The graph this thread is capturing into, if any."""
    me = get_ident()
    for graph in ACTIVE:
        if graph._thread == me:
            return graph
    return None


class Graph:
    """A CUDA graph of tmaflow launches on one device."""

    def __init__(self, device: Device | None = None):
        self.device = as_device(device, "Graph")
        self.stream = Stream(self.device)  # non-blocking: the legacy stream never joins a capture
        # Allocations during a capture are made eagerly, ordered on a stream of their own (one
        # on the legacy stream was refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED).
        self.alloc_stream = Stream(self.device)
        self._graph = self._exec = None
        self._thread = None
        self._launches: list = []   # (kernel name, args) of the current capture, strongly held
        self._owned: list = []      # allocations made during the capture (outputs)
        self._checks: list = []     # (allocation, what) that must be live at replay
        self.nodes = 0
        self.updates = 0            # captures applied to the instantiated graph in place

    # --- capture -------------------------------------------------------------------------
    @contextlib.contextmanager
    def capture(self):
        """Capture the launches of the ``with`` block. On an already captured graph, the new
        capture replaces the old one (updated in place when the topology is the same)."""
        if self.stream._handle is None:
            raise TmaflowError("Graph.capture(): the graph was closed")
        if capturing() is not None:
            raise TmaflowError("Graph.capture(): this thread is already capturing a graph")
        cu = driver.cu()
        self.device.activate()
        launches, owned = [], []
        self._pending = (launches, owned)
        # Relaxed: the thread may still allocate from the pool on another stream (the outputs);
        # thread-local and global modes refuse that (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED).
        driver.call("cuStreamBeginCapture", self.stream._handle,
                    cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
        self._thread = get_ident()
        ACTIVE.append(self)
        try:
            yield self
        except BaseException:
            self._stop_capture(ignore_errors=True)
            raise
        graph = self._stop_capture()
        self._install(graph, launches, owned)

    def _stop_capture(self, ignore_errors: bool = False):
        ACTIVE.remove(self)
        self._thread = None
        err, graph = driver.cu().cuStreamEndCapture(self.stream._handle)
        if ignore_errors or int(err):
            if graph is not None and int(graph):
                driver.cu().cuGraphDestroy(graph)
            if ignore_errors:
                return None
            raise CudaError("cuStreamEndCapture", int(err), driver._error_name(err),
                                   "the capture was invalidated: something in it waited on, or was "
                                   "ordered with, work outside the capture (a launch on a stream "
                                   "that is not the graph's, a synchronous copy or memset)")
        return graph

    def _install(self, graph, launches: list, owned: list) -> None:
        cu = driver.cu()
        nodes = driver.check("cuGraphGetNodes", cu.cuGraphGetNodes(graph, 0))[1]
        if nodes == 0:
            driver.cu().cuGraphDestroy(graph)
            raise TmaflowError("Graph.capture(): nothing was captured; launches inside the "
                               "capture must use stream=None (or stream=graph.stream)")
        if owned:  # the outputs' allocations are complete before any replay
            self.alloc_stream.synchronize()
        updated = False
        if self._exec is not None:
            err, _info = cu.cuGraphExecUpdate(self._exec, graph)
            updated = not int(err)
            if not updated:
                driver.cu().cuGraphExecDestroy(self._exec)
                self._exec = None
        if not updated:
            self._exec = driver.call("cuGraphInstantiate", graph, 0)
        if self._graph is not None:
            driver.cu().cuGraphDestroy(self._graph)
        self._graph, self.nodes = graph, nodes
        self.updates += updated
        self._launches, self._owned = launches, owned
        self._checks = [(arg._alloc, f"launch {i} ({name}), argument {j}: {arg!r}")
                        for i, (name, args) in enumerate(launches) for j, arg in enumerate(args)
                        if getattr(getattr(arg, "_alloc", None), "live", None) is not None]

    def record(self, kernel_name: str, args: tuple) -> None:
        """A launch captured into this graph (called by the launch path)."""
        self._pending[0].append((kernel_name, args))

    def own(self, allocation) -> None:
        """An allocation made during the capture: the graph keeps it for its replays."""
        self._pending[1].append(allocation)

    # --- replay --------------------------------------------------------------------------
    def replay(self, stream=None) -> None:
        """Launch the captured graph on ``stream`` (default: the legacy default stream, as
        tmaflow launches of tmaflow arrays)."""
        if self._exec is None:
            raise TmaflowError("Graph.replay(): nothing captured yet (use `with graph.capture():`)")
        for alloc, what in self._checks:
            if alloc.live is False:
                raise LaunchError(f"Graph.replay(): {what} was freed after the capture; "
                                  "capture again with live arrays")
        driver.call("cuGraphLaunch", self._exec, stream_handle(stream))

    __call__ = replay

    @property
    def launches(self) -> list:
        """(kernel name, arguments) of every captured launch, in order."""
        return list(self._launches)

    def close(self) -> None:
        """Destroy the graph, its instance and its stream; outputs it owned are released."""
        cu = driver.cu()
        if self._exec is not None:
            cu.cuGraphExecDestroy(self._exec)
        if self._graph is not None:
            cu.cuGraphDestroy(self._graph)
        self._exec = self._graph = None
        self._launches, self._owned, self._checks = [], [], []
        self.stream.close()
        self.alloc_stream.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"Graph({len(self._launches)} launches, {self.nodes} nodes, updates={self.updates})"
