"""``tf.autotune``: variants of a kernel (or of an entry point's config) compiled, checked
against the default variant, timed on the device for the call's key, the fastest correct one
remembered on disk and used from then on."""
from __future__ import annotations

import concurrent.futures
import functools
import logging
import os
import sys
import time
from typing import Any

from ..bench.timing import do_bench, rounds
from ..errors import TmaflowError
from ..version import __version__
from .check import as_outputs, as_tolerance, mismatch, poison, to_host
from .key import build_key, source_hash
from .memo import Memo, memo_path

log = logging.getLogger("tmaflow.autotune")
ENV = "TMAFLOW_AUTOTUNE"


def enabled() -> bool:
    """``TMAFLOW_AUTOTUNE``: "0" runs the default variant and tunes nothing; "1" or unset tunes."""
    value = os.environ.get(ENV, "1").strip()
    if value not in ("0", "1", ""):
        raise TmaflowError(f"{ENV}={value!r} must be 0 (tuning off: the default variant runs) or 1")
    return value != "0"


def stderr_progress(line: str) -> None:
    print(f"tmaflow autotune: {line}", file=sys.stderr, flush=True)


def event_timer(fn, *, warmup: int, repeats: int, flush_l2: bool) -> float:
    """Median seconds of ``fn()`` (tf.bench.do_bench)."""
    return do_bench(fn, warmup=warmup, repeats=repeats, flush_l2=flush_l2).median


def rounds_ratio(candidate, default, *, warmup: int, repeats: int, flush_l2: bool) -> float:
    """Median per-round speed of ``candidate`` over ``default`` (above 1: faster), the two
    interleaved so drift in clocks and power hits both alike (tf.bench.rounds)."""
    got = rounds({"candidate": candidate, "default": default}, warmup=warmup, repeats=repeats,
                 flush_l2=flush_l2)
    return got.ratio("candidate", "default").median


class Tuner:
    """Calls the fastest correct variant for each key. ``factory(variant)`` makes a function
    for a variant (the factories run in a thread pool, so kernels they compile compile in
    parallel); the first variant is the default, the reference every other must match."""

    def __init__(self, factory, variants, *, key=None, name: str | None = None, outputs=None,
                 tolerance=None, warmup: int = 3, repeats: int = 10, flush_l2: bool = False,
                 source: str = "", progress=stderr_progress, timer=event_timer, device: str | None = None,
                 memo_root=None, min_gain: float = 0.02, confirm=rounds_ratio):
        variants = list(variants)
        if not variants:
            raise TmaflowError("autotune: variants=[] is empty; give at least the default variant")
        if not callable(factory):
            raise TmaflowError(f"autotune: factory={factory!r} must be callable (variant -> function)")
        self.factory, self.variants, self.key = factory, variants, key
        self.name = name or str(getattr(factory, "__qualname__", "tuned"))
        self.outputs = outputs  # (call's result, *args, **kwargs) -> the outputs to compare
        self.tolerance = as_tolerance(tolerance)
        self.warmup, self.repeats, self.flush_l2 = warmup, repeats, flush_l2
        self.progress, self.timer, self.device = progress or (lambda line: None), timer, device
        # A variant replaces the default only if it is faster by more than min_gain when the two
        # run interleaved (confirm): one-after-another screening times drift by a few percent.
        self.min_gain, self.confirm = min_gain, confirm
        self.source = source_hash(self.name, [repr(v) for v in variants], source)
        self.memo = Memo(memo_path(self.name, memo_root))
        self._fns: dict[int, object] = {}
        self._chosen: dict[str, int] = {}
        self._results: dict[str, list[dict]] = {}
        self._last_outputs: list = []
        self.last_key: str | None = None

    def function(self, index: int):
        """The function of ``variants[index]`` (made on first use)."""
        if index not in self._fns:
            self._fns[index] = self.factory(self.variants[index])
        return self._fns[index]

    def __call__(self, *args, **kwargs):
        if not enabled():
            return self.function(0)(*args, **kwargs)
        return self.function(self.choose(args, kwargs))(*args, **kwargs)

    def key_of(self, args: tuple, kwargs: dict) -> str:
        return build_key(args, kwargs, self.key, self.device)

    def choose(self, args: tuple, kwargs: dict) -> int:
        """The index of the variant for this call's key: remembered, or tuned now."""
        key = self.last_key = self.key_of(args, kwargs)
        if key in self._chosen:
            return self._chosen[key]
        entry = self.memo.get(key, self.source)
        if entry is not None and 0 <= entry["choice"] < len(self.variants):
            self._results[key] = entry.get("results", [])
            self._chosen[key] = entry["choice"]
            return entry["choice"]
        choice = self.tune(key, args, kwargs)
        self._chosen[key] = choice
        return choice

    def _make_all(self) -> dict[int, Exception]:
        """Make every variant's function, in a thread pool; {index: the error} of those that failed."""
        missing = [i for i in range(len(self.variants)) if i not in self._fns]
        failed: dict[int, Exception] = {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, max(1, len(missing)))) as pool:
            futures = {i: pool.submit(self.factory, self.variants[i]) for i in missing}
            for i, future in futures.items():
                try:
                    self._fns[i] = future.result()
                except TmaflowError as exc:
                    failed[i] = exc
        return failed

    def _run(self, index: int, args, kwargs, written=()) -> list:
        """Run variant ``index`` once with its outputs poisoned first (``outputs(None, ...)``,
        or ``written``: arguments the default variant returned, i.e. wrote in place); its
        outputs on the host."""
        for out in as_outputs(self.outputs(None, *args, **kwargs)) if self.outputs is not None else written:
            poison(out)
        result = self.function(index)(*args, **kwargs)
        got = self.outputs(result, *args, **kwargs) if self.outputs is not None else result
        self._last_outputs = as_outputs(got)
        return [to_host(x) for x in self._last_outputs]

    def tune(self, key: str, args: tuple, kwargs: dict) -> int:
        """Check and time every variant on this call's arguments; remember the fastest correct."""
        n = len(self.variants)
        self.progress(f"{self.name}: tuning {n} variants for {key}")
        started = time.perf_counter()
        failed = self._make_all()
        if 0 in failed:
            raise failed[0]
        reference = self._run(0, args, kwargs)
        given = (*args, *kwargs.values())
        written = [x for x in self._last_outputs if any(x is a for a in given)]
        results = []
        for i, variant in enumerate(self.variants):
            row: dict[str, Any] = {"index": i, "variant": repr(variant), "median_s": None, "correct": False, "note": ""}
            try:
                if i in failed:
                    raise failed[i]
                why = None if i == 0 else mismatch(self._run(i, args, kwargs, written), reference, self.tolerance)
                if why is not None:
                    row["note"] = why
                else:
                    row["correct"] = True
                    fn = self.function(i)
                    row["median_s"] = self.timer(lambda: fn(*args, **kwargs), warmup=self.warmup,
                                                 repeats=self.repeats, flush_l2=self.flush_l2)
            except TmaflowError as exc:
                row["note"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            results.append(row)
            status = f"{row['median_s'] * 1e6:.1f} us" if row["median_s"] is not None else f"refused ({row['note']})"
            self.progress(f"{self.name}: [{i + 1}/{n}] {row['variant']}: {status}")
        timed = [r for r in results if r["median_s"] is not None]
        choice = min(timed, key=lambda r: r["median_s"])["index"]
        if choice != 0:
            best, default = self.function(choice), self.function(0)
            gain = self.confirm(lambda: best(*args, **kwargs), lambda: default(*args, **kwargs),
                                warmup=self.warmup, repeats=self.repeats, flush_l2=self.flush_l2)
            results[choice]["confirmed_speedup"] = gain
            self.progress(f"{self.name}: {self.variants[choice]!r} against the default, interleaved: "
                          f"{gain:.3f}x")
            if gain <= 1 + self.min_gain:
                choice = 0
        self._results[key] = results
        self.memo.put(key, self.source, {"choice": choice, "variant": repr(self.variants[choice]),
                                         "results": results})
        self.progress(f"{self.name}: chose {self.variants[choice]!r} in {time.perf_counter() - started:.1f} s")
        return choice

    def _key(self, key: str | None) -> str:
        """``key``, or the last call's ("" before any call, a key nothing was tuned for)."""
        return key if key is not None else self.last_key or ""

    def chosen(self, key: str | None = None):
        """The variant chosen for ``key`` (default: the last call's), or None if not tuned."""
        index = self._chosen.get(self._key(key))
        return None if index is None else self.variants[index]

    def results(self, key: str | None = None) -> list[dict]:
        """Every variant's row for ``key`` (default: the last call's): index, variant, median
        seconds, whether it matched the default, and why not."""
        return list(self._results.get(self._key(key), []))

    def table(self, key: str | None = None) -> str:
        """``results(key)`` as text, the chosen variant starred."""
        chosen = self._chosen.get(self._key(key))
        lines = [f"{self.name} @ {key if key is not None else self.last_key}"]
        for r in self.results(key):
            time_text = f"{r['median_s'] * 1e6:10.1f} us" if r["median_s"] is not None else f"{'-':>13s}"
            lines.append(f"{'*' if r['index'] == chosen else ' '} {r['index']:3d} {time_text}  {r['variant']}"
                         + (f"  [{r['note']}]" if r["note"] else ""))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Tuner({self.name!r}, {len(self.variants)} variants, {len(self._chosen)} keys tuned)"


def autotune(factory, variants, *, key=None, **options) -> Tuner:
    """A function that runs the fastest correct of ``variants`` for each call's key.

    ``factory(variant)`` makes the function of one variant (e.g. a Kernel compiled with the
    variant's defines and launched with its config); ``variants[0]`` is the default, the
    reference the others must match (bit-exact, or within ``tolerance=(rtol, atol)``).
    ``outputs(result, *args, **kwargs)`` names the outputs to compare (default: what the call
    returns). ``key(*args, **kwargs)`` gives what the choice depends on (default: every
    argument's shape, dtype and strides, and the device). Options: ``name``, ``warmup``,
    ``repeats``, ``flush_l2``, ``source`` (hashed into the memo key), ``progress``,
    ``min_gain`` (the fastest variant replaces the default only if, run interleaved with it,
    it is faster by more than this fraction; default 0.02).
    ``TMAFLOW_AUTOTUNE=0`` runs the default variant.
    """
    return Tuner(factory, variants, key=key, **options)


def _with_config(entry, config):
    return functools.partial(entry, config=config)


def entry(entry_point, configs, *, key=None, **options) -> Tuner:
    """``entry_point`` (e.g. ``kernels.gemm``) with its ``config=`` tuned: a callable with the
    same signature that runs the fastest of ``configs`` correct against the entry point's own
    choice (``config=None``, the default variant)."""
    if not callable(entry_point):
        raise TmaflowError(f"autotune.entry: entry_point={entry_point!r} must be callable")
    name = options.pop("name", getattr(entry_point, "__qualname__", None) or getattr(entry_point, "__name__", "entry"))
    tuner = Tuner(functools.partial(_with_config, entry_point), [None, *configs], key=key, name=name,
                  source=options.pop("source", __version__), **options)
    functools.update_wrapper(tuner, entry_point, updated=())
    return tuner


autotune.entry = entry  # type: ignore[attr-defined]
