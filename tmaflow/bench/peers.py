"""Ours against a peer in the same run, timed both ways: cold (L2 flushed before every call)
and back to back, each in interleaved rounds with per-round ratios."""
from __future__ import annotations

from dataclasses import dataclass

from .result import Result
from .timing import Rounds, rounds

MODES = ("cold", "warm")  # warm: back to back, operands left in L2 by the previous call
WARM_BATCH = 10  # calls per back-to-back sample: hides launch gaps as a loop does


@dataclass(frozen=True)
class Versus:
    """Both timings of the same functions; ``ours`` and ``peer`` name the two compared."""

    cold: Rounds
    warm: Rounds
    ours: str
    peer: str

    def ratio(self, mode: str) -> Result:
        """Per-round peer time / ours (above 1: ours is faster)."""
        return getattr(self, mode).ratio(self.ours, self.peer)

    def row(self) -> dict:
        """JSON-ready figures: per mode, both medians (ms) and the ratio with its spread."""
        out = {}
        for mode in MODES:
            got = getattr(self, mode)
            ratio = self.ratio(mode)
            out[mode] = {"ours_ms": got[self.ours].median * 1e3, "peer_ms": got[self.peer].median * 1e3,
                         "ratio": ratio.median, "ratio_p20": ratio.p20, "ratio_p80": ratio.p80}
        return out

    def line(self, flop: float | None = None) -> str:
        """One text cell per mode: times (or TFLOP/s given ``flop``) and the median ratio."""
        cells = []
        for mode, label in zip(MODES, ("cold", "back to back")):
            got = getattr(self, mode)
            ours, peer = got[self.ours].median, got[self.peer].median
            if flop is None:
                figures = f"{ours * 1e6:9.1f} us vs {peer * 1e6:9.1f} us"
            else:
                figures = f"{flop / ours / 1e12:6.1f} vs {flop / peer / 1e12:6.1f} TFLOP/s"
            cells.append(f"{label} {figures} ratio {self.ratio(mode).median:.3f}")
        return " | ".join(cells)


def versus(fns: dict, *, ours: str, peer: str, repeats: int = 10, warmup: int = 3,
           stream=None, warm_batch: int = WARM_BATCH) -> Versus:
    """Interleaved rounds of ``fns`` (ours, the peer and any others: every one gets both
    timings) cold and back to back."""
    cold = rounds(fns, repeats=repeats, warmup=warmup, flush_l2=True, stream=stream)
    warm = rounds(fns, repeats=repeats, warmup=warmup, flush_l2=False, stream=stream, batch=warm_batch)
    return Versus(cold, warm, ours, peer)
