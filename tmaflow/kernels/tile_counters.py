"""Counters of captured dynamic tile schedules (``attention.cu``'s DYNAMIC_TILES): a kernel that
takes its tiles from a counter needs one no concurrent launch shares, zero when it starts (the
grid's last CTA zeroes it again as it finishes). Eager launches use their stream's split-K
workspace (launches on one stream run in order). A captured launch may be replayed on any
stream, beside eager work on the stream it was captured on, so it gets a pair of its own:
taken here once, at the capture, never handed out again. A replay of one graph waits for the
one before it (CUDA orders launches of one executable graph), so its pair is zero again by then.

The pairs come from chunks allocated and zeroed outside any capture: a torch capture (global
mode) refuses allocations, so every eager dynamic launch's state tops the pool up first
(``reserve``) and a capture that finds it empty gets None (the caller launches the static
schedule instead)."""
from __future__ import annotations

import threading

import numpy as np

from ..runtime.memory import DeviceArray, from_numpy

CHUNK = 4096  # pairs a chunk (32 KiB)
LOW = 1024  # free pairs below which ``reserve`` adds a chunk


class _Pool:
    def __init__(self) -> None:
        self.chunks: list[DeviceArray] = []  # kept: graphs captured with their pairs may replay at any time
        self.free: list[int] = []  # addresses of untaken pairs, the next one last

    def add(self, device) -> None:
        chunk = from_numpy(np.zeros(2 * CHUNK, np.uint32), device=device)  # synchronous: zero before any take
        self.chunks.append(chunk)
        self.free.extend(reversed([chunk.ptr + 8 * i for i in range(CHUNK)]))


_pools: dict[int, _Pool] = {}
_lock = threading.Lock()


def _pool(device) -> _Pool:
    pool = _pools.get(device.ordinal)
    if pool is None or (pool.chunks and not pool.chunks[0].alive):  # a reset context freed them
        pool = _pools[device.ordinal] = _Pool()
    return pool


def reserve(device) -> None:
    """At least LOW untaken pairs on ``device`` (call outside captures)."""
    with _lock:
        pool = _pool(device)
        if len(pool.free) < LOW:
            pool.add(device)


def take(device) -> int | None:
    """A zeroed pair of uint32 for one captured launch, never handed out again; None when the
    pool is empty (nothing reserved it outside a capture)."""
    with _lock:
        pool = _pool(device)
        return pool.free.pop() if pool.free else None


def untaken(device) -> int:
    """Pairs ``take`` can still hand out on ``device``."""
    with _lock:
        return len(_pool(device).free)
