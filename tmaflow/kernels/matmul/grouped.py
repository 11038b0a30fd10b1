"""``grouped_gemm``: the grouped (MoE) GEMM, whose kernel patches the tensor maps of each
group on the device."""
from __future__ import annotations

import math

import numpy as np
from types import SimpleNamespace as _GemmState  # a prepared state's fields
from dataclasses import replace
from threading import get_ident

from ...checks import as_optional_int
from ...dtypes import as_dtype
from ...errors import TensorMapError, TmaflowError
from ...launch.config import resolve_stream
from ...launch.launcher import Launcher
from ...runtime.device import current_device, current_ordinal
from ...runtime.memory import DeviceArray, as_array
from ...tma.tensormap import encode
from ...tma.workspace import DescriptorWorkspace
from .. import checks, edge
from ..entry import (STATES, cached_state, entry_point, given_output, new_output, on_current_device,
                     output_strides, scratch)
from ..registry import get_kernel
from .config import BM, GemmConfig, LAYOUTS, SkinnyConfig
from .dense import _resident_clusters
from .heuristics import GROUPED_HOT_ROWS, grouped_chunk_rows, grouped_config, grouped_wide_tiles
from .operands import _check_rows, _device_offsets, _empty_product, _offsets, _template, _upload
from .plan import gemm_plan, skinny_plan
from .splitk import _refuse_foreign_capture, _split_k_buffers, _with_split_k, call_scratch, keep_for_graphs

UINT8 = as_dtype("uint8")
_GROUPED_OPTIONS = checks.Options("grouped_gemm", pdl=checks.flag(), debug=checks.DEBUG, trace=checks.TRACE)


@entry_point
def grouped_gemm(a, b, offsets, out=None, *, layout: str = "nt",
                 config: GemmConfig | SkinnyConfig | None = None, max_tokens_per_group: int | None = None,
                 stream=None, pdl: bool = False, debug: bool | None = None, trace: bool | str = False):
    """M-grouped GEMM (mixture of experts): for every group g, rows offsets[g] .. offsets[g+1]
    of C = those rows of A @ B[g]^T (``layout="nt"``: B is G x N x K) or of A @ B[g] (``"nn"``:
    B is G x K x N). A is T x K, bfloat16; C is T x N bfloat16, fp32 accumulation.
    ``offsets`` holds G + 1 ints: 0, then the running sums of the group sizes, T last (groups
    may be empty); device or host offsets and the device-patched maps: docs/gemm.md.
    ``max_tokens_per_group``: the largest group's rows, if the caller knows a bound that device
    offsets hide (it sizes the decode path's chunks; a larger group is still computed right).
    A ``SkinnyConfig`` forces the decode path ("nt"), a ``GemmConfig`` the dense one."""
    if (type(pdl), type(debug), type(trace)) not in _GROUPED_OPTIONS.plain:
        pdl, debug, trace = _GROUPED_OPTIONS.check(pdl, debug, trace)
    if config is not None and not isinstance(config, (GemmConfig, SkinnyConfig)):
        raise TmaflowError(f"grouped_gemm: config={config!r} must be None, a kernels.GemmConfig or "
                           "a kernels.SkinnyConfig")
    hint = as_optional_int("grouped_gemm: max_tokens_per_group", max_tokens_per_group, 1, 2**31 - 1)
    if isinstance(config, SkinnyConfig):
        _check_skinny(config, layout)
    if isinstance(config, GemmConfig) and config.cluster_k > 1:
        raise TmaflowError(f"grouped_gemm: cluster_k={config.cluster_k} is for single products "
                           "(gemm); split a grouped product's K with split_k")
    if isinstance(config, GemmConfig) and config.cluster_m > 2:
        raise TmaflowError(f"grouped_gemm: cluster_m={config.cluster_m} is for single products (gemm); "
                           "use cluster_m=1 or 2")
    if isinstance(config, GemmConfig) and config.bn % 64:
        raise TmaflowError(f"grouped_gemm: bn={config.bn} (no multiple of 64) is for single products "
                           "(gemm); use 64, 128, 192 or 256 columns")
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
    C = None if out is None else given_output("grouped_gemm", out, (t, n), A.dtype)
    ordinal = current_ordinal()
    stream = resolve_stream(stream, (A, B, C), ordinal)
    sizes = chunks = None  # the groups' rows and the chunks of those with rows, where the host knows them
    if _device_offsets(offsets):
        offs, known = _offsets("grouped_gemm", offsets, g, t, A.device, stream), hint
    else:  # the host knows every group's size: the largest sizes the decode path's chunks
        host = checks.host_offsets("grouped_gemm", offsets, g, t)
        sizes = np.diff(host)
        known = int(sizes.max()) if g else 0
        if hint is not None and known > hint:
            group = int(np.argmax(sizes))
            raise TmaflowError(f"grouped_gemm: max_tokens_per_group={hint} but group {group} has "
                               f"{known} rows (offsets {host.tolist()}); pass a bound at least the "
                               "largest group, or None")
        on_current_device("grouped_gemm", A)  # (before the upload: another device's call runs again)
        offs = _upload(host, A.device, stream)
    # device offsets are the caller's array, which out must not overlap (host ones are uploaded)
    given = as_array(offs) if C is not None and offs is offsets else None
    chunk = grouped_chunk_rows(known)  # the decode path's rows a chunk (a kernel variant)
    hot = known is not None and known > GROUPED_HOT_ROWS  # the default route takes the dense path
    wide = None  # host offsets: their chunks decide the decode path's tiles (grouped_wide_tiles)
    if sizes is not None and config is None:
        chunks = int(np.sum(-(-sizes // chunk)))
        wide = grouped_wide_tiles(t, n, g, (A.device or current_device()).sm_count, chunks)  # (no driver call)
    key = ("grouped_gemm", A.shape, A.strides, B.shape, B.strides, layout, C and C.strides,
           given and given.strides, edge.aligned(A, B, C), config, chunk, hot, known is None, wide, stream, pdl,
           A.device, ordinal, debug, trace, get_ident())
    try:
        st, windows = STATES[key]
    except (KeyError, TypeError):
        st = windows = None
    if C is not None and not checks.apart(C.ptr, (A.ptr, B.ptr, given.ptr if given else 0), windows):
        windows = checks.no_aliasing("grouped_gemm", C, (("a", A), ("b", B), ("offsets", given)))
    if st is None:
        if t == 0 or n == 0 or k == 0:
            return _empty_product(a, A, out, C, (t, n), k, stream)
        if not edge.grouped_takes_tma(A, B, C, n, layout):
            return edge.grouped_gemm(grouped_gemm.__wrapped__, a, A, B, offs, out, C, layout=layout,
                                     options=dict(config=config, max_tokens_per_group=known or None,
                                                  stream=stream, pdl=pdl, debug=debug, trace=trace))
        c_strides = output_strides(C, (t, n), 2)
        st, _ = cached_state(key, lambda: (_grouped_state(A, c_strides, t, n, k, g, layout, config, chunk,
                                                          known, chunks, stream, pdl, debug, trace), windows))
    result, C = (out, C) if C is not None else new_output(a, A, (t, n), None, stream)
    B2 = B._as((g * B.shape[1], B.shape[2]), (B.shape[2] * 2, 2))  # the experts one after another
    if st.tc is None:  # the decode path writes C through its pointer
        return st.launcher, (st.ta.bind(A), st.ta8.bind(A), st.tb.bind(B2), C, st.ldc, n, k, offs, g), result
    # a captured call's C-map slots are its own, as its split-K buffers (splitk.call_scratch); the
    # kernel writes every slot it reads
    captured = call_scratch(stream, A)
    slots = scratch(a, A, (st.slots.array.nbytes,), UINT8, stream) if captured else st.slots.array
    if captured is False:
        keep_for_graphs(slots)
    return st.launcher, (st.ta.bind(A), st.tb.bind(B2), st.tc.bind(C), *_split_k_buffers(st, a, A, captured), t, n, k,
                         st.split, offs, g, slots, 1.0, 0, 0), result  # the slots' DeviceArray: a C-plan kind


def _check_skinny(config: SkinnyConfig, layout: str) -> None:
    """The grouped decode kernel: "nt", no K splits, no clusters (skinny.cu's GROUPED)."""
    if layout != "nt":
        raise TmaflowError(f"grouped_gemm: a SkinnyConfig takes layout='nt' (got {layout!r}); use a "
                           "GemmConfig or None")
    for name, got, want in (("split_k", config.split_k, (None, 1)), ("cluster", config.cluster, (1,)),
                            ("m_rows", config.m_rows, (None,)), ("m_halves", config.m_halves, (1,))):
        if got not in want:
            raise TmaflowError(f"grouped_gemm: SkinnyConfig {name}={got} is for single products (gemm); "
                               f"the grouped decode path takes {name}={want[-1]}")


def _grouped_state(A, c_strides, t, n, k, g, layout, config, chunk, known, chunks, stream, pdl, debug,
                   trace) -> _GemmState:
    _GROUPED_OPTIONS.check(pdl, debug, trace)
    on_current_device("grouped_gemm", A)
    C = DeviceArray(0, (t, n), "bfloat16", c_strides)
    for name, arr in (("a", A), ("out", C)):
        _check_rows(name, arr)
    device = current_device()
    if getattr(config, "split_tail", False):
        raise TmaflowError("grouped_gemm: split_tail=True is for single products (a group's tiles "
                           "change with its offsets); use split_k")
    config = config or grouped_config(t, n, k, g, device.sm_count, layout, known, chunks)
    if isinstance(config, SkinnyConfig):
        return _skinny_state(A, C, t, n, k, g, config, chunk, device, stream, pdl, debug, trace)
    plan = gemm_plan(max(t, 1), n, k, layout, config)
    patch = {"PATCH_ALL": 1} if config.patch_full_tiles else {}
    kern = get_kernel("gemm_bf16", plan.layout, defines=dict(plan.defines, GROUPED=1, **patch), file="gemm",
                      debug=debug, trace=trace)
    cm = plan.config.cluster_m
    clusters = _resident_clusters(kern, cm, device.ordinal)
    launcher: Launcher | _ProvedSlots
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


def _skinny_state(A, C, t, n, k, g, config, chunk, device, stream, pdl, debug, trace) -> _GemmState:
    """The decode path: persistent CTAs over (group, chunk of ``chunk`` rows, 64-row tile of the
    expert) items, counted on the device from the offsets (skinny.cu's GROUPED)."""
    plan = skinny_plan(chunk, g * n, k, replace(config, split_k=1), device.sm_count)
    order = {"TILE_FASTEST": 1} if config.tile_fastest else {}
    kern = get_kernel("gemm_skinny_bf16", plan.layout, defines=dict(plan.defines, GROUPED=1, **order),
                      file="skinny", debug=debug, trace=trace)
    rows = plan.config.rows
    items = (math.ceil(t / chunk) + g) * math.ceil(n / rows)  # at most: a group adds one partial chunk
    launcher = kern.launcher(grid=max(1, min(items, device.sm_count)), block=128 * (1 + rows // 64),
                             stream=stream, pdl=pdl)
    B2 = DeviceArray(0, (g * n, k), "bfloat16", (k * 2, 2))
    rows8 = replace(plan.spec_x, box=(8, plan.spec_x.box[1]))  # a partial chunk's A, 8 rows a box
    return _GemmState(launcher=launcher, ta=_template(A, plan.spec_x), ta8=_template(A, rows8),
                      tb=_template(B2, plan.spec_w), tc=None, ldc=C.strides[0] // 2, plan=plan)


class _ProvedSlots:
    """A debug grouped launch: the C-map slots are cleared before it, and after it every slot
    a CTA patched must equal the host encode of the C map clipped at some group's end, byte
    for byte (a wrong patch or a stale slot raises TensorMapError naming the slot)."""

    def __init__(self, launcher, slots):
        self.launcher, self.slots = launcher, slots

    def __call__(self, *args) -> None:
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
