"""Python entry points of the example kernels. Each accepts tmaflow, torch or cupy arrays,
returns an output of the caller's kind, and has ``.prepare(...)`` for timing loops."""
from __future__ import annotations

import functools
import math
from threading import get_ident

from ..checks import as_float, as_int
from ..errors import TmaflowError
from ..launch.config import resolve_stream
from ..runtime.device import current_device, current_ordinal
from ..runtime.memory import as_array
from ..tma.layout import Barrier, Buffer, Pipeline, SharedLayout
from ..tma.spec import TensorMapSpec
from ..tma.tensormap import MapTemplate, TensorMap
from . import checks, edge
from .entry import (STATES, cached_state, contiguous_strides, entry_point, given_output, new_output,
                    on_current_device, output_strides)
from .registry import get_kernel

def _persistent_grid(tiles: int, per_sm: int = 1) -> int:
    return max(1, min(tiles, current_device().sm_count * per_sm))


def _padded(shape, itemsize: int) -> tuple:
    """Row-major strides of ``shape`` with rows padded to 16 bytes: a plan only needs its
    boxes and byte counts, which do not depend on the pitch; the maps a call encodes use the
    arrays' real strides (which TMA requires to be 16-byte multiples)."""
    row = -(-shape[-1] * itemsize // 16) * 16 // itemsize  # elements (itemsize divides 16)
    return contiguous_strides((*shape[:-1], row), itemsize)


class _State:
    """A prepared entry point for one key: launcher, map templates, fixed arguments."""

    def __init__(self, launcher, src=None, dst=None, extra=(), **more):
        self.launcher, self.src, self.dst, self.extra = launcher, src, dst, tuple(extra)
        self.__dict__.update(more)


# --- tile copy ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=64)  # plans are pure: build each once
def copy_plan(dtype, shape, box=None, stages: int | None = None):
    """(spec, layout, defines) of the persistent tile copy for a 2-D ``shape``."""
    itemsize = TensorMapSpec.tiled(dtype, (1, 16), (1, 16)).dtype.itemsize
    if not box:  # 64 KB boxes, or as large as the stages asked for allow
        rows = 64 * 4 // itemsize
        while stages and rows > 1 and stages * rows * 256 * itemsize > 200 * 1024:
            rows //= 2
        box = (min(rows, max(shape[0], 1)), 256)
    spec = TensorMapSpec.tiled(dtype, shape, tuple(box), strides=_padded(shape, itemsize))
    stages = stages or max(2, min(3, (200 * 1024) // spec.smem_bytes))
    layout = SharedLayout([Pipeline("tiles", stages=stages, tiles=[spec])])
    return spec, layout, {"BOX_X": box[1], "BOX_Y": box[0]}


@entry_point
def copy(src, dst=None, *, box=None, stages=None, ctas_per_sm: int = 1,
         l2_promotion: str = "none", flatten: bool | None = None, evict_first: bool = True,
         stores: int = 2, stream=None, pdl: bool = False, debug: bool | None = None,
         trace: bool = False):
    """dst = src for a 2-D array through a persistent, multi-stage TMA load -> store loop.
    Other ranks, empty arrays and layouts the TMA cannot address take ``edge.copy``.

    With ``flatten``, two contiguous arrays are tiled as (size / 256, 256) views, so every box
    is one contiguous range of memory. By default (``None``) that is done only when rows are
    not a multiple of the box width (narrow or ragged rows would leave boxes partly empty);
    wide rows are copied as they are, which measured faster (1 GiB fp32 on H200: 0.965 of
    cuMemcpyDtoD against 0.933 flattened). The other defaults (64 KB boxes, 3 stages, 2 stores
    in flight, evict-first loads) are the fastest configuration the bandwidth sweep found.
    """
    if (type(box), type(stages), type(ctas_per_sm), type(l2_promotion), type(flatten), type(evict_first),
            type(stores), type(pdl), type(debug), type(trace)) not in _COPY_OPTIONS.plain:
        box, stages, ctas_per_sm, l2_promotion, flatten, evict_first, stores, pdl, debug, trace = \
            _COPY_OPTIONS.check(box, stages, ctas_per_sm, l2_promotion, flatten, evict_first, stores, pdl,
                                debug, trace)
    a = as_array(src)
    o = None if dst is None else given_output("copy", dst, a.shape, a.dtype, bits_only=True)
    ordinal = current_ordinal()
    stream = resolve_stream(stream, (a, o), ordinal)
    key = ("copy", a.shape, a.strides, a.dtype.name, o and o.strides, edge.aligned(a, o), box, stages,
           ctas_per_sm, l2_promotion, flatten, evict_first, stores, stream, pdl, a.device, ordinal,
           debug, trace, get_ident())
    try:
        st, windows = STATES[key]
    except (KeyError, TypeError):
        st = windows = None
    if o is not None and not checks.apart(o.ptr, (a.ptr,), windows):
        windows = checks.no_aliasing("copy", o, (("src", a),))
    if st is None:
        if not edge.takes_tma(a, o):
            return edge.copy(copy.__wrapped__, src, a, dst, o, dict(
                box=box, stages=stages, ctas_per_sm=ctas_per_sm, l2_promotion=l2_promotion,
                flatten=flatten, evict_first=evict_first, stores=stores, stream=stream, pdl=pdl,
                debug=debug, trace=trace))
        st, _ = cached_state(key, lambda: (_copy_state(a, o, box, stages, ctas_per_sm, l2_promotion,
                                                       flatten, evict_first, stores, stream, pdl,
                                                       debug, trace), windows))
    if o is None:
        dst, o = new_output(src, a, a.shape, None, stream)
    if st.flat:
        a, o = a._as(st.shape, st.strides), o._as(st.shape, st.strides)
    return st.launcher, (st.src.bind(a), st.dst.bind(o), *st.extra), dst


_COPY_OPTIONS = checks.Options(
    "copy", box=checks.box(optional=True), stages=checks.integer(2, 32, optional=True),
    ctas_per_sm=checks.integer(1, 32), l2_promotion=checks.choice(*checks.L2_PROMOTIONS),
    flatten=checks.flag(optional=True), evict_first=checks.flag(), stores=checks.integer(1, 31),
    pdl=checks.flag(), debug=checks.DEBUG, trace=checks.TRACE)


def _copy_state(a, o, box, stages, ctas_per_sm, l2_promotion, flatten, evict_first,
                stores, stream, pdl, debug, trace=False):
    _COPY_OPTIONS.check(box, stages, ctas_per_sm, l2_promotion, flatten, evict_first, stores, pdl, debug, trace)
    if a.ndim != 2:
        raise TmaflowError(f"copy: src must be 2-D (got shape {a.shape}); reshape it")
    on_current_device("copy", a)
    contiguous = contiguous_strides(a.shape, a.dtype.itemsize)
    o_strides = o.strides if o is not None else contiguous
    width = box[1] if box is not None else 256
    if flatten is None:
        flatten = a.shape[1] % width != 0
    flat = bool(flatten and a.strides == contiguous == o_strides and a.size % width == 0)
    shape = (a.size // width, width) if flat else a.shape
    spec, layout, defines = copy_plan(a.dtype, shape, box, stages)
    defines = dict(defines)  # the cached plan's dict stays untouched
    if evict_first:
        defines["EVICT_FIRST"] = 1
    if not 1 <= stores < layout.items[0].stages:
        raise TmaflowError(f"copy: stores={stores} must be in [1, stages - 1] "
                           f"(stages={layout.items[0].stages})")
    defines["STORES"] = stores
    box = spec.box
    k = get_kernel("tile_copy", layout, defines, debug=debug, trace=trace)
    tiles_y, tiles_x = math.ceil(shape[0] / box[0]), math.ceil(shape[1] / box[1])
    launcher = k.launcher(grid=_persistent_grid(tiles_x * tiles_y, ctas_per_sm), block=32,
                          stream=stream, pdl=pdl)
    out_spec = TensorMapSpec.tiled(a.dtype, shape, box, l2_promotion=l2_promotion,
                                   strides=None if flat else o_strides)
    in_spec = TensorMapSpec.tiled(a.dtype, shape, box, l2_promotion=l2_promotion,
                                  strides=None if flat else a.strides)
    return _State(launcher, MapTemplate(in_spec), MapTemplate(out_spec, "store"), (tiles_x, tiles_y),
                  flat=flat, shape=shape, strides=in_spec.strides)


# --- transpose ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=64)  # plans are pure: build each once
def transpose_plan(shape, stages: int = 4):
    spec_in = TensorMapSpec.tiled("float32", shape, (128, 32), swizzle="128B", strides=_padded(shape, 4))
    spec_out = TensorMapSpec.tiled("float32", shape[::-1], (32, 32), swizzle="128B",
                                   strides=_padded(shape[::-1], 4))
    layout = SharedLayout([Pipeline("tin", stages=stages, tiles=[spec_in], consumers=1),
                           Buffer("tout", 2 * 4 * spec_out.smem_bytes, align=1024)])
    return spec_in, spec_out, layout


_TRANSPOSE_OPTIONS = checks.Options("transpose", debug=checks.DEBUG)


@entry_point
def transpose(a, out=None, *, stream=None, debug: bool | None = None):
    """out = a.T for a 2-D 4-byte array, through 128B-swizzled shared memory (layouts the TMA
    cannot address, and empty arrays, through ``edge.transpose``)."""
    if (type(debug),) not in _TRANSPOSE_OPTIONS.plain:
        (debug,) = _TRANSPOSE_OPTIONS.check(debug)
    x = as_array(a)
    if x.ndim != 2 or x.dtype.itemsize != 4:
        raise TmaflowError(f"transpose: needs a 2-D 4-byte array (got {x.shape} {x.dtype})")
    shape_t = (x.shape[1], x.shape[0])
    o = None if out is None else given_output("transpose", out, shape_t, x.dtype, bits_only=True)
    ordinal = current_ordinal()
    stream = resolve_stream(stream, (x, o), ordinal)
    key = ("transpose", x.shape, x.strides, x.dtype.name, o and o.strides, edge.aligned(x, o), stream,
           x.device, ordinal, debug, get_ident())
    try:
        st, windows = STATES[key]
    except (KeyError, TypeError):
        st = windows = None
    if o is not None and not checks.apart(o.ptr, (x.ptr,), windows):
        windows = checks.no_aliasing("transpose", o, (("a", x),))
    if st is None:
        if not edge.takes_tma(x, o, transposed=True):
            return edge.transpose(a, x, out, o, stream, debug)
        st, _ = cached_state(key, lambda: (_transpose_state(x, o, stream, debug), windows))
    if o is None:
        out, o = new_output(a, x, shape_t, None, stream)
    return st.launcher, (st.src.bind(x), st.dst.bind(o), *st.extra), out


def _transpose_state(x, o, stream, debug) -> _State:
    _TRANSPOSE_OPTIONS.check(debug)
    on_current_device("transpose", x)
    shape_t = (x.shape[1], x.shape[0])
    spec_in, spec_out, layout = transpose_plan(x.shape)
    k = get_kernel("transpose", layout, debug=debug)
    tiles_x, tiles_y = math.ceil(x.shape[1] / 32), math.ceil(x.shape[0] / 128)
    launcher = k.launcher(grid=_persistent_grid(tiles_x * tiles_y), block=256, stream=stream)
    tin = TensorMapSpec.tiled(x.dtype, x.shape, spec_in.box, strides=x.strides, swizzle="128B")
    tout = TensorMapSpec.tiled(x.dtype, shape_t, spec_out.box, strides=output_strides(o, shape_t, 4),
                               swizzle="128B")
    return _State(launcher, MapTemplate(tin), MapTemplate(tout, "store"), (tiles_x, tiles_y))


# --- softmax --------------------------------------------------------------------------------
SOFTMAX_SMEM = 200 * 1024
SOFTMAX_MAX_COLS = SOFTMAX_SMEM // 2 // 1024 * 256  # two stages of one row of 256-column boxes


def softmax_plan(shape, rows: int = 4, stages: int = 3):
    """A stage holds ``rows`` rows as n_box boxes of (rows, 256) placed back to back, which
    is planned as one (rows * n_box, 256) tile: same bytes, same transaction count. The
    kernel's loop needs at least two stages (it refills a stage after the store of the one
    before has read it), so long rows take fewer rows per stage; rows too long for two
    stages of one row are refused."""
    return _softmax_plan(tuple(shape), as_int("softmax: rows", rows, 1, 8),  # 128 threads a row, 1024 a block
                         as_int("softmax: stages", stages, 2, 32))  # at most: as many as shared memory holds


@functools.lru_cache(maxsize=64)  # plans are pure: build each once
def _softmax_plan(shape: tuple, rows: int, stages: int):
    n_box = math.ceil(shape[1] / 256)
    stage_bytes = lambda r: r * n_box * 256 * 4  # noqa: E731
    while rows > 1 and 2 * stage_bytes(rows) > SOFTMAX_SMEM:
        rows //= 2
    if 2 * stage_bytes(rows) > SOFTMAX_SMEM:
        raise TmaflowError(f"softmax: rows of {shape[1]} float32 need {stage_bytes(1)} B of shared "
                           f"memory per stage and the kernel needs two stages in "
                           f"{SOFTMAX_SMEM} B; at most {SOFTMAX_MAX_COLS} columns fit")
    spec = TensorMapSpec.tiled("float32", shape, (rows, 256), strides=_padded(shape, 4))
    stage = TensorMapSpec.tiled("float32", (rows * n_box, 256), (rows * n_box, 256))
    stages = max(2, min(stages, SOFTMAX_SMEM // stage.smem_bytes))
    layout = SharedLayout([Pipeline("rows", stages=stages, tiles=[stage])])
    return spec, layout, {"ROWS": rows, "NBOX": n_box, "WPR": 4}


@entry_point
def softmax(x, out=None, *, stream=None, pdl: bool = False, debug: bool | None = None,
            trace: bool = False):
    """Softmax over the last dim of a float32 array: 2-D rows loaded and stored by TMA;
    other ranks, widths and strides through ``edge.softmax``. ``out`` may be ``x`` itself (each
    row is read whole before it is written), but no other view overlapping it."""
    if (type(pdl), type(debug), type(trace)) not in _SOFTMAX_OPTIONS.plain:
        pdl, debug, trace = _SOFTMAX_OPTIONS.check(pdl, debug, trace)
    a = as_array(x)
    o = None if out is None else given_output("softmax", out, a.shape, a.dtype)
    ordinal = current_ordinal()
    stream = resolve_stream(stream, (a, o), ordinal)
    key = ("softmax", a.shape, a.strides, a.dtype.name, o and o.strides, edge.aligned(a, o), stream, pdl,
           a.device, ordinal, debug, trace, get_ident())
    try:
        st, windows = STATES[key]
    except (KeyError, TypeError):
        st = windows = None
    if o is not None and not checks.apart(o.ptr, (a.ptr,), windows):
        windows = checks.no_aliasing("softmax", o, (("x", a),), in_place="x")
    if st is None:
        if not edge.takes_tma(a, o) or a.shape[1] > SOFTMAX_MAX_COLS:
            return edge.softmax(softmax.__wrapped__, x, a, out, o, SOFTMAX_MAX_COLS,
                                dict(stream=stream, pdl=pdl, debug=debug, trace=trace))
        st, _ = cached_state(key, lambda: (_softmax_state(a, o, stream, pdl, debug, trace), windows))
    if o is None:
        out, o = new_output(x, a, a.shape, None, stream)
    return st.launcher, (st.src.bind(a), st.dst.bind(o), *st.extra), out


_SOFTMAX_OPTIONS = checks.Options("softmax", pdl=checks.flag(), debug=checks.DEBUG, trace=checks.TRACE)


def _softmax_state(a, o, stream, pdl, debug, trace=False) -> _State:
    _SOFTMAX_OPTIONS.check(pdl, debug, trace)
    if a.ndim != 2 or a.dtype.name != "float32":
        raise TmaflowError(f"softmax: needs a 2-D float32 array (got {a.shape} {a.dtype})")
    on_current_device("softmax", a)
    spec, layout, defines = softmax_plan(a.shape)
    k = get_kernel("softmax", layout, defines, debug=debug, trace=trace)
    rows = defines["ROWS"]
    groups = math.ceil(a.shape[0] / rows)
    launcher = k.launcher(grid=_persistent_grid(groups), block=32 * rows * defines["WPR"],
                          stream=stream, pdl=pdl)
    tin = TensorMapSpec.tiled(a.dtype, a.shape, spec.box, strides=a.strides)
    tout = TensorMapSpec.tiled(a.dtype, a.shape, spec.box, strides=output_strides(o, a.shape, 4))
    return _State(launcher, MapTemplate(tin), MapTemplate(tout, "store"), (a.shape[1], groups))


# --- TMA reduce-add --------------------------------------------------------------------------
_REDUCE_OPTIONS = checks.Options("reduce_add", box=checks.box(), debug=checks.DEBUG)


@entry_point
def reduce_add(parts, out, *, box=(32, 64), stream=None, debug: bool | None = None):
    """out += sum(parts, axis=0) with cp.reduce.async.bulk.tensor (float32 or int32)."""
    box, debug = _REDUCE_OPTIONS.check(box, debug)
    p, o = as_array(parts), as_array(out)
    if p.ndim != 3 or o.shape != p.shape[1:] or p.dtype != o.dtype:
        raise TmaflowError(f"reduce_add: parts {p.shape} {p.dtype} must be (P, M, N) over out "
                           f"{o.shape} {o.dtype}")
    checks.no_aliasing("reduce_add", o, (("parts", p),))
    for arr in (p, o):
        on_current_device("reduce_add", arr)
    stream = resolve_stream(stream, (p, o), current_ordinal())
    tp = TensorMap.tiled(p, (1, *box))
    to = TensorMap.tiled(o, box)
    layout = SharedLayout([Buffer("tile", tp.spec.smem_bytes, align=128),
                           Barrier("loaded", arrivals=1, tx_bytes=tp.spec.tx_bytes)])
    k = get_kernel("reduce_add", layout, {"BOX_X": box[1], "BOX_Y": box[0]}, debug=debug)
    tiles_x, tiles_y = math.ceil(o.shape[1] / box[1]), math.ceil(o.shape[0] / box[0])
    launcher = k.launcher(grid=(tiles_x * tiles_y, p.shape[0]), block=32, stream=stream)
    return launcher, (tp, to, tiles_x), out


# --- multicast broadcast ------------------------------------------------------------------------
@functools.lru_cache(maxsize=64)  # plans are pure: build each once
def broadcast_plan(k_tiles: int, cluster: int, stages: int = 4, wrows: int = 32):
    w_spec = TensorMapSpec.tiled("float32", (k_tiles * wrows, 256), (wrows, 256))
    x_spec = TensorMapSpec.tiled("float32", (32, 256), (32, 256))
    pipe = Pipeline("w", stages=stages, tiles=[w_spec], consumers=4,
                    multicast=["x"] if cluster > 1 else None, cluster=(cluster, 1, 1))
    layout = SharedLayout([pipe, Buffer("xtile", x_spec.smem_bytes),
                           Barrier("xbar", arrivals=1, tx_bytes=x_spec.tx_bytes)])
    return pipe, layout


_BROADCAST_OPTIONS = checks.Options(
    "broadcast_scale", cluster=checks.integer(1, 16), stages=checks.integer(1, 32),
    wrows=checks.one_of_ints(32, 64), group_size=checks.integer(1, optional=True),
    iters=checks.integer(1, 2**31 - 1, optional=True), sparse=checks.one_of_ints(1, 2, 4, 8, 16, 32, 64),
    debug=checks.DEBUG)


@entry_point
def broadcast_scale(x, w, out=None, *, cluster: int = 1, stages: int = 4, wrows: int = 32,
                    group_size: int | None = None, iters: int | None = None, sparse: int = 1,
                    stream=None, debug: bool | None = None):
    """Broadcast-heavy reduction: out[b] = x[b] * sum over ``iters`` w tiles of CTA b's group.

    x is (B*32, 256) float32 (one 32-row block per CTA), w is (T*wrows, 256). By default all
    CTAs form one group reading every w tile once. With ``group_size`` g, consecutive groups of
    g CTAs own T / (B / g) tiles each and cycle through them ``iters`` times in total. With
    ``cluster`` > 1 the cluster's lowest rank loads each tile once and multicasts it. With
    ``sparse`` s, a consumer adds only every s-th 4 KB block of a tile (block j of tile k when
    j % s == k % s), so loads rather than shared-memory reads dominate.
    """
    cluster, stages, wrows, group_size, iters, sparse, debug = _BROADCAST_OPTIONS.check(
        cluster, stages, wrows, group_size, iters, sparse, debug)
    xa, wa = as_array(x), as_array(w)
    if xa.ndim != 2 or wa.ndim != 2 or xa.dtype.name != "float32" or wa.dtype != xa.dtype or \
            xa.shape[1] != 256 or wa.shape[1] != 256 or xa.shape[0] % 32 or wa.shape[0] % wrows \
            or not xa.shape[0] or not wa.shape[0]:
        raise TmaflowError(f"broadcast_scale: x must be (n*32, 256) and w (k*{wrows}, 256) float32, "
                           f"n and k >= 1 (got {xa.shape} {xa.dtype}, {wa.shape} {wa.dtype})")
    blocks, w_tiles = xa.shape[0] // 32, wa.shape[0] // wrows
    group_size = group_size or blocks
    if blocks % group_size or group_size % cluster or w_tiles % (blocks // group_size):
        raise TmaflowError(f"broadcast_scale: group_size={group_size} must divide the {blocks} "
                           f"CTAs, be a multiple of cluster={cluster}, and the groups must split "
                           f"the {w_tiles} w tiles evenly")
    group_tiles = w_tiles // (blocks // group_size)
    iters = iters or group_tiles
    o = None if out is None else given_output("broadcast_scale", out, xa.shape, xa.dtype)
    if o is not None:
        checks.no_aliasing("broadcast_scale", o, (("x", xa), ("w", wa)))
    for arr in (xa, wa, o):
        if arr is not None:
            on_current_device("broadcast_scale", arr)
    stream = resolve_stream(stream, (xa, wa, o), current_ordinal())
    result, o = (out, o) if o is not None else new_output(x, xa, xa.shape, None, stream)
    _, layout = broadcast_plan(w_tiles, cluster, stages, wrows)
    k = get_kernel("broadcast_scale", layout, {"WROWS": wrows, "SPARSE": sparse}, debug=debug)
    tx, tw = TensorMap.tiled(xa, (32, 256)), TensorMap.tiled(wa, (wrows, 256))
    launcher = k.launcher(grid=blocks, block=160, cluster=(cluster, 1, 1), stream=stream)
    return launcher, (tx, tw, o, iters, group_size, group_tiles), result


def broadcast_reference(x, w, *, group_size=None, iters=None, wrows=32, only=None, sparse=1):
    """numpy reference of broadcast_scale (float64); ``only``: just the first CTAs' rows."""
    import numpy as np

    blocks, w_tiles = x.shape[0] // 32, w.shape[0] // wrows
    group_size = group_size or blocks
    group_tiles = w_tiles // (blocks // group_size)
    iters = iters or group_tiles
    tiles = w.reshape(w_tiles, wrows // 32, 32, 256).sum(1, dtype=np.float64)
    count = only or blocks
    out = np.empty((count, 32, 256))
    for b in range(count):
        g = b // group_size
        acc = np.zeros(32 * 256)
        block = np.arange(32 * 256) // 128  # the 4 KB block j of each element
        for k in range(iters):
            use = (block % sparse) == (k % sparse)
            acc[use] += tiles[g * group_tiles + k % group_tiles].ravel()[use]
        out[b] = x.reshape(blocks, 32, 256)[b] * acc.reshape(32, 256)
    return out.reshape(count * 32, 256)


# --- LDGSTS vs TMA ------------------------------------------------------------------------------
_AXPB_OPTIONS = checks.Options("axpb", method=checks.choice("tma", "ldgsts"), debug=checks.DEBUG)


@entry_point
def axpb(x, a: float, b: float, out=None, *, method: str = "tma", stream=None,
         debug: bool | None = None):
    """out = a * x + b over a 1-D float32 array whose length is a multiple of 4096, double
    buffered through smem with LDGSTS (``method="ldgsts"``) or 1-D TMA bulk copies."""
    a, b = as_float("axpb: a", a), as_float("axpb: b", b)
    method, debug = _AXPB_OPTIONS.check(method, debug)
    xa = as_array(x)
    if xa.ndim != 1 or xa.size % 4096 or xa.dtype.name != "float32":
        raise TmaflowError(f"axpb: needs a 1-D float32 array with a multiple of 4096 elements "
                           f"(got {xa.shape} {xa.dtype})")
    o = None if out is None else given_output("axpb", out, xa.shape, xa.dtype)
    if o is not None:
        checks.no_aliasing("axpb", o, (("x", xa),))
    for arr in (xa, o):
        if arr is not None:
            on_current_device("axpb", arr)
    stream = resolve_stream(stream, (xa, o), current_ordinal())
    result, o = (out, o) if o is not None else new_output(x, xa, xa.shape, None, stream)
    k = get_kernel(f"axpb_{method}", None, debug=debug)
    launcher = k.launcher(grid=_persistent_grid(xa.size // 4096, 4), block=256, stream=stream)
    return launcher, (xa, o, a, b, xa.size), result
