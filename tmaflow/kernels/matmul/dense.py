"""``gemm``: the dense and skinny GEMM entry point and its cached launch states."""
from __future__ import annotations

import functools
import math
from types import SimpleNamespace as _GemmState  # a prepared state's fields
from threading import get_ident

from ...errors import TmaflowError
from ...launch.config import resolve_stream
from ...runtime.device import current_device, current_ordinal
from ...runtime.memory import DeviceArray, as_array
from .. import checks, edge
from ..entry import (STATES, cached_state, entry_point, given_output, new_output, on_current_device,
                     output_strides)
from ..registry import get_kernel
from .config import BF16, BM, GemmConfig, LAYOUTS, SKINNY_M, SkinnyConfig
from .heuristics import block_scale_config, choose_config, tail_splits
from .operands import (_check_operands, _check_rows, _empty_product, _scale_map_view, _scales,
                       _template)
from .plan import gemm_plan, skinny_plan, skinny_row_scales_by_default, skinny_takes_row_major_scales
from .splitk import _split_k_buffers, _with_split_k


@entry_point
def gemm(a, b, out=None, *, layout: str = "nt", config: GemmConfig | None = None, stream=None,
         pdl: bool = False, debug: bool | None = None, trace: bool = False,
         scale_a: float | None = None, scale_b: float | None = None):
    """C = A @ B^T (``layout="nt"``: A is M x K, B is N x K) or C = A @ B (``"nn"``: B is K x N)
    for bfloat16 tmaflow, torch or cupy arrays; fp32 accumulation, bfloat16 ``out`` (M x N,
    allocated of the caller's kind when None). ``gemm.prepare(...)`` returns the launch ready
    to repeat. fp8 operands, block scales, any shape and stride, the skinny path: docs/gemm.md."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise TmaflowError(f"gemm: layout={layout!r} must be one of {LAYOUTS}")
    if config is not None and not isinstance(config, (GemmConfig, SkinnyConfig)):
        raise TmaflowError(f"gemm: config={config!r} must be a kernels.GemmConfig or kernels.SkinnyConfig")
    if isinstance(config, SkinnyConfig) and layout != "nt":
        raise TmaflowError(f"gemm: a SkinnyConfig takes layout='nt' (got {layout!r})")
    if isinstance(config, SkinnyConfig) and config.tile_fastest:
        raise TmaflowError("gemm: SkinnyConfig tile_fastest=True orders grouped_gemm's decode items; "
                           "a single product takes tile_fastest=False")
    if (type(pdl), type(debug), type(trace)) not in _LAUNCH_OPTIONS.plain:
        pdl, debug, trace = _LAUNCH_OPTIONS.check(pdl, debug, trace)
    A, B = as_array(a), as_array(b)
    m, n, k = _check_operands(A, B, layout)
    scale, blocks, mode = _scales(A, B, scale_a, scale_b)
    if blocks is not None and isinstance(config, GemmConfig) and (config.bn != 128 or config.promote != 1):
        raise TmaflowError(f"gemm: block scales are applied at every k-block: config must be a "
                           f"GemmConfig with bn=128 and promote=1, or a SkinnyConfig (got {config!r})")
    C = None if out is None else given_output("gemm", out, (m, n), BF16)
    ordinal = current_ordinal()
    stream = resolve_stream(stream, (A, B, C), ordinal)
    # scale_a's strides and the mode decide how block scales are read; their layouts, the
    # operands' and the addresses' alignment whether the TMA kernel runs as given
    key = ("gemm", A.dtype.name, A.shape, A.strides, B.shape, B.strides, C and C.strides,
           edge.aligned(A, B, C), layout, config, stream, pdl, A.device, ordinal,
           debug, trace, get_ident(), mode, blocks and (blocks[0].strides, blocks[1].strides, blocks[0].ptr % 16))
    try:
        st, windows = STATES[key]
    except (KeyError, TypeError):
        st = windows = None
    if C is not None:
        ptrs = (A.ptr, B.ptr) if blocks is None else (A.ptr, B.ptr, blocks[0].ptr, blocks[1].ptr)
        if not checks.apart(C.ptr, ptrs, windows):
            windows = checks.no_aliasing("gemm", C, (("a", A), ("b", B), *zip(("scale_a", "scale_b"), blocks or ())))
    if st is None:
        if m == 0 or n == 0 or k == 0:
            return _empty_product(a, A, out, C, (m, n), k, stream, BF16)
        if not edge.gemm_takes_tma(A, B, C, n, mode):
            return edge.gemm(gemm.__wrapped__, a, A, B, out, C, layout=layout, scale_a=scale_a,
                             scale_b=scale_b, scale_mode=mode, options=dict(
                                 config=config, stream=stream, pdl=pdl, debug=debug, trace=trace))
        c_strides = output_strides(C, (m, n), 2)
        st, _ = cached_state(key, lambda: (_gemm_state(A, B, c_strides, m, n, k, layout, config,
                                                       stream, pdl, debug, trace, mode,
                                                       blocks and _scale_map_view(blocks[0], mode)),
                                           windows))
    result, C = (out, C) if C is not None else new_output(a, A, (m, n), BF16, stream)
    if st.tc is None:  # the skinny kernel writes C through its pointer; A's block scales come by map only
        args = (st.ta.bind(A), st.tb.bind(B), C, st.ldc, *_split_k_buffers(st, a, A), *st.tail, scale,
                blocks[1] if blocks else 0)
    else:
        args = (st.ta.bind(A), st.tb.bind(B), st.tc.bind(C), *_split_k_buffers(st, a, A), *st.tail, scale,
                *(blocks or (0, 0)))
    if st.ts is not None:
        args += (st.ts.bind(_scale_map_view(blocks[0], mode)),)
    if st.tc is not None and st.tr is not None:  # a width that is no multiple of 64: its last columns' map
        args += (st.tr.bind(C),)
    return st.launcher, args, result


_LAUNCH_OPTIONS = checks.Options("gemm", pdl=checks.flag(), debug=checks.DEBUG, trace=checks.TRACE)


def block_scale_default(m: int, n: int, k: int, layout: str, block_scales: str, scale_view,
                        sm_count: int) -> GemmConfig | SkinnyConfig:
    """The configuration a block-scaled product takes by default: the dense kernel with K split
    inside clusters where ``block_scale_config`` says so, else the skinny path up to SKINNY_M
    rows where its map can read scale_a (M-major; row-major where
    ``skinny_row_scales_by_default`` and ``skinny_takes_row_major_scales``), else the dense
    kernel (its warp gathers a row-major scale_a). ``scale_view``: scale_a, any array kind."""
    config = block_scale_config(m, n, k, sm_count)
    readable = block_scales == "m_major" or skinny_row_scales_by_default(m, k) and \
        skinny_takes_row_major_scales(as_array(scale_view))
    if readable and layout == "nt" and m <= SKINNY_M and config.cluster_k == 1:
        return SkinnyConfig()
    return config


def _gemm_state(A, B, c_strides, m, n, k, layout, config, stream, pdl, debug,
                trace=False, block_scales=None, scale_view=None) -> _GemmState:
    _LAUNCH_OPTIONS.check(pdl, debug, trace)
    on_current_device("gemm", A)
    checks.same_device("gemm", "b", B, A)
    C = DeviceArray(0, (m, n), "bfloat16", c_strides)  # the layout the output will have
    for name, arr in (("a", A), ("b", B), ("out", C)):
        _check_rows(name, arr)
    device = current_device()
    dtype = A.dtype.name
    if config is None and block_scales:
        config = block_scale_default(m, n, k, layout, block_scales, scale_view, device.sm_count)
    config = config or choose_config(m, n, k, device.sm_count, layout, dtype)
    if isinstance(config, SkinnyConfig):
        return _skinny_state(A, B, c_strides, m, n, k, config, device, stream, pdl, debug, trace,
                             block_scales, scale_view)
    plan = gemm_plan(m, n, k, layout, config, dtype, block_scales)
    kern = get_kernel("gemm_bf16", plan.layout, defines=plan.defines, file="gemm", debug=debug, trace=trace)
    cm, split = plan.config.cluster_m, plan.config.split_k
    size = cm * plan.config.cluster_k  # CTAs a cluster: M tiles sharing B, or K splits of one tile
    # (cm M tiles, N tile) groups: one cluster's work item per K split
    tile_groups = math.ceil(math.ceil(m / BM) / cm) * math.ceil(n / plan.config.bn)
    clusters = max(1, min(tile_groups * split, _resident_clusters(kern, size, device.ordinal)))
    launcher = kern.launcher(grid=size * clusters, block=384, cluster=(size, 1, 1), stream=stream,
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
                      tr=_template(C, plan.spec_c_rem, "store") if plan.spec_c_rem else None,
                      ts=_template(scale_view, plan.spec_s) if plan.spec_s else None)


def _skinny_state(A, B, c_strides, m, n, k, config, device, stream, pdl, debug, trace,
                  block_scales=None, scale_view=None) -> _GemmState:
    if block_scales == "row_major" and not skinny_takes_row_major_scales(scale_view):
        raise TmaflowError(f"gemm: a row-major scale_a reaches the skinny kernel through a TMA map: its base "
                           f"and row pitch must be multiples of 16 bytes (got address {scale_view.ptr:#x}, "
                           f"pitch {scale_view.strides[0]} bytes: ceil(K/128) = {scale_view.shape[1]} "
                           "k-blocks); leave config=None (the dense kernel gathers it) or pass scale_a "
                           "M-major")
    plan = skinny_plan(m, n, k, config, device.sm_count, A.dtype.name, block_scales)
    kern = get_kernel("gemm_skinny_bf16", plan.layout, defines=plan.defines, file="skinny",
                      debug=debug, trace=trace)
    rows, split, cl = plan.config.rows, plan.config.split_k, plan.config.cluster
    halves = plan.config.m_halves  # a cluster's two CTAs: one N tile's halves of M
    # whole clusters; a tile past N loads zeros, stores nothing
    tiles = -(-math.ceil(n / rows) // cl) * cl * halves
    launcher = kern.launcher(grid=(tiles, split, plan.grid_z), block=128 * (1 + rows // 64),
                             cluster=(max(cl, halves), 1, 1), stream=stream, pdl=pdl)
    # skinny_plan fills in split_k; the config type keeps it optional for callers
    launcher, ws = _with_split_k(launcher, split > 1, device, stream)  # type: ignore[operator]
    return _GemmState(launcher=launcher, ta=_template(A, plan.spec_x), tb=_template(B, plan.spec_w),
                      tc=None, ldc=c_strides[0] // 2, tail=(m, n, k, split), plan=plan, workspace=ws,
                      workspace_sizes=(tiles * plan.grid_z, split * n * plan.defines["MP"] * halves * plan.grid_z),
                      ts=_template(scale_view, plan.spec_s) if plan.spec_s else None)


@functools.lru_cache(maxsize=32)
def _resident_clusters(kern, size: int, ordinal: int) -> int:
    """Clusters of ``size`` CTAs that run at once: a persistent grid any larger would leave
    CTAs waiting for a second wave."""
    probe = kern.bind(grid=size, block=384, cluster=(size, 1, 1))
    return probe.max_active_clusters()
