"""A timing's samples and their summary: median and spread (min, p20, p80, max)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np

from ..errors import TmaflowError


def _seconds(value: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(value) >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value / 1e-9:.4g} ns"


@dataclass(frozen=True)
class Result:
    """Samples of one timing (seconds, or a ratio with ``unit="x"``) and their summary."""

    samples: tuple[float, ...]
    unit: str = "s"
    median: float = field(init=False)
    min: float = field(init=False)
    p20: float = field(init=False)
    p80: float = field(init=False)
    max: float = field(init=False)

    def __post_init__(self):
        if not self.samples:
            raise TmaflowError("Result: samples=() is empty; a timing needs at least one sample")
        object.__setattr__(self, "samples", tuple(float(s) for s in self.samples))
        values = np.asarray(self.samples)
        object.__setattr__(self, "median", statistics.median(self.samples))
        object.__setattr__(self, "min", float(values.min()))
        object.__setattr__(self, "p20", float(np.percentile(values, 20)))
        object.__setattr__(self, "p80", float(np.percentile(values, 80)))
        object.__setattr__(self, "max", float(values.max()))

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def spread(self) -> tuple[float, float, float, float]:
        """(min, p20, p80, max)."""
        return self.min, self.p20, self.p80, self.max

    def summary(self) -> dict:
        """The summary as JSON-ready numbers (the samples left out)."""
        return {"median": self.median, "min": self.min, "p20": self.p20, "p80": self.p80,
                "max": self.max, "n": len(self.samples), "unit": self.unit}

    def _fmt(self, value: float) -> str:
        return _seconds(value) if self.unit == "s" else f"{value:.4f}{self.unit}"

    def __repr__(self) -> str:
        spread = ", ".join(f"{name} {self._fmt(v)}" for name, v in
                           zip(("min", "p20", "p80", "max"), self.spread))
        return f"Result(median {self._fmt(self.median)}; {spread}; n={len(self.samples)})"


def ratios(numerators, denominators) -> Result:
    """Per-round ratios ``numerators[i] / denominators[i]`` (a peer's time over ours: above 1
    means ours is faster)."""
    num, den = list(numerators), list(denominators)
    if len(num) != len(den):
        raise TmaflowError(f"ratios: {len(num)} numerators and {len(den)} denominators; "
                           "per-round ratios need one of each per round")
    return Result(tuple(a / b for a, b in zip(num, den)), unit="x")
