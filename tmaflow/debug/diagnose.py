"""Naming what went wrong in a pipeline, from a flight-recorder trace and the layout's plan.

``diagnose(trace, layout, cluster)`` keeps a ledger per CTA, pipeline and stage (the bytes
each fill announced, the copies issued into it with their multicast masks, the waits on its
full and empty barriers with their parities, the releases that reached it) and checks it
against the plan (``tf.Pipeline``: bytes per stage, arrivals per release, multicast masks).
Each broken rule is a :class:`Finding` with a name:

- ``tx-announced-more`` / ``tx-announced-less``: a fill announced other bytes than the
  stage's copies carry (the phase waits for bytes that never come / completes before its
  data lands);
- ``multicast-mask``: a CTA multicast a stage with another mask than the plan's (cluster
  members disagree: a rank never receives its data);
- ``multicast-before-init``: a multicast was issued before the cluster sync that publishes
  the receivers' barrier initialisation;
- ``wrong-parity``: a producer's first wait on an empty barrier waited for a phase that
  cannot complete (the first round must pass at once);
- ``missing-arrive``: a stage was consumed but fewer releases than planned reached its empty
  barrier (the warps that took it and did not release it are named);
- ``missing-commit``: consumers wait for a fill of a stage that no producer announced;
- ``stage-reused``: a stage was refilled before its consumers released the previous round;
- ``missing-cluster-sync``: a CTA reached into its peers' shared memory (remote arrivals,
  multicast) and then left without a cluster sync or a producer tail (its producer waiting
  until every stage is released, peers' releases included), so a peer may still be using it,
  or it may write into a peer that already left; a last remote arrival that its target waited
  for on that barrier (a sender draining its releases) is not one;
- ``missing-acquire``: a TMA copy went through a tensor map published on the device in this
  launch (``tensormap::publish_warp``) without ``tensormap::acquire`` of that slot first in
  the copying CTA (it may see the old descriptor).

Waits are counted from the trace's events, so the richer ``trace="all"`` gives the full ledger
(stage traces carry announced bytes, cluster syncs and the waits that waited).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from .. import checks
from . import trace as tr

K = tr.KIND


@dataclass(frozen=True)
class Finding:
    name: str          # the rule: "tx-announced-more", "missing-arrive", ...
    message: str
    block: int = -1
    barrier: str = ""

    def __str__(self) -> str:
        return f"[{self.name}] {self.message}"


class _Stage:
    """What happened to one stage of one pipeline in one CTA, in time order."""

    def __init__(self):
        self.announced = []   # (t, bytes, warp) arrive + expect_tx on full[s]
        self.loads = []       # (t, issuer block, mask) copies landing here
        self.multicasts = []  # (t, issuer block, mask) multicasts this CTA issued
        self.producer = []    # (t, kind, warp) announcements and completed empty waits, in order
        self.full_waits = []  # (t, parity, timed_out, warp)
        self.empty_waits = []
        self.releases = []    # (t, from block, warp) arrivals on empty[s]


def _pipelines(layout):
    return [item for item in getattr(layout, "items", ()) if hasattr(item, "tx_bytes") and hasattr(item, "stages")]


def ledger(trace, layout, cluster_size: int = 1) -> dict:
    """(block, pipeline name, stage) -> _Stage, from the trace's events."""
    cluster_size = checks.as_int("ledger: cluster_size", cluster_size, 1, 16)
    bars = {}  # smem offset -> (pipeline, "full" | "empty", stage)
    for pipe in _pipelines(layout):
        for side in ("full", "empty"):
            base = layout.offset(f"{pipe.name}_{side}")
            for s in range(pipe.stages):
                bars[base + 8 * s] = (pipe, side, s)
    book: defaultdict[tuple[int, str, int], _Stage] = defaultdict(_Stage)  # (block, pipe, stage)
    ev = trace.events
    ev = ev[np.isin(ev["bar"], list(bars))]  # events on a pipeline's barriers only
    columns = (ev[f].tolist() for f in ("bar", "kind", "block", "warp", "t0", "value", "dur"))
    for bar, kind, block, warp, t, value, dur in zip(*columns):
        pipe, side, s = bars[bar]
        if kind == K["arrive + expect_tx"] and side == "full":
            book[block, pipe.name, s].announced.append((t, value, warp))
            book[block, pipe.name, s].producer.append((t, "fill", warp))
        elif kind in (K["TMA load"], K["TMA load (multicast)"]) and side == "full":
            if kind == K["TMA load"]:
                book[block, pipe.name, s].loads.append((t, block, 1 << (block % cluster_size)))
            else:
                book[block, pipe.name, s].multicasts.append((t, block, value))
                first = block - block % cluster_size
                for r in range(cluster_size):
                    if value >> r & 1:
                        book[first + r, pipe.name, s].loads.append((t, block, value))
        elif kind in (K["wait"], K["wait (cluster)"]) and not value & tr.GAVE_UP:
            entry = (t + dur, value & 1, bool(value & tr.TIMED_OUT), warp)
            stage = book[block, pipe.name, s]
            (stage.full_waits if side == "full" else stage.empty_waits).append(entry)
            if side == "empty" and not entry[2]:
                stage.producer.append((t, "empty wait", warp))
        elif kind == K["arrive"] and side == "empty":  # value: lanes that arrived
            book[block, pipe.name, s].releases += [(t, block, warp)] * max(value, 1)
        elif kind == K["arrive (remote)"] and side == "empty":  # target rank | lanes << 16
            target = block - block % cluster_size + (value & 0xFFFF)
            book[target, pipe.name, s].releases += [(t, block, warp)] * max(value >> 16, 1)
    return book


def diagnose(trace, layout, cluster_size: int = 1, book: dict | None = None) -> list[Finding]:
    """Every broken rule in the trace, most specific first (see the module doc). Rules that
    count every wait, arrival or copy apply to ``trace="all"`` traces only. ``book``: the
    trace's ``ledger``, when the caller has it already."""
    cluster_size = checks.as_int("diagnose: cluster_size", cluster_size, 1, 16)
    if trace is None or not len(trace):
        return []
    detail = getattr(trace, "level", "all") == "all"
    found: list[Finding] = _unacquired_maps(trace) if detail else []
    if layout is None:
        return found
    pipes = {p.name: p for p in _pipelines(layout)}
    book = ledger(trace, layout, cluster_size) if book is None else book
    if detail:
        found += _early_multicast(trace, cluster_size)
        found += _no_final_sync(trace, layout, pipes, cluster_size)
    for (block, name, s), st in sorted(book.items()):
        pipe = pipes[name]
        full, empty = f"{name}_full[{s}]", f"{name}_empty[{s}]"
        rank = block % cluster_size
        for t, nbytes, warp in st.announced:
            if nbytes != pipe.tx_bytes:
                rule = "tx-announced-more" if nbytes > pipe.tx_bytes else "tx-announced-less"
                effect = (f"the phase waits for {nbytes - pipe.tx_bytes} B that never come"
                          if nbytes > pipe.tx_bytes else
                          f"the phase completes when {nbytes} B have landed, before the rest of its "
                          f"data (stale reads), and the other {pipe.tx_bytes - nbytes} B count "
                          "against the next phase")
                found.append(Finding(rule, f"CTA {block} announced {nbytes} B on {full} (warp {warp}) "
                                           f"but the stage's copies carry {pipe.tx_bytes} B per the "
                                           f"plan: {effect}", block, full))
                break
        if detail and pipe.multicast and cluster_size > 1:
            planned = {pipe.group_mask(t, rank) for t in range(len(pipe.tiles))
                       if pipe.multicast[t] is not None}
            for t, issuer, mask in st.multicasts:
                if issuer == block and mask not in planned:
                    want = max(planned, key=lambda m: bin(m & mask).count("1"))
                    missing = [r for r in range(cluster_size) if want >> r & 1 and not mask >> r & 1]
                    found.append(Finding(
                        "multicast-mask", f"CTA {block} (cluster rank {rank}) multicast {name} stage "
                        f"{s} with mask 0b{mask:b}; the plan's mask is 0b{want:b}: rank(s) "
                        f"{missing} never receive it and their {name}_full[{s}] never completes",
                        block, full))
                    break
        found += _waits(block, pipe, st, full, empty, detail)
    order = ["multicast-before-init", "multicast-mask", "tx-announced-more", "tx-announced-less",
             "wrong-parity", "stage-reused", "missing-acquire", "missing-cluster-sync",
             "missing-arrive", "missing-commit"]
    # a producer stuck on an empty barrier commits nothing more: its CTA's missing commits are
    # the consequence, not the cause
    stuck_producers = {f.block for f in found if f.name in ("missing-arrive", "wrong-parity")}
    found = [f for f in found if not (f.name == "missing-commit" and f.block in stuck_producers)]
    unique = {(f.name, f.block, f.barrier): f for f in found}
    return sorted(unique.values(), key=lambda f: (order.index(f.name), f.block))


def _waits(block, pipe, st, full, empty, detail: bool) -> list[Finding]:
    out = []
    per_release = pipe.empty_arrivals
    # the producer's first wait on an empty barrier must pass at once (parity 1 of a fresh one)
    for t, parity, timed_out, warp in st.empty_waits:
        fills_before = sum(1 for a in st.announced if a[0] <= t)
        if timed_out and fills_before == 0 and parity == 0:
            out.append(Finding("wrong-parity", f"CTA {block} warp {warp} waited on {empty} with parity 0 "
                                               "before filling the stage once: that waits for a release "
                                               "of data never produced. A producer's first wait on an "
                                               "empty barrier passes at once with parity 1 (phase ^ 1)",
                               block, empty))
    if not detail:
        return out
    stuck_full = [w for w in st.full_waits if w[2]]
    if stuck_full:
        rounds = max(sum(1 for w in st.full_waits if w[3] == warp and not w[2]) for *_, warp in stuck_full)
        if len(st.announced) <= rounds:
            out.append(Finding("missing-commit", f"CTA {block}: consumers wait for round {rounds} of "
                                                 f"{full}, but only {len(st.announced)} fill(s) of that "
                                                 "stage were ever announced: the producer stopped "
                                                 "committing (arrive + expect_tx) before the consumers' "
                                                 "last round", block, full))
    stuck_empty = [w for w in st.empty_waits if w[2]]
    if stuck_empty and per_release:
        rounds = len(st.announced)  # the refill it waits to make needs every earlier round released
        need = per_release * rounds
        got = len(st.releases)
        if got < need:
            takers = {w[3] for w in st.full_waits if not w[2]}
            releasers = {r[2] for r in st.releases if r[1] == block}
            silent = sorted(takers - releasers)
            who = f"; warps that consumed it and never released it: {silent}" if silent else ""
            out.append(Finding("missing-arrive", f"CTA {block}: {empty} received {got} of the {need} "
                                                 f"arrivals its {rounds} consumed round(s) owe "
                                                 f"({per_release} per release){who}", block, empty))
    # the producer refills round r only after a completed wait on the empty barrier (program
    # order within its warp: no clocks compared across warps)
    waited = False
    for t, what, warp in st.producer:
        if what == "empty wait":
            waited = True
        elif what == "fill":
            if not waited and any(p[1] == "fill" and p[0] < t for p in st.producer):
                out.append(Finding("stage-reused", f"CTA {block} warp {warp} refilled {full} without "
                                                   f"a completed wait on {empty} since the previous "
                                                   "fill: the stage may be overwritten while consumers "
                                                   "still read it (a skipped producer_acquire)",
                                   block, full))
                break
            waited = False
    return out


def _early_multicast(trace, cluster_size) -> list[Finding]:
    """A multicast issued by a CTA before its first cluster sync completed."""
    if cluster_size <= 1:
        return []
    ev = trace.events
    out = []
    syncs = ev[ev["kind"] == K["cluster sync"]]
    casts = ev[ev["kind"] == K["TMA load (multicast)"]]
    for block in np.unique(casts["block"]):
        mine = syncs[syncs["block"] == block]
        first_sync_end = int((mine["t0"] + mine["dur"]).min()) if len(mine) else None
        early = casts[(casts["block"] == block) & ((first_sync_end is None) |
                                                     (casts["t0"] < (first_sync_end or 0)))]
        if len(early):
            e = early[0]
            out.append(Finding("multicast-before-init",
                               f"CTA {int(block)} multicast into ranks of mask 0b{int(e['value']):b} "
                               f"({trace.label(e)}) before its first cluster sync completed: the "
                               "receivers may not have initialised their barriers yet (init, fence, "
                               "cluster sync, then multicast)", int(block), trace.barrier(int(e["bar"]))))
    return out


def _unacquired_maps(trace) -> list[Finding]:
    """TMA copies through a slot published in this launch, by a CTA that has not acquired
    that slot since it started (program order within the CTA: no clocks compared)."""
    ev = trace.events
    published: dict[int, int] = {}  # slot -> the block that published it first
    for e in ev[ev["kind"] == K["tensormap publish"]]:
        published.setdefault(int(e["value"]), int(e["block"]))
    if not published:
        return []
    copies = [K["TMA load"], K["TMA load (multicast)"], K["TMA store"], K["TMA reduce"]]
    acquired: dict = {}
    out = []
    for e in ev[np.isin(ev["kind"], copies + [K["tensormap acquire"]])]:
        block, slot = int(e["block"]), int(e["value"] if e["kind"] == K["tensormap acquire"] else e["line"])
        if e["kind"] == K["tensormap acquire"]:
            acquired.setdefault(block, set()).add(slot)
        elif slot in published and slot not in acquired.get(block, ()):
            out.append(Finding("missing-acquire",
                               f"CTA {block} warp {int(e['warp'])}: {trace.label(e)} went through the "
                               f"tensor map in slot ..{slot:08x}, published in this launch by CTA "
                               f"{published[slot]}, without tensormap::acquire(slot) first: the copy "
                               "may use the old descriptor", block, f"slot ..{slot:08x}"))
            acquired.setdefault(block, set()).add(slot)  # once per CTA and slot
    return out


_ARRIVAL_SLACK_NS = 2000  # an event's stamp after its instruction, and SMs' timer readings apart


def _no_final_sync(trace, layout, pipes, cluster_size) -> list[Finding]:
    """A CTA whose last remote operation (remote arrive, multicast) has neither a cluster sync
    after it in the same CTA nor a producer tail: waits on every stage's empty barrier of each
    clustered pipeline after the CTA's last fill there, which hold the CTA until its peers'
    releases have all arrived (their multicasts into it were over once it consumed them)."""
    if cluster_size <= 1:
        return []
    ev = trace.events
    remote = ev[(ev["kind"] == K["arrive (remote)"]) | (ev["kind"] == K["TMA load (multicast)"])]
    syncs = ev[ev["kind"] == K["cluster sync"]]
    waits = ev[(ev["kind"] == K["wait"]) & ((ev["value"] & tr.GAVE_UP) == 0)]
    fills = ev[np.isin(ev["kind"], [K["arrive + expect_tx"], K["TMA load (multicast)"]])]
    clustered = [p for p in pipes.values() if getattr(p, "uses_cluster", False)]

    def producer_tail(block) -> bool:
        for pipe in clustered:
            full, empty = layout.offset(f"{pipe.name}_full"), layout.offset(f"{pipe.name}_empty")
            mine = fills[(fills["block"] == block) & (fills["bar"] >= full)
                         & (fills["bar"] < full + 8 * pipe.stages)]
            since = int(mine["t0"].max()) if len(mine) else 0
            waited = waits[(waits["block"] == block) & (waits["t0"] >= since)
                           & (waits["bar"] >= empty) & (waits["bar"] < empty + 8 * pipe.stages)]
            if len(np.unique(waited["bar"])) < pipe.stages:
                return False
        return bool(clustered)

    def awaited(e) -> bool:
        """A remote arrival whose target CTA waited on that barrier until it landed (the target
        could not have left; the arriving CTA wrote nothing after it): the release a cluster's K
        splits hand back to a sender that drains it before leaving. The arriving warp stamps its
        event after the arrive, so the target may wake and stamp its wait's end first, on
        another SM's reading of the timer: a wait ending up to _ARRIVAL_SLACK_NS before counts."""
        if e["kind"] != K["arrive (remote)"]:
            return False
        target = int(e["block"]) - int(e["block"]) % cluster_size + (int(e["value"]) & 0xFFFF)
        theirs = waits[(waits["block"] == target) & (waits["bar"] == e["bar"])]
        return bool(len(theirs)) and int((theirs["t0"] + theirs["dur"]).max()) + _ARRIVAL_SLACK_NS >= int(e["t0"])

    out = []
    for block in np.unique(remote["block"]):
        last = remote[remote["block"] == block][-1]
        after = syncs[(syncs["block"] == block) & (syncs["t0"] >= last["t0"])]
        if not len(after) and not producer_tail(block) and not awaited(last):
            out.append(Finding("missing-cluster-sync",
                               f"CTA {int(block)} warp {int(last['warp'])}: {trace.label(last)} was its "
                               "last reach into a peer's shared memory, and neither a cluster sync nor a "
                               "producer tail (a wait on every stage's empty barrier after the last fill) "
                               "followed before it left: a peer may still write into it (multicast, "
                               "remote arrive) or it into a peer that left. End the kernel with "
                               "cluster::sync(), or with the producer waiting for every stage to be "
                               "released", int(block), trace.barrier(int(last["bar"]))))
    return out


def ledger_text(book: dict, layout, records: list, grid: tuple, limit: int = 4) -> str:
    """For each barrier a hang is stuck on (``records``: the watchdog's): planned bytes, the
    bytes each phase announced, the copies issued into it, and the waits and releases it saw,
    from ``book`` (the trace's ``ledger``)."""
    pipes = {p.name: p for p in _pipelines(layout)}
    lines, seen = [], set()
    for rec in records:
        name, stage = str(rec.get("barrier", "")), int(rec.get("stage", -1))
        pipe_name, _, side = name.rpartition(".")
        pipe = pipes.get(pipe_name)
        if pipe is None or stage < 0 or side not in ("full", "empty"):
            continue
        x, y, z = rec["block"]
        block = x + grid[0] * (y + grid[1] * z)
        if (block, name, stage) in seen:
            continue
        seen.add((block, name, stage))
        st = book.get((block, pipe_name, stage))
        if st is None:
            continue
        boxes = sum(pipe.boxes)
        same = len({s.tx_bytes for s in pipe.tiles}) == 1
        per_copy = f" = {len(st.loads) * pipe.tiles[0].tx_bytes} B" if same else ""
        announced = ", ".join(str(a[1]) for a in st.announced[-6:]) or "none"
        taken = sum(1 for w in st.full_waits if not w[2])
        if side == "full":
            lines.append(
                f"  CTA {block} {pipe_name}_full[{stage}]: planned {pipe.tx_bytes} B per fill "
                f"({boxes} box(es)); fills announced {len(st.announced)} (last bytes: {announced}); "
                f"copies issued into it {len(st.loads)}{per_copy}; consumer waits completed {taken}")
        else:
            owed = pipe.empty_arrivals * len(st.announced)
            lines.append(
                f"  CTA {block} {pipe_name}_empty[{stage}]: {pipe.empty_arrivals} release(s) per "
                f"round; rounds filled {len(st.announced)}, consumer waits completed {taken}; "
                f"releases received {len(st.releases)} of the {owed} the filled rounds owe")
        if len(lines) >= limit:
            break
    return "\n".join(lines)


def explain(findings: list[Finding], limit: int = 6) -> str:
    lines = [f"  {f}" for f in findings[:limit]]
    if len(findings) > limit:
        names = sorted({f.name for f in findings[limit:]})
        lines.append(f"  ... and {len(findings) - limit} more ({', '.join(names)})")
    return "\n".join(lines)
