"""Calls of one collective plan take turns, whatever streams they are queued on.

A plan's calls share its symmetric buffer, staging and communication stream. Two calls on one
stream are ordered by the stream; two calls on two streams were not: the second's GEMMs
could overwrite the partial or the staging the first was still summing or multiplying (a
reduce-scatter's partial even at world size 1). So each call ends by recording the plan's
event on its stream, and a call queued on another stream first waits for that event. A call
on the same stream as the previous one queues no wait; the record is one driver call.

Plans whose symmetric buffers share a signal pad (newer torch versions carve symmetric
tensors out of one larger allocation, with one pad) share their turns too (``of_pad``): two
calls of them in flight at once would take each other's signals.

Calls inside a caller's graph capture take no turn: a capture cannot wait on an event recorded
outside it, and its replays run where the caller replays them (the caller orders those).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager, suppress

from ..runtime import driver


class Turns:
    """The order of one plan's calls: the stream of the latest one, and an event at its end."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # one call queued at a time: its wait and record pair up
        self.event = None              # created on first use, in the call's device context
        self.last: int | None = None   # raw handle of the stream the latest call ended on
        self.users = 0                 # plans holding these turns (of_pad)

    @contextmanager
    def turn(self, stream: int, capturing: bool | None = None):
        """Queue a call on ``stream`` (a raw handle) after the plan's previous call
        (``capturing``: whether the stream is being captured, where the caller asked already)."""
        with self.lock:
            if driver.stream_capturing(stream) if capturing is None else capturing:
                yield
                return
            if self.last is not None and self.last != stream:
                driver.call("cuStreamWaitEvent", stream, self.event, 0)
            try:
                yield
            except BaseException:  # what was queued before the error still goes first
                with suppress(Exception):  # (a faulted context refuses; the error says why)
                    self._ended(stream)
                raise
            self._ended(stream)

    def _ended(self, stream: int) -> None:
        if self.event is None:
            self.event = driver.call("cuEventCreate", driver.cu().CUevent_flags.CU_EVENT_DISABLE_TIMING)
        driver.call("cuEventRecord", self.event, stream)
        self.last = stream

    def close(self) -> None:
        with self.lock:
            if self.event is not None:
                with suppress(Exception):  # a faulted context refuses: release goes on with the rest
                    driver.call("cuEventDestroy", self.event)  # the driver keeps it until waits end
                self.event, self.last = None, None


_BY_PAD: dict = {}  # signal pad (this rank's address) -> the turns of the plans using it
_BY_PAD_LOCK = threading.Lock()


def of_pad(pad) -> Turns:
    """The turns of every plan whose buffer signals through ``pad`` (this rank's pad address);
    give them back with ``release``."""
    with _BY_PAD_LOCK:
        turns = _BY_PAD.get(pad)
        if turns is None:
            turns = _BY_PAD[pad] = Turns()
        turns.users += 1
        return turns


def release(pad, turns: Turns) -> None:
    """A plan using ``pad`` is gone: the last one closes the turns."""
    with _BY_PAD_LOCK:
        turns.users -= 1
        if turns.users > 0:
            return
        if _BY_PAD.get(pad) is turns:
            del _BY_PAD[pad]
    turns.close()
