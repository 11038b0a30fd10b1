"""CUDA events on a stream and the L2 flush: the two primitives every timing is built from."""
from __future__ import annotations

from ..runtime.device import Device, current_device
from ..runtime.memory import empty
from .internals import call, stream_handle

MIN_FLUSH_BYTES = 256 << 20  # what the peer tools always wrote; more than 2x any Hopper L2


class EventPair:
    """A start and a stop event on one stream: ``start()``, the work, ``stop()`` gives seconds."""

    def __init__(self, stream=None):
        current_device()  # events belong to the current device's context
        self.stream = stream_handle(stream)
        self._start = call("cuEventCreate", 0)
        self._stop = call("cuEventCreate", 0)

    def start(self) -> None:
        call("cuEventRecord", self._start, self.stream)

    def stop(self) -> float:
        """Record the stop event, wait for it, return the seconds since ``start()``."""
        call("cuEventRecord", self._stop, self.stream)
        call("cuEventSynchronize", self._stop)
        return call("cuEventElapsedTime", self._start, self._stop) / 1e3

    def close(self) -> None:
        for event in (self._start, self._stop):
            if event is not None:
                call("cuEventDestroy", event)
        self._start = self._stop = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"EventPair(stream=0x{int(self.stream):x})"


def flush_bytes(device: Device | None = None) -> int:
    """Bytes one L2 flush writes: at least twice the device's L2, never below 256 MiB."""
    device = device or current_device()
    return max(2 * device.l2_bytes, MIN_FLUSH_BYTES)


class L2Flush:
    """A buffer whose write, queued on a stream, evicts every line the previous work left in
    L2: a call timed right after it reads its operands from DRAM, as a layer of a real model
    reads its weights."""

    def __init__(self, stream=None):
        self.stream = stream_handle(stream)
        self.buffer = empty(flush_bytes(), "uint8")

    def __call__(self) -> None:
        call("cuMemsetD8Async", self.buffer.ptr, 0, self.buffer.nbytes, self.stream)

    def __repr__(self) -> str:
        return f"L2Flush({self.buffer.nbytes >> 20} MiB, stream=0x{int(self.stream):x})"
