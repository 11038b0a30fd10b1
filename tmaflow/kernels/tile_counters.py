"""Counters of captured launches. A kernel that counts on the device (split-K and split-tail
tiles' pieces, decode splits, ``attention.cu``'s DYNAMIC_TILES schedule) needs counters no
concurrent launch shares, zero when it starts (its last CTAs zero them again as they finish).
Eager launches use their stream's split-K workspace (launches on one stream run in order). A
captured launch may be replayed on any stream, beside other graphs captured on the same stream
and eager work on it, and after that stream's workspace was replaced and freed: it gets
counters of its own, taken once at the capture and never handed out again. A replay of one
graph waits for the one before it (CUDA orders launches of one executable graph), so its
counters are zero again by then.

The counters come from chunks zeroed when they are made and kept for the process (a graph
captured with them may replay at any time). Eager calls top the current chunk up
(``reserve``); a chunk made during a capture is allocated and zeroed on a stream of its own
with the thread's capture mode relaxed for those calls (as torch's allocator does for its
``cudaMalloc``), so the capture gains no node and the capturing stream sees no operation."""
from __future__ import annotations

import threading

from ..errors import TmaflowError
from ..runtime import driver
from ..runtime.device import Stream
from ..runtime.memory import DeviceArray, unowned_block

CHUNK = 1 << 16  # words (uint32) a chunk: 256 KiB
LOW = 2048  # free words below which ``reserve`` adds a chunk
LINE = 32  # words: a take of more than a pair starts on a 128-byte line of its own


class _Slab:
    """One device's chunks, handed out front to back (a bump pointer: nothing is reused)."""

    def __init__(self) -> None:
        self.chunks: list[DeviceArray] = []  # kept: graphs captured with their counters may replay at any time
        self.next = self.end = 0  # addresses: the next untaken byte, the end of the current chunk
        self.stream: Stream | None = None  # where chunks are allocated and zeroed

    def add(self, device, words: int) -> None:
        cu = driver.cu()
        previous = driver.call("cuThreadExchangeStreamCaptureMode",
                               cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
        try:
            if self.stream is None:
                self.stream = Stream(device)
            chunk = unowned_block(4 * words, device, self.stream.handle)
            driver.call("cuMemsetD32Async", chunk.ptr, 0, words, self.stream.handle)
            self.stream.synchronize()  # zero before any take
        finally:
            driver.call("cuThreadExchangeStreamCaptureMode", previous)
        self.chunks.append(chunk)
        self.next, self.end = chunk.ptr, chunk.ptr + 4 * words

    def take(self, words: int) -> int:
        start = self.next if words <= 2 else -(-self.next // (4 * LINE)) * (4 * LINE)
        if start + 4 * words > self.end:
            return -1
        self.next = start + 4 * words
        return start


_slabs: dict[int, _Slab] = {}
_lock = threading.Lock()


def _slab(device) -> _Slab:
    slab = _slabs.get(device.ordinal)
    if slab is None or (slab.chunks and not slab.chunks[0].alive):  # a reset context freed them
        slab = _slabs[device.ordinal] = _Slab()
    return slab


def reserve(device) -> None:
    """At least LOW untaken words in the current chunk of ``device`` (call outside captures)."""
    with _lock:
        slab = _slab(device)
        if slab.end - slab.next < 4 * LOW:
            slab.add(device, CHUNK)


def take(device, words: int = 2) -> int | None:
    """The address of ``words`` zeroed uint32 for one captured launch, never handed out again
    (a pair: DYNAMIC_TILES's counters). None where no chunk could be made."""
    with _lock:
        slab = _slab(device)
        ptr = slab.take(words)
        if ptr < 0:
            try:
                slab.add(device, max(CHUNK, words + LINE))
            except TmaflowError:
                return None
            ptr = slab.take(words)
        return ptr


def untaken(device) -> int:
    """Pairs ``take`` can still hand out on ``device`` before it makes another chunk."""
    with _lock:
        slab = _slab(device)
        return (slab.end - slab.next) // 8
