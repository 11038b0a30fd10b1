"""bf16 GEMM written with tmaflow: C = A @ B^T ("nt") or A @ B ("nn"), fp32 accumulation.

The kernel (gemm.cu) is planned here: tensor-map specs for the three operands, the shared
memory layout (a ``Pipeline`` of A and B boxes, B multicast within the cluster, and an
epilogue buffer), and a persistent grid sized by how many clusters the device runs at once.
"""
from __future__ import annotations

import functools
import math
import numbers
import threading
from types import SimpleNamespace as _GemmState  # a prepared state's fields
from dataclasses import dataclass, replace
from threading import get_ident

from .. import driver
from ..device import current_device, current_ordinal
from ..dtypes import as_dtype
from ..checks import as_bool, as_choice, as_int, as_optional_int
from ..errors import TmaflowError
from ..graph import capturing
from ..launch import resolve_stream
from ..layout import HOPPER_SMEM_LIMIT, Buffer, Pipeline, SharedLayout
from ..memory import DeviceArray, arg_kind, as_array, empty
from ..tensormap import MapTemplate, TensorMapSpec
from .entry import (STATES, cached_state, entry_point, given_output, new_output,
                    on_current_device, output_strides)
from . import checks, edge
from .checks import L2_PROMOTIONS, int_in, settle
from .registry import get_kernel

BM, BK = 128, 64
FP8_BK = 128  # fp8 k-blocks: 128-byte rows, as bf16's 64
BF16 = as_dtype("bfloat16")  # every product's output
LAYOUTS = ("nt", "nn")
_BARRIER_RESERVE = 256  # full/empty mbarriers after the tiles
SCALE_STRIDE = BM + 4  # fp32 block scales per stage: A's BM rows, then B's, padded to 16 B
# How A's block scales reach shared memory, by their layout (the value: the kernel's SCALES_TMA).
# "row_major" (M, KB): a producer warp gathers a stage's BM scales 4 bytes apart with cp.async
# (a TMA box would be 16 bytes wide, 4 k-blocks, and run no faster on H200). "m_major" (M, KB)
# stored k-block by k-block (DeepGEMM's and cuBLAS's layout): one TMA box of BM scales.
SCALE_MODES = {"row_major": 0, "m_major": 1}


@dataclass(frozen=True)
class GemmConfig:
    """Tile and schedule choices. ``stages=None`` takes as many as shared memory holds."""

    bn: int = 256            # tile columns (tile rows are 128: two consumer warpgroups of 64)
    cluster_m: int = 2       # CTAs per cluster, on consecutive M tiles sharing B by multicast
    epi_cols: int = 128      # epilogue columns per round (its buffer is 2 x 64 x epi_cols bf16)
    group_m: int = 16        # M tiles per band of the grouped (L2-friendly) tile order
    stages: int | None = None
    split_k: int = 1         # work items per tile along K; the last sums their fp32 partials
    l2_promotion: str = "256B"  # of the A and B loads: L2 fetches whole 256 B from DRAM
    promote: int = 4         # fp8: k-blocks (of 128) the tensor cores sum before fp32 registers do (0: never)
    split_tail: bool = False  # split a last, partly idle wave's tiles along K (``tail_splits``)

    def __post_init__(self):
        who = "GemmConfig"
        settle(self, bn=int_in(f"{who}: bn", self.bn, (64, 128, 192, 256)),
               cluster_m=int_in(f"{who}: cluster_m", self.cluster_m, (1, 2)),
               epi_cols=as_int(f"{who}: epi_cols", self.epi_cols, 64, 256),
               group_m=as_int(f"{who}: group_m", self.group_m, 1, 1 << 16),
               stages=as_optional_int(f"{who}: stages", self.stages, 2, 16),
               split_k=as_int(f"{who}: split_k", self.split_k, 1, 64),
               l2_promotion=as_choice(f"{who}: l2_promotion", self.l2_promotion, L2_PROMOTIONS),
               promote=as_int(f"{who}: promote", self.promote, 0, 64),
               split_tail=as_bool(f"{who}: split_tail", self.split_tail))
        if self.epi_cols % 64 or self.bn % self.epi_cols:
            raise TmaflowError(f"GemmConfig: epi_cols={self.epi_cols} must be a multiple of 64 "
                               f"dividing bn={self.bn}")
        if self.group_m % self.cluster_m:
            raise TmaflowError(f"GemmConfig: group_m={self.group_m} must be a multiple of "
                               f"cluster_m={self.cluster_m}")
        if self.split_tail and self.split_k > 1:
            raise TmaflowError(f"GemmConfig: split_tail=True splits only the last wave's tiles; it "
                               f"takes split_k=1 (got split_k={self.split_k})")


SKINNY_MP = (8, 16, 32, 64, 128)  # the wgmma N a skinny product's M is rounded up to
SKINNY_M = 128  # products of at most this many rows ("nt") take the skinny path by default
SKINNY_FP8_PROMOTE = 4  # fp8 on the skinny path: k-blocks of 128 the tensor cores sum before fp32 registers do
# fp8 on the skinny path splits K only into splits of at least 32 k-blocks (H200: 16x/64x4096x4096
# in 2 splits of 16, 0.96x / 0.87x _scaled_mm; unsplit, 1.02x / 0.93x)
_SKINNY_FP8_MIN_K_BLOCKS = 32


@dataclass(frozen=True)
class SkinnyConfig:
    """The skinny path (``layout="nt"``, M <= 128, bf16 or fp8 with per-tensor scales or block
    scales whose scale_a is M-major): operands swapped so B's rows fill the MMA's 64 rows
    (gemm_skinny_bf16 in skinny.cu). ``rows`` of B per CTA (64 per consumer warpgroup);
    ``split_k=None`` picks enough K splits to fill the GPU; ``cluster=2`` pairs neighbouring
    tiles, which share A by multicast."""

    rows: int = 64  # H200: 64-row CTAs beat 128 on 11 of the 12 decode shapes of BENCHMARKS.md
    split_k: int | None = None
    stages: int | None = None
    l2_promotion: str = "256B"
    cluster: int = 1

    def __post_init__(self):
        who = "SkinnyConfig"
        settle(self, rows=int_in(f"{who}: rows", self.rows, (64, 128)),
               split_k=as_optional_int(f"{who}: split_k", self.split_k, 1, 64),
               stages=as_optional_int(f"{who}: stages", self.stages, 2, 16),
               l2_promotion=as_choice(f"{who}: l2_promotion", self.l2_promotion, L2_PROMOTIONS),
               cluster=int_in(f"{who}: cluster", self.cluster, (1, 2)))


def skinny_splits(n: int, k: int, rows: int, sm_count: int, bk: int = BK, min_k_blocks: int = 4) -> int:
    """K splits that bring (N tiles x splits) CTAs closest to one per SM without a second
    wave, each split keeping at least ``min_k_blocks`` k-blocks (of ``bk``: 64 bf16, 128 fp8)."""
    tiles, k_blocks = math.ceil(n / rows), math.ceil(k / bk)
    split = max(1, min(sm_count // tiles, k_blocks // min_k_blocks, 64))
    return _nonempty_splits(k_blocks, split)


def choose_config(m: int, n: int, k: int, sm_count: int, layout: str = "nt",
                  dtype: str = "bfloat16") -> GemmConfig | SkinnyConfig:
    """The skinny path for "nt" products of at most SKINNY_M rows, bf16 or fp8 (H200, fp8 decode
    shapes: median 0.97-0.99x _scaled_mm against 0.75x in dense tiles). Otherwise
    ``dense_config``: the tile width whose whole waves take least time, wide tiles in clusters
    of two from two waves on, K split among several CTAs when the tiles leave most SMs idle and
    K is long. fp8: ``fp8_config``. (Block scales take ``block_scale_config``.)"""
    if layout == "nt" and m <= SKINNY_M:
        return SkinnyConfig()
    if dtype == "float8_e4m3fn":
        return fp8_config(m, n, k, sm_count)
    return dense_config(m, n, k, sm_count)


# fp8 promoted every 4 k-blocks, relative speed of a tile's math (H200, full waves)
_FP8_TILE_SPEED = {192: 1.0, 128: 0.88}


def fp8_config(m: int, n: int, k: int, sm_count: int) -> GemmConfig:
    """Promoted every 4 k-blocks of 128, in 128 x 192 or 128 x 128 tiles, whichever take least
    time in whole waves (each promotion of a 192-column tile covers 1.5x the math: H200, 8192^3
    1.01x _scaled_mm against 0.89x for 128 x 128; 4096x2112x7168, 3 waves of 192 columns 1.01x
    against 5 of 128 columns 0.86x). 192-column tiles run in clusters of two from four waves
    on (8192^3: 1.000-1.003x against 0.991-0.993x unclustered; 4096x2112x7168, 3 waves, 0.4%
    faster unclustered), 128-column ones when there are two M tiles; K split as the bf16 tiles
    are. 192-column tiles split a last, partial wave along K where that pays (``tail_splits``;
    4096x7168x16384, 9.2 waves: 1.031x against 0.997x _scaled_mm; 128-column tiles and the bf16
    ones measured slower with their tails split)."""
    tiles_m = math.ceil(m / BM)
    if _cheapest_width(tiles_m, n, sm_count, _FP8_TILE_SPEED) == 192:
        wide = tiles_m > 1 and tiles_m * math.ceil(n / 192) >= 4 * sm_count
        cm = 2 if wide else 1
        # the clusters a persistent grid holds, one CTA an SM (the launch uses the occupancy API)
        items = math.ceil(tiles_m / cm) * math.ceil(n / 192)
        split_tail = tail_splits(items, sm_count // cm, math.ceil(k / FP8_BK)) > 1
        return GemmConfig(bn=192, cluster_m=cm, epi_cols=64, split_tail=split_tail)
    tiles, k_blocks = tiles_m * math.ceil(n / 128), math.ceil(k / FP8_BK)
    return GemmConfig(bn=128, cluster_m=2 if m > BM else 1, split_k=_filling_splits(tiles, k_blocks, sm_count))


def block_scale_config(m: int, n: int, k: int, sm_count: int) -> GemmConfig:
    """Block scales: 128 x 128 tiles (B's scales cover 128 x 128) promoted every k-block, in
    clusters of two sharing B when there are two M tiles (H200, M-major scales: 1257 against
    1201 TFLOP/s unclustered at 4096x7168x16384, 1221 against 1157 at 8192^3), with 64-column
    epilogue rounds (room for a sixth stage beside the scales); K split as the bf16 tiles are."""
    tiles, k_blocks = math.ceil(m / BM) * math.ceil(n / 128), math.ceil(k / FP8_BK)
    return GemmConfig(bn=128, cluster_m=2 if m > BM else 1, epi_cols=64, promote=1,
                      split_k=_filling_splits(tiles, k_blocks, sm_count))


# Relative speed of a tile's math (H200, full waves): 128 x 256 tiles read 20% less shared
# memory per MMA than 128 x 128 ones; 128 x 192 ones lie between; 128 x 64 ones (cuBLAS's at
# 1024^3) read A once per 64 columns.
_TILE_SPEED = {256: 1.0, 192: 0.98, 128: 0.96, 64: 0.85}


def dense_config(m: int, n: int, k: int, sm_count: int) -> GemmConfig:
    """The dense kernel's tiles for this shape (``choose_config`` without the skinny path): the
    width (64, 128, 192 or 256 columns) whose whole waves of tiles take least time (a last wave
    a fifth full costs a whole wave: H200, 3072^3, 128 x 256 tiles in 3 waves 0.75x cuBLAS,
    128 x 128 ones in 5 waves 0.87x, 128 x 192 ones in 3 nearly full waves 0.97x). Wide tiles
    go in clusters of two sharing B when there are two waves or more (in one wave, unclustered
    ran faster: 2048^3, 24.0 against 25.0 us)."""
    tiles_m = math.ceil(m / BM)
    # 64-column tiles only with two M tiles or more (one M tile is the split-K path's, measured
    # with 128 columns)
    widths = [w for w in _TILE_SPEED if w != 64 or tiles_m > 1]
    bn = _cheapest_width(tiles_m, n, sm_count, _TILE_SPEED, widths)
    tiles = tiles_m * math.ceil(n / bn)
    cluster_m = 2 if bn == 256 and tiles_m > 1 and tiles > sm_count else 1
    # 64-column epilogue rounds for 64, 192 and unclustered 256-column tiles (H200, 2048^3: 23.67
    # against 23.89 us; K = 64: 4.90 against 5.06 us); clustered 256-column tiles keep 128
    # (8192^3: 1.024x against 1.052x cuBLAS)
    epi_cols = 128 if bn == 128 or (bn == 256 and cluster_m == 2) else 64
    return GemmConfig(bn=bn, cluster_m=cluster_m, epi_cols=epi_cols,
                      split_k=_filling_splits(tiles, math.ceil(k / BK), sm_count))


def _cheapest_width(tiles_m: int, n: int, sm_count: int, speed: dict, widths=None) -> int:
    """The tile width (of ``widths``, default every key of ``speed``) whose whole waves of
    tiles cost least: waves x the math of one tile / its relative speed; ties go to the wider."""
    def cost(bn):
        return math.ceil(tiles_m * math.ceil(n / bn) / sm_count) * bn / speed[bn]

    return min(widths or speed, key=lambda width: (cost(width), -width))


def _filling_splits(tiles: int, k_blocks: int, sm_count: int) -> int:
    """K splits for products whose tiles leave most SMs idle and whose K is long: enough to
    fill the GPU, at most 4 (on H200, 8 and 16 splits ran slower than 2-4 for every skinny
    shape measured), each of at least 16 k-blocks (with 8, the partials' round trip cost more
    than the SMs gained: 1024^3 in 2 splits 13.6 us, in 1 split 7.6 us); 1 otherwise."""
    split = 1
    if 2 * tiles <= sm_count and k_blocks >= 32:
        split = max(1, min(4, sm_count // max(tiles, 1), k_blocks // 16))
    return _nonempty_splits(k_blocks, split)


def _nonempty_splits(k_blocks: int, split: int) -> int:
    """The split count actually used: ceil(k_blocks / per) with per = ceil(k_blocks / split),
    so that no split is empty."""
    per = math.ceil(k_blocks / split)
    return math.ceil(k_blocks / per)


_TAIL_MIN_K_BLOCKS = 4  # k-blocks a tail part keeps at least
# k-blocks' time a part's fp32 partial round trip costs: its store and fence, and the last
# part's ordered reload (H200, 3072^3 bf16 in 128 x 128 tiles: a tail in 5 parts cost about
# 16 us more than its k-blocks, about 9 k-blocks a part; rounded up, as bf16 tails measured slower)
_TAIL_PART_COST = 12
_TAIL_WORTH = 0.9  # split the tail only if its parts take at most this much of a tile's time


def tail_splits(items: int, clusters: int, k_blocks: int) -> int:
    """K splits for the tail: the cluster items past the last whole wave of ``clusters``
    (gemm.cu's SPLIT_TAIL). The split (2-8 parts, each of at least 4 k-blocks) whose rounds of
    parts take least time, each part costing 12 k-blocks more for its partial's round trip, if
    that is under 0.9 of the whole wave the tail would take; 1 (no tail) otherwise, and when the
    items fill whole waves or do not fill one."""
    tail = items % clusters if items > clusters else 0
    best, best_cost = 1, _TAIL_WORTH
    for split in range(2, 9):
        if k_blocks < split * _TAIL_MIN_K_BLOCKS:
            break
        split = _nonempty_splits(k_blocks, split)
        cost = math.ceil(tail * split / clusters) * (math.ceil(k_blocks / split) + _TAIL_PART_COST) / k_blocks
        if tail and cost < best_cost:
            best, best_cost = split, cost
    return best


def _m_major_scales_spec(m: int, k: int, bk: int, rows: int) -> TensorMapSpec:
    """The map of an M-major scale_a seen as (KB, M): a row holds one k-block's scales, a box
    ``rows`` of them; the pitch is padded to 4 rows here (the binding takes the real one)."""
    return TensorMapSpec.tiled("float32", (math.ceil(k / bk), m), (1, rows), strides=(16 * -(-m // 4), 4))


@dataclass(frozen=True)
class GemmPlan:
    spec_a: TensorMapSpec
    spec_b: TensorMapSpec      # one B box; a stage holds ``b_boxes`` of them
    spec_c: TensorMapSpec      # one 64 x 64 epilogue box
    layout: SharedLayout
    defines: dict
    config: GemmConfig
    spec_s: TensorMapSpec | None = None  # one stage's box of A's block scales (their TMA modes)


@functools.lru_cache(maxsize=64)  # plans are pure: build each once
def gemm_plan(m: int, n: int, k: int, layout: str = "nt", config: GemmConfig = GemmConfig(),
              dtype: str = "bfloat16", block_scales: str | None = None) -> GemmPlan:
    """Specs, shared-memory layout and compile-time defines for an (m x k) @ B product of
    bfloat16 or float8_e4m3fn operands. ``block_scales`` (one of ``SCALE_MODES``): each stage
    also holds its k-block's scales of A's BM rows, loaded by the TMA or gathered by a warp."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise TmaflowError(f"gemm: layout={layout!r} must be one of {LAYOUTS}")
    fp8 = dtype == "float8_e4m3fn"
    if fp8 and layout != "nt":
        raise TmaflowError(f"gemm: fp8 operands take layout 'nt' (got {layout!r}): the tensor cores "
                           "read fp8 K-major only; pass b as (N, K)")
    if fp8 and config.promote and config.bn == 256:
        raise TmaflowError(f"gemm: fp8 with promote={config.promote} needs bn=128 or 192 (got bn={config.bn}): "
                           "promotion keeps a second set of accumulators; use promote=0 for bn=256")
    if fp8 and config.bn == 64:
        raise TmaflowError("gemm: fp8 tiles are 128, 192 or 256 columns (got bn=64)")
    if block_scales is not None and block_scales not in SCALE_MODES:
        raise TmaflowError(f"gemm: block_scales={block_scales!r} must be None or one of {tuple(SCALE_MODES)}")
    if block_scales and not (fp8 and config.promote == 1 and config.bn == 128):
        raise TmaflowError(f"gemm: block scales are applied at every k-block: fp8 operands with bn=128 "
                           f"and promote=1 (got {dtype}, bn={config.bn}, promote={config.promote})")
    bn, cm, bk = config.bn, config.cluster_m, FP8_BK if fp8 else BK
    l2 = {"swizzle": "128B", "l2_promotion": config.l2_promotion}
    spec_a = TensorMapSpec.tiled(dtype, (m, k), (BM, bk), **l2)
    if layout == "nt":  # B is n x k: bn rows of 128 B, split in row slices among the cluster
        spec_b = TensorMapSpec.tiled(dtype, (n, k), (bn // cm, bk), **l2)
        b_boxes = cm
    else:               # B is k x n: boxes of 64 k-rows x 64 columns (128 B), bn / 64 of them
        spec_b = TensorMapSpec.tiled(dtype, (k, n), (BK, 64), **l2)
        b_boxes = bn // 64
    spec_c = TensorMapSpec.tiled("bfloat16", (m, n), (64, 64), swizzle="128B")
    epilogue = Buffer("c", 2 * 64 * config.epi_cols * 2, align=1024)
    spec_s = _m_major_scales_spec(m, k, bk, BM) if block_scales == "m_major" else None
    scale_bytes = SCALE_STRIDE * 4 if block_scales == "row_major" else 0
    stage_bytes = (spec_a.smem_bytes + b_boxes * spec_b.smem_bytes + scale_bytes +
                   (spec_s.smem_bytes if spec_s else 0))
    stages = config.stages or min(8, (HOPPER_SMEM_LIMIT - epilogue.nbytes - _BARRIER_RESERVE) // stage_bytes)
    # consumers: one arrival per consumer warp (2 warpgroups x 4 warps) per release.
    # producers: the TMA thread, and with gathered block scales the 32 lanes gathering them.
    tiles = {"a": spec_a, "b": (spec_b, b_boxes), **({"s": spec_s} if spec_s else {})}
    pipe = Pipeline("ab", stages=stages, tiles=tiles, consumers=8, cluster=(cm, 1, 1),
                    multicast=[None, "x"] + [None] * bool(spec_s) if cm > 1 else None,
                    producers=33 if block_scales == "row_major" else 1)
    extra = [Buffer("scales", stages * scale_bytes, align=16)] if scale_bytes else []
    smem = SharedLayout([pipe, epilogue, *extra])
    split = _nonempty_splits(math.ceil(k / bk), config.split_k)
    defines = {"BN": bn, "EPI_COLS": config.epi_cols, "B_N_MAJOR": int(layout == "nn"),
               "CLUSTER_M": cm, "GROUP_M": config.group_m, "SPLIT_K": int(split > 1),
               "SPLIT_TAIL": int(config.split_tail)}
    if fp8:
        defines.update(FP8=1, PROMOTE=config.promote)
    if block_scales:
        defines.update(BLOCK_SCALES=1, SCALES_TMA=SCALE_MODES[block_scales])
    return GemmPlan(spec_a, spec_b, spec_c, smem, defines, replace(config, stages=stages, split_k=split),
                    spec_s)


@dataclass(frozen=True)
class SkinnyPlan:
    spec_x: TensorMapSpec      # one MP x 64 box of A (the activations)
    spec_w: TensorMapSpec      # one 64 x 64 box of B (the weights); a stage holds rows / 64
    layout: SharedLayout
    defines: dict
    config: SkinnyConfig       # with split_k and stages filled in
    spec_s: TensorMapSpec | None = None  # block scales: one k-block's MP scales of A (M-major)


@functools.lru_cache(maxsize=64)
def skinny_plan(m: int, n: int, k: int, config: SkinnyConfig, sm_count: int,
                dtype: str = "bfloat16", block_scales: str | None = None) -> SkinnyPlan:
    """The skinny kernel's specs, layout and defines for bfloat16 or float8_e4m3fn operands
    (fp8: k-blocks of 128, promoted every ``SKINNY_FP8_PROMOTE``). ``block_scales="m_major"``:
    fp8 promoted every k-block with DeepSeek's block scales, A's loaded by the TMA with each
    stage (row-major ones take the dense kernel)."""
    if m > SKINNY_MP[-1]:
        raise TmaflowError(f"gemm: the skinny path takes M <= {SKINNY_MP[-1]} (got M={m}); use a GemmConfig")
    if dtype not in ("bfloat16", "float8_e4m3fn"):
        raise TmaflowError(f"gemm: the skinny path takes bfloat16 or float8_e4m3fn operands (got {dtype})")
    if block_scales not in (None, "m_major") or block_scales and dtype != "float8_e4m3fn":
        raise TmaflowError(f"gemm: the skinny path takes fp8 block scales with scale_a M-major (stored "
                           f"k-block by k-block; got {block_scales!r} scales, {dtype} operands); row-major "
                           "scale_a takes a GemmConfig (bn=128, promote=1)")
    fp8 = dtype == "float8_e4m3fn"
    mp = next(p for p in SKINNY_MP if p >= m)
    boxes = config.rows // 64
    bk = FP8_BK if fp8 else BK  # 128-byte rows either way
    l2 = {"swizzle": "128B", "l2_promotion": config.l2_promotion}
    spec_x = TensorMapSpec.tiled(dtype, (m, k), (mp, bk), **l2)
    spec_w = TensorMapSpec.tiled(dtype, (n, k), (64, bk), **l2)
    spec_s = _m_major_scales_spec(m, k, bk, mp) if block_scales else None
    stage_bytes = spec_x.smem_bytes + boxes * spec_w.smem_bytes + (spec_s.smem_bytes if spec_s else 0)
    stages = config.stages or min(16, (HOPPER_SMEM_LIMIT - _BARRIER_RESERVE) // stage_bytes)
    cl = config.cluster
    tiles = {"w": (spec_w, boxes), "x": spec_x, **({"s": spec_s} if spec_s else {})}
    pipe = Pipeline("wx", stages=stages, tiles=tiles, consumers=4 * boxes, cluster=(cl, 1, 1),
                    multicast=[None, "x"] + [None] * bool(spec_s) if cl > 1 else None)
    min_k_blocks = _SKINNY_FP8_MIN_K_BLOCKS if fp8 else 4
    split = config.split_k or skinny_splits(n, k, config.rows, sm_count, bk, min_k_blocks)
    split = _nonempty_splits(math.ceil(k / bk), split)
    defines = {"MP": mp, "CONSUMERS": boxes, "CLUSTER": cl}
    if fp8:
        defines.update(FP8=1, PROMOTE=1 if block_scales else SKINNY_FP8_PROMOTE)
    if block_scales:
        # two accumulator sets, one promoted while the next k-block's wgmmas run, where they fit
        # (H200, against one set: 1.06x at M = 16, 1.09x at 64, 1.13-1.24x at 128)
        defines.update(BLOCK_SCALES=1, BLOCK_SCALE_SETS=2 if boxes == 1 or mp <= 64 else 1)
    return SkinnyPlan(spec_x, spec_w, SharedLayout([pipe]), defines, replace(config, split_k=split, stages=stages),
                      spec_s)


def _check_operands(A, B, layout: str):
    for name, arr in (("a", A), ("b", B)):
        if arr.ndim != 2:
            raise TmaflowError(f"gemm: {name} must be 2-D (got shape {arr.shape})")
        if arr.dtype.name not in ("bfloat16", "float8_e4m3fn"):
            raise TmaflowError(f"gemm: {name} must be bfloat16 or float8_e4m3fn (got {arr.dtype.name})")
    if A.dtype is not B.dtype:
        raise TmaflowError(f"gemm: a is {A.dtype.name} but b is {B.dtype.name}; both must be one type")
    m, k = A.shape
    if layout == "nt":
        n, kb = B.shape
        want = "(N, K) for layout 'nt' (C = A @ B.T)"
    else:
        kb, n = B.shape
        want = "(K, N) for layout 'nn' (C = A @ B)"
    if kb != k:
        raise TmaflowError(f"gemm: a is {A.shape} (M, K) but b is {B.shape}; b must be {want}")
    return m, n, k


def _check_rows(name: str, arr) -> None:
    if name == "out" and arr.shape[1] % 8:
        raise TmaflowError(
            f"gemm: out has {arr.shape[1]} columns; TMA stores write whole 16-byte chunks, so a "
            "row that is not a multiple of 8 bf16 would spill into the next columns. Use an out "
            "with a multiple of 8 columns and slice the result")
    item = arr.dtype.itemsize
    if arr.strides[1] != item or arr.strides[0] % 16:
        raise TmaflowError(
            f"gemm: {name} has strides {arr.strides} B; rows must be contiguous and start "
            f"16-byte aligned (TMA row pitch rule: a multiple of 16 B, i.e. {16 // item} "
            f"{arr.dtype.name}). Pad the leading dimension to a multiple of {16 // item} or copy "
            "to a contiguous array")


def _template(arr, spec: TensorMapSpec, access: str = "load") -> MapTemplate:
    """Maps of ``arr``'s shape and row pitch with the box, swizzle and L2 promotion the plan
    chose (the plan's specs assume contiguous rows; the array's real pitch is used)."""
    return MapTemplate(TensorMapSpec.tiled(arr.dtype, arr.shape, spec.box, strides=arr.strides,
                                           swizzle=spec.swizzle, l2_promotion=spec.l2_promotion),
                       access)


@entry_point
def gemm(a, b, out=None, *, layout: str = "nt", config: GemmConfig | None = None, stream=None,
         pdl: bool = False, debug: bool | None = None, trace: bool = False,
         scale_a: float | None = None, scale_b: float | None = None):
    """C = A @ B^T (``layout="nt"``: A is M x K, B is N x K) or C = A @ B (``"nn"``: B is K x N)
    for bfloat16 tmaflow, torch or cupy arrays; fp32 accumulation, bfloat16 ``out`` (M x N,
    allocated of the caller's kind when None). ``gemm.prepare(...)`` returns the launch ready
    to repeat.

    fp8: a and b float8_e4m3fn ("nt" only), C = scale_a * scale_b * A @ B^T with per-tensor
    scales (the dequantisation factors, floats), accumulated in fp32 with the tensor cores'
    partial sums promoted every ``config.promote`` k-blocks of 128. Block scales instead:
    scale_a an (M, ceil(K/128)) and scale_b an (ceil(N/128), ceil(K/128)) float32 device
    array, applied as each k-block is promoted (DeepSeek's 1 x 128 / 128 x 128 scaling);
    scale_a row-major, or stored k-block by k-block (strides (1, P), P >= M a multiple of 4:
    the layout DeepGEMM and cuBLAS take), which the TMA loads fastest; other layouts are
    copied into that one first.
    Any M, N, K and element strides: operands the TMA cannot address as given (rows that are
    not 16-byte multiples, misaligned or element-strided views) are staged into aligned
    scratch, K zero-padded, and a staged output's valid columns copied out (``edge.py``).
    Products on "nt" with M <= 128 (bf16, or fp8 with per-tensor scales or block scales whose
    scale_a is M-major) take the skinny path unless a GemmConfig is given."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise TmaflowError(f"gemm: layout={layout!r} must be one of {LAYOUTS}")
    if config is not None and not isinstance(config, (GemmConfig, SkinnyConfig)):
        raise TmaflowError(f"gemm: config={config!r} must be a kernels.GemmConfig or kernels.SkinnyConfig")
    if isinstance(config, SkinnyConfig) and layout != "nt":
        raise TmaflowError(f"gemm: a SkinnyConfig takes layout='nt' (got {layout!r})")
    pdl, debug, trace = _LAUNCH_OPTIONS(pdl, debug, trace)
    A, B = as_array(a), as_array(b)
    m, n, k = _check_operands(A, B, layout)
    scale, blocks, mode = _scales(A, B, scale_a, scale_b)
    if blocks is not None and isinstance(config, GemmConfig) and (config.bn != 128 or config.promote != 1):
        raise TmaflowError(f"gemm: block scales are applied at every k-block: config must be a "
                           f"GemmConfig with bn=128 and promote=1, or a SkinnyConfig (got {config!r})")
    C = None
    if out is not None:
        C = given_output("gemm", out, (m, n), BF16)
        checks.no_aliasing("gemm", C, (("a", A), ("b", B), *zip(("scale_a", "scale_b"), blocks or ())))
    ordinal = current_ordinal()
    stream = resolve_stream(stream, (A, B, C), ordinal)
    if m == 0 or n == 0 or k == 0:
        return _empty_product(a, A, out, C, (m, n), k, stream, BF16)
    if not edge.gemm_takes_tma(A, B, C, n, mode):
        return edge.gemm(gemm.__wrapped__, a, A, B, out, C, layout=layout, scale_a=scale_a,
                         scale_b=scale_b, scale_mode=mode, options=dict(
                             config=config, stream=stream, pdl=pdl, debug=debug, trace=trace))
    key = ("gemm", A.dtype, A.shape, A.strides, B.shape, B.strides, C and C.strides, layout, config,
           stream, pdl, A.device, ordinal, debug, trace, get_ident(),
           blocks and blocks[0].strides)  # scale_a's strides decide its mode
    try:
        st = STATES[key]
    except (KeyError, TypeError):
        c_strides = output_strides(C, (m, n), 2)
        st = cached_state(key, lambda: _gemm_state(A, B, c_strides, m, n, k, layout, config,
                                                   stream, pdl, debug, trace, mode,
                                                   blocks and _scale_map_view(blocks[0], mode)))
    result, C = (out, C) if C is not None else new_output(a, A, (m, n), BF16, stream)
    if st.tc is None:  # the skinny kernel writes C through its pointer; A's block scales come by map only
        args = (st.ta.bind(A), st.tb.bind(B), C, st.ldc, *_split_k_buffers(st), *st.tail, scale,
                blocks[1] if blocks else 0)
    else:
        args = (st.ta.bind(A), st.tb.bind(B), st.tc.bind(C), *_split_k_buffers(st), *st.tail, scale,
                *(blocks or (0, 0)))
    if st.ts is not None:
        args += (st.ts.bind(_scale_map_view(blocks[0], mode)),)
    return st.launcher, args, result


_LAUNCH_OPTIONS = checks.Options("gemm", pdl=checks.flag(), debug=checks.DEBUG, trace=checks.TRACE)
_GROUPED_OPTIONS = checks.Options("grouped_gemm", pdl=checks.flag(), debug=checks.DEBUG, trace=checks.TRACE)


def _scale_map_view(scale_a, mode: str):
    """scale_a as the 2-D array its TMA map covers: (M, KB) row-major, or (KB, M) rows of one
    k-block for the M-major layout."""
    if mode == "m_major":
        return scale_a._as(scale_a.shape[::-1], scale_a.strides[::-1])
    return scale_a


def _scales(A, B, scale_a, scale_b) -> tuple:
    """(the epilogue's factor, block scales or None, their SCALE_MODES key or None). fp8
    operands take per-tensor scales (finite floats, 1 when None; their product scales the fp32
    sum) or block scales: scale_a an (M, ceil(K/128)) and scale_b a (ceil(N/128), ceil(K/128))
    float32 device array, applied at every k-block of 128. bf16 products take none."""
    if A.dtype.name != "float8_e4m3fn":
        if scale_a is not None or scale_b is not None:
            raise TmaflowError("gemm: scale_a / scale_b dequantise fp8 operands; a and b are "
                               f"{A.dtype.name} (scale the output instead)")
        return 1.0, None, None
    for name, value in (("scale_a", scale_a), ("scale_b", scale_b)):
        if value is not None and (isinstance(value, bool) or
                                  not (isinstance(value, numbers.Real) or arg_kind(value) == "array")):
            raise TmaflowError(f"gemm: {name}={value!r} must be a finite float > 0 (a per-tensor "
                               "dequantisation factor) or a float32 device array of block scales")
    if "array" in (arg_kind(scale_a), arg_kind(scale_b)):
        m, k = A.shape
        n, kb = B.shape[0], -(-k // FP8_BK)
        views = []
        for name, value, shape, what in (("scale_a", scale_a, (m, kb), "1 x 128 blocks of a"),
                                         ("scale_b", scale_b, (-(-n // 128), kb), "128 x 128 blocks of b")):
            arr = as_array(value) if value is not None else None
            if arr is None or arr.shape != shape or arr.dtype.name != "float32":
                got = "None" if arr is None else f"{arr.shape} {arr.dtype.name} strides {arr.strides} B"
                raise TmaflowError(f"gemm: block scales need both scale_a and scale_b as float32 device "
                                   f"arrays; {name} must be {shape} ({what}), got {got}")
            if not arr.alive:
                raise TmaflowError(f"gemm: {name} {arr!r} was freed")
            checks.same_device("gemm", name, arr, A)
            views.append(arr)
        sa, sb = views
        if not (_readable_scale_a(sa) and _row_major(sb)):  # other layouts are staged (edge.py)
            return 1.0, tuple(views), edge.STAGED
        return 1.0, tuple(views), "row_major" if _row_major(sa) else "m_major"
    return checks.tensor_scale("gemm", scale_a, scale_b), None, None


def _row_major(arr) -> bool:
    """A 2-D float32 array whose rows are contiguous and packed (a single row's stride is moot)."""
    return arr.strides[1] == 4 and (arr.shape[0] == 1 or arr.strides[0] == 4 * arr.shape[1])


def _m_major(arr) -> bool:
    """An (M, KB) float32 array stored k-block by k-block: strides (4, P) bytes, P >= 4 M."""
    return arr.ndim == 2 and arr.strides[0] == 4 and arr.strides[1] >= 4 * arr.shape[0]


def _readable_scale_a(arr) -> bool:
    """scale_a as the kernels read it: row-major (gathered), or M-major (one k-block's M scales,
    then the next one's) with the 16-byte pitch and base its TMA map needs."""
    return _row_major(arr) or _m_major(arr) and not (arr.ptr | arr.strides[1]) % 16


def _empty_product(a, A, out, C, shape: tuple, k: int, stream, dtype=None):
    """A product with no rows, columns or terms: nothing to launch, or zeros where a sum has
    no terms (written in order on the stream, at any strides of out)."""
    result, C = (out, C) if C is not None else new_output(a, A, shape, dtype, stream)
    return (*edge.empty_product(C, k, stream), result)


def _with_split_k(launcher, partials: bool, device, stream: int) -> tuple:
    """(launcher, workspace): where pieces of tiles meet in fp32 partials (split-K, split tails),
    the launch guarded by the workspace of the stream it launches on (resolved)."""
    if not partials:
        return launcher, None
    ws = _workspace(device, stream)
    return _SplitK(launcher, ws), ws


def _split_k_buffers(st) -> tuple:
    """(partials, counters) of a split-K state, fetched per call: a failed launch discards the
    workspace. (0, 0) without split-K."""
    if st.workspace is None:
        return 0, 0
    counters, partials = st.workspace.views(*st.workspace_sizes)
    return partials, counters


def _gemm_state(A, B, c_strides, m, n, k, layout, config, stream, pdl, debug,
                trace=False, block_scales=None, scale_view=None) -> _GemmState:
    _LAUNCH_OPTIONS.check(pdl, debug, trace)
    on_current_device("gemm", A)
    C = DeviceArray(0, (m, n), "bfloat16", c_strides)  # the layout the output will have
    for name, arr in (("a", A), ("b", B), ("out", C)):
        _check_rows(name, arr)
    device = current_device()
    dtype = A.dtype.name
    if config is None and block_scales:  # M-major scale_a can take the skinny path (row-major: gathered)
        skinny = block_scales == "m_major" and layout == "nt" and m <= SKINNY_M
        config = SkinnyConfig() if skinny else block_scale_config(m, n, k, device.sm_count)
    config = config or choose_config(m, n, k, device.sm_count, layout, dtype)
    if isinstance(config, SkinnyConfig):
        return _skinny_state(A, B, c_strides, m, n, k, config, device, stream, pdl, debug, trace,
                             block_scales, scale_view)
    plan = gemm_plan(m, n, k, layout, config, dtype, block_scales)
    kern = get_kernel("gemm_bf16", plan.layout, defines=plan.defines, file="gemm", debug=debug, trace=trace)
    cm, split = plan.config.cluster_m, plan.config.split_k
    # (cm M tiles, N tile) groups: one cluster's work item per K split
    tile_groups = math.ceil(math.ceil(m / BM) / cm) * math.ceil(n / plan.config.bn)
    clusters = max(1, min(tile_groups * split, _resident_clusters(kern, cm, device.ordinal)))
    launcher = kern.launcher(grid=cm * clusters, block=384, cluster=(cm, 1, 1), stream=stream,
                             pdl=pdl)
    sizes = (tile_groups * cm, split * m * n)
    if plan.config.split_tail:  # each tail tile's CTA owns a counter and a slot per part
        split = tail_splits(tile_groups, clusters, math.ceil(k / plan.spec_a.box[1]))  # k-blocks
        tail_items = tile_groups % clusters if split > 1 else 0
        sizes = (tail_items * cm, tail_items * cm * split * BM * plan.config.bn)
    launcher, ws = _with_split_k(launcher, split > 1, device, stream)
    tail = (m, n, k, split, 0, 0, 0)  # after the split-K buffers; not grouped
    return _GemmState(launcher=launcher, ta=_template(A, plan.spec_a), tb=_template(B, plan.spec_b),
                      tc=_template(C, plan.spec_c, "store"), tail=tail, plan=plan, workspace=ws,
                      workspace_sizes=sizes,
                      ts=_template(scale_view, plan.spec_s) if plan.spec_s else None)


def _skinny_state(A, B, c_strides, m, n, k, config, device, stream, pdl, debug, trace,
                  block_scales=None, scale_view=None) -> _GemmState:
    plan = skinny_plan(m, n, k, config, device.sm_count, A.dtype.name, block_scales)
    kern = get_kernel("gemm_skinny_bf16", plan.layout, defines=plan.defines, file="skinny",
                      debug=debug, trace=trace)
    rows, split, cl = plan.config.rows, plan.config.split_k, plan.config.cluster
    tiles = -(-math.ceil(n / rows) // cl) * cl  # whole clusters; a tile past N loads zeros, stores nothing
    launcher = kern.launcher(grid=(tiles, split), block=128 * (1 + rows // 64), cluster=(cl, 1, 1),
                             stream=stream, pdl=pdl)
    launcher, ws = _with_split_k(launcher, split > 1, device, stream)
    return _GemmState(launcher=launcher, ta=_template(A, plan.spec_x), tb=_template(B, plan.spec_w),
                      tc=None, ldc=c_strides[0] // 2, tail=(m, n, k, split), plan=plan, workspace=ws,
                      workspace_sizes=(tiles, split * n * plan.defines["MP"]),
                      ts=_template(scale_view, plan.spec_s) if plan.spec_s else None)


class _Workspace:
    """Split-K scratch for one (thread, device, stream): per-tile counters, zero between
    launches (each tile's last split resets its own), then the fp32 partial sums. Allocated,
    zeroed and freed in order on its stream, so a replaced buffer goes back to the pool only
    after the launches that used it."""

    def __init__(self, device, stream: int):
        self.device, self.stream, self.buf, self._views = device, stream, None, None
        self.counters = self.floats = 0

    def views(self, counters: int, floats: int):
        """(counters, partials) views holding at least the sizes asked for."""
        if self.buf is None or not self.buf.alive or counters > self.counters or floats > self.floats:
            self.counters = max(self.counters, -(-counters // 64) * 64, 4096)
            self.floats = max(self.floats, floats, 1 << 20)
            _refuse_foreign_capture(self.stream, "its split-K workspace")
            self.buf = _zeroed_now(empty((self.counters + self.floats,), "float32", self.device,
                                         stream=self.stream), self.stream)
            base = self.buf.ptr
            self._views = (
                DeviceArray(base, (self.counters,), "uint32", owner=self.buf, device=self.device),
                DeviceArray(base + 4 * self.counters, (self.floats,), "float32", owner=self.buf,
                            device=self.device))
        return self._views

    def discard(self) -> None:
        """After a failed launch (a watchdog abort, say) counters may be left mid-count."""
        self.buf = None


def _zeroed_now(buf: DeviceArray, stream: int) -> DeviceArray:
    """``buf`` zeroed before the first launch on ``stream`` reads it: in order on ``stream``, or
    while a tf.Graph captures, eagerly on the graph's allocation stream (a captured memset would
    leave the workspace dirty until the first replay; the capture waits for that stream)."""
    graph = capturing()
    driver.call("cuMemsetD8Async", buf.ptr, 0, buf.nbytes,
                stream if graph is None else graph.alloc_stream.handle)
    return buf


def _foreign_capture(stream: int) -> bool:
    """Is ``stream`` being captured into another library's graph (torch.cuda.graph)? Memory
    allocated on it there would become a node of that graph."""
    if capturing() is not None:
        return False  # a tf.Graph: allocations go to its own stream, eagerly
    cu = driver.cu()
    err, status = cu.cuStreamIsCapturing(stream)
    return bool(int(err)) or status != cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def _refuse_foreign_capture(stream: int, what: str) -> None:
    """Per-stream memory is made once per stream, outside captures."""
    if _foreign_capture(stream):
        raise TmaflowError(
            f"a call on stream 0x{int(stream):x} needs {what}, made once per stream, but the stream "
            "is being captured into a CUDA graph; make the same call once on that stream before the "
            "capture (with torch: warm up on a stream s, then torch.cuda.graph(g, stream=s))")


class _SplitK:
    """The split-K launch; a failed launch drops the workspace so its counters start clean."""

    def __init__(self, launcher, workspace: _Workspace):
        self.launcher, self.workspace = launcher, workspace

    def __call__(self, *args) -> None:
        try:
            self.launcher(*args)
        except BaseException:
            self.workspace.discard()
            raise


_workspaces = threading.local()


def _workspace(device, stream: int) -> _Workspace:
    """The workspace of this thread's launches on ``stream`` (resolved): launches on one stream
    run in order, so they may share one; other streams and threads get their own."""
    key = (device.ordinal, stream)
    cache = _workspaces.__dict__
    ws = cache.get(key)
    if ws is None:
        ws = cache[key] = _Workspace(device, stream)
    return ws


@functools.lru_cache(maxsize=32)
def _resident_clusters(kern, cluster_m: int, ordinal: int) -> int:
    """Clusters that run at once: a persistent grid any larger would leave CTAs waiting for
    a second wave."""
    probe = kern.bind(grid=cluster_m, block=384, cluster=(cluster_m, 1, 1))
    return probe.max_active_clusters()


# --- grouped (MoE) GEMM ----------------------------------------------------------------------

@entry_point
def grouped_gemm(a, b, offsets, out=None, *, layout: str = "nt", config: GemmConfig | None = None,
                 stream=None, pdl: bool = False, debug: bool | None = None, trace: bool | str = False):
    """M-grouped GEMM (mixture of experts): for every group g, rows offsets[g] .. offsets[g+1]
    of C = those rows of A @ B[g]^T (``layout="nt"``: B is G x N x K) or of A @ B[g] (``"nn"``:
    B is G x K x N). A is T x K, bfloat16; C is T x N bfloat16, fp32 accumulation; operands
    the TMA cannot address as given are staged (``edge.py``). ``offsets`` holds G + 1 ints: 0, then the running sums of the group sizes,
    T last (groups may be empty).

    Given as a device array (int32: tmaflow, torch or cupy), the group sizes stay on the GPU:
    a call does no host work that depends on them, so a captured graph replays with new sizes.
    A host sequence is checked and uploaded. Each CTA clips a group's last tile with a C map
    patched on the device (``tmaflow::tensormap``) in a workspace the state keeps.
    """
    pdl, debug, trace = _GROUPED_OPTIONS(pdl, debug, trace)
    if config is not None and not isinstance(config, GemmConfig):
        raise TmaflowError(f"grouped_gemm: config={config!r} must be None or a kernels.GemmConfig")
    A, B = as_array(a), as_array(b)
    if A.ndim != 2 or B.ndim != 3 or A.dtype.name != "bfloat16" or B.dtype.name != "bfloat16":
        raise TmaflowError(f"grouped_gemm: a must be (T, K) and b (G, N, K), both bfloat16 (got "
                           f"{A.shape} {A.dtype.name}, {B.shape} {B.dtype.name})")
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise TmaflowError(f"grouped_gemm: layout={layout!r} must be one of {LAYOUTS}")
    t, k = A.shape
    if layout == "nt":
        g, n, kb = B.shape
    else:
        g, kb, n = B.shape
    want = "(G, N, K)" if layout == "nt" else "(G, K, N)"
    if kb != k:
        raise TmaflowError(f"grouped_gemm: a is {A.shape} (T, K) but b is {B.shape}; b must be {want}")
    C = None
    if out is not None:
        C = given_output("grouped_gemm", out, (t, n), A.dtype)
    ordinal = current_ordinal()
    stream = resolve_stream(stream, (A, B, C), ordinal)
    offs = _offsets("grouped_gemm", offsets, g, t, A.device, stream)
    if C is not None:
        checks.no_aliasing("grouped_gemm", C, (("a", A), ("b", B),
                                                ("offsets", as_array(offs) if offs is offsets else None)))
    if t == 0 or n == 0 or k == 0:
        return _empty_product(a, A, out, C, (t, n), k, stream)
    if not edge.grouped_takes_tma(A, B, C, n, layout):
        return edge.grouped_gemm(grouped_gemm.__wrapped__, a, A, B, offs, out, C, layout=layout,
                                 options=dict(config=config, stream=stream, pdl=pdl, debug=debug,
                                              trace=trace))
    key = ("grouped_gemm", A.shape, A.strides, B.shape, layout, C and C.strides, config, stream,
           pdl, A.device, ordinal, debug, trace, get_ident())
    try:
        st = STATES[key]
    except (KeyError, TypeError):
        c_strides = output_strides(C, (t, n), 2)
        st = cached_state(key, lambda: _grouped_state(A, c_strides, t, n, k, g, layout, config,
                                                      stream, pdl, debug, trace))
    result, C = (out, C) if C is not None else new_output(a, A, (t, n), None, stream)
    B2 = B._as((g * B.shape[1], B.shape[2]), (B.shape[2] * 2, 2))  # the experts one after another
    return st.launcher, (st.ta.bind(A), st.tb.bind(B2), st.tc.bind(C), *_split_k_buffers(st), t, n, k,
                         st.split, offs, g, st.slots.array, 1.0, 0, 0), result  # the slots' DeviceArray: a C-plan kind


def _offsets(name: str, offsets, groups: int, rows: int, device, stream: int):
    """The offsets as a device int32 array: device arrays as given (their values are the
    caller's to keep right), host sequences checked and uploaded in order on ``stream``."""
    if hasattr(offsets, "__cuda_array_interface__") or hasattr(offsets, "data_ptr") or \
            isinstance(offsets, DeviceArray):
        arr = as_array(offsets)
        if arr.shape != (groups + 1,) or arr.dtype.name != "int32":
            raise TmaflowError(f"{name}: offsets must be {groups + 1} int32 values (got "
                               f"{arr.shape} {arr.dtype.name})")
        return offsets
    return _upload(checks.host_offsets(name, offsets, groups, rows), device, stream)


def _upload(host, device, stream: int) -> DeviceArray:
    """``host`` copied into memory allocated on ``stream`` and copied there (pageable memory is
    staged at once), so its free, also on ``stream``, waits for the launch reading it. While a
    tf.Graph captures: eagerly, as the graph's own array."""
    from ..memory import from_numpy

    if capturing() is not None:
        return from_numpy(host, device=device)
    if _foreign_capture(stream):
        raise TmaflowError("grouped_gemm: offsets given as host values are uploaded at each call, "
                           "which a CUDA graph capture cannot hold; pass them as a device int32 "
                           "tensor (a replay then reads their new values)")
    arr = empty(host.shape, host.dtype, device, stream=stream)
    driver.call("cuMemcpyHtoDAsync", arr.ptr, host.ctypes.data, arr.nbytes, stream)
    return arr


def _grouped_config(t: int, n: int, k: int, g: int, sm_count: int) -> GemmConfig:
    """Wide tiles when all groups' tiles fill the GPU with them; clusters of two M tiles only
    when an average group has rows for both (a pair straddling a group end computes rows it
    throws away); K split as the dense GEMM does when even narrow tiles leave SMs idle."""
    rows = t / max(g, 1)
    m_tiles = math.ceil(rows / BM) * g
    bn = 256 if m_tiles * math.ceil(n / 256) >= sm_count else 128
    tiles = m_tiles * math.ceil(n / bn)
    return GemmConfig(bn=bn, cluster_m=2 if bn == 256 and rows >= 2 * BM else 1,
                      split_k=_filling_splits(tiles, math.ceil(k / BK), sm_count))


def _grouped_state(A, c_strides, t, n, k, g, layout, config, stream, pdl, debug, trace) -> _GemmState:
    from ..workspace import DescriptorWorkspace

    _GROUPED_OPTIONS.check(pdl, debug, trace)
    on_current_device("grouped_gemm", A)
    C = DeviceArray(0, (t, n), "bfloat16", c_strides)
    for name, arr in (("a", A), ("out", C)):
        _check_rows(name, arr)
    device = current_device()
    if getattr(config, "split_tail", False):
        raise TmaflowError("grouped_gemm: split_tail=True is for single products (a group's tiles "
                           "change with its offsets); use split_k")
    config = config or _grouped_config(t, n, k, g, device.sm_count)
    plan = gemm_plan(max(t, 1), n, k, layout, config)
    kern = get_kernel("gemm_bf16", plan.layout, defines=dict(plan.defines, GROUPED=1), file="gemm",
                      debug=debug, trace=trace)
    cm = plan.config.cluster_m
    clusters = _resident_clusters(kern, cm, device.ordinal)
    launcher = kern.launcher(grid=cm * clusters, block=384, cluster=(cm, 1, 1), stream=stream, pdl=pdl)
    B2 = DeviceArray(0, (g * n, k), "bfloat16", (k * 2, 2)) if layout == "nt" else \
        DeviceArray(0, (g * k, n), "bfloat16", (n * 2, 2))
    _refuse_foreign_capture(stream, "its device-side C-map slots")
    slots = DescriptorWorkspace(2 * cm * clusters, device, stream)
    if launcher.module.watch is not None:  # debug builds prove every patched C map
        launcher = _ProvedSlots(launcher, slots)
    split = plan.config.split_k
    launcher, ws = _with_split_k(launcher, split > 1, device, stream)
    # counters for every tile any offsets can make: a group adds at most one
    tiles = (math.ceil(t / BM) + g + 1) * math.ceil(n / plan.config.bn) * cm
    return _GemmState(launcher=launcher, ta=_template(A, plan.spec_a), tb=_template(B2, plan.spec_b),
                      tc=_template(C, plan.spec_c, "store"), plan=plan, slots=slots, split=split,
                      workspace=ws, workspace_sizes=(tiles, split * t * n))


class _ProvedSlots:
    """A debug grouped launch: the C-map slots are cleared before it, and after it every slot
    a CTA patched must equal the host encode of the C map clipped at some group's end, byte
    for byte (a wrong patch or a stale slot raises TensorMapError naming the slot)."""

    def __init__(self, launcher, slots):
        self.launcher, self.slots = launcher, slots

    def __call__(self, *args) -> None:
        import numpy as np

        from ..errors import TensorMapError
        from ..tensormap import encode

        ws = self.slots
        ws.array.fill_bytes(0)
        self.launcher(*args)
        spec, offsets = args[2].spec, as_array(args[9]).numpy()
        candidates = {encode(replace(spec, shape=(int(end), spec.shape[1]))): int(end)
                      for end in np.unique(offsets[1:]) if end > 0}
        for i in range(ws.slots):
            raw = ws.read(i)
            if raw != bytes(128) and raw not in candidates:
                raise TensorMapError(
                    f"grouped_gemm (debug): the C map CTA {i // 2} warpgroup {i % 2} patched is no "
                    f"host encode of the output clipped at a group's end ({sorted(set(candidates.values()))}"
                    f"): a wrong patch, or a publish that did not land (slot {i} of {ws!r})")
