"""Measured heuristics: which configuration a product of a given shape takes on a device of
``sm_count`` SMs (tile widths, clusters, split-K, the skinny path's splits). Kept apart from the
implementations, which ask and only launch."""
from __future__ import annotations

import math

from .config import BK, BM, FP8_BK, GemmConfig, SKINNY_M, SKINNY_MP, SkinnyConfig


def skinny_splits(n: int, k: int, rows: int, sm_count: int, bk: int = BK, min_k_blocks: int = 4) -> int:
    """K splits that bring (N tiles x splits) CTAs closest to one per SM without a second
    wave, each split keeping at least ``min_k_blocks`` k-blocks (of ``bk``: 64 bf16, 128 fp8)."""
    tiles, k_blocks = math.ceil(n / rows), math.ceil(k / bk)
    split = max(1, min(sm_count // tiles, k_blocks // min_k_blocks, 64))
    return _nonempty_splits(k_blocks, split)


def choose_config(m: int, n: int, k: int, sm_count: int, layout: str = "nt",
                  dtype: str = "bfloat16") -> GemmConfig | SkinnyConfig:
    """The skinny path for "nt" products of at most SKINNY_M rows, bf16 or fp8 (H200, fp8 decode
    shapes: median 0.97-0.99x _scaled_mm against 0.75x in dense tiles), except bf16 ones of one
    full M tile that dense tiles spread over the SMs (``one_m_tile_config``). Otherwise
    ``dense_config``: the tile width whose whole waves take least time, wide tiles in clusters
    of two past one wave, K split among several CTAs when the tiles leave most SMs idle and
    K is long. fp8: ``fp8_config``. (Block scales take ``block_scale_config``.) Small bf16
    products take ``m_chunk_config`` before all of these."""
    chunks = m_chunk_config(m, n, k, sm_count, layout, dtype)
    if chunks is not None:
        return chunks
    if layout == "nt" and m <= SKINNY_M:
        if dtype == "bfloat16":
            one_tile = one_m_tile_config(m, n, k, sm_count)
        else:
            one_tile = fp8_one_m_tile_config(m, n, k, sm_count)
        return one_tile or skinny_config(m, n, sm_count, dtype)
    if dtype == "float8_e4m3fn":
        return fp8_config(m, n, k, sm_count)
    return dense_config(m, n, k, sm_count, layout)


def m_chunk_config(m: int, n: int, k: int, sm_count: int, layout: str = "nt",
                   dtype: str = "bfloat16") -> SkinnyConfig | None:
    """Small bf16 "nt" products (129-512 rows, N and K at most 512) on the skinny kernel with M
    in 16 chunks (SkinnyConfig.m_rows), one CTA a chunk and 64 columns: 64-128 CTAs each fetching
    a few KB, as cuBLAS's 64x8 / 64x48 tiles do, where 128-row tiles leave 8-64 CTAs fetching
    their whole K serially (H200, session 17 call 4, 40 interleaved rounds, the default's time
    over this, cold / back to back: 256^3 m_rows 16 1.145 / 1.094, 512^3 m_rows 32 1.117 / 1.079;
    at 512x512x2048 the chunks lost: 0.954 / 0.935). None elsewhere."""
    if dtype != "bfloat16" or layout != "nt" or not 128 < m <= 512 or n > 512 or k > 512:
        return None
    rows = min(mp for mp in SKINNY_MP if mp >= math.ceil(m / 16))  # about 16 chunks
    if -(-m // rows) * -(-n // 64) > sm_count:
        return None
    return SkinnyConfig(m_rows=rows)


SKINNY_SHARED_STAGES = 5  # 64-row tiles that outnumber the SMs: stages for several CTAs an SM


# fp8 per-tensor products of at most this many rows promote every k-block on two accumulator
# sets (H200, session 32, 30 rotated rounds, over promotion every 4 k-blocks, cold / back to
# back: 1x4096x4096 1.019 / 1.012, 16x4096x4096 1.016 / 1.001, 1x8192x8192 1.022 / 1.023,
# 16x8192x8192 1.018 / 1.025, 1x7168x16384 1.019 / 1.024, 16x7168x16384 1.014 / 1.017; at
# M = 64 they lost back to back: 64x4096x4096 1.019 / 0.944, 64x7168x16384 0.996 / 0.999)
FP8_TWO_SETS_M = 16


def skinny_config(m: int, n: int, sm_count: int, dtype: str = "bfloat16") -> SkinnyConfig:
    """64 rows of B a CTA (fp8 of up to FP8_TWO_SETS_M rows: promoted on two sets), or 128
    when M fills the MMA's 64 columns and 64-row tiles alone outnumber the SMs (H200,
    gemm_sweep: 64x14336x4096 1.044x / 1.073x cold / back to back; at fewer tiles 64 rows
    won, as on 11 of the 12 decode shapes before). Fewer rows whose 64-row tiles outnumber the
    SMs keep 64 rows in 5 stages instead of 16: a CTA an SM left a second, partial wave; at 5
    stages (50-60 KB) three or four CTAs an SM hold every tile from the start up to N of about
    25k-34k (H100, tools/experiments/gemm_latency_ab.py, over 16 stages cold / back to back: 16x14336x7168
    1.023 / 1.023, 32x14336x4096 1.028 / 1.040, 1x14336x4096 1.016 / 1.024, fp8 16x14336x7168
    1.022 / 1.039; 8 stages 1.01-1.02, 128-row tiles 1.02)."""
    if math.ceil(n / 64) <= sm_count:
        two_sets = dtype == "float8_e4m3fn" and m <= FP8_TWO_SETS_M
        return SkinnyConfig(promote_sets=2 if two_sets else 1)
    if m > 32:
        return SkinnyConfig(rows=128)
    return SkinnyConfig(stages=SKINNY_SHARED_STAGES)


_ONE_TILE_FILL = 0.8  # the dense path must keep this share of the SMs busy to beat the skinny one


def one_m_tile_config(m: int, n: int, k: int, sm_count: int) -> GemmConfig | None:
    """bf16 "nt" products of 65-128 rows (one M tile) in dense tiles when a width (a multiple of
    16) and a K split inside a cluster of at most two give nearly one CTA an SM: the most CTAs
    up to the SM count, then no K split, then the wider tile (H200, gemm_sweep, over the skinny
    path cold / back to back: 128x4096x7168 bn64 ck2 1.163 / 1.235, 128x7168x7168 bn112 ck2
    1.021 / 1.016, 128x8192x8192 bn64 1.036 / 1.024). Where N is so narrow that the skinny path
    would split K eight ways or more (16 tiles of 64 columns or fewer on 132 SMs) and K is long
    (64 k-blocks or more), a cluster of four splits each 64-column tile's K instead (H200,
    session 27, gemm_sweep, over the skinny path cold / back to back: 96x768x4096 2.27 / 2.45,
    128x512x8192 2.27 / 2.49, 128x256x16384 2.51 / 2.64, 128x1024x8192 1.67 / 1.91: the skinny
    path's 8-32 K splits meet in one CTA a tile). None (the skinny path, whose K splits fill the
    GPU) for fewer rows, short K, or N between those."""
    k_blocks = math.ceil(k / BK)
    if m <= 64 or k_blocks < 16:
        return None
    fits = [(math.ceil(n / bn) * ck, -ck, bn, ck) for bn in range(64, 257, 16) for ck in (1, 2)
            if math.ceil(n / bn) * ck <= sm_count]
    if not fits:
        return None
    ctas, _, bn, ck = max(fits)
    if ctas < _ONE_TILE_FILL * sm_count:
        if 8 * math.ceil(n / 64) <= sm_count and k_blocks >= 64:
            return GemmConfig(bn=64, cluster_m=1, epi_cols=64, cluster_k=4)
        return None
    return GemmConfig(bn=bn, cluster_m=1, epi_cols=128 if bn == 128 else 64, cluster_k=ck)


def fp8_one_m_tile_config(m: int, n: int, k: int, sm_count: int) -> GemmConfig | None:
    """fp8 products of 65-128 rows with K of 16 k-blocks (of 128) or more: one M tile, K split
    in clusters of two (H200, cold / back to back against the skinny path's default:
    128x4096x4096 0.923 / 1.09x against 0.850x _scaled_mm cold, 128x8192x8192 1.016 against
    0.935, 128x7168x16384 0.978 against 0.938; at M = 64 the skinny path stays ahead), in
    64-column tiles where the pairs of them fit one wave (cuBLAS's 64x64 tiles in 128 CTAs:
    128x4096x4096 1.133 / 1.347x the 128-column tiles, H200, session 18), else 128."""
    if m <= 64 or math.ceil(k / FP8_BK) < 16:
        return None
    if 2 * -(-n // 64) <= sm_count:
        return GemmConfig(bn=64, cluster_m=1, epi_cols=64, cluster_k=2)
    return GemmConfig(bn=128, cluster_m=1, cluster_k=2)


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
    epilogue rounds (room for a sixth stage beside the scales); K split as the bf16 tiles are.
    Where the tiles fill at most half the SMs (and M is past the skinny path's 64 rows), K is
    split inside clusters instead (``block_scale_cluster_k``)."""
    tiles, k_blocks = math.ceil(m / BM) * math.ceil(n / 128), math.ceil(k / FP8_BK)
    ck = block_scale_cluster_k(m, tiles, k_blocks, sm_count)
    if ck > 1:
        return GemmConfig(bn=128, cluster_m=1, epi_cols=64, promote=1, cluster_k=ck)
    return GemmConfig(bn=128, cluster_m=2 if m > BM else 1, epi_cols=64, promote=1,
                      split_k=_filling_splits(tiles, k_blocks, sm_count))


# Block scales: M from which few tiles split K inside clusters rather than take the skinny path
# (64x4096x4096 cold x cuBLAS: skinny 1.275, two CTAs a tile 1.202)
_BLOCK_CLUSTER_K_FROM_M = 65


def block_scale_cluster_k(m: int, tiles: int, k_blocks: int, sm_count: int) -> int:
    """CTAs of a cluster splitting each block-scaled tile's K (1: none). Tiles filling at most
    half the SMs, 8 k-blocks or more: two, or four where four CTAs a tile stay within 3/4 of
    the SMs (clusters of four must fit a GPC's free SMs: 32 tiles in 128 CTAs ran slower than in
    64). H200, session 28, cold x cuBLAS's block-scaled _scaled_mm, the old default -> two ->
    four CTAs a tile: 128x4096x4096 1.009 -> 1.177 -> 0.975; 128x4096x8192 1.177 -> 1.252 ->
    1.076; 256x2048x7168 1.022 -> 1.414 -> 1.151; 96x7168x16384 1.441 -> 1.784 -> 1.694;
    256x4096x16384 1.196 -> 1.347; 128x4096x1024 0.899 -> 1.010; 128x2048x4096 1.000 -> 1.303 ->
    1.492; 128x3072x4096 1.033 -> 1.253 -> 1.424; 128x1024x8192 1.324 -> 1.562 -> 2.050; back
    to back 1.2-1.7x the old default. At 96 tiles (384x4096x4096) 0.894 -> 0.839: none."""
    if m < _BLOCK_CLUSTER_K_FROM_M or 2 * tiles > sm_count or k_blocks < 8:
        return 1
    return 4 if 16 * tiles <= 3 * sm_count else 2


# Relative speed of a tile's math (H200, full waves): 128 x 256 tiles read 20% less shared
# memory per MMA than 128 x 128 ones; 128 x 192 ones lie between; 128 x 64 ones (cuBLAS's at
# 1024^3) read A once per 64 columns.
_TILE_SPEED = {256: 1.0, 192: 0.98, 128: 0.96, 64: 0.85}


def dense_config(m: int, n: int, k: int, sm_count: int, layout: str = "nt") -> GemmConfig:
    """The dense kernel's tiles for this shape (``choose_config`` without the skinny path): the
    width (64, 128, 192 or 256 columns) whose whole waves of tiles take least time (a last wave
    a fifth full costs a whole wave: H200, 3072^3, 128 x 256 tiles in 3 waves 0.75x cuBLAS,
    128 x 128 ones in 5 waves 0.87x, 128 x 192 ones in 3 nearly full waves 0.97x). 256-column
    tiles go in clusters of two sharing B over more than one wave (in one wave, unclustered ran
    faster: 2048^3, 24.0 against 25.0 us), 128-column ones too from N = 2048 ("nt"), and 128+
    column tiles in one nearly full wave over a short K."""
    tiles_m = math.ceil(m / BM)
    # 64-column tiles only with two M tiles or more (one M tile is the split-K path's, measured
    # with 128 columns)
    widths = [w for w in _TILE_SPEED if w != 64 or tiles_m > 1]
    bn = _cheapest_width(tiles_m, n, sm_count, _TILE_SPEED, widths)
    if layout == "nt":  # widths that are no multiple of 64 run "nt" products only
        bn = _fuller_last_wave(tiles_m, n, sm_count, bn)
    tiles = tiles_m * math.ceil(n / bn)
    k_blocks = math.ceil(k / BK)
    cluster_m = 2 if bn == 256 and tiles_m > 1 and tiles > sm_count else 1
    # 128-column tiles over several waves pair up too where B is wide (H100, gemm_latency_ab,
    # over unclustered cold / back to back: 2304x4608x1024 1.039 / 1.065, 2048x5120x2048
    # 1.061 / 1.009, 3072x4608x4096 1.058 / 0.999; 6144x1024x1024, 8 N tiles, 0.991 / 0.993;
    # "nn" not timed)
    if bn == 128 and tiles_m > 1 and tiles > sm_count and n >= _PAIRED_128_MIN_N and layout == "nt":
        cluster_m = 2
    # One nearly full wave over a short K: pairs sharing B by multicast halve its loads, which
    # is most of a tile's time (H200, 1000x3000x520, 128 tiles of 192 columns, 9 k-blocks:
    # 1.076x / 1.098x cold / back to back; pairs of 64-column tiles were slower: 256^3, 512^3,
    # 1024^3)
    if bn >= 128 and tiles_m > 1 and 2 * tiles >= sm_count and tiles <= sm_count and k_blocks <= 12:
        cluster_m = 2
    # 64-column epilogue rounds for 64, 192 and unclustered 256-column tiles (H200, 2048^3: 23.67
    # against 23.89 us; K = 64: 4.90 against 5.06 us); clustered 256-column tiles keep 128
    # (8192^3: 1.024x against 1.052x cuBLAS)
    epi_cols = 128 if bn == 128 or (bn == 256 and cluster_m == 2) else 64
    split = _filling_splits(tiles, k_blocks, sm_count)
    return GemmConfig(bn=bn, cluster_m=cluster_m, epi_cols=epi_cols,
                      **_cluster_splits(tiles, k_blocks, split, cluster_m, bn, sm_count))


def _cluster_splits(tiles: int, k_blocks: int, split: int, cluster_m: int, bn: int, sm_count: int) -> dict:
    """A grid under half the SMs with K to share: a cluster of CTAs splits each tile's K and sums
    the partials in shared memory, no global round trip: two where ``_filling_splits`` gives at
    most 2 (H200, tools/peers/gemm_sweep.py, cold / back to back: 512x512x2048 1.38x / 1.35x
    over two global splits, 512^3 1.09x / 1.04x over none; 256^3, 4 k-blocks, gained nothing),
    four where it gives 3-4 to 64-column tiles and four CTAs a tile fit the SMs (H200, session
    27, over four global splits, cold: 129x264x4096 1.64x, 256x256x4096 1.67x, 192x384x7168
    1.48x: the global splits' last CTA reads the others' partials alone; wider tiles, of one M
    tile, not measured). {split_k, cluster_k}."""
    if 2 * tiles > sm_count or k_blocks < 8 or cluster_m != 1:
        return {"split_k": split, "cluster_k": 1}
    if split <= 2:
        return {"split_k": 1, "cluster_k": 2}
    if bn == 64 and 4 * tiles <= sm_count and k_blocks >= 16:
        return {"split_k": 1, "cluster_k": 4}
    return {"split_k": split, "cluster_k": 1}


_PAIRED_128_MIN_N = 2048


def _cheapest_width(tiles_m: int, n: int, sm_count: int, speed: dict, widths=None) -> int:
    """The tile width (of ``widths``, default every key of ``speed``) whose whole waves of
    tiles cost least: waves x the math of one tile / its relative speed; ties go to the wider."""
    def cost(bn):
        return math.ceil(tiles_m * math.ceil(n / bn) / sm_count) * bn / speed[bn]

    return min(widths or speed, key=lambda width: (cost(width), -width))


# Relative speed of the widths between the measured ones, for _fuller_last_wave: linear
def _width_speed(bn: int) -> float:
    known = sorted(_TILE_SPEED)
    lo = max(w for w in known if w <= bn)
    hi = min(w for w in known if w >= bn)
    if lo == hi:
        return _TILE_SPEED[lo]
    return _TILE_SPEED[lo] + (_TILE_SPEED[hi] - _TILE_SPEED[lo]) * (bn - lo) / (hi - lo)


_NARROWER_WORTH = 0.95  # an odd width must cut the modelled time by 5% to be taken


def _fuller_last_wave(tiles_m: int, n: int, sm_count: int, bn: int) -> int:
    """``bn``, or a width up to 32 columns narrower (a multiple of 16) whose tiles fill their
    waves at least 5% cheaper in the model of ``_cheapest_width``, for grids of one to three
    waves (under one, narrower tiles only change the split-K and cluster choices measured with
    the standard widths; beyond three, a wave's fill matters little) (H200, 4096x2112x7168: 384 tiles of 176 columns in 3 waves
    1.073x / 1.090x over 352 of 192 columns in 3, cold / back to back)."""
    def cost(width):
        return math.ceil(tiles_m * math.ceil(n / width) / sm_count) * width / _width_speed(width)

    narrower = range(max(64, bn - 32), bn, 16)
    if not narrower or not sm_count <= tiles_m * math.ceil(n / bn) <= 3 * sm_count:
        return bn
    best = min(narrower, key=lambda width: (cost(width), -width))
    return best if cost(best) <= _NARROWER_WORTH * cost(bn) else bn


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


# The grouped skinny path's rows a chunk at most by default (skinny.cu's GROUPED): a mean group
# of at most this many rows takes it
GROUPED_SKINNY_ROWS = 64
# A known group larger than this sends the product to the dense path: its 128-row tiles read an
# expert's weights once for every 128 rows, the decode path's chunks once for every 64 and A as
# often (H200, round 1, device offsets, skewed loads: G = 32, 4096 x 7168, 64 rows a group with
# groups of 520 and 488 rows, 1.47x torch dense against 1.18x decode; G = 128, 2048 x 7168, 16 a
# group with groups of 276 to 153, 1.32x against 0.96x)
GROUPED_HOT_ROWS = 128
# With device offsets and no hint the largest group is unknown: only a mean group of at most this
# many rows takes the decode path (H200, round 2, quick grid, device offsets: 1 row a group
# 1.46-1.65x torch on the decode path against 0.80-1.27x dense, skewed included; 16 and 64 rows a
# group, skewed: decode 0.64-1.17x, dense 1.17-1.49x; balanced: dense 1.27-1.33x, decode 1.22-1.38x)
GROUPED_BLIND_MEAN = 8


def grouped_config(t: int, n: int, k: int, g: int, sm_count: int, layout: str = "nt",
                   max_rows: int | None = None, chunks: int | None = None) -> GemmConfig | SkinnyConfig:
    """Decode-time MoE (mean group of at most 64 rows, "nt", tiles of 64 columns for at least
    half the SMs): the grouped skinny kernel, whose CTAs read only their group's rows of A and
    stream each expert's weights once (the dense path's 128-row tiles compute mostly padding
    there and fill fewer SMs; H200 history: G = 8, 7168x2048, 64 rows a group, 0.74x
    torch._grouped_mm). Otherwise ``grouped_dense_config``, and also when ``max_rows`` (host
    offsets' largest group, or the caller's hint) shows a group of more than GROUPED_HOT_ROWS.
    Without ``max_rows`` (device offsets, no hint) only a mean of at most GROUPED_BLIND_MEAN
    rows takes the decode path: skewed loads of a larger mean run faster dense. ``max_rows``
    also sizes the chunks (``grouped_chunk_rows``). Tiles of 128 rows (two consumer warpgroups)
    where ``grouped_wide_tiles`` takes them (``chunks``: the chunks of the groups with rows, where
    host offsets tell them)."""
    if max_rows is None:  # the largest group is unknown: a hot expert may hide behind the mean
        small = t <= GROUPED_BLIND_MEAN * g
    else:
        small = t <= GROUPED_SKINNY_ROWS * g and max_rows <= GROUPED_HOT_ROWS
    if layout == "nt" and small and 2 * g * math.ceil(n / 64) >= sm_count:
        return SkinnyConfig(rows=128 if grouped_wide_tiles(t, n, g, sm_count, chunks) else 64, split_k=1)
    return grouped_dense_config(t, n, k, g, sm_count)


def grouped_wide_tiles(t: int, n: int, g: int, sm_count: int, chunks: int | None = None) -> bool:
    """Whether the grouped decode path's items are 128 rows of an expert (two consumer warpgroups
    a CTA, twice the weights in flight an SM) rather than 64. Chunks of more than 16 rows are MMA
    work as much as weight traffic: two warpgroups share each chunk of A where 128-row tiles still
    give every SM four items (a guess, not measured). Also where the 64-row items take more than
    one round of the SMs: ``chunks`` x 64-row tiles when the host offsets tell the chunks of the
    groups with rows, else as many as could have rows (min(t, g) groups, one chunk each). A CTA's
    64-row item is bounded by its bytes in flight, so a second, partial round of them costs about
    a full one, and 128-row items that fit one round move about 1.4x the bytes an SM. H200,
    session 27, device offsets (64-row chunks), 1 token an expert, skewed, time at 128 rows over
    64: 32 experts of 2048 x 7168 (5 with rows: 160 items of 64 on 132 SMs) 0.678 cold / 0.640
    back to back, 8 of 4096 x 4096 (3: 192 items) 0.943 / 0.822, 32 of 4096 x 7168 (4: 256) 0.965
    / 0.931; balanced, 32 of 2048 x 7168 0.987 / 0.975. Where the 64-row items fit one round it
    costs 1.07-1.23 (8 of 4096 x 7168, 2 with rows: 128 items; 8 of 2048 x 7168, 3: 96), the
    price of not knowing the sizes. Host offsets
    (chunks of 8-32 rows: more stages), the same rows: 0.732 / 0.632, 0.970 / 0.894, 0.963 /
    0.942, balanced 0.997-0.998 / 0.987-1.002; 1.073 / 1.252 and 1.047 / 1.113 where 64-row items
    fit one round (the counts there pick 64)."""
    if t > 16 * g and g * math.ceil(n / 128) >= 4 * sm_count:
        return True
    groups = min(t, g) if chunks is None else chunks
    return groups * math.ceil(n / 64) > sm_count


def grouped_chunk_rows(max_rows: int | None = None) -> int:
    """Rows a grouped skinny chunk holds (the wgmma N, one of SKINNY_MP up to 64 by default):
    the largest group's when it is known (host offsets, or the caller's max_tokens_per_group),
    else 64: device offsets may hide a hot expert (Pareto loads put 100+ rows of a 16-row mean in
    one group), whose every chunk re-reads the expert's tiles. A wide chunk costs a small group
    only MMA work, which the weights' traffic hides (the kernel loads A up to the chunk's last
    row; H200, round 1: G = 8, 7168 x 2048, 16 rows a group, skewed: 0.73x torch in 16-row chunks)."""
    if max_rows is None:
        return GROUPED_SKINNY_ROWS
    return next(p for p in SKINNY_MP if p >= min(max(max_rows, 1), GROUPED_SKINNY_ROWS))


def grouped_dense_config(t: int, n: int, k: int, g: int, sm_count: int) -> GemmConfig:
    """Wide tiles when all groups' tiles fill the GPU with them; clusters of two M tiles only
    when an average group has rows for both (a pair straddling a group end computes rows it
    throws away); K split as the dense GEMM does when even narrow tiles leave SMs idle."""
    rows = t / max(g, 1)
    m_tiles = math.ceil(rows / BM) * g
    bn = 256 if m_tiles * math.ceil(n / 256) >= sm_count else 128
    tiles = m_tiles * math.ceil(n / bn)
    return GemmConfig(bn=bn, cluster_m=2 if bn == 256 and rows >= 2 * BM else 1,
                      split_k=_filling_splits(tiles, math.ceil(k / BK), sm_count))
