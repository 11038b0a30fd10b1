"""Attention forward written with tmaflow (``attention.cu``): the plan (3-D tensor maps of Q, K
and V, a one-stage pipeline for Q and a multi-stage one each for K and V tiles) and the entry
point ``kernels.attention``; and ``kernels.attention_cp_async``, seed 002's pre-Hopper schedule
(``attention_cp_async.cu``), kept beside it to compare."""
from __future__ import annotations

import functools
import math
from threading import get_ident
from types import SimpleNamespace

from ..dtypes import as_dtype
from ..errors import TmaflowError
from ..launch.config import resolve_stream
from ..runtime.device import current_device, current_ordinal
from ..runtime.memory import as_array
from ..tma.layout import HOPPER_SMEM_LIMIT, Pipeline, SharedLayout
from ..tma.spec import TensorMapSpec
from ..tma.tensormap import MapTemplate
from . import checks
from .entry import (STATES, cached_state, contiguous_strides, entry_point, given_output, new_output,
                    on_current_device, packed)
from .registry import get_kernel

BM = 128                  # query rows a work tile
HEAD_DIMS = (64, 128, 256)
DTYPES = ("bfloat16", "float16")
_BARRIER_RESERVE = 256


def keys_per_tile(head_dim: int, causal: bool) -> int:
    """64 at head dim 256 (its O accumulators take 128 registers a thread); 176 at head dim 128
    without a causal mask (as attention.cu's BN), else 128."""
    return 64 if head_dim == 256 else 176 if head_dim == 128 and not causal else 128


@functools.lru_cache(maxsize=16)
def attention_plan(head_dim: int, causal: bool = False) -> tuple:
    """(Q box spec, K/V box spec, shared layout) for a head dimension; the shapes (and the
    dtype: fp16 has bf16's bytes) in the specs are placeholders (the layout needs only box bytes;
    calls bind maps of the real shapes and dtype).

    K and V are separate pipelines (K_j is needed a step before V_j, and each goes back as
    soon as its GEMM is done); they take equal stages, up to four, and K any bytes left over."""
    if head_dim not in HEAD_DIMS:
        raise TmaflowError(f"attention: head dim {head_dim} is not supported; use one of {HEAD_DIMS}")
    box = {"swizzle": "128B"}
    spec_q = TensorMapSpec.tiled("bfloat16", (1, BM, head_dim), (1, BM, 64), **box)
    bn = keys_per_tile(head_dim, causal)
    spec_kv = TensorMapSpec.tiled("bfloat16", (1, bn, head_dim), (1, bn, 64), **box)
    boxes = head_dim // 64
    q_bytes, kv_bytes = boxes * spec_q.smem_bytes, boxes * spec_kv.smem_bytes
    budget = HOPPER_SMEM_LIMIT - _BARRIER_RESERVE
    pairs = min(4, (budget - q_bytes) // (2 * kv_bytes))
    k_stages = pairs + (pairs < 4 and budget - q_bytes - 2 * pairs * kv_bytes >= kv_bytes)
    layout = SharedLayout([Pipeline("qp", stages=1, tiles={"q": (spec_q, boxes)}, consumers=8),
                           Pipeline("kp", stages=k_stages, tiles={"k": (spec_kv, boxes)}, consumers=8),
                           Pipeline("vp", stages=pairs, tiles={"v": (spec_kv, boxes)}, consumers=8)])
    return spec_q, spec_kv, layout


def _check(q, k, v, head_dims=HEAD_DIMS, who="attention", dtypes=DTYPES):
    for name, arr in (("q", q), ("k", k), ("v", v)):
        if len(arr.shape) != 4:
            raise TmaflowError(f"{who}: {name} must be 4-D (batch, heads, seq, head_dim); got shape {arr.shape}")
        if arr.dtype.name not in dtypes:
            raise TmaflowError(f"{who}: {name} must be {' or '.join(dtypes)} (got {arr.dtype.name})")
        if arr.dtype is not q.dtype:
            raise TmaflowError(f"{who}: {name} is {arr.dtype.name} but q is {q.dtype.name}; q, k and v "
                               "must have one dtype")
        if arr.strides != contiguous_strides(arr.shape, 2):
            raise TmaflowError(f"{who}: {name} must be contiguous (batch, heads, seq, head_dim); "
                               f"strides {arr.strides} B")
    b, hq, sq, d = q.shape
    if k.shape != v.shape:
        raise TmaflowError(f"{who}: k {k.shape} and v {v.shape} must have one shape")
    bk, hkv, skv, dk = k.shape
    if bk != b or dk != d:
        raise TmaflowError(f"{who}: q is {q.shape} but k is {k.shape}; batch and head_dim must match")
    if hkv == 0 or hq % hkv:
        raise TmaflowError(f"{who}: {hq} query heads must be a multiple of the {hkv} key/value heads "
                           "(grouped-query attention)")
    if d not in head_dims:
        raise TmaflowError(f"{who}: head_dim={d} is not supported; use one of {head_dims}")
    if skv == 0 and sq > 0:
        raise TmaflowError(f"{who}: k and v have no keys (seq 0); softmax over nothing is undefined")
    return b, hq, sq, d, hkv, skv


def _scale(scale, d: int, who: str = "attention") -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    return checks.positive_float(f"{who}: scale", scale, "a positive finite float (the kernel takes "
                                 "row maxima of the unscaled scores)")


def _given_out(out, like, who: str = "attention", field: str = "out", align: int = 4):
    """``out`` (or the output ``field``) checked: ``like``'s shape and dtype, contiguous, at an
    ``align``-byte boundary (the kernels store two elements as one 4-byte word, or more)."""
    if out is None:
        return None
    O = packed(given_output(who, out, like.shape, like.dtype, field=field))
    if O.strides != contiguous_strides(like.shape, 2) or O.ptr % align:
        raise TmaflowError(f"{who}: {field} must be contiguous and {align}-byte aligned (strides "
                           f"{O.strides} B, at 0x{O.ptr:x})")
    return O


@entry_point
def attention(q, k, v, out=None, *, causal: bool = False, scale: float | None = None,
              return_lse: bool = False, stream=None, pdl: bool = False, debug: bool | None = None,
              trace: bool = False):
    """softmax(scale * q @ k^T) @ v for bfloat16 or float16 (batch, heads, seq, head_dim) arrays,
    head_dim 64, 128 or 256; k and v may have fewer heads (grouped-query attention: query head h
    reads key/value head h // (heads / kv_heads)). ``causal``: query i sees keys j <= i (as
    torch's ``is_causal``). ``scale`` defaults to 1 / sqrt(head_dim). Returns out (of q's kind),
    and with ``return_lse`` also the (batch, heads, seq) float32 log-sum-exp of the scaled scores."""
    if (type(causal), type(pdl), type(debug), type(trace)) not in _OPTIONS.plain:
        causal, pdl, debug, trace = _OPTIONS.check(causal, pdl, debug, trace)
    if type(return_lse) is not bool:  # a flag: any bool is valid, not part of the key
        (return_lse,) = _RETURN_LSE.check(return_lse)
    Q, K, V = packed(as_array(q)), packed(as_array(k)), packed(as_array(v))
    b, hq, sq, d, hkv, skv = _check(Q, K, V)
    scale = _scale(scale, d)
    O = _given_out(out, Q)
    ordinal = current_ordinal()
    stream = resolve_stream(stream, (Q, K, V, O), ordinal)
    key = ("attention", Q.dtype.name, Q.shape, K.shape, O is None, causal, stream, pdl, Q.device,
           ordinal, debug, trace, get_ident())
    try:
        st, windows = STATES[key]
    except (KeyError, TypeError):
        st = windows = None
    if O is not None and not checks.apart(O.ptr, (Q.ptr, K.ptr, V.ptr), windows):
        windows = checks.no_aliasing("attention", O, (("q", Q), ("k", K), ("v", V)))
    if st is None:
        st, _ = cached_state(key, lambda: (_state(Q, K, causal, stream, pdl, debug, trace), windows))
    result, O = (out, O) if O is not None else new_output(q, Q, Q.shape, None, stream)
    lse_out, lse = (None, 0)
    if return_lse:
        lse_out, lse = new_output(q, Q, (b, hq, sq), as_dtype("float32"), stream)
    ret = (result, lse_out) if return_lse else result
    if b * hq * sq == 0:
        return None, (), ret
    # (batch x heads, seq, head_dim) views: the arrays are contiguous (checked), so the view's
    # strides are the last three of theirs.
    args = (st.tq.bind(Q._as((b * hq, sq, d), Q.strides[1:])),
            st.tk.bind(K._as((b * hkv, skv, d), K.strides[1:])),
            st.tv.bind(V._as((b * hkv, skv, d), V.strides[1:])),
            O, lse, sq, skv, b * hq, hq, hq // hkv, float(scale) * math.log2(math.e))
    return st.launcher, args, ret


_OPTIONS = checks.Options("attention", causal=checks.flag(), pdl=checks.flag(), debug=checks.DEBUG,
                          trace=checks.TRACE)
_RETURN_LSE = checks.Options("attention", return_lse=checks.flag())


def _state(Q, K, causal, stream, pdl, debug, trace) -> SimpleNamespace:
    _OPTIONS.check(causal, pdl, debug, trace)
    on_current_device("attention", Q)
    b, hq, sq, d = Q.shape
    hkv, skv = K.shape[1], K.shape[2]
    spec_q, spec_kv, layout = attention_plan(d, causal)
    defines = {"HEAD_DIM": d, "CAUSAL": int(causal), **({"FP16": 1} if Q.dtype.name == "float16" else {})}
    kern = get_kernel("attention_fwd", layout, defines=defines, file="attention", debug=debug, trace=trace)
    # Non-causal work tiles are all alike: one CTA an SM striding over them (persistent).
    # Causal ones differ in length: one CTA a tile, so the hardware's block scheduler balances.
    work = max(1, math.ceil(sq / BM) * b * hq)
    grid = work if causal else min(work, current_device().sm_count)
    launcher = kern.launcher(grid=grid, block=384, stream=stream, pdl=pdl)

    def template(rows, seq, spec):
        return MapTemplate(TensorMapSpec.tiled(Q.dtype.name, (max(rows, 1), max(seq, 1), d), spec.box,
                                               swizzle="128B"))
    return SimpleNamespace(launcher=launcher, tq=template(b * hq, sq, spec_q), tk=template(b * hkv, skv, spec_kv),
                  tv=template(b * hkv, skv, spec_kv))


CP_ASYNC_HEAD_DIMS = (64, 128)
_CP_ASYNC_ROWS = 64  # query rows (and keys) a CTA block


@entry_point
def attention_cp_async(q, k, v, out=None, *, causal: bool = False, scale: float | None = None, stream=None):
    """The same attention the pre-Hopper way (``attention_cp_async.cu``: seed 002's cp.async
    double buffering and mma.sync), kept beside ``attention`` to compare; head dim 64 or 128."""
    (causal,) = _CP_ASYNC_OPTIONS(causal)
    Q, K, V = packed(as_array(q)), packed(as_array(k)), packed(as_array(v))
    who = "attention_cp_async"
    b, hq, sq, d, hkv, skv = _check(Q, K, V, CP_ASYNC_HEAD_DIMS, who, ("bfloat16",))
    scale = _scale(scale, d, who)
    O = _given_out(out, Q, who)
    if O is not None:
        checks.no_aliasing(who, O, (("q", Q), ("k", K), ("v", V)))
    ordinal = current_ordinal()
    stream = resolve_stream(stream, (Q, K, V, O), ordinal)
    key = ("attention_cp_async", Q.shape, K.shape, causal, stream, Q.device, ordinal, get_ident())
    try:
        launcher = STATES[key]
    except (KeyError, TypeError):
        launcher = cached_state(key, lambda: _cp_async_launcher(Q, causal, stream))
    result, O = (out, O) if O is not None else new_output(q, Q, Q.shape, None, stream)
    if b * hq * sq == 0:
        return None, (), result
    return launcher, (Q, K, V, O, sq, skv, hq, hq // hkv, scale * math.log2(math.e)), result


_CP_ASYNC_OPTIONS = checks.Options("attention_cp_async", causal=checks.flag())


def _cp_async_launcher(Q, causal, stream):
    _CP_ASYNC_OPTIONS.check(causal)
    on_current_device("attention_cp_async", Q)
    b, hq, sq, d = Q.shape
    kern = get_kernel("attention_cp_async", None, defines={"HEAD_DIM": d, "CAUSAL": int(causal)},
                      file="attention_cp_async")
    return kern.launcher(grid=(max(1, math.ceil(sq / _CP_ASYNC_ROWS)), max(1, b * hq)), block=128,
                         smem=3 * _CP_ASYNC_ROWS * d * 2, stream=stream)
