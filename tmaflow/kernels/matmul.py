"""bf16 GEMM written with tmaflow: C = A @ B^T ("nt") or A @ B ("nn"), fp32 accumulation.

The kernel (gemm.cu) is planned here: tensor-map specs for the three operands, the shared
memory layout (a ``Pipeline`` of A and B boxes, B multicast within the cluster, and an
epilogue buffer), and a persistent grid sized by how many clusters the device runs at once.
"""
from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass, replace

from .. import driver
from ..device import current_device, stream_handle
from ..errors import TmaflowError
from ..layout import HOPPER_SMEM_LIMIT, Buffer, Pipeline, SharedLayout
from ..memory import as_array, empty
from ..tensormap import TensorMap, TensorMapSpec
from .examples import get_kernel

BM, BK = 128, 64
LAYOUTS = ("nt", "nn")
_BARRIER_RESERVE = 256  # full/empty mbarriers after the tiles


@dataclass(frozen=True)
class GemmConfig:
    """Tile and schedule choices. ``stages=None`` takes as many as shared memory holds."""

    bn: int = 256            # tile columns (tile rows are 128: two consumer warpgroups of 64)
    cluster_m: int = 2       # CTAs per cluster, on consecutive M tiles sharing B by multicast
    epi_cols: int = 128      # epilogue columns per round (its buffer is 2 x 64 x epi_cols bf16)
    group_m: int = 16        # M tiles per band of the grouped (L2-friendly) tile order
    stages: int | None = None
    split_k: int = 1         # work items per tile along K, adding fp32 partials (skinny shapes)

    def __post_init__(self):
        if self.bn not in (128, 256):
            raise TmaflowError(f"GemmConfig: bn={self.bn} must be 128 or 256")
        if self.cluster_m not in (1, 2):
            raise TmaflowError(f"GemmConfig: cluster_m={self.cluster_m} must be 1 or 2")
        if self.epi_cols % 64 or self.bn % self.epi_cols:
            raise TmaflowError(f"GemmConfig: epi_cols={self.epi_cols} must be a multiple of 64 "
                               f"dividing bn={self.bn}")
        if self.group_m < self.cluster_m or self.group_m % self.cluster_m:
            raise TmaflowError(f"GemmConfig: group_m={self.group_m} must be a multiple of "
                               f"cluster_m={self.cluster_m}")
        if self.stages is not None and not 2 <= self.stages <= 16:
            raise TmaflowError(f"GemmConfig: stages={self.stages} must be in [2, 16]")
        if not 1 <= self.split_k <= 64:
            raise TmaflowError(f"GemmConfig: split_k={self.split_k} must be in [1, 64]")


def choose_config(m: int, n: int, k: int, sm_count: int) -> GemmConfig:
    """Wide tiles when there are enough of them to fill the GPU, narrow ones otherwise; no
    cluster when a single M tile would leave its partner idle; K split among several CTAs
    when even narrow tiles leave most SMs idle and K is long."""
    cluster_m = 1 if m <= BM else 2
    wide = math.ceil(m / BM) * math.ceil(n / 256)
    bn = 256 if wide >= sm_count else 128
    tiles = math.ceil(m / BM) * math.ceil(n / bn)
    k_blocks = math.ceil(k / BK)
    split = 1
    if 2 * tiles <= sm_count and k_blocks >= 8:
        split = max(1, min(16, sm_count // tiles, k_blocks // 4))
    return GemmConfig(bn=bn, cluster_m=cluster_m, split_k=_nonempty_splits(k_blocks, split))


def _nonempty_splits(k_blocks: int, split: int) -> int:
    """The split count actually used: ceil(k_blocks / per) with per = ceil(k_blocks / split),
    so that no split is empty."""
    per = math.ceil(k_blocks / split)
    return math.ceil(k_blocks / per)


@dataclass(frozen=True)
class GemmPlan:
    spec_a: TensorMapSpec
    spec_b: TensorMapSpec      # one B box; a stage holds ``b_boxes`` of them
    spec_c: TensorMapSpec      # one 64 x 64 epilogue box
    layout: SharedLayout
    defines: dict
    config: GemmConfig


@functools.lru_cache(maxsize=64)  # plans are pure: build each once
def gemm_plan(m: int, n: int, k: int, layout: str = "nt", config: GemmConfig = GemmConfig()) -> GemmPlan:
    """Specs, shared-memory layout and compile-time defines for an (m x k) @ B product."""
    if layout not in LAYOUTS:
        raise TmaflowError(f"gemm: layout={layout!r} must be one of {LAYOUTS}")
    bn, cm = config.bn, config.cluster_m
    spec_a = TensorMapSpec.tiled("bfloat16", (m, k), (BM, BK), swizzle="128B")
    if layout == "nt":  # B is n x k: bn rows of 128 B, split in row slices among the cluster
        spec_b = TensorMapSpec.tiled("bfloat16", (n, k), (bn // cm, BK), swizzle="128B")
        b_boxes = cm
    else:               # B is k x n: boxes of 64 k-rows x 64 columns (128 B), bn / 64 of them
        spec_b = TensorMapSpec.tiled("bfloat16", (k, n), (BK, 64), swizzle="128B")
        b_boxes = bn // 64
    spec_c = TensorMapSpec.tiled("bfloat16", (m, n), (64, 64), swizzle="128B")
    epilogue = Buffer("c", 2 * 64 * config.epi_cols * 2, align=1024)
    stage_bytes = spec_a.smem_bytes + b_boxes * spec_b.smem_bytes
    stages = config.stages or min(8, (HOPPER_SMEM_LIMIT - epilogue.nbytes - _BARRIER_RESERVE) // stage_bytes)
    # consumers: one arrival per consumer warp (2 warpgroups x 4 warps) per release.
    pipe = Pipeline("ab", stages=stages, tiles={"a": spec_a, "b": (spec_b, b_boxes)}, consumers=8,
                    cluster=(cm, 1, 1), multicast=[None, "x"] if cm > 1 else None)
    smem = SharedLayout([pipe, epilogue])
    split = _nonempty_splits(math.ceil(k / BK), config.split_k)
    defines = {"BN": bn, "EPI_COLS": config.epi_cols, "B_N_MAJOR": int(layout == "nn"),
               "CLUSTER_M": cm, "GROUP_M": config.group_m, "SPLIT_K": int(split > 1)}
    return GemmPlan(spec_a, spec_b, spec_c, smem, defines, replace(config, stages=stages, split_k=split))


def _check_operands(A, B, layout: str):
    for name, arr in (("a", A), ("b", B)):
        if arr.ndim != 2:
            raise TmaflowError(f"gemm: {name} must be 2-D (got shape {arr.shape})")
        if arr.dtype.name != "bfloat16":
            raise TmaflowError(f"gemm: {name} must be bfloat16 (got {arr.dtype.name})")
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
    if arr.strides[1] != 2 or arr.strides[0] % 16:
        raise TmaflowError(
            f"gemm: {name} has strides {arr.strides} B; rows must be contiguous and start "
            "16-byte aligned (TMA row pitch rule: a multiple of 16 B, i.e. 8 bf16). Pad the "
            "leading dimension to a multiple of 8 or copy to a contiguous array")


def gemm(a, b, out=None, *, layout: str = "nt", config: GemmConfig | None = None, stream=None,
         debug: bool | None = None, launch: bool = True):
    """C = A @ B^T (``layout="nt"``: A is M x K, B is N x K) or C = A @ B (``"nn"``: B is K x N)
    for bfloat16 tmaflow, torch or cupy arrays; fp32 accumulation, bfloat16 ``out`` (M x N,
    allocated when None). ``launch=False`` returns ``(launcher, args, out)`` for timing loops."""
    if layout not in LAYOUTS:
        raise TmaflowError(f"gemm: layout={layout!r} must be one of {LAYOUTS}")
    A, B = as_array(a), as_array(b)
    if out is None:
        n = B.shape[0 if layout == "nt" else 1] if B.ndim == 2 else 0
        out = empty((A.shape[0] if A.ndim == 2 else 0, n), "bfloat16")
    C = as_array(out)
    m, n, k = _check_operands(A, B, layout)
    if C.shape != (m, n) or C.dtype.name != "bfloat16":
        raise TmaflowError(f"gemm: out must be a ({m}, {n}) bfloat16 array (got {C.shape} {C.dtype.name})")
    if m == 0 or n == 0 or k == 0:
        if k == 0 and C.size:
            C.fill_bytes(0)  # an empty sum: C is all zeros
        return out if launch else (None, (), out)
    for name, arr in (("a", A), ("b", B), ("out", C)):
        _check_rows(name, arr)
    device = current_device()
    plan = gemm_plan(m, n, k, layout, config or choose_config(m, n, k, device.sm_count))
    kern = get_kernel("gemm_bf16", plan.layout, defines=plan.defines, file="gemm", debug=debug)
    ta = TensorMap.tiled(A, plan.spec_a.box, swizzle="128B")
    tb = TensorMap.tiled(B, plan.spec_b.box, swizzle="128B")
    tc = TensorMap.tiled(C, plan.spec_c.box, swizzle="128B")
    cm, split = plan.config.cluster_m, plan.config.split_k
    work = math.ceil(math.ceil(m / BM) / cm) * math.ceil(n / plan.config.bn) * split
    clusters = max(1, min(work, _resident_clusters(kern, cm, device.ordinal)))
    launcher = kern.bind(grid=cm * clusters, block=384, cluster=(cm, 1, 1), stream=stream)
    if split == 1:
        args = (ta, tb, tc, 0, m, n, k, 1)
    else:
        partial = _workspace(m * n, device)
        finish = get_kernel("cast_f32_bf16", None, debug=debug).bind(
            grid=min(4 * device.sm_count, math.ceil(m * n / 256)), block=256, stream=stream)
        launcher = _SplitK(launcher, finish, partial, m * n, (C, m, n, C.strides[0] // 2))
        args = (ta, tb, tc, partial, m, n, k, split)
    if launch:
        launcher(*args)
        return out
    return launcher, args, out


class _SplitK:
    """A split-K launch: zero the fp32 partial sums, run the GEMM (which adds into them),
    convert them to bf16 into ``out``, all on the GEMM's stream."""

    def __init__(self, gemm_launcher, finish_launcher, partial, count: int, finish_args):
        self.gemm, self.finish, self.partial = gemm_launcher, finish_launcher, partial
        self.count, self.finish_args = count, finish_args

    def __call__(self, *args) -> None:
        driver.call("cuMemsetD32Async", self.partial.ptr, 0, self.count, self.gemm.stream)
        self.gemm(*args)
        self.finish(self.partial, *self.finish_args)


_workspaces = threading.local()  # one per thread: concurrent GEMMs never share partial sums


def _workspace(count: int, device):
    """An fp32 buffer of at least ``count`` elements, kept per thread and device, grown as needed."""
    cache = _workspaces.__dict__
    buf = cache.get(device.ordinal)
    if buf is None or buf.size < count or not buf.alive:
        buf = empty((max(count, 1 << 20),), "float32", device)
        cache[device.ordinal] = buf
    return buf


@functools.lru_cache(maxsize=32)
def _resident_clusters(kern, cluster_m: int, ordinal: int) -> int:
    """Clusters that run at once: a persistent grid any larger would leave CTAs waiting for
    a second wave."""
    probe = kern.bind(grid=cluster_m, block=384, cluster=(cluster_m, 1, 1))
    return probe.max_active_clusters()
