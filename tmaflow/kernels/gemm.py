"""bf16 GEMM written with tmaflow (issue 6). STATUS: compiles (HGMMA, multicast TMA, no spills);
not yet run on a GPU: verify with tests/test_gpu_gemm.py before relying on it."""
from __future__ import annotations

import functools
import math

from ..device import current_device
from ..errors import TmaflowError
from ..layout import Buffer, Pipeline, SharedLayout
from ..memory import as_array, empty
from ..tensormap import TensorMap, TensorMapSpec
from .examples import get_kernel

BM, BN, BK = 128, 128, 64


@functools.lru_cache(maxsize=64)  # plans are pure: build each once
def gemm_plan(m: int, n: int, k: int, stages: int = 5):
    """Specs and shared-memory layout of the "nt" kernel for an (m x k) @ (n x k)^T product."""
    spec_a = TensorMapSpec.tiled("bfloat16", (m, k), (BM, BK), swizzle="128B")
    spec_b = TensorMapSpec.tiled("bfloat16", (n, k), (BN, BK), swizzle="128B")
    spec_c = TensorMapSpec.tiled("bfloat16", (m, n), (BM, BN))
    # consumers: one arrival per consumer warp (2 warpgroups x 4 warps); B shared along x.
    pipe = Pipeline("ab", stages=stages, tiles={"a": spec_a, "b": spec_b}, consumers=8,
                    cluster=(2, 1, 1), multicast=[None, "x"])
    layout = SharedLayout([pipe, Buffer("c", spec_c.smem_bytes, align=1024)])
    return spec_a, spec_b, spec_c, layout


def gemm(a, b, out=None, *, layout: str = "nt", stages: int = 5, stream=None,
         debug: bool | None = None, launch: bool = True):
    """C = A @ B^T for bf16 A (M x K) and B (N x K) ("nt"); fp32 accumulation, bf16 out."""
    if layout != "nt":
        raise TmaflowError(f"gemm: layout={layout!r} is not implemented yet; only 'nt' "
                           "(A: M x K, B: N x K, both K-contiguous)")
    A, B = as_array(a), as_array(b)
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[1]:
        raise TmaflowError(f"gemm: A {A.shape} and B {B.shape} must be (M, K) and (N, K)")
    if A.dtype.name != "bfloat16" or B.dtype.name != "bfloat16":
        raise TmaflowError(f"gemm: A and B must be bfloat16 (got {A.dtype}, {B.dtype})")
    m, k = A.shape
    n = B.shape[0]
    if out is None:
        out = empty((m, n), "bfloat16")
    C = as_array(out)
    if C.shape != (m, n) or C.dtype.name != "bfloat16":
        raise TmaflowError(f"gemm: out must be a ({m}, {n}) bfloat16 array (got {C.shape} {C.dtype})")
    spec_a, spec_b, spec_c, smem = gemm_plan(m, n, k, stages)
    kern = get_kernel("gemm_nt", smem, file="gemm", debug=debug)
    ta = TensorMap.tiled(A, spec_a.box, swizzle="128B")
    tb = TensorMap.tiled(B, spec_b.box, swizzle="128B")
    tc = TensorMap.tiled(C, spec_c.box)
    work = math.ceil(math.ceil(m / BM) / 2) * math.ceil(n / BN)
    clusters = max(1, min(work, current_device().sm_count // 2))
    launcher = kern.bind(grid=2 * clusters, block=384, cluster=(2, 1, 1), stream=stream)
    args = (ta, tb, tc, m, n, k)
    if launch:
        launcher(*args)
        return out
    return launcher, args, out
