"""The flight recorder: timelines of what a kernel's TMA copies, barriers and wgmma did.

A kernel compiled with ``trace=True`` (``Kernel(..., trace=True)``, or ``trace=True`` on the
entry points) records an event each time a device-library wrapper of a pipeline stage runs:
the waits on a stage's barriers (with how long they took), the announced transaction bytes,
TMA stores and store waits, cluster syncs, PDL waits and user markers
(``tmaflow::trace::mark(id)``). ``trace="all"`` also records every arrival, TMA load and
reduction, wgmma commit / wait and named barrier (more detail, more cost: BENCHMARKS.md). Events go into a ring per warp in device memory
(the last ``capacity`` events of each warp are kept), stamped with ``%globaltimer``. After a
traced launch the host copies them out: ``kernel.last_trace`` / ``tf.trace.last()`` is a
:class:`Trace`, which exports a Chrome / Perfetto JSON (``to_chrome``) and a PNG timeline
(``to_png``), and summarises itself. A traced launch is synchronous.

Without ``trace=True`` none of this is compiled (the macros expand to nothing).
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import struct
import threading
import tokenize
import zipfile

import numpy as np

from .. import checks, plot
from ..errors import TmaflowError
from ..runtime import driver
from ..runtime.memory import DeviceArray, empty, zero_for_sanitizer

# Mirrors enum tmaflow::trace::Kind (include/tmaflow/trace.cuh), from 1.
KINDS = ("wait", "wait (cluster)", "arrive", "arrive + expect_tx", "expect_tx", "arrive (remote)",
         "TMA load", "TMA load (multicast)", "TMA store", "TMA reduce", "store wait",
         "store wait (read)", "wgmma commit", "wgmma wait", "named barrier", "cluster sync",
         "PDL wait", "mark", "tensormap publish", "tensormap acquire", "signal wait", "signal put")
KIND = {name: code for code, name in enumerate(KINDS, start=1)}
SPANS = {"wait", "wait (cluster)", "signal wait", "store wait", "store wait (read)", "wgmma wait", "named barrier",
         "cluster sync", "PDL wait"}
_EVENT_FIELDS = [("t0", "<u8"), ("dur", "<u4"), ("kind", "<u2"), ("stage", "<i2"), ("bar", "<u4"),
                 ("value", "<u4"), ("line", "<u4"), ("sm", "<u4")]
EVENT = np.dtype(_EVENT_FIELDS)
assert EVENT.itemsize == 32
_SAVED = np.dtype(_EVENT_FIELDS + [("block", "<u4"), ("warp", "<u4")])  # events with their warp
STATIC_SMEM = 0x80000000  # bar: bit 31 = an address in static shared memory
TIMED_OUT = 0x100  # value of a wait the watchdog stopped (it timed out)
GAVE_UP = 0x200  # value of a wait that stopped because another one had timed out
DEFAULT_CAPACITY = 1024  # events kept per warp
BUDGET_BYTES = 256 << 20  # device memory for the rings of one launch, at most
MAPPED_BUDGET_BYTES = 64 << 20  # pinned host memory for them (debug builds)

_last = threading.local()


def last() -> "Trace | None":
    """The trace of this thread's latest traced launch."""
    return getattr(_last, "trace", None)


class Recorder:
    """Per-module state of a trace build: the ring buffer and the device global naming it."""

    def __init__(self, module, device, capacity: int = DEFAULT_CAPACITY, mapped: bool = False):
        self.state = driver.module_global(module, b"tmaflow_trace_state")  # None: no wrappers, inert
        self.device, self.capacity = device, capacity
        # Debug builds keep the rings in pinned host memory the device writes through: they
        # can be read after a fault, before the context reset frees them.
        self.mapped = mapped
        self.buffer: DeviceArray | None = None
        self.host = self.host_bytes = self.host_address = 0
        self.rings = self.capacity_log2 = 0
        self._state_bytes: bytes | None = None
        self._generation = device.generation
        self.last: Trace | None = None  # the Trace of the latest launch, once collected

    def arm(self, config, stream: int) -> None:
        """Size, zero and publish the rings for a launch of ``config`` on ``stream``."""
        if self.state is None:
            return

        self.last = None
        warps = -(-config.threads // 32)
        self.rings = math.prod(config.grid) * warps
        budget = MAPPED_BUDGET_BYTES if self.mapped else BUDGET_BYTES
        log2 = max(4, int(math.log2(self.capacity)))
        while log2 > 4 and self.rings * (EVENT.itemsize << log2) > budget:
            log2 -= 1  # large grids keep fewer events per warp
        self.capacity_log2 = log2
        nbytes = self.rings * (EVENT.itemsize << log2)
        if self.mapped:
            if self.host_bytes < nbytes:
                self._free_host()
                self.host, self.host_address = driver.mapped_host(nbytes)
                self.host_bytes = nbytes
            else:
                ctypes.memset(self.host, 0, nbytes)
            address = self.host_address
        else:
            buffer = self.buffer
            if buffer is None or buffer.nbytes < nbytes or not buffer.alive:
                buffer = self.buffer = empty(nbytes, "uint8", self.device)
                zero_for_sanitizer(buffer, 0)  # copied out whole, written in part
            driver.call("cuMemsetD8Async", buffer.ptr, 0, nbytes, stream)
            address = buffer.ptr
        self._state_bytes = struct.pack("<QII", address, log2, self.rings)
        driver.call("cuMemcpyHtoDAsync", self.state, self._state_bytes, 16, stream)

    def collect(self, stream: int, kernel, config) -> "Trace | None":
        """Wait for the launch, copy the rings out and keep them as ``kernel.last_trace``."""
        if self.state is None:
            return None
        count = self.rings << self.capacity_log2
        if self.mapped:  # no synchronisation: after a fault it would fail; debug launches are done
            raw = (ctypes.c_char * (count * EVENT.itemsize)).from_address(self.host)
            events = np.frombuffer(memoryview(raw), dtype=EVENT).copy()
        else:
            if self.buffer is None:
                raise TmaflowError(f"trace of {kernel.name}: collect() before arm(); no rings to read")
            driver.call("cuStreamSynchronize", stream)
            events = np.empty(count, dtype=EVENT)
            driver.call("cuMemcpyDtoH", events.ctypes.data, self.buffer.ptr, events.nbytes)
        trace = Trace.from_rings(events.reshape(self.rings, -1), kernel.name, config,
                                 getattr(kernel, "layout", None))
        trace.level = kernel.trace
        kernel.last_trace = _last.trace = self.last = trace
        return trace

    def _free_host(self) -> None:
        if self.host and self.device.generation == self._generation:
            driver.call("cuMemFreeHost", self.host)
        self.host = self.host_bytes = self.host_address = 0
        self._generation = self.device.generation

    def close(self) -> None:
        """Drop the device rings and free the mapped host copy."""
        self.buffer = None
        self._free_host()


class Trace:
    """The events of one traced launch: ``events`` (a numpy structured array sorted by time,
    with ``block`` and ``warp`` columns), exports and summaries. ``save`` / ``Trace.load``
    keep one in an ``.npz`` file (to draw it on another machine, say)."""

    def __init__(self, events: np.ndarray, kernel_name: str, warps_per_block: int,
                 placements=(), wrapped: int = 0):
        self.events, self.kernel_name = events, kernel_name
        self.warps_per_block, self.wrapped = warps_per_block, wrapped
        self.placements = [(str(n), int(o), int(b)) for n, o, b in placements]
        self.level = "all"  # or "stage": what the build recorded (set by the recorder)

    @classmethod
    def from_rings(cls, rings: np.ndarray, kernel_name: str, config, layout=None) -> "Trace":
        """From the rings as the device left them: empty slots dropped, sorted by time."""
        warps = -(-config.threads // 32) if config is not None else 1
        ring_index = np.repeat(np.arange(rings.shape[0]), rings.shape[1]).reshape(rings.shape)
        valid = rings["t0"] != 0
        ev, ring = rings[valid], ring_index[valid]
        order = np.argsort(ev["t0"], kind="stable")
        ev, ring = ev[order], ring[order]
        out = np.empty(len(ev), dtype=_SAVED)
        for name, _ in _EVENT_FIELDS:
            out[name] = ev[name]
        out["block"], out["warp"] = ring // warps, ring % warps
        placements = [(p.name, p.offset, p.nbytes) for p in getattr(layout, "placements", ())]
        # a ring that came back full may have lost its oldest events
        wrapped = int((valid.sum(axis=1) == rings.shape[1]).sum())
        return cls(out, kernel_name, warps, placements, wrapped)

    def save(self, path) -> None:
        """Write the events and their metadata to ``path`` (``.npz``; ``Trace.load`` reads it back)."""
        meta = json.dumps({"kernel": self.kernel_name, "warps_per_block": self.warps_per_block,
                           "placements": self.placements, "wrapped": self.wrapped,
                           "level": self.level})
        np.savez_compressed(path, events=self.events, meta=np.array(meta))

    @classmethod
    def load(cls, path) -> "Trace":
        """A trace kept by ``save``; any other file is a TmaflowError naming what is wrong."""
        if not isinstance(path, (str, os.PathLike)):
            raise TmaflowError(f"Trace.load: path={path!r} must be a str or a path")
        where = f"Trace.load: path={os.fspath(path)!r}"
        try:
            with open(path, "rb") as head:
                single = head.read(6) == b"\x93NUMPY"
            if single:
                raise TmaflowError(f"{where} is not a trace saved by Trace.save (one array, not "
                                   "an archive of events and meta)")
            f = np.load(path, allow_pickle=False)
            if not hasattr(f, "files"):  # a single .npy array (an NpzFile lists its members)
                raise TmaflowError(f"{where} is not a trace saved by Trace.save (one array, not "
                                   "an archive of events and meta)")
            with f:
                if {"events", "meta"} - set(f.files):
                    raise TmaflowError(f"{where} is not a trace saved by Trace.save (no events "
                                       "and meta arrays)")
                events, meta = f["events"], json.loads(str(f["meta"]))
        # JSON errors are ValueErrors; numpy's header parser can also raise the tokenizer's
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, SyntaxError, tokenize.TokenError) as exc:
            raise TmaflowError(f"{where} is not a readable trace ({type(exc).__name__}: {exc})") from None
        _check_saved(where, events, meta)
        trace = cls(events, meta["kernel"], meta["warps_per_block"], meta["placements"],
                    meta["wrapped"])
        trace.level = meta.get("level", "all")
        return trace

    # --- naming ----------------------------------------------------------------------------
    def kind(self, code: int) -> str:
        """The name of an event kind code (``'wait'``, ``'TMA load'``, ...)."""
        return KINDS[code - 1] if 1 <= code <= len(KINDS) else f"kind {code}"

    def barrier(self, bar: int) -> str:
        """The layout item a barrier offset falls in, with its stage: 'tiles_full[2]'."""
        if bar & STATIC_SMEM:
            return f"static smem 0x{bar & ~STATIC_SMEM:x}"
        for name, offset, nbytes in self.placements:
            if offset <= bar < offset + nbytes:
                return f"{name}[{(bar - offset) // 8}]" if name.endswith(("_full", "_empty")) \
                    else f"{name}+{bar - offset}"
        return f"smem+{bar}"

    def _lanes(self) -> np.ndarray:
        """Each event's warp, numbered across the grid."""
        return self.events["block"].astype(np.int64) * self.warps_per_block + self.events["warp"]

    def roles(self) -> dict:
        """(block, warp) -> role, from what the warp did: 'producer' issued TMA loads (or
        announced their bytes), 'consumer' waited on wgmma or on barriers it did not fill,
        'storer' issued stores."""
        ev = self.events
        lanes = self._lanes()

        def did(*names):
            codes = [KIND[n] for n in names]
            return set(np.unique(lanes[np.isin(ev["kind"], codes)]).tolist())

        producers = did("TMA load", "TMA load (multicast)", "arrive + expect_tx")
        consumers = did("wgmma wait", "wait") - producers
        storers = did("TMA store") - producers - consumers
        roles = {}
        for lane in np.unique(lanes).tolist():
            role = ("producer" if lane in producers else "consumer" if lane in consumers
                    else "storer" if lane in storers else "warp")
            roles[(lane // self.warps_per_block, lane % self.warps_per_block)] = role
        return roles

    def label(self, e) -> str:
        """One event as text: its kind and, for barrier events, the layout item and stage."""
        return self._label(self.kind(int(e["kind"])), int(e["bar"]), int(e["stage"]), int(e["value"]))

    def _label(self, name: str, bar: int, stage: int, value: int) -> str:
        if name in ("wait", "wait (cluster)", "arrive", "arrive + expect_tx", "expect_tx",
                    "arrive (remote)", "TMA load", "TMA load (multicast)"):
            where = self.barrier(bar)
            if stage >= 0 and "[" not in where:
                where += f"[{stage}]"
            return f"{name} {where}"
        if name == "mark":
            return f"mark {value}"
        if name.startswith("tensormap"):
            return f"{name} slot ..{value:08x}"
        if name == "signal wait":  # bar: the signal's index; value: the peer << 16 | the value seen
            return f"signal wait {bar} from rank {value >> 16}"
        if name == "signal put":  # bar: the low 32 bits of the address; value: the value put
            return f"signal put {value} at ..{bar:08x}"
        return name

    # --- exports ---------------------------------------------------------------------------
    def to_chrome(self, path=None) -> dict:
        """The Chrome trace-event JSON (opens in Perfetto and chrome://tracing): one process per
        CTA, one thread per warp named by its role; waits are spans, the rest instants."""
        t_min = int(self.events["t0"].min()) if len(self.events) else 0
        roles = self.roles()
        out = []
        for (block, warp), role in sorted(roles.items()):
            out.append({"ph": "M", "name": "process_name", "pid": block, "tid": 0,
                        "args": {"name": f"CTA {block}"}})
            out.append({"ph": "M", "name": "thread_name", "pid": block, "tid": warp,
                        "args": {"name": f"warp {warp} ({role})"}})
        ev = self.events
        labels: dict[tuple[int, int, int, int], str] = {}  # (kind, bar, stage, value) -> label: a few distinct ones for many events
        columns = zip(ev["kind"].tolist(), ev["bar"].tolist(), ev["stage"].tolist(),
                      ev["value"].tolist(), ev["sm"].tolist(), ev["line"].tolist(),
                      ev["block"].tolist(), ev["warp"].tolist(), ev["t0"].tolist(), ev["dur"].tolist())
        for kind, bar, stage, value, sm, line, block, warp, t0, dur in columns:
            name = self.kind(kind)
            key = (kind, bar, stage, value if name == "mark" else 0)
            label = labels.get(key)
            if label is None:
                label = labels[key] = self._label(name, bar, stage, value)
            args = {"sm": sm, "value": value}
            if stage >= 0:
                args["stage"] = stage
            if line:
                args["line"] = line
            if name in ("wait", "wait (cluster)"):
                args["parity"] = value & 1
                if value & TIMED_OUT:
                    args["timed_out"] = True
                if value & GAVE_UP:
                    args["gave_up"] = True
            item = {"name": label, "cat": name, "pid": block, "tid": warp,
                    "ts": (t0 - t_min) / 1e3, "args": args}
            if name in SPANS:
                item.update(ph="X", dur=max(dur, 1) / 1e3)
            else:
                item.update(ph="i", s="t")
            out.append(item)
        doc = {"traceEvents": out, "displayTimeUnit": "ns",
               "otherData": {"kernel": self.kernel_name, "events": int(len(self.events)),
                             "wrapped_rings": self.wrapped}}
        if path is not None:
            with open(path, "w") as f:  # dumps, not dump: the C encoder (dump streams in Python)
                f.write(json.dumps(doc, separators=(",", ":")))
        return doc

    def to_png(self, path, blocks: int = 2, window_us: float | None = 12.0, width: float = 14.0) -> None:
        """A timeline of the first ``blocks`` CTAs: a lane per warp, waits as bars coloured by
        stage, loads and stores as ticks, over the last ``window_us`` microseconds (None: all
        of it). Needs matplotlib (the ``plot`` extra)."""
        roles = self.roles()
        shown = sorted({b for b, _ in roles})[:blocks]
        lanes = [(b, w) for b, w in sorted(roles) if b in shown]
        if not lanes:
            raise TmaflowError("Trace.to_png: the trace has no events")
        t_min = int(self.events["t0"].min())
        t_end = int((self.events["t0"] + self.events["dur"]).max())
        lo = t_min if window_us is None else max(t_min, t_end - int(window_us * 1e3))
        fig = plot.figure("Trace.to_png", (width, 0.35 * len(lanes) + 1.2))
        ax = fig.subplots()
        cmap = plot.colormap("tab10")
        for y, (b, w) in enumerate(lanes):
            mine = self.events[(self.events["block"] == b) & (self.events["warp"] == w)]
            mine = mine[mine["t0"] + mine["dur"] >= lo]
            for e in mine:
                name = self.kind(int(e["kind"]))
                x = (int(e["t0"]) - t_min) / 1e3
                if name in SPANS:
                    colour = cmap(int(e["stage"]) % 10) if e["stage"] >= 0 else "0.6"
                    ax.broken_barh([(x, max(int(e["dur"]), 20) / 1e3)], (y - 0.35, 0.7), color=colour)
                elif name.startswith("TMA"):
                    ax.plot([x, x], [y - 0.4, y + 0.4], color="k" if "load" in name else "r", lw=0.6)
                elif name.startswith("arrive"):
                    ax.plot([x], [y], marker="|", color="tab:blue", ms=5, lw=0)
        ax.set_yticks(range(len(lanes)))
        ax.set_yticklabels([f"CTA {b} warp {w} ({roles[(b, w)]})" for b, w in lanes], fontsize=7)
        ax.set_xlim((lo - t_min) / 1e3, (t_end - t_min) / 1e3)
        ax.set_xlabel("µs since the first event")
        ax.set_title(f"{self.kernel_name}: waits coloured by stage (grey: no stage); TMA loads black, "
                     "stores red, arrivals blue")
        ax.invert_yaxis()
        fig.tight_layout()
        fig.savefig(path, dpi=120)

    def summary(self) -> str:
        """Events, span and CTAs, then per kind its count (and for waits and other spans the mean
        and longest duration)."""
        if not len(self.events):
            return f"{self.kernel_name}: no events recorded"
        span_us = (int(self.events["t0"].max()) - int(self.events["t0"].min())) / 1e3
        lines = [f"{self.kernel_name}: {len(self.events)} events over {span_us:.1f} µs, "
                 f"{len(set(self.events['block'].tolist()))} CTAs"
                 + (f", {self.wrapped} rings wrapped (oldest events lost)" if self.wrapped else "")]
        for code in np.unique(self.events["kind"]):
            sel = self.events[self.events["kind"] == code]
            name = self.kind(int(code))
            if name in SPANS:
                lines.append(f"  {name:22s} {len(sel):8d}  mean {sel['dur'].mean() / 1e3:8.2f} µs  "
                             f"max {sel['dur'].max() / 1e3:8.2f} µs")
            else:
                lines.append(f"  {name:22s} {len(sel):8d}")
        return "\n".join(lines)

    def tail(self, n: int = 4) -> str:
        """The last ``n`` events of every warp, as text (what led up to a hang): up to and
        including the warp's own timed-out wait; what it did after another wait timed out
        (waits that gave up at once) is left out."""
        n = checks.as_int("Trace.tail: n", n, 0)
        if not len(self.events):
            return f"{self.kernel_name}: no events recorded"
        roles = self.roles()
        ev = self.events
        t_min = int(ev["t0"].min()) if len(ev) else 0
        waits = np.isin(ev["kind"], [KIND["wait"], KIND["wait (cluster)"]])
        keep = ~(waits & ((ev["value"] & GAVE_UP) != 0))
        ev, waits, lanes = ev[keep], waits[keep], self._lanes()[keep]
        order = np.argsort(lanes, kind="stable")  # by warp, in time order within each
        ev, waits, lanes = ev[order], waits[order], lanes[order]
        bounds = np.flatnonzero(np.r_[True, lanes[1:] != lanes[:-1], True])
        spans = {int(lanes[a]): (a, b) for a, b in zip(bounds[:-1], bounds[1:])}
        lines = []
        for (b, w), role in sorted(roles.items()):
            lo, hi = spans.get(b * self.warps_per_block + w, (0, 0))
            stuck = np.flatnonzero(waits[lo:hi] & ((ev["value"][lo:hi] & TIMED_OUT) != 0))
            if len(stuck):
                hi = lo + stuck[0] + 1
            steps = []
            for e in ev[max(lo, hi - n):hi]:
                text = f"{self.label(e)} @{(int(e['t0']) - t_min) / 1e3:.1f}us"
                if self.kind(int(e["kind"])).startswith("wait"):
                    if int(e["value"]) & TIMED_OUT:
                        text += " TIMED OUT"
                    elif int(e["value"]) & GAVE_UP:
                        text += " (gave up)"
                steps.append(text)
            lines.append(f"  CTA {b} warp {w} ({role}): " + " -> ".join(steps))
        return "\n".join(lines)

    def __len__(self) -> int:
        return len(self.events)

    def __repr__(self) -> str:
        return f"Trace({self.kernel_name}, {len(self.events)} events)"

_META = {"kernel": str, "warps_per_block": int, "placements": list, "wrapped": int}


def _check_saved(where: str, events, meta) -> None:
    """The schema ``Trace.save`` writes: events of the saved dtype, meta of these fields."""
    if not isinstance(events, np.ndarray) or events.ndim != 1 or events.dtype != _SAVED:
        raise TmaflowError(f"{where}: events of dtype {getattr(events, 'dtype', None)} are not "
                           "a saved trace's (a file of another tmaflow version?)")
    if not isinstance(meta, dict) or any(not isinstance(meta.get(k), t) or isinstance(meta.get(k), bool)
                                         for k, t in _META.items()):
        raise TmaflowError(f"{where}: meta={meta!r} must hold "
                           + ", ".join(f"{k} ({t.__name__})" for k, t in _META.items()))
    if meta["warps_per_block"] < 1 or any(
            not (isinstance(p, list) and len(p) == 3 and isinstance(p[0], str)
                 and all(checks.is_int(v) for v in p[1:])) for p in meta["placements"]):
        raise TmaflowError(f"{where}: meta={meta!r} has a warps_per_block below 1 or placements "
                           "that are not [name, offset, bytes] triples")
