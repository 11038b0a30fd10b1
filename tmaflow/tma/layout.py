"""Shared-memory plans: ``Barrier``, ``Pipeline``, ``Buffer`` and the ``SharedLayout`` that
places them and generates the header a kernel includes (``tmaflow_layout.cuh``).

Numbers a kernel author usually spells by hand (transaction bytes, arrival counts,
multicast masks, offsets and alignments) are derived here from tensor-map specs and the
cluster shape.
"""
from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, field
from typing import cast

from .. import checks
from ..errors import LaunchError, LayoutError
from ..launch.config import dims
from .spec import TensorMapSpec

HOPPER_SMEM_LIMIT = 227 * 1024
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# Names become C++ identifiers in the generated header (and members of its Smem struct):
# keywords, reserved identifiers and the header's own names cannot be used.
_CXX_KEYWORDS = frozenset("""alignas alignof and asm auto bool break case catch char char16_t
char32_t char8_t class const consteval constexpr constinit const_cast continue co_await co_return
co_yield decltype default delete do double dynamic_cast else enum explicit export extern false
float for friend goto if inline int long mutable namespace new noexcept not nullptr operator or
private protected public register reinterpret_cast requires return short signed sizeof static
static_assert static_cast struct switch template this thread_local throw true try typedef typeid
typename union unsigned using virtual void volatile wchar_t while xor""".split())
# The header's own names in each scope it generates (a pipeline's namespace gets PIPELINE_NAMES,
# plus tile-derived ones), and the types and macros it uses unqualified.
_GENERATED = frozenset({"Smem", "tmaflow_layout", "tmaflow", "total_bytes", "align", "base",
                        "uint8_t", "uint16_t", "uint32_t", "uint64_t"})
PIPELINE_NAMES = ("stages", "tx_bytes", "full_arrivals", "empty_arrivals", "consumers",
                  "consumer_lanes", "cluster_x", "cluster_y", "release_mask", "peer_mask")
TILE_SUFFIXES = ("_bytes", "_stride", "_boxes", "_box_stride", "_index", "_mask", "_leader",
                 "_group_size", "_slice")


def _check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise LayoutError(f"{kind} name={name!r} must be a C identifier")
    if name in _CXX_KEYWORDS or name in _GENERATED or name.startswith(("__", "TMAFLOW")) or \
            (name[0] == "_" and name[1:2].isupper()):
        raise LayoutError(f"{kind} name={name!r} is a C++ keyword, a reserved identifier or a "
                          "name the generated header uses; choose another")
    return name


def _count(kind: str, name: str, field_name: str, value, lo: int, hi: int, note: str = "") -> int:
    """An int in [lo, hi] (a bool, float or anything else is a LayoutError naming the field)."""
    if not checks.is_int(value) or not lo <= operator.index(value) <= hi:
        raise LayoutError(f"{kind} {name!r}: {field_name}={value!r} must be an int in "
                          f"[{lo}, {hi}]{note}")
    return operator.index(value)


def _tile_entries(name: str, tiles) -> tuple[tuple, tuple]:
    """(names, entries) of ``tiles``: a dict name -> entry or an iterable of entries."""
    if isinstance(tiles, dict):
        return tuple(tiles), tuple(tiles.values())
    if isinstance(tiles, (str, bytes, TensorMapSpec)) or not hasattr(tiles, "__iter__"):
        raise LayoutError(f"Pipeline {name!r}: tiles={tiles!r} must be a list of tensor map specs "
                          "or maps (or (spec, n) pairs), or a dict name -> spec")
    entries = tuple(tiles)
    return tuple(f"tile{i}" for i in range(len(entries))), entries


def _tile(name: str, tname: str, label: str, entry) -> tuple[TensorMapSpec, int]:
    """The spec and box count of one ``tiles`` entry: a spec, a map or a (spec, n) pair."""
    spec, n = entry if isinstance(entry, tuple) and len(entry) == 2 else (entry, 1)
    spec = getattr(spec, "spec", spec)  # a TensorMap's spec
    if not isinstance(spec, TensorMapSpec):
        raise LayoutError(f"Pipeline {name!r}: {label}={entry!r} must be a TensorMapSpec, a "
                          "TensorMap or a (spec, n) pair")
    if not checks.is_int(n) or not 1 <= operator.index(n) <= 16:
        raise LayoutError(f"Pipeline {name!r}: tile {tname!r} has boxes={n!r}; give "
                          "(spec, n) with n an int in [1, 16]")
    return spec, operator.index(n)


def _check_tile_symbols(name: str, tile_names: tuple) -> None:
    """Each tile name generates constants and functions in the pipeline's namespace; two
    tiles, or a tile and the pipeline's own constants, must not generate the same one."""
    owner = {sym: "the pipeline" for sym in PIPELINE_NAMES}
    for tname in tile_names:
        for sym in (tname + suffix for suffix in TILE_SUFFIXES):
            if sym in owner:
                raise LayoutError(f"Pipeline {name!r}: tile name {tname!r} generates {sym!r}, which "
                                  f"{owner[sym]} also defines; rename the tile")
            owner[sym] = f"tile {tname!r}"


@dataclass(frozen=True)
class Barrier:
    """One mbarrier: ``arrivals`` per phase and the transaction bytes announced with it."""

    name: str
    arrivals: int = 1
    tx_bytes: int = 0

    def __post_init__(self):
        _check_name("Barrier", self.name)
        object.__setattr__(self, "arrivals",
                           _count("Barrier", self.name, "arrivals", self.arrivals, 1, (1 << 20) - 1))
        object.__setattr__(self, "tx_bytes",
                           _count("Barrier", self.name, "tx_bytes", self.tx_bytes, 0, (1 << 20) - 1,
                                  " (the mbarrier tx-count range)"))


@dataclass(frozen=True)
class Buffer:
    """A plain shared-memory region (epilogue staging, scratch, a tile loaded by hand).

    ``nbytes`` is a byte count, or a ``TensorMapSpec`` / ``TensorMap`` whose box the buffer
    holds: then its size is ``spec.smem_bytes`` and its alignment ``spec.smem_align`` (1024 B
    for a 128B-swizzled box; the swizzle pattern follows absolute addresses, so less would
    change the image). ``align`` defaults to 128 B for byte counts; an explicit ``align`` below
    a spec's is an error.

    ``count`` > 1 places that many such buffers ``stride`` bytes apart (``nbytes`` rounded up
    to ``align``): double buffering under one name, ``S.<name>(i)`` on the device and
    ``L::<name>::count`` / ``stride`` in the header. A single buffer is ``S.<name>()``.
    """

    name: str
    nbytes: int
    align: int | None = None
    count: int = 1

    def __post_init__(self):
        _check_name("Buffer", self.name)
        spec = getattr(self.nbytes, "spec", self.nbytes)
        if self.align is not None:
            object.__setattr__(self, "align", _int_field(self.name, "align", self.align))
        if hasattr(spec, "smem_bytes") and hasattr(spec, "smem_align"):
            if self.align is not None and self.align < spec.smem_align:
                raise LayoutError(f"Buffer {self.name!r}: align={self.align} is below the "
                                  f"{spec.smem_align} B its {spec.swizzle} box needs; leave align out")
            object.__setattr__(self, "nbytes", spec.smem_bytes)
            object.__setattr__(self, "align", max(self.align or 0, spec.smem_align))
        elif self.align is None:
            object.__setattr__(self, "align", 128)
        object.__setattr__(self, "nbytes", _int_field(self.name, "nbytes", self.nbytes))
        if not 0 < self.nbytes < 1 << 32:
            raise LayoutError(f"Buffer {self.name!r}: nbytes={self.nbytes} must be in [1, 2^32)")
        if not 0 < self.align <= 1 << 31 or self.align & (self.align - 1):
            raise LayoutError(f"Buffer {self.name!r}: align={self.align} must be a power of two "
                              "<= 2^31")
        object.__setattr__(self, "count", _count("Buffer", self.name, "count", self.count, 1, 1024))

    @property
    def stride(self) -> int:
        """Bytes from one of ``count`` buffers to the next: ``nbytes`` rounded up to ``align``."""
        align = cast(int, self.align)  # resolved by __post_init__
        return -(-self.nbytes // align) * align

    @property
    def total_bytes(self) -> int:
        """Bytes the ``count`` buffers span (the last needs only its ``nbytes``)."""
        return (self.count - 1) * self.stride + self.nbytes


def _int_field(name: str, field_name: str, value) -> int:
    if not checks.is_int(value):
        raise LayoutError(f"Buffer {name!r}: {field_name}={value!r} must be an int "
                          "(or nbytes a TensorMapSpec)")
    return operator.index(value)


_AXES = {"x": 0, "y": 1, "z": 2}


def _cluster(name: str, cluster) -> tuple[int, int, int]:
    try:
        return dims("cluster", cluster)
    except LaunchError as exc:
        raise LayoutError(f"Pipeline {name!r}: {exc}") from None


@dataclass(frozen=True, init=False)
class Pipeline:
    """A ring of ``stages`` buffers, each holding one box of every tile, with full/empty
    barrier pairs.

    ``tiles``: a list of specs/maps (named tile0, tile1, ...) or a dict name -> spec. An
    entry ``(spec, n)`` holds ``n`` boxes of that map back to back per stage (a tile loaded
    in several pieces, or split among the CTAs of a multicast group).
    ``consumers``: arrivals on an empty barrier per CTA per release (e.g. one elected thread
    per consumer warp, or every thread for a unified pipeline).
    ``consumer_lanes``: arrivals of each consumer on its own CTA's empty barrier (default 1).
    32 for consumer warps whose every lane releases its own reads of the stage
    (``Pipeline::consumer_release_lanes``: a tool like racecheck credits a release only to the
    thread that made it); their releases to the other CTAs of the mask stay one per warp.
    ``producers``: arrivals on a full barrier per stage: the thread announcing the bytes, plus
    threads that fill part of the stage themselves and arrive when their copies land
    (``cp_async::arrive_on``).
    ``cluster`` and ``multicast``: with ``multicast`` a list (one entry per tile) of None or
    the cluster axis ("x" | "y") along which CTAs share that tile; the group's lowest rank
    issues the multicast load and every consumer releases to every CTA that writes into it.
    """

    name: str
    stages: int
    tiles: tuple
    consumers: int = 1
    cluster: tuple = (1, 1, 1)
    multicast: tuple | None = None
    tile_names: tuple = field(default=(), compare=False)
    boxes: tuple = ()
    producers: int = 1
    consumer_lanes: int = 1

    def __init__(self, name, stages, tiles, consumers=1, multicast=None, cluster=(1, 1, 1), producers=1,
                 consumer_lanes=1):
        _check_name("Pipeline", name)
        names, entries = _tile_entries(name, tiles)
        for n in names:
            _check_name("tile", n)
        _check_tile_symbols(name, names)
        if not entries:
            raise LayoutError(f"Pipeline {name!r}: tiles is empty; give at least one spec or map")
        keys = names if isinstance(tiles, dict) else range(len(entries))
        pairs = [_tile(name, t, f"tiles[{k!r}]", e) for t, k, e in zip(names, keys, entries)]
        specs, boxes = tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
        stages = _count("Pipeline", name, "stages", stages, 1, 32)
        consumers = _count("Pipeline", name, "consumers", consumers, 1, 1024)
        producers = _count("Pipeline", name, "producers", producers, 1, 1024)
        consumer_lanes = _count("Pipeline", name, "consumer_lanes", consumer_lanes, 1, 1024)
        cluster = _cluster(name, cluster)
        if math.prod(cluster) > 16 or cluster[2] != 1 and multicast:
            raise LayoutError(f"Pipeline {name!r}: cluster={cluster} must have at most 16 CTAs "
                              "(and z = 1 with multicast)")
        if multicast is not None:
            multicast = tuple(multicast) if isinstance(multicast, (list, tuple)) else (multicast,) * len(specs)
            if len(multicast) != len(specs):
                raise LayoutError(f"Pipeline {name!r}: multicast={multicast!r} has {len(multicast)} entries for "
                                  f"{len(specs)} tiles")
            for i, axis in enumerate(multicast):
                if axis is not None and not (isinstance(axis, str) and axis in ("x", "y")):
                    raise LayoutError(f"Pipeline {name!r}: multicast[{i}]={axis!r} must be None, "
                                      "'x' or 'y'")
                if axis is not None and cluster[_AXES[axis]] == 1:
                    raise LayoutError(f"Pipeline {name!r}: multicast[{i}]={axis!r} but cluster="
                                      f"{cluster} has one CTA along {axis}; nothing to share")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "stages", stages)
        object.__setattr__(self, "tiles", specs)
        object.__setattr__(self, "tile_names", names)
        object.__setattr__(self, "boxes", boxes)
        object.__setattr__(self, "consumers", consumers)
        object.__setattr__(self, "producers", producers)
        object.__setattr__(self, "consumer_lanes", consumer_lanes)
        object.__setattr__(self, "cluster", cluster)
        object.__setattr__(self, "multicast", multicast)
        if self.tx_bytes > (1 << 20) - 1:
            raise LayoutError(f"Pipeline {name!r}: one stage carries {self.tx_bytes} B, over the "
                              "mbarrier tx-count limit of 2^20-1; use smaller boxes")
        if self.empty_arrivals > (1 << 20) - 1:
            raise LayoutError(f"Pipeline {name!r}: consumers={consumers} x consumer_lanes={consumer_lanes} "
                              f"(plus the other CTAs' releases) make {self.empty_arrivals} arrivals per "
                              "phase, over the mbarrier limit of 2^20-1")

    @property
    def tx_bytes(self) -> int:
        """Bytes landing in each CTA per stage: what the producer announces."""
        return sum(n * s.tx_bytes for s, n in zip(self.tiles, self.boxes))

    def box_stride(self, tile: int) -> int:
        """Bytes between consecutive boxes of one tile (each box keeps its alignment)."""
        spec = self.tiles[tile]
        return -(-spec.smem_bytes // spec.smem_align) * spec.smem_align

    def stage_stride(self, tile: int) -> int:
        """Bytes between one stage's boxes of tile ``tile`` and the next stage's."""
        return self.box_stride(tile) * self.boxes[tile]

    @property
    def full_arrivals(self) -> int:
        """Arrivals that complete a full barrier's phase: ``producers``."""
        return self.producers

    def _rank(self, x: int, y: int) -> int:
        return x + y * self.cluster[0]

    def group_mask(self, tile: int, rank: int) -> int:
        """CTAs (bit per cluster rank) receiving tile ``tile`` together with CTA ``rank``."""
        cx, cy, _ = self.cluster
        x, y = rank % cx, (rank // cx) % cy
        axis = self.multicast[tile] if self.multicast else None
        if axis is None:
            return 1 << rank
        if axis == "x":
            return sum(1 << self._rank(i, y) for i in range(cx))
        return sum(1 << self._rank(x, j) for j in range(cy))

    def is_leader(self, tile: int, rank: int) -> bool:
        """Whether CTA ``rank`` is the lowest of its group for tile ``tile`` (the one that issues a
        whole-tile multicast)."""
        mask = self.group_mask(tile, rank)
        return (mask & -mask) == (1 << rank)

    def release_mask(self, rank: int) -> int:
        """CTAs (bit per cluster rank) whose empty barriers CTA ``rank``'s consumers release: the
        OR of its tiles' group masks."""
        mask = 0
        for t in range(len(self.tiles)):
            mask |= self.group_mask(t, rank)
        return mask

    @property
    def empty_arrivals(self) -> int:
        """Arrivals that complete an empty barrier's phase: ``consumers x consumer_lanes`` from
        the CTA itself and ``consumers`` from each other CTA that releases to it (the CTAs of its
        release mask: multicast groups are symmetric)."""
        peers = bin(self.release_mask(0)).count("1") - 1
        return self.consumers * (self.consumer_lanes + peers)

    @property
    def uses_cluster(self) -> bool:
        """Whether some tile is multicast (releases then reach other CTAs of the cluster)."""
        return self.multicast is not None and any(a is not None for a in self.multicast)


@dataclass(frozen=True)
class Placement:
    name: str
    offset: int
    nbytes: int
    align: int
    what: str


class SharedLayout:
    """A kernel's dynamic shared memory: ``Pipeline``, ``Barrier`` and ``Buffer`` items placed in
    order, each at its alignment (1024 B for 128B-swizzled tiles); the total is checked against
    ``limit`` (227 KB on Hopper). ``header()`` is the generated ``tmaflow_layout.cuh`` a kernel
    includes (``Kernel(..., layout=...)`` adds it): ``tmaflow_layout::Smem S(smem)`` gives every
    item by name, with its arrival counts, transaction bytes and multicast masks.
    ``total_bytes`` is what a launch passes as dynamic smem by default, and the least it may
    pass; ``cluster`` is the cluster its pipelines were planned for (None when all keep the
    default (1, 1, 1)), the only cluster a kernel with this layout launches with."""

    def __init__(self, items, limit: int = HOPPER_SMEM_LIMIT):
        if isinstance(items, (str, bytes, dict)) or not hasattr(items, "__iter__"):
            raise LayoutError(f"SharedLayout: items={items!r} must be a list of Pipeline, Barrier "
                              "and Buffer items")
        self.items = list(items)
        self.limit = checks.as_int("SharedLayout: limit", limit, 1, (1 << 31) - 1, LayoutError)
        self._header: str | None = None
        self.placements: list[Placement] = []
        offset = 0
        seen: dict[str, str] = {}

        def claim(name, what):
            # one namespace for items and what they generate: Smem gets a member of each
            if name in seen:
                raise LayoutError(f"SharedLayout: name {name!r} is used twice ({seen[name]}; {what})")
            seen[name] = what

        for item in self.items:
            if isinstance(item, Pipeline):
                claim(item.name, f"Pipeline {item.name!r}")

        def place(name, nbytes, align, what):
            nonlocal offset
            claim(name, what)
            offset = -(-offset // align) * align
            self.placements.append(Placement(name, offset, nbytes, align, what))
            offset += nbytes

        # Big, strictly aligned tiles first so padding stays small; barriers last.
        for item in self.items:
            if isinstance(item, Pipeline):
                for t, (tname, spec) in enumerate(zip(item.tile_names, item.tiles)):
                    boxes = f"{item.boxes[t]} x " if item.boxes[t] > 1 else ""
                    place(f"{item.name}_{tname}", item.stage_stride(t) * item.stages, spec.smem_align,
                          f"{item.stages} x {boxes}{spec.smem_bytes} B {spec.dtype.name} box {spec.box}"
                          f" swizzle {spec.swizzle}")
        for i, item in enumerate(self.items):
            if isinstance(item, Buffer):
                copies = f"{item.count} x " if item.count > 1 else ""
                place(item.name, item.total_bytes, item.align, f"{copies}buffer {item.nbytes} B")
            elif not isinstance(item, (Pipeline, Barrier)):
                raise LayoutError(f"SharedLayout: items[{i}]={item!r} is not a Pipeline, Barrier or Buffer")
        for item in self.items:
            if isinstance(item, Pipeline):
                place(f"{item.name}_full", 8 * item.stages, 8, f"{item.stages} full mbarriers")
                place(f"{item.name}_empty", 8 * item.stages, 8, f"{item.stages} empty mbarriers")
            elif isinstance(item, Barrier):
                place(item.name, 8, 8, f"mbarrier ({item.arrivals} arrivals, {item.tx_bytes} tx B)")
        self.total_bytes = offset
        self.align = max((p.align for p in self.placements), default=8)
        self.cluster, self._cluster_owner = self._planned_cluster()
        if self.total_bytes > self.limit:
            raise LayoutError(f"SharedLayout needs {self.total_bytes} B of shared memory, over the "
                              f"{self.limit} B per-block limit:\n{self.describe()}\n"
                              "Use fewer stages or smaller boxes")

    def _planned_cluster(self) -> tuple[tuple[int, int, int] | None, str | None]:
        """The cluster the pipelines were planned for and the first pipeline naming it; (None,
        None) when every pipeline keeps the default (1, 1, 1), which holds in any cluster."""
        planned: dict[tuple, str] = {}
        for item in self.items:
            if isinstance(item, Pipeline) and item.cluster != (1, 1, 1):
                planned.setdefault(item.cluster, item.name)
        if len(planned) > 1:
            (a, first), (b, second) = list(planned.items())[:2]
            raise LayoutError(f"SharedLayout: Pipeline {first!r} plans cluster={a} but Pipeline "
                              f"{second!r} plans cluster={b}; a launch has one cluster, so plan "
                              "both for the same one")
        return next(iter(planned.items()), (None, None))

    def check_launch(self, kernel: str, cluster: tuple[int, int, int], smem: int | None) -> None:
        """Refuse a launch this plan does not hold: a cluster other than the one its pipelines
        were planned for (their arrival counts and multicast masks count its CTAs), or an
        explicit ``smem`` below ``total_bytes``."""
        if self.cluster is not None and cluster != self.cluster:
            raise LaunchError(f"{kernel}: launched with cluster={cluster}, but its layout's Pipeline "
                              f"{self._cluster_owner!r} was planned for cluster={self.cluster} (its "
                              "arrival counts and multicast masks count those CTAs); launch with "
                              f"cluster={self.cluster} or plan the Pipeline with cluster={cluster}")
        if smem is not None and smem < self.total_bytes:
            raise LaunchError(f"{kernel}: smem={smem} B is below the {self.total_bytes} B its "
                              "layout places (layout.total_bytes); leave smem out (the layout's "
                              f"total is the default) or pass smem >= {self.total_bytes}")

    def offset(self, name: str) -> int:
        """The byte offset of a placed item (``'ab_tile0'``, ``'ab_full'``, a buffer or barrier name)."""
        for p in self.placements:
            if p.name == name:
                return p.offset
        raise LayoutError(f"SharedLayout has no item {name!r}")

    def check_device(self, device) -> None:
        """Raise LayoutError when ``total_bytes`` is over ``device``'s shared memory per block."""
        if self.total_bytes > device.max_smem_per_block:
            raise LayoutError(f"SharedLayout needs {self.total_bytes} B; {device.name} allows "
                              f"{device.max_smem_per_block} B per block")

    def describe(self) -> str:
        """A table of the placements: offset, size, alignment, name and what each holds."""
        rows = [f"  {p.offset:7d}  {p.nbytes:7d} B  align {p.align:5d}  {p.name}: {p.what}"
                for p in self.placements]
        return "\n".join(rows + [f"  total {self.total_bytes} B"])

    def __repr__(self) -> str:
        return f"SharedLayout({len(self.placements)} items, total_bytes={self.total_bytes})"

    def header(self) -> str:
        """C++ for ``#include "tmaflow_layout.cuh"``: ``tmaflow_layout::Smem`` accessors."""
        if self._header is None:
            self._header = self._render_header()
        return self._header

    def _render_header(self) -> str:
        L = ["// Generated by tmaflow.SharedLayout. Do not edit.", "#pragma once",
             "#include <tmaflow.cuh>", "namespace tmaflow_layout {",
             "using tmaflow::uint8_t; using tmaflow::uint16_t; using tmaflow::uint32_t; using tmaflow::uint64_t;",
             f"constexpr uint32_t total_bytes = {self.total_bytes};",
             f"constexpr uint32_t align = {self.align};"]
        for item in self.items:
            if isinstance(item, Pipeline):
                n = item.name
                L.append(f"namespace {n} {{")
                L.append(f"constexpr int stages = {item.stages};")
                L.append(f"constexpr uint32_t tx_bytes = {item.tx_bytes};")
                L.append(f"constexpr uint32_t full_arrivals = {item.full_arrivals};")
                L.append(f"constexpr uint32_t empty_arrivals = {item.empty_arrivals};")
                L.append(f"constexpr uint32_t consumers = {item.consumers};")
                L.append(f"constexpr uint32_t consumer_lanes = {item.consumer_lanes};")
                L.append(f"constexpr uint32_t cluster_x = {item.cluster[0]}, cluster_y = {item.cluster[1]};")
                for t, (tname, spec) in enumerate(zip(item.tile_names, item.tiles)):
                    L.append(f"constexpr uint32_t {tname}_bytes = {item.boxes[t] * spec.tx_bytes};")
                    L.append(f"constexpr uint32_t {tname}_stride = {item.stage_stride(t)};")
                    L.append(f"constexpr int {tname}_boxes = {item.boxes[t]};")
                    L.append(f"constexpr uint32_t {tname}_box_stride = {item.box_stride(t)};")
                    L.append(f"constexpr int {tname}_index = {t};")
                L.extend(_mask_functions(item))
                L.append(f"}}  // namespace {n}")
            elif isinstance(item, Barrier):
                L.append(f"namespace {item.name} {{ constexpr uint32_t arrivals = {item.arrivals}; "
                         f"constexpr uint32_t tx_bytes = {item.tx_bytes}; }}")
            elif isinstance(item, Buffer) and item.count > 1:
                L.append(f"namespace {item.name} {{ constexpr int count = {item.count}; "
                         f"constexpr uint32_t stride = {item.stride}; }}")
        L.append("struct Smem {")
        L.append("  uint8_t* base;")
        L.append("  TMAFLOW_DEVICE explicit Smem(void* p) : base(static_cast<uint8_t*>(p)) {}")
        for item in self.items:
            if isinstance(item, Pipeline):
                n = item.name
                for tname in item.tile_names:
                    L.append(f"  TMAFLOW_DEVICE void* {n}_{tname}(uint32_t stage, uint32_t box = 0) const {{ return base + "
                             f"{self.offset(f'{n}_{tname}')} + stage * {n}::{tname}_stride + box * {n}::{tname}_box_stride; }}")
                rank = "const uint32_t r = tmaflow::cluster::rank(); " if item.uses_cluster else ""
                masks = f"{n}::release_mask(r), {n}::peer_mask(r)" if item.uses_cluster else "0, 0"
                L.append(f"  TMAFLOW_DEVICE tmaflow::Pipeline<{item.stages}> {n}() const {{ {rank}return {{"
                         f"reinterpret_cast<uint64_t*>(base + {self.offset(f'{n}_full')}), "
                         f"reinterpret_cast<uint64_t*>(base + {self.offset(f'{n}_empty')}), "
                         f"{n}::tx_bytes, {n}::full_arrivals, {n}::empty_arrivals, {masks}, "
                         f"\"{n}.full\", \"{n}.empty\"}}; }}")
            elif isinstance(item, Barrier):
                L.append(f"  TMAFLOW_DEVICE tmaflow::Barrier {item.name}() const {{ return {{"
                         f"reinterpret_cast<uint64_t*>(base + {self.offset(item.name)}), "
                         f"{item.arrivals}, {item.tx_bytes}, \"{item.name}\"}}; }}")
            elif isinstance(item, Buffer) and item.count > 1:
                L.append(f"  TMAFLOW_DEVICE void* {item.name}(uint32_t i) const {{ return base + "
                         f"{self.offset(item.name)} + i * {item.name}::stride; }}")
            elif isinstance(item, Buffer):
                L.append(f"  TMAFLOW_DEVICE void* {item.name}() const {{ return base + {self.offset(item.name)}; }}")
        L.append("};")
        L.append("}  // namespace tmaflow_layout")
        return "\n".join(L) + "\n"


def _mask_functions(pipe: Pipeline) -> list[str]:
    """Device functions giving each tile's multicast group (a CTA bit mask) from the cluster
    rank, computed rather than looked up so no local array lands on the stack."""
    cx, cy, _ = pipe.cluster
    L = []
    for t, tname in enumerate(pipe.tile_names):
        axis = pipe.multicast[t] if pipe.multicast else None
        if axis == "x":
            expr = f"((1u << {cx}) - 1u) << ((rank / {cx}) % {cy} * {cx})"
        elif axis == "y":
            column = sum(1 << (j * cx) for j in range(cy))
            expr = f"{column}u << (rank % {cx})"
        else:
            expr = "1u << rank"
        L.append(f"// CTAs that receive {tname} together with CTA `rank`; the lowest issues it"
                 " whole, or each issues its slice.")
        L.append(f"TMAFLOW_DEVICE uint16_t {tname}_mask(uint32_t rank) {{ return uint16_t({expr}); }}")
        L.append(f"TMAFLOW_DEVICE bool {tname}_leader(uint32_t rank) {{ uint32_t m = {tname}_mask(rank); "
                 "return (m & (~m + 1u)) == (1u << rank); }")
        L.append(f"TMAFLOW_DEVICE uint32_t {tname}_group_size(uint32_t rank) {{ return __popc({tname}_mask(rank)); }}")
        L.append(f"// Position of CTA `rank` within its {tname} group (0 for the leader).")
        L.append(f"TMAFLOW_DEVICE uint32_t {tname}_slice(uint32_t rank) {{ "
                 f"return __popc({tname}_mask(rank) & ((1u << rank) - 1u)); }}")
    if pipe.uses_cluster:
        ors = " | ".join(f"{tname}_mask(rank)" for tname in pipe.tile_names)
        L.append(f"TMAFLOW_DEVICE uint32_t release_mask(uint32_t rank) {{ return {ors}; }}")
        L.append("// The other CTAs of the release mask (they count one arrival per consumer).")
        L.append("TMAFLOW_DEVICE uint32_t peer_mask(uint32_t rank) { return release_mask(rank) & ~(1u << rank); }")
    else:
        L.append("TMAFLOW_DEVICE uint32_t release_mask(uint32_t) { return 0; }")
        L.append("TMAFLOW_DEVICE uint32_t peer_mask(uint32_t) { return 0; }")
    return L
