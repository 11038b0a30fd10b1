"""The GEMM configurations (``GemmConfig``, ``SkinnyConfig``) and the constants the kernels are built around."""
from __future__ import annotations

from dataclasses import dataclass

from ...checks import as_bool, as_choice, as_int, as_optional_bool, as_optional_int
from ...dtypes import as_dtype
from ...errors import TmaflowError
from ..checks import L2_PROMOTIONS, int_in, settle

BM, BK = 128, 64


FP8_BK = 128  # fp8 k-blocks: 128-byte rows, as bf16's 64


BF16 = as_dtype("bfloat16")  # every product's output


LAYOUTS = ("nt", "nn")


_BARRIER_RESERVE = 256  # full/empty mbarriers after the tiles


# GemmConfig.bn: any multiple of 16 from 64 to 256 (wgmma's N); widths that are no multiple of
# 64 (DeepGEMM's way of filling 132 SMs with whole waves) run bf16 "nt" products only
WIDTHS = tuple(range(64, 257, 16))


def _width(field: str, value) -> int:
    width = as_int(field, value)
    if width not in WIDTHS:
        raise TmaflowError(f"{field}={width} must be a multiple of 16 from 64 to 256")
    return width


PROMOTE_SETS = (1, 2)  # GemmConfig / SkinnyConfig.promote_sets: fp8 accumulator sets (PROMOTE_SETS)


CLUSTER_K = (1, 2, 4)  # GemmConfig.cluster_k: K splits within a cluster (gemm.cu's CLUSTER_K)


SCALE_STRIDE = BM + 4  # fp32 block scales per stage: A's BM rows, then B's, padded to 16 B


WARP = 32  # lanes
CONSUMER_WARPS = 2 * 4  # gemm.cu's consumers: two warpgroups of four warps


# How A's block scales reach the dense kernel's shared memory, by their layout (the value: its
# SCALES_TMA). "row_major" (M, KB): a producer warp gathers a stage's BM scales 4 bytes apart
# with cp.async (a TMA box would be 16 bytes wide, 4 k-blocks, and ran no faster on H200 there;
# the skinny kernel does load such boxes: skinny.cu's SCALES_ROW_MAJOR). "m_major" (M, KB)
# stored k-block by k-block (DeepGEMM's and cuBLAS's layout): one TMA box of BM scales.
SCALE_MODES = {"row_major": 0, "m_major": 1}


@dataclass(frozen=True)
class GemmConfig:
    """Tile and schedule choices. ``stages=None`` takes as many as shared memory holds."""

    bn: int = 256            # tile columns (rows: 128, two consumer warpgroups of 64): WIDTHS
    cluster_m: int = 2       # CTAs per cluster, on consecutive M tiles sharing B by multicast (4: "nt" only)
    epi_cols: int = 128      # epilogue columns per round (its buffer is 2 x 64 x epi_cols bf16)
    group_m: int = 16        # M tiles per band of the grouped (L2-friendly) tile order
    stages: int | None = None
    split_k: int = 1         # work items per tile along K; the last sums their fp32 partials
    l2_promotion: str = "256B"  # of the A and B loads: L2 fetches whole 256 B from DRAM
    promote: int = 4         # fp8: k-blocks (of 128) the tensor cores sum before fp32 registers do (0: never)
    split_tail: bool = False  # split a last, partly idle wave's tiles along K (``tail_splits``)
    # CTAs of a cluster computing one tile, each over 1/cluster_k of K; their fp32 partials meet
    # in the owners' shared memory (bf16, cluster_m=1: a cluster splits K or shares B, not both)
    cluster_k: int = 1
    # grouped_gemm: every tile leaves through its group's C map patched on the device, as the first
    # grouped kernel did (False: only a warpgroup's rows crossing a group's end; kept to compare)
    patch_full_tiles: bool = False
    # fp8 per-tensor, bn=128: accumulator sets the k-loop alternates between promotions (2: the
    # next ``promote`` k-blocks' wgmmas run while the last ones are added, no drain; the sums and
    # their order are those of 1)
    promote_sets: int = 1

    def __post_init__(self):
        who = "GemmConfig"
        settle(self, bn=_width(f"{who}: bn", self.bn),
               cluster_m=int_in(f"{who}: cluster_m", self.cluster_m, (1, 2, 4)),
               epi_cols=as_int(f"{who}: epi_cols", self.epi_cols, 64, 256),
               group_m=as_int(f"{who}: group_m", self.group_m, 1, 1 << 16),
               stages=as_optional_int(f"{who}: stages", self.stages, 2, 16),
               split_k=as_int(f"{who}: split_k", self.split_k, 1, 64),
               l2_promotion=as_choice(f"{who}: l2_promotion", self.l2_promotion, L2_PROMOTIONS),
               promote=as_int(f"{who}: promote", self.promote, 0, 64),
               split_tail=as_bool(f"{who}: split_tail", self.split_tail),
               cluster_k=int_in(f"{who}: cluster_k", self.cluster_k, CLUSTER_K),
               patch_full_tiles=as_bool(f"{who}: patch_full_tiles", self.patch_full_tiles),
               promote_sets=int_in(f"{who}: promote_sets", self.promote_sets, PROMOTE_SETS))
        whole = self.bn - self.bn % 64  # columns in whole 64-column boxes; the rest leave in one round
        if self.epi_cols % 64 or whole % self.epi_cols:
            rest = "" if whole == self.bn else f"'s {whole} columns in whole 64-column boxes"
            raise TmaflowError(f"GemmConfig: epi_cols={self.epi_cols} must be a multiple of 64 "
                               f"dividing bn={self.bn}{rest}")
        if self.group_m % self.cluster_m:
            raise TmaflowError(f"GemmConfig: group_m={self.group_m} must be a multiple of "
                               f"cluster_m={self.cluster_m}")
        if self.split_tail and self.split_k > 1:
            raise TmaflowError(f"GemmConfig: split_tail=True splits only the last wave's tiles; it "
                               f"takes split_k=1 (got split_k={self.split_k})")
        if self.cluster_k > 1:
            other = {"cluster_m": (self.cluster_m, 1), "split_k": (self.split_k, 1),
                     "split_tail": (self.split_tail, False)}
            for name, (got, want) in other.items():
                if got != want:
                    raise TmaflowError(f"GemmConfig: cluster_k={self.cluster_k} splits each tile's K "
                                       f"among the CTAs of a cluster; it takes {name}={want} "
                                       f"(got {name}={got})")


SKINNY_MP = (8, 16, 32, 64, 128)  # the wgmma N a skinny product's M is rounded up to


# SkinnyConfig.m_rows: SKINNY_MP, and 48 (bf16: cuBLAS's 64 x 48 tiles at 512^3 and 512x512x2048)
SKINNY_M_ROWS = (8, 16, 32, 48, 64, 128)


SKINNY_M = 128  # products of at most this many rows ("nt") take the skinny path by default


SKINNY_FP8_PROMOTE = 4  # fp8 on the skinny path: k-blocks of 128 the tensor cores sum before fp32 registers do


# fp8 on the skinny path splits K only into splits of at least 32 k-blocks (H200: 16x/64x4096x4096
# in 2 splits of 16, 0.96x / 0.87x _scaled_mm; unsplit, 1.02x / 0.93x)
_SKINNY_FP8_MIN_K_BLOCKS = 32


@dataclass(frozen=True)
class SkinnyConfig:
    """The skinny path (``layout="nt"``, M <= 128, bf16 or fp8 with per-tensor scales or block
    scales, scale_a M-major or row-major): operands swapped so B's rows fill the MMA's 64 rows
    (gemm_skinny_bf16 in skinny.cu). ``rows`` of B per CTA (64 per consumer warpgroup);
    ``split_k=None`` picks enough K splits to fill the GPU; ``cluster=2`` pairs neighbouring
    tiles, which share A by multicast. ``m_rows`` (one of SKINNY_M_ROWS): M in chunks of that many
    rows, a CTA each (any M; None: all of M, at most 128, in one). ``m_halves=2``: the two CTAs
    of a cluster compute neighbouring chunks (64 rows without ``m_rows``) on the same rows of B,
    which they share by multicast (cuBLAS's fp8 M = 128 scheme; not with ``cluster=2``).
    Neither takes block scales. ``scale_ring`` (block scales, row-major scale_a): True loads each
    box of 4 k-blocks' scales once, into a ring of its own (row-major scale_a only); False loads
    the box with every stage; None (the default) takes the ring for row-major block scales and
    nothing otherwise (H200, 30 rounds: 1-13% less time than the per-stage box at M = 64 and 128,
    but for 64x4096x4096 cold, 2% more). ``skinny_plan(...).config`` holds the choice made."""

    rows: int = 64  # H200: 64-row CTAs beat 128 on 11 of the 12 decode shapes of BENCHMARKS.md
    split_k: int | None = None
    stages: int | None = None
    l2_promotion: str = "256B"
    cluster: int = 1
    # grouped_gemm's decode path: round 1's items (tile fastest within a chunk, A in whole MP-row
    # boxes; False: chunk fastest within a tile, A up to a chunk's last row), kept to compare
    tile_fastest: bool = False
    m_rows: int | None = None
    m_halves: int = 1
    promote_sets: int = 1  # fp8 per-tensor: 2 alternates two accumulator sets (GemmConfig's)
    scale_ring: bool | None = None  # row-major block scales: a box a group of 4 k-blocks (skinny_plan)

    def __post_init__(self):
        who = "SkinnyConfig"
        settle(self, rows=int_in(f"{who}: rows", self.rows, (64, 128)),
               split_k=as_optional_int(f"{who}: split_k", self.split_k, 1, 64),
               stages=as_optional_int(f"{who}: stages", self.stages, 2, 16),
               l2_promotion=as_choice(f"{who}: l2_promotion", self.l2_promotion, L2_PROMOTIONS),
               cluster=int_in(f"{who}: cluster", self.cluster, (1, 2)),
               tile_fastest=as_bool(f"{who}: tile_fastest", self.tile_fastest),
               m_rows=None if self.m_rows is None else int_in(f"{who}: m_rows", self.m_rows, SKINNY_M_ROWS),
               m_halves=int_in(f"{who}: m_halves", self.m_halves, (1, 2)),
               promote_sets=int_in(f"{who}: promote_sets", self.promote_sets, PROMOTE_SETS),
               scale_ring=as_optional_bool(f"{who}: scale_ring", self.scale_ring))
        if self.m_halves > 1 and self.cluster > 1:
            raise TmaflowError(f"{who}: m_halves={self.m_halves} pairs the CTAs of a cluster along M; "
                               f"it takes cluster=1 (got cluster={self.cluster})")


def _row_major(arr) -> bool:
    """A 2-D float32 array whose rows are contiguous and packed (a single row's stride is moot)."""
    return arr.strides[1] == 4 and (arr.shape[0] == 1 or arr.strides[0] == 4 * arr.shape[1])


def _m_major(arr) -> bool:
    """An (M, KB) float32 array stored k-block by k-block: strides (4, P) bytes, P >= 4 M."""
    return arr.ndim == 2 and arr.strides[0] == 4 and arr.strides[1] >= 4 * arr.shape[0]


def _readable_scale_a(arr) -> bool:
    """scale_a as the kernels read it: row-major (gathered by the dense kernel, or boxes of 4
    k-blocks on the skinny path), or M-major (one k-block's M scales, then the next one's) with
    the 16-byte pitch and base its TMA map needs."""
    return _row_major(arr) or _m_major(arr) and not (arr.ptr | arr.strides[1]) % 16
