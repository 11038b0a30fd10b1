"""GEMM plans: tensor-map specs for the operands, the shared-memory layout (a ``Pipeline`` of
A and B boxes, B multicast within the cluster, an epilogue buffer) and the kernel's defines, for
the dense (``gemm.cu``) and skinny (``skinny.cu``) kernels. Pure: each plan is built once."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from ...errors import TmaflowError
from ...tma.layout import Barrier, Buffer, HOPPER_SMEM_LIMIT, Pipeline, SharedLayout
from ...tma.spec import TensorMapSpec
from .config import (BK, BM, CONSUMER_WARPS, FP8_BK, GemmConfig, LAYOUTS, SCALE_MODES, SCALE_STRIDE,
                     SKINNY_FP8_PROMOTE, SKINNY_M, SKINNY_MP, SkinnyConfig, WARP, _BARRIER_RESERVE,
                     _SKINNY_FP8_MIN_K_BLOCKS)
from .heuristics import _nonempty_splits, skinny_splits


def _m_major_scales_spec(m: int, k: int, bk: int, rows: int) -> TensorMapSpec:
    """The map of an M-major scale_a seen as (KB, M): a row holds one k-block's scales, a box
    ``rows`` of them; the pitch is padded to 4 rows here (the binding takes the real one)."""
    return TensorMapSpec.tiled("float32", (math.ceil(k / bk), m), (1, rows), strides=(16 * -(-m // 4), 4))


SKINNY_ROW_SCALE_COLS = 4  # k-blocks of a row-major scale_a box: its rows' 16 bytes, the TMA's least


def _row_major_scales_spec(m: int, k: int, bk: int, rows: int) -> TensorMapSpec:
    """The map of a row-major scale_a (M, KB) for the skinny kernel: a box of ``rows`` rows x 4
    k-blocks (a stage uses one column; past KB the box reads zeros); the pitch is padded to 4
    k-blocks here (the binding takes the real one: ``skinny_takes_row_major_scales``)."""
    kb = math.ceil(k / bk)
    return TensorMapSpec.tiled("float32", (m, kb), (rows, SKINNY_ROW_SCALE_COLS), strides=(16 * -(-kb // 4), 4))


# Row-major scale_a takes the skinny path by default up to this M. A stage's box is MP rows of
# 16 bytes, a TMA row request each: 3-5% slower than M-major's one row (at M-major's stage count
# or the row-major one's alike). Against the dense kernel's gather, H100, session 20, cold, x
# cuBLAS's block-scaled kernel in bench_gemm's record (f500e3d): M = 16 1.05-1.26 against
# 0.94-1.05, M = 64 1.02 against 0.97 (64x8192x8192) and a tie at 64x7168x16384 (0.994 / 1.001,
# back to back 1.094 / 1.139); M = 1 x per-tensor _scaled_mm 0.90-1.02 against 0.66-0.97; the
# rotated rounds of tools/experiments/block_scales_ab.py agree (64x4096x4096 16.6 / 19.3 us). At
# M = 128 the two ways disagreed: the rotated rounds put the skinny kernel 1-6% ahead at all three
# shapes, bench_gemm's pairs at 0.908, 0.885 and 0.884 (three runs) against the gather's
# 0.957-0.985 at 128x7168x16384. Since the scale ring (session 21, bench_gemm's records, cold,
# skinny against the gather): H200 (fb5fc30) 128x4096x4096 0.982 / 0.935, 128x8192x8192 0.998
# / 0.992, 128x7168x16384 0.999 / 1.126; H100 (884aa48) 0.970 / 0.893, 0.980 / 0.940, 1.024 /
# 0.958. So M = 128 takes it where K has fewer than 128 k-blocks, where both GPUs agree.
SKINNY_ROW_SCALES_M = 64
_ROW_SCALES_M128_MAX_K_BLOCKS = 127


def skinny_row_scales_by_default(m: int, k: int) -> bool:
    """Does a product with row-major block scales (its scale_a readable by the skinny kernel's
    map) take the skinny path by default?"""
    return m <= SKINNY_ROW_SCALES_M or m <= SKINNY_M and math.ceil(k / FP8_BK) <= _ROW_SCALES_M128_MAX_K_BLOCKS


def skinny_takes_row_major_scales(scale_a) -> bool:
    """A row-major scale_a the skinny kernel reads through its map: 16-byte aligned, its row pitch
    a multiple of 16 bytes (packed rows: ceil(K / 128) a multiple of 4). Others take the dense
    kernel, whose warp gathers them. (A single row's pitch is moot to the TMA; one row of a
    K whose k-blocks are no multiple of 4 is still gathered: not yet run on a GPU that way.)"""
    return not (scale_a.ptr | scale_a.strides[0]) % 16


@dataclass(frozen=True)
class GemmPlan:
    spec_a: TensorMapSpec
    spec_b: TensorMapSpec      # one B box; a stage holds ``b_boxes`` of them
    spec_c: TensorMapSpec      # one 64 x 64 epilogue box
    layout: SharedLayout
    defines: dict
    config: GemmConfig
    spec_s: TensorMapSpec | None = None  # one stage's box of A's block scales (their TMA modes)
    spec_c_rem: TensorMapSpec | None = None  # a tile's last bn % 64 columns of C (one box)


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
        raise TmaflowError(f"gemm: fp8 with promote={config.promote} needs bn=64, 128 or 192 (got bn={config.bn}): "
                           "promotion keeps a second set of accumulators; use promote=0 for bn=256")
    if block_scales is not None and block_scales not in SCALE_MODES:
        raise TmaflowError(f"gemm: block_scales={block_scales!r} must be None or one of {tuple(SCALE_MODES)}")
    if block_scales and not (fp8 and config.promote == 1 and config.bn == 128):
        raise TmaflowError(f"gemm: block scales are applied at every k-block: fp8 operands with bn=128 "
                           f"and promote=1 (got {dtype}, bn={config.bn}, promote={config.promote})")
    if config.bn % 64 and (fp8 or layout != "nt"):
        raise TmaflowError(f"gemm: bn={config.bn} (no multiple of 64) is for bfloat16 'nt' products (got "
                           f"{dtype}, layout {layout!r}); use 64, 128, 192 or 256 columns")
    if config.promote_sets > 1 and not (fp8 and config.promote == 1 and config.bn <= 128 and not block_scales
                                        and layout == "nt"):
        raise TmaflowError(f"gemm: promote_sets={config.promote_sets} promotes every k-block on two accumulator "
                           f"sets: fp8 with per-tensor scales, bn=64 or 128 and promote=1 (got {dtype}, "
                           f"bn={config.bn}, promote={config.promote}, block scales {block_scales})")
    if config.cluster_m == 4 and (layout != "nt" or config.bn % 32):
        raise TmaflowError(f"gemm: cluster_m=4 shares B in four 8-row-aligned slices of a tile's rows: layout "
                           f"'nt' and bn a multiple of 32 (got layout {layout!r}, bn={config.bn})")
    bn, cm, ck, bk = config.bn, config.cluster_m, config.cluster_k, FP8_BK if fp8 else BK
    l2 = {"swizzle": "128B", "l2_promotion": config.l2_promotion}
    spec_a = TensorMapSpec.tiled(dtype, (m, k), (BM, bk), **l2)
    if layout == "nt":  # B is n x k: bn rows of 128 B, split in row slices among the cluster
        spec_b = TensorMapSpec.tiled(dtype, (n, k), (bn // cm, bk), **l2)
        b_boxes = cm
    else:               # B is k x n: boxes of 64 k-rows x 64 columns (128 B), bn / 64 of them
        spec_b = TensorMapSpec.tiled(dtype, (k, n), (BK, 64), **l2)
        b_boxes = bn // 64
    # C leaves in 64 x 64 boxes, 64 rows a consumer warpgroup; with cluster K-splits a CTA stores
    # only the BM / ck rows it owns (32-row boxes when that is a quarter)
    stored_rows = BM // ck
    spec_c = TensorMapSpec.tiled("bfloat16", (m, n), (min(64, stored_rows), 64), swizzle="128B")
    # a width that is no multiple of 64 stores its last columns through boxes that narrow
    rem = bn % 64
    spec_c_rem = TensorMapSpec.tiled("bfloat16", (m, n), (min(64, stored_rows), rem), swizzle="128B") if rem else None
    epilogue = Buffer("c", stored_rows * config.epi_cols * 2, align=1024)
    reduce = _cluster_reduce(ck, bn)
    spec_s = _m_major_scales_spec(m, k, bk, BM) if block_scales == "m_major" else None
    scale_bytes = SCALE_STRIDE * 4 if block_scales == "row_major" else 0
    stage_bytes = (spec_a.smem_bytes + b_boxes * spec_b.smem_bytes + scale_bytes +
                   (spec_s.smem_bytes if spec_s else 0))
    reduce_bytes = sum(item.nbytes for item in reduce if isinstance(item, Buffer))
    stages = config.stages or min(8, (HOPPER_SMEM_LIMIT - epilogue.nbytes - reduce_bytes - _BARRIER_RESERVE)
                                  // stage_bytes)
    # consumers: one arrival per consumer warp and CTA per release. Gathered block scales are
    # read by every lane with ld.shared after a cp.async, and each lane releases its own reads on
    # its CTA's barrier (racecheck credits no warp sync): consumer_lanes = the warp's lanes.
    # producers: the TMA thread, and with gathered block scales the lanes gathering them.
    gathered = block_scales == "row_major"
    tiles = {"a": spec_a, "b": (spec_b, b_boxes), **({"s": spec_s} if spec_s else {})}
    pipe = Pipeline("ab", stages=stages, tiles=tiles, consumers=CONSUMER_WARPS, cluster=(cm, 1, 1),
                    multicast=[None, "x"] + [None] * bool(spec_s) if cm > 1 else None,
                    producers=1 + WARP if gathered else 1, consumer_lanes=WARP if gathered else 1)
    extra = [Buffer("scales", stages * scale_bytes, align=16)] if scale_bytes else []
    smem = SharedLayout([pipe, epilogue, *extra, *reduce])
    split = _nonempty_splits(math.ceil(k / bk), config.split_k)
    defines = {"BN": bn, "EPI_COLS": config.epi_cols, "B_N_MAJOR": int(layout == "nn"),
               "CLUSTER_M": cm, "GROUP_M": config.group_m, "SPLIT_K": int(split > 1),
               "SPLIT_TAIL": int(config.split_tail)}
    if ck > 1:
        defines["CLUSTER_K"] = ck
    if rem:
        defines["EPI_REM_MAP"] = 1
    if fp8:
        defines.update(FP8=1, PROMOTE=config.promote)
    if config.promote_sets > 1:
        defines["PROMOTE_SETS"] = config.promote_sets
    if block_scales:
        defines.update(BLOCK_SCALES=1, SCALES_TMA=SCALE_MODES[block_scales])
    return GemmPlan(spec_a, spec_b, spec_c, smem, defines, replace(config, stages=stages, split_k=split),
                    spec_s, spec_c_rem)


def _cluster_reduce(ck: int, bn: int) -> list:
    """Where a cluster's K splits meet (gemm.cu's ClusterReduce): each CTA owns BM / ck rows
    of the tile and takes the other ck - 1 ranks' fp32 partials of them in ``red``; ``red_full``
    completes when their bytes landed, ``red_freed`` when the ranks this CTA sent to have read
    theirs (one arrival per owning warp, BM / ck / 16 of them, in each of the ck - 1 others)."""
    if ck == 1:
        return []
    slots = (ck - 1) * (BM // ck) * bn * 4
    return [Buffer("red", slots, align=128), Barrier("red_full", 1, slots),
            Barrier("red_freed", (ck - 1) * (BM // ck // 16))]


@dataclass(frozen=True)
class SkinnyPlan:
    spec_x: TensorMapSpec      # one MP x 64 box of A (the activations)
    spec_w: TensorMapSpec      # one 64 x 64 box of B (the weights); a stage holds rows / 64
    layout: SharedLayout
    defines: dict
    config: SkinnyConfig       # with split_k, stages and scale_ring filled in
    spec_s: TensorMapSpec | None = None  # block scales: a stage's box of A's MP row scales
    grid_z: int = 1  # CTAs (pairs with m_halves) along M: chunks of MP rows


@functools.lru_cache(maxsize=64)
def skinny_plan(m: int, n: int, k: int, config: SkinnyConfig, sm_count: int,
                dtype: str = "bfloat16", block_scales: str | None = None) -> SkinnyPlan:
    """The skinny kernel's specs, layout and defines for bfloat16 or float8_e4m3fn operands
    (fp8: k-blocks of 128, promoted every ``SKINNY_FP8_PROMOTE``). ``block_scales="m_major"``:
    fp8 promoted every k-block with DeepSeek's block scales, A's loaded by the TMA with each
    stage; ``"row_major"``: the same from a row-major scale_a, a box of 4 k-blocks' scales in the
    ring ``sc`` beside ``wx`` once a group of 4 k-blocks (``config.scale_ring`` None, the default,
    or True), or with every stage (False). The returned config holds the choice made."""
    if m > SKINNY_MP[-1] and config.m_rows is None:
        raise TmaflowError(f"gemm: the skinny path takes M <= {SKINNY_MP[-1]} (got M={m}); use a GemmConfig, "
                           "or a SkinnyConfig with m_rows (M in chunks)")
    if dtype not in ("bfloat16", "float8_e4m3fn"):
        raise TmaflowError(f"gemm: the skinny path takes bfloat16 or float8_e4m3fn operands (got {dtype})")
    if block_scales not in (None, "m_major", "row_major") or block_scales and dtype != "float8_e4m3fn":
        raise TmaflowError(f"gemm: the skinny path takes block scales with fp8 operands, scale_a M-major "
                           f"or row-major (got {block_scales!r} scales, {dtype} operands)")
    halves, mp = config.m_halves, config.m_rows or (64 if config.m_halves > 1 else next(p for p in SKINNY_MP if p >= m))
    chunks = math.ceil(m / mp)  # of M, a CTA each
    if halves > 1 and chunks < 2:
        raise TmaflowError(f"gemm: SkinnyConfig(m_halves=2) pairs two chunks of {mp} rows of M; it takes "
                           f"M over {mp} rows (got M={m})")
    if (halves > 1 or config.m_rows) and block_scales:
        raise TmaflowError(f"gemm: SkinnyConfig(m_rows={config.m_rows}, m_halves={halves}) takes per-tensor "
                           "scales (got block scales); use m_rows=None, m_halves=1")
    fp8 = dtype == "float8_e4m3fn"
    if mp not in SKINNY_MP and (fp8 or halves > 1):
        raise TmaflowError(f"gemm: SkinnyConfig(m_rows={mp}) is for bfloat16 products without M halves (got "
                           f"{dtype}, m_halves={halves}); use m_rows of {SKINNY_MP}")
    if config.promote_sets > 1 and (not fp8 or block_scales or config.rows > 64 and mp > 64):
        raise TmaflowError(f"gemm: SkinnyConfig(promote_sets={config.promote_sets}) promotes every k-block on "
                           f"two accumulator sets: fp8 with per-tensor scales, and with rows=128 at most 64 "
                           f"rows of M a CTA (got {dtype}, block scales {block_scales}, rows={config.rows}, "
                           f"{mp} rows of M)")
    grid_z = math.ceil(chunks / halves)  # pairs of chunks with M halves
    boxes = config.rows // 64
    bk = FP8_BK if fp8 else BK  # 128-byte rows either way
    l2 = {"swizzle": "128B", "l2_promotion": config.l2_promotion}
    spec_x = TensorMapSpec.tiled(dtype, (m, k), (mp, bk), **l2)
    # M halves: each CTA of the pair loads and multicasts one 32-row slice of every 64-row box
    spec_w = TensorMapSpec.tiled(dtype, (n, k), (64 // halves, bk), **l2)
    scales_spec = {"m_major": _m_major_scales_spec, "row_major": _row_major_scales_spec}.get(block_scales or "")
    spec_s = scales_spec(m, k, bk, mp) if scales_spec else None
    # None: the ring wherever scale_a is row-major (H200, 30 rounds, cold / back to back against
    # the per-stage box: 64x7168x16384 45.6 / 38.6 us against 50.4 / 44.4, 64x4096x4096 15.5 /
    # 11.1 against 15.1 / 11.4, 1-4% at the three M = 128 shapes)
    scale_ring = block_scales == "row_major" if config.scale_ring is None else config.scale_ring
    if scale_ring and block_scales != "row_major":
        raise TmaflowError(f"gemm: SkinnyConfig(scale_ring=True) holds a row-major scale_a's boxes of 4 k-blocks "
                           f"in a ring of their own (got block scales {block_scales!r}); use scale_ring=False "
                           f"or None")
    ring_s = spec_s if scale_ring else None  # the scale boxes of the ring sc
    staged_s = None if ring_s else spec_s           # the scale box a main stage carries
    stage_bytes = spec_x.smem_bytes + halves * boxes * spec_w.smem_bytes + (staged_s.smem_bytes if staged_s else 0)
    cl = max(config.cluster, halves)
    if ring_s is not None:
        stages = config.stages or _stages_beside_scale_ring(stage_bytes, ring_s)
    else:
        stages = config.stages or min(16, (HOPPER_SMEM_LIMIT - _BARRIER_RESERVE) // stage_bytes)
    rings = [_scale_ring(ring_s, stages, 4 * boxes, cl)] if ring_s is not None else []
    tiles = {"w": (spec_w, halves * boxes), "x": spec_x, **({"s": staged_s} if staged_s else {})}
    if halves > 1:
        multicast: list | None = ["x", None]  # B shared by the halves, A each its own
    else:
        multicast = [None, "x"] + [None] * bool(staged_s) if cl > 1 else None
    pipe = Pipeline("wx", stages=stages, tiles=tiles, consumers=4 * boxes, cluster=(cl, 1, 1),
                    multicast=multicast)
    min_k_blocks = _SKINNY_FP8_MIN_K_BLOCKS if fp8 else 4
    # M in chunks: that many CTAs a tile, so the splits fill a share of the SMs each
    split = config.split_k or skinny_splits(n, k, config.rows, sm_count // (halves * grid_z), bk, min_k_blocks)
    split = _nonempty_splits(math.ceil(k / bk), split)
    defines = {"MP": mp, "CONSUMERS": boxes, "CLUSTER": cl}
    if halves > 1:
        defines["M_HALVES"] = halves
    if fp8:
        defines.update(FP8=1, PROMOTE=1 if block_scales or config.promote_sets > 1 else SKINNY_FP8_PROMOTE)
    if config.promote_sets > 1:  # promoted every k-block, two sets alternating (as block scales)
        defines["PROMOTE_SETS"] = config.promote_sets
    if block_scales:
        # two accumulator sets, one promoted while the next k-block's wgmmas run, where they fit
        # (H200, against one set: 1.06x at M = 16, 1.09x at 64, 1.13-1.24x at 128)
        defines.update(BLOCK_SCALES=1, BLOCK_SCALE_SETS=2 if boxes == 1 or mp <= 64 else 1)
        if block_scales == "row_major":
            defines["SCALES_ROW_MAJOR"] = 1
        if rings:
            defines["SCALE_RING"] = 1
    return SkinnyPlan(spec_x, spec_w, SharedLayout([pipe, *rings]), defines,
                      replace(config, split_k=split, stages=stages, scale_ring=scale_ring), spec_s, grid_z)


def skinny_scale_ring_slots(stages: int) -> int:
    """Slots of the row-major scale ring (a box of 4 k-blocks each) that let the producer run
    ``stages`` k-blocks ahead of the consumers without waiting on it. With k-block r the oldest
    still held, the producer may next load k-block r + stages (once r is released), and it takes
    that k-block's group slot first: r .. r + stages, stages + 1 k-blocks, span at most
    ceil(stages / 4) + 1 groups (a split's first group is part of one), so the slot is free
    before the stage is (one fewer would hold the producer back no longer than the stage does
    only at stages % 4 == 1). It takes a group's slot before the stage of the group's first
    k-block, which the consumers of the two-set loop wait for before they retire (and release)
    the previous group's last: one slot would deadlock."""
    return -(-stages // SKINNY_ROW_SCALE_COLS) + 1


def _stages_beside_scale_ring(stage_bytes: int, spec_s: TensorMapSpec) -> int:
    """The most main stages (at most 16) that fit with their scale ring and its barriers."""
    room = HOPPER_SMEM_LIMIT - _BARRIER_RESERVE
    slot = spec_s.smem_bytes + 16  # a box and its full/empty mbarriers
    return next(s for s in range(16, 0, -1) if s * stage_bytes + skinny_scale_ring_slots(s) * slot <= room)


def _scale_ring(spec_s: TensorMapSpec, stages: int, consumers: int, cluster: int) -> Pipeline:
    """The ring ``sc`` of row-major scale boxes (tile ``s``), filled by the producer of ``wx``
    at a group's first k-block and released by every consumer warp after its last; each CTA
    loads its own rows' scales (no multicast, releases to this CTA only, in any cluster)."""
    return Pipeline("sc", stages=skinny_scale_ring_slots(stages), tiles={"s": spec_s}, consumers=consumers,
                    cluster=(cluster, 1, 1))
