"""One Perfetto timeline from the flight recorder of every rank: a process (track group) per
rank, a thread per (kernel launch, CTA, warp), all on one clock.

Each rank saves the traces of its traced launches (``kernel.last_trace.save(f"rank{r}-{i}.npz")``
or ``Trace.to_chrome``'s input), one process merges them: ``merge_traces({0: [...], 1: [...]},
"run.json")``. Events are stamped with each GPU's ``%globaltimer`` (ns); GPUs of one host
read the same host-synchronised time to within a few microseconds, so spans that far apart
across ranks are not ordered by the picture.
"""
from __future__ import annotations

import json
import os

from ..debug.trace import Trace
from ..errors import TmaflowError


def _traces(rank: int, given) -> list[Trace]:
    items = given if isinstance(given, (list, tuple)) else [given]
    out = []
    for item in items:
        if isinstance(item, (str, os.PathLike)):
            item = Trace.load(item)
        if not isinstance(item, Trace):
            raise TmaflowError(f"merge_traces: rank {rank}: {item!r} must be a tmaflow Trace or "
                               "the path of one saved by Trace.save")
        out.append(item)
    return out


def merge_traces(per_rank: dict, path=None) -> dict:
    """The Chrome / Perfetto trace-event JSON of every rank's traces (``per_rank``: rank ->
    a Trace, a saved trace's path, or a list of them), written to ``path`` when given: pid =
    rank, one thread per launch, CTA and warp, times in µs from the earliest event of all."""
    if not isinstance(per_rank, dict) or not per_rank:
        raise TmaflowError(f"merge_traces: per_rank must be a non-empty dict rank -> traces "
                           f"(got {type(per_rank).__name__})")
    ranks = {}
    for rank, given in per_rank.items():
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise TmaflowError(f"merge_traces: rank {rank!r} must be an int >= 0")
        ranks[rank] = [t for t in _traces(rank, given) if len(t.events)]
    starts = [int(t.events["t0"].min()) for traces in ranks.values() for t in traces]
    origin = min(starts) if starts else 0
    events: list[dict] = []
    for rank in sorted(ranks):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
        tids: dict = {}
        for launch, trace in enumerate(ranks[rank]):
            shift = (int(trace.events["t0"].min()) - origin) / 1e3
            for e in trace.to_chrome()["traceEvents"]:
                key = (launch, e["pid"], e["tid"])
                tid = tids.setdefault(key, len(tids) + 1)
                if e["ph"] == "M" and e["name"] == "thread_name":
                    name = f"{trace.kernel_name} #{launch} CTA {e['pid']} {e['args']['name']}"
                    events.append({**e, "pid": rank, "tid": tid, "args": {"name": name}})
                elif e["ph"] != "M":
                    events.append({**e, "pid": rank, "tid": tid, "ts": e["ts"] + shift})
    doc = {"traceEvents": events, "displayTimeUnit": "ns",
           "otherData": {"ranks": sorted(ranks), "origin_ns": origin}}
    if path is not None:
        with open(path, "w") as f:
            f.write(json.dumps(doc, separators=(",", ":")))
    return doc
