"""The signal protocol's waits and puts, and the copies from peers, as driver stream operations
(``cuStreamWaitValue32`` / ``cuStreamWriteValue32`` / ``cuMemcpyAsync``): queued by the GPU's
front end, no kernel and no SM, a few µs of host time each (a collective queues 4-6 of them a
peer). The collectives take them outside debug and trace builds and outside graph capture;
there, the one-thread kernels of signal.cu run (bounded waits, flight-recorder spans)."""
from __future__ import annotations

from ..runtime import driver

_flags: dict = {}


def _flag(name: str) -> int:
    if name not in _flags:
        cu = driver.cu()
        value = getattr(cu.CUstreamWaitValue_flags, name, None) or getattr(cu.CUstreamWriteValue_flags, name)
        _flags[name] = int(value)
    return _flags[name]


def put(stream: int, address: int, value: int = 1) -> None:
    """Set the uint32 at ``address`` (a pad slot, this GPU's or a peer's) to ``value`` once the
    stream's earlier work is done. The driver fences first (as ``__threadfence_system``, scoped
    to the stream): a peer that sees the value sees what the stream wrote before it."""
    driver.call("cuStreamWriteValue32", stream, address, value, _flag("CU_STREAM_WRITE_VALUE_DEFAULT"))


def wait_reset(stream: int, address: int) -> None:
    """Hold the stream's later work until the uint32 at ``address`` (this GPU's pad) is 1, then
    set it back to 0 (the next call, or a graph replay, puts 1 again)."""
    driver.call("cuStreamWaitValue32", stream, address, 1, _flag("CU_STREAM_WAIT_VALUE_EQ"))
    driver.call("cuStreamWriteValue32", stream, address, 0, _flag("CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER"))


def copy(stream: int, dst: int, src: int, nbytes: int) -> None:
    """``nbytes`` from ``src`` to ``dst`` (device addresses; a peer's through its mapping) by a
    copy engine, in stream order."""
    if nbytes:
        driver.call("cuMemcpyAsync", dst, src, nbytes, stream)
