"""Event timing of one function (``do_bench``) and interleaved rounds of several (``rounds``):
the one harness behind ``python -m tmaflow bench``, the peer tools and the autotuner.

Two ways to time a call, both honest about different things:
- ``flush_l2=True`` ("cold"): a write of at least twice the L2 size goes before every timed
  call, so the call reads its operands from DRAM, as a layer reads its weights in a model.
- ``flush_l2=False`` ("back to back"): calls follow each other, operands that fit stay in L2,
  and ``batch`` calls per sample hide the launch gaps as a loop does.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ..errors import TmaflowError
from .events import EventPair, L2Flush
from .internals import call
from .result import Result, ratios

RETURN_MODES = ("result", "median", "min", "max", "mean", "all")


def _positive(who: str, name: str, value, minimum: int = 1) -> int:
    if type(value) is not int or value < minimum:
        raise TmaflowError(f"{who}: {name}={value!r} must be an int >= {minimum}")
    return value


def _check_batch(who: str, batch: int, flush_l2: bool) -> None:
    _positive(who, "batch", batch)
    if flush_l2 and batch != 1:
        raise TmaflowError(f"{who}: batch={batch} with flush_l2=True; the flush goes before "
                           "every timed call, so batch must be 1")


class Sampler:
    """Times one sample of a function on a stream: an optional L2 flush, then events around
    ``batch`` calls; seconds per call."""

    def __init__(self, *, flush_l2: bool = False, stream=None, batch: int = 1):
        _check_batch("Sampler", batch, flush_l2)
        self.events = EventPair(stream)
        self.flush = L2Flush(stream) if flush_l2 else None
        self.batch = batch

    def __call__(self, fn) -> float:
        if self.flush is not None:
            self.flush()
        self.events.start()
        for _ in range(self.batch):
            fn()
        return self.events.stop() / self.batch

    def close(self) -> None:
        self.events.close()
        if self.flush is not None:
            self.flush.buffer.free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def do_bench(fn, *, warmup: int = 3, repeats: int = 10, flush_l2: bool = False, stream=None,
             batch: int = 1, return_mode: str = "result"):
    """Time ``fn()`` with CUDA events on ``stream`` (None: the legacy default stream).

    ``warmup`` untimed calls first (compiles, plans, allocations), then ``repeats`` samples,
    each ``batch`` calls (1 with ``flush_l2=True``, which writes at least twice the L2 before
    every timed call). Returns a :class:`Result` (median, spread, samples; seconds per call),
    or with ``return_mode`` one of "median", "min", "max", "mean" that number, "all" the
    samples.
    """
    if return_mode not in RETURN_MODES:
        raise TmaflowError(f"do_bench: return_mode={return_mode!r} must be one of {RETURN_MODES}")
    _positive("do_bench", "warmup", warmup, 0)
    _positive("do_bench", "repeats", repeats)
    with Sampler(flush_l2=flush_l2, stream=stream, batch=batch) as sample:
        for _ in range(warmup):
            fn()
        call("cuCtxSynchronize")
        result = Result(tuple(sample(fn) for _ in range(repeats)))
    if return_mode == "result":
        return result
    if return_mode == "all":
        return list(result.samples)
    return getattr(result, return_mode)


@dataclass(frozen=True)
class Rounds:
    """Samples of several functions taken in turns: ``samples[name][i]`` is round i's."""

    samples: dict

    def __getitem__(self, name: str) -> Result:
        return Result(tuple(self.samples[name]))

    def ratio(self, name: str, ref: str) -> Result:
        """Per-round ``ref / name`` (above 1: ``name`` is faster than ``ref``)."""
        return ratios(self.samples[ref], self.samples[name])

    def __repr__(self) -> str:
        body = ", ".join(f"{name!r}: {self[name]!r}" for name in self.samples)
        return f"Rounds({body})"


def rounds(fns: dict, *, repeats: int = 10, warmup: int = 3, settle: int = 0,
           flush_l2: bool = False, stream=None, batch: int = 1, rotate: bool = False) -> Rounds:
    """Samples of every function in ``fns`` ({name: fn}), one of each per round, so drift in
    clocks and power hits them alike; per-round ratios compare them (:meth:`Rounds.ratio`).

    ``warmup`` untimed rounds first; ``settle`` untimed calls of a function right before each
    of its samples (it starts from its own steady state, not its predecessor's dirty L2);
    ``rotate`` shifts the order every round so each takes each place equally often.
    """
    _positive("rounds", "repeats", repeats)
    _positive("rounds", "warmup", warmup, 0)
    _positive("rounds", "settle", settle, 0)
    names = list(fns)
    got: dict = {name: [] for name in names}
    with Sampler(flush_l2=flush_l2, stream=stream, batch=batch) as sample:
        for _ in range(warmup):
            for fn in fns.values():
                fn()
        call("cuCtxSynchronize")
        for r in range(repeats):
            shift = r % len(names) if rotate and names else 0
            for name in names[shift:] + names[:shift]:
                for _ in range(settle):
                    fns[name]()
                got[name].append(sample(fns[name]))
    return Rounds(got)


def per_call_host(fn, n: int) -> float:
    """Seconds per call of ``fn`` over ``n`` calls by the host clock, the queued GPU work
    included (host-bound when the work is small: what a user's loop sees)."""
    call("cuCtxSynchronize")
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    call("cuCtxSynchronize")
    return (time.perf_counter() - t0) / n


def host_rounds(fns: dict, *, calls: int, repeats: int, warmup: int = 3) -> Rounds:
    """Host seconds per call of each function in interleaved rounds of ``calls`` calls. The
    process is pinned to one CPU meanwhile: host-bound timings otherwise move with scheduler
    migrations."""
    got: dict = {name: [] for name in fns}
    for fn in fns.values():  # compile, plan, generate the fast paths
        for _ in range(warmup):
            fn()
    pinned = hasattr(os, "sched_setaffinity")
    if pinned:
        allowed = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(allowed)})
    try:
        for _ in range(repeats):
            for name, fn in fns.items():
                got[name].append(per_call_host(fn, calls))
    finally:
        if pinned:
            os.sched_setaffinity(0, allowed)
    return Rounds(got)
