"""The signal protocol's waits and puts, and the copies from peers, as driver stream operations
(``cuStreamWaitValue32`` / ``cuStreamWriteValue32`` / ``cuMemcpyAsync``): queued by the GPU's
front end, no kernel and no SM, a few µs of host time each (a collective queues 4-6 of them a
peer). The collectives take them outside debug and trace builds and outside graph capture;
there, the one-thread kernels of signal.cu run (bounded waits, flight-recorder spans)."""
from __future__ import annotations

import logging

from ..errors import TmaflowError
from ..runtime import driver

log = logging.getLogger("tmaflow.distributed")

_flags: dict = {}


def _flag(name: str) -> int:
    if name not in _flags:
        cu = driver.cu()
        kind = cu.CUstreamWaitValue_flags if name.startswith("CU_STREAM_WAIT") else cu.CUstreamWriteValue_flags
        _flags[name] = int(getattr(kind, name))
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
    # NO_MEMORY_BARRIER would do (nothing is published by a reset), but the driver refused it
    # on a symmetric-memory pad (CUDA_ERROR_INVALID_VALUE, 4 H200s, driver 580)
    driver.call("cuStreamWriteValue32", stream, address, 0, _flag("CU_STREAM_WRITE_VALUE_DEFAULT"))


def copy(stream: int, dst: int, src: int, nbytes: int) -> None:
    """``nbytes`` from ``src`` to ``dst`` (device addresses; a peer's through its mapping) by a
    copy engine, in stream order."""
    if nbytes:
        driver.call("cuMemcpyAsync", dst, src, nbytes, stream)


def usable(stream: int, own: int, peer: int) -> bool:
    """Whether the driver takes these operations on the pads (``own``: an unused slot of this
    GPU's pad, ``peer``: of a peer's): a write of 0 to each and a wait that holds already. The
    collectives fall back to the signal kernels where it does not."""
    try:
        put(stream, own, 0)
        put(stream, peer, 0)
        driver.call("cuStreamWaitValue32", stream, own, 0, _flag("CU_STREAM_WAIT_VALUE_GEQ"))
    except TmaflowError as e:
        log.warning("stream memory operations refused on the signal pads (%s); the collectives "
                    "use the signal kernels", e)
        return False
    return True
