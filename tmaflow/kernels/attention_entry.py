"""Attention forward written with tmaflow (``attention.cu``): the plan (3-D tensor maps of Q, K
and V, a one-stage pipeline for Q and a multi-stage one each for K and V tiles) and the entry
point ``kernels.attention``; and ``kernels.attention_cp_async``, seed 002's pre-Hopper schedule
(``attention_cp_async.cu``), kept beside it to compare."""
from __future__ import annotations

import functools
import math
from threading import get_ident
from types import SimpleNamespace
from typing import NamedTuple

from ..dtypes import as_dtype
from ..errors import TmaflowError
from ..launch.compiler import nvrtc_version
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
HEAD_DIMS = range(32, 257, 16)  # multiples of 16 (wgmma's k-step) for Q / K and for V
DTYPES = ("bfloat16", "float16")
_BARRIER_RESERVE = 256
_BUDGET = HOPPER_SMEM_LIMIT - _BARRIER_RESERVE
# Keys a tile measured on H100 / H200 (docs/history.md, session 6), by (head dim, causal).
_MEASURED_KEYS = {(64, False): 128, (64, True): 128, (128, False): 176, (128, True): 128,
                  (256, False): 64, (256, True): 64}
# Keys a tile at most in varlen plans: a tile past a sequence's end reads the next sequence's
# keys (TMA does not stop there) only to mask them. H200 (session 21, tools/experiments/
# varlen_ab.py, cold, x the dense kernel at equal tokens): head dim 128 non-causal with 128 keys
# against 176, 128 x 128 tokens 0.979 against 0.861, lengths 32-224 0.834 / 0.775, 128-1024
# 0.869 / 0.804, 256-5120 1.015 / 1.008.
VARLEN_KEYS = 128
# V head dims whose varlen builds keep the static schedule: with PAIRED's walk ptxas spills
# 8 B (208) and 24 B (240) (NVRTC 13.5), and with DYNAMIC_TILES' slots 8 B at 240.
_VARLEN_UNPAIRED = {208, 240}


def varlen_dynamic() -> int:
    """The varlen schedule: CTAs take their tiles from a counter, a tile ahead (attention.cu's
    DYNAMIC_TILES=2), where NVRTC 13 builds it; 0 (the stride) with CUDA 12, whose ptxas spills
    4-16 B with the counter (the producer warp holding the tile ahead at 40 registers; with the
    take before a tile's last V load, DYNAMIC_TILES=1, still 12 B at head dim 176 causal and at
    224). H200 (session 21 call 9, varlen_ab, cold, x the dense kernel at equal tokens, stride ->
    counter): head dim 256 ragged 0.922 -> 1.020, causal 0.909 -> 1.076; head dim 128 ragged
    causal 0.998 -> 1.105, 128-1024 causal 0.760 -> 0.843, 32-224 0.798 -> 0.878; head dim 64
    128 x 128 0.904 -> 0.949, causal 0.837 -> 0.941."""
    return 2 if nvrtc_version()[0] >= 13 else 0


# V head dims whose varlen builds keep a single Q buffer whole: the static schedule (above), and
# 224, where ptxas spills 108 B with the split and the counter.
_VARLEN_WHOLE_Q = _VARLEN_UNPAIRED | {224}
# (head dim, v's, causal) planned with one whole Q buffer where a second would fit (H200, session
# 17, cold / back to back ratio to cuDNN at 1k-16k, one buffer against two: head dim 64 full
# 0.997-1.053 / 1.014-1.047 against 0.969-0.997 / 0.958-1.021)
# Varlen plans with the counter schedule take the second buffer where it costs no K or V stage,
# head dims up to 80 (H200, session 22, varlen_ab, head dim 64, cold x dense: 128 x 128 tokens
# 0.945 -> 1.054, causal 0.943 -> 1.011; 32-224 0.697 -> 0.718, causal 0.788 -> 0.812), and
# split one into two 64-row stages past that, as dense plans (two runs, whole -> split: head dim
# 128 4 x 4096 0.958 -> 0.972, causal 0.935 -> 0.976, lengths 256-5120 1.008 -> 1.016, causal
# 1.030 -> 1.076, 128-1024 0.875 -> 0.894, causal 0.801 -> 0.835; head dim 256 0.913 -> 0.945,
# 0.913 -> 0.970, 0.946 -> 0.992, 1.000 -> 1.058, 0.778 -> 0.812, 0.722 -> 0.747). With the
# stride (CUDA 12) they keep one whole buffer, session 21's plan (the split spills 12-24 B there
# at head dims 144 and 176 causal).
_ONE_Q_BUFFER = {(64, 64, False)}
# Per consumer thread, 232 registers hold O (head_dim_v / 2), S (keys / 2), P (keys / 4) and
# about 36 more (indices, sums, addresses): head dim 128 with 176 keys is the measured limit.
_TILE_REGISTERS = 196
# Where that sum is not enough, by v's head dim: the rule's 128 keys at 176 spill 8-16 B in the
# varlen build, 80 keys at 240 spill 36 B (tests/test_attention_plan.py compiles every variant).
_KEY_CAPS = {176: 112, 240: 64}


def swizzle_span(head_dim: int) -> int:
    """Bytes of a box row (attention.cu's kSpanQK, kSpanV): the widest swizzle span that divides the
    head dim's bytes, so boxes hold no padding columns (64 columns with the 128B swizzle, else
    32 with 64B or 16 with 32B)."""
    return 128 if head_dim % 64 == 0 else 64 if head_dim % 32 == 0 else 32


def keys_per_tile(head_dim: int, causal: bool, head_dim_v: int | None = None) -> int:
    """Keys a tile (attention.cu's BLOCK_N). Measured for head dims 64, 128 and 256 (Q, K and V
    alike): 128, 176 without a causal mask at 128 (fewer, longer softmax steps, as
    FlashAttention-3 chooses) and 64 at 256 (its O accumulators take 128 registers a thread).
    Other head dims (a guess, not measured): the most keys, a multiple of 16 up to 128 causal
    or 176 not, whose O, S and P fit the consumers' registers (compiled without spills) and
    whose Q and two K and V stages fit shared memory."""
    dv = head_dim if head_dim_v is None else head_dim_v
    if dv == head_dim and (head_dim, causal) in _MEASURED_KEYS:
        return _MEASURED_KEYS[(head_dim, causal)]
    keys = min(128 if causal else 176, (_TILE_REGISTERS - dv // 2) * 4 // 3 // 16 * 16)
    keys = min(keys, _KEY_CAPS.get(dv, keys))
    while keys > 16 and BM * head_dim * 2 + 2 * keys * (head_dim + dv) * 2 > _BUDGET:
        keys -= 16
    return keys


class AttentionPlan(NamedTuple):
    """What one forward variant compiles and binds: the box specs of Q, K and V (placeholder
    shapes: the layout needs only box bytes, calls bind maps of the real shapes and dtype), the
    shared layout, keys a tile and the kernel's defines."""

    spec_q: TensorMapSpec
    spec_k: TensorMapSpec
    spec_v: TensorMapSpec
    layout: SharedLayout
    keys: int
    defines: dict


def _box_spec(rows: int, head_dim: int) -> TensorMapSpec:
    span = swizzle_span(head_dim)
    return TensorMapSpec.tiled("bfloat16", (1, rows, head_dim), (1, rows, span // 2), swizzle=f"{span}B")


@functools.lru_cache(maxsize=64)
def attention_plan(head_dim: int, causal: bool = False, head_dim_v: int | None = None,
                   varlen: bool = False, q_stages: int | None = None, keys: int | None = None,
                   q_split: bool | None = None) -> AttentionPlan:
    """The plan of a head dim (Q and K; ``head_dim_v`` for V and O, default the same), with or
    without a causal mask, dense or ``varlen`` (packed sequences: the same layout, other maps).

    K and V are separate pipelines (K_j is needed a step before V_j, and each goes back as
    soon as its GEMM is done); they take equal stages, up to four, and K one more when its
    bytes are left over. Dense plans take a second Q stage where its bytes are left over after
    that (head dims up to 64 or so: a CTA's next work tile's Q loads while this one runs, not
    after its last S; the kernel's L2_PREFETCH, the next work tile's Q, first K and first V
    prefetched into L2 for plans of one Q buffer, measured 1-3% slower on an H200 and is off);
    ``q_stages`` forces 1 or 2 (the kernel's Q_STAGES, to compare: a forced
    second stage takes its bytes first, K and V stages get what is left); ``keys`` forces the
    keys a tile (a multiple of 16 up to 256 whose Q and two K and V stages fit; the kernel's
    BLOCK_N, to compare; varlen plans take at most VARLEN_KEYS). Dense plans of one Q buffer
    split it (Q_SPLIT: two stages of 64 rows, each consumer warpgroup's released after its own
    last S, so the first one's next Q loads half a step earlier); ``q_split`` forces it on or
    off (varlen too). Every plan stores O 16 B a lane (STORE16). Causal plans pair row blocks
    (PAIRED; varlen ones but at V head dims 208 and 240, where the paired walk spills)."""
    dv = head_dim if head_dim_v is None else head_dim_v
    for name, d in (("head dim", head_dim), ("head dim of v", dv)):
        if d not in HEAD_DIMS:
            raise TmaflowError(f"attention: {name} {d} is not supported; use a multiple of 16 from 32 to 256")
    if keys is None:
        keys = keys_per_tile(head_dim, causal, dv)
        keys = min(keys, VARLEN_KEYS) if varlen else keys
    elif type(keys) is not int or keys % 16 or not 16 <= keys <= 256 or \
            BM * head_dim * 2 + 2 * keys * (head_dim + dv) * 2 > _BUDGET:
        raise TmaflowError(f"attention: keys={keys!r} must be a multiple of 16 up to 256 whose Q tile and two "
                           "K and V stages fit shared memory")
    if q_stages not in (None, 1, 2):
        raise TmaflowError(f"attention: q_stages={q_stages!r} must be 1 or 2")
    if q_split is not None and type(q_split) is not bool:
        raise TmaflowError(f"attention: q_split={q_split!r} must be True or False")
    spec_k, spec_v = _box_spec(keys, head_dim), _box_spec(keys, dv)
    qk_boxes, v_boxes = head_dim // spec_k.box[-1], dv // spec_v.box[-1]
    q_bytes, k_bytes, v_bytes = BM * head_dim * 2, keys * head_dim * 2, keys * dv * 2
    q_total = q_bytes * (q_stages or 1)  # a forced second Q stage may cost K and V stages
    pairs = min(4, (_BUDGET - q_total) // (k_bytes + v_bytes))
    k_stages = pairs + (pairs < 4 and _BUDGET - q_total - pairs * (k_bytes + v_bytes) >= k_bytes)
    # whole, unless q_split says (varlen with the stride, CUDA 12: session 21's one whole buffer)
    one_q = (head_dim, dv, causal) in _ONE_Q_BUFFER and not varlen or varlen and not varlen_dynamic()
    if q_stages is None:
        left = _BUDGET - q_bytes - pairs * (k_bytes + v_bytes) - (k_stages - pairs) * k_bytes
        q_stages = 2 if left >= q_bytes and not one_q else 1
    if q_split is None:
        q_split = q_stages == 1 and not one_q and not (varlen and dv in _VARLEN_WHOLE_Q)
    halves = 2 if q_split else 1  # a split Q stage is one warpgroup's 64 rows, released by its 4 warps
    spec_q = _box_spec(BM // halves, head_dim)
    layout = SharedLayout([Pipeline("qp", stages=q_stages * halves, tiles={"q": (spec_q, qk_boxes)},
                                    consumers=8 // halves),
                           Pipeline("kp", stages=k_stages, tiles={"k": (spec_k, qk_boxes)}, consumers=8),
                           Pipeline("vp", stages=pairs, tiles={"v": (spec_v, v_boxes)}, consumers=8)])
    defines = {"HEAD_DIM": head_dim, "CAUSAL": int(causal), "BLOCK_N": keys,
               **({"HEAD_DIM_V": dv} if dv != head_dim else {}), **({"VARLEN": 1} if varlen else {}),
               **({"PAIRED": 1} if causal and not (varlen and dv in _VARLEN_UNPAIRED) else {}),
               **({"DYNAMIC_TILES": varlen_dynamic()} if varlen and dv not in _VARLEN_UNPAIRED and varlen_dynamic()
                  else {}),
               "Q_STAGES": q_stages,
               **({"Q_SPLIT": 1} if q_split else {}), "STORE16": 1}
    return AttentionPlan(spec_q, spec_k, spec_v, layout, keys, defines)


def forced_layout(plan: AttentionPlan, kernel) -> dict:
    """The ``attention_plan`` arguments (q_stages, keys, q_split) that defines given through
    ``kernels.registry.extra_defines`` force on ``kernel`` where they change ``plan``'s shared
    layout: the plan to build again with them; empty when they do not."""
    forced = {"q_stages": int(kernel.defines["Q_STAGES"]), "keys": int(kernel.defines["BLOCK_N"]),
              "q_split": bool(kernel.defines.get("Q_SPLIT"))}
    planned = {"q_stages": plan.defines["Q_STAGES"], "keys": plan.keys, "q_split": bool(plan.defines.get("Q_SPLIT"))}
    return forced if forced != planned else {}


def attention_kernel(plan: AttentionPlan, dtype: str, debug=None, trace: bool = False):
    """The compiled forward kernel of ``plan`` for bfloat16 or float16 operands."""
    defines = {**plan.defines, **({"FP16": 1} if dtype == "float16" else {})}
    return get_kernel("attention_fwd", plan.layout, defines=defines, file="attention", debug=debug, trace=trace)


def map_template(dtype: str, shape: tuple, spec: TensorMapSpec, varlen: bool = False) -> MapTemplate:
    """A map of ``spec``'s box over ``shape`` (dense: (batch x heads, seq, head dim); varlen:
    (tokens, heads, head dim), whose box spans rows of tokens of one head)."""
    shape = tuple(max(n, 1) for n in shape)
    box = (spec.box[1], 1, spec.box[2]) if varlen else spec.box
    return MapTemplate(TensorMapSpec.tiled(dtype, shape, box, swizzle=spec.swizzle))


def dims_rule(head_dims) -> str:
    """How an error message states the head dims a kernel takes."""
    if isinstance(head_dims, range):
        return f"a multiple of {head_dims.step} from {head_dims.start} to {head_dims.stop - 1}"
    return f"one of {tuple(head_dims)}"


def _check(q, k, v, head_dims=HEAD_DIMS, who="attention", dtypes=DTYPES, v_head_dims=None):
    """(batch, heads, seq_q, head_dim, kv_heads, seq_kv) after the rules. v's head dim is k's
    unless ``v_head_dims`` says which others it may take."""
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
    if v_head_dims is None and k.shape != v.shape:
        raise TmaflowError(f"{who}: k {k.shape} and v {v.shape} must have one shape")
    if k.shape[:3] != v.shape[:3]:
        raise TmaflowError(f"{who}: k {k.shape} and v {v.shape} must have one batch, heads and seq")
    bk, hkv, skv, dk = k.shape
    if bk != b or dk != d:
        raise TmaflowError(f"{who}: q is {q.shape} but k is {k.shape}; batch and head_dim must match")
    if hkv == 0 or hq % hkv:
        raise TmaflowError(f"{who}: {hq} query heads must be a multiple of the {hkv} key/value heads "
                           "(grouped-query attention)")
    if d not in head_dims:
        raise TmaflowError(f"{who}: head_dim={d} is not supported; use {dims_rule(head_dims)}")
    if v_head_dims is not None and v.shape[3] not in v_head_dims:
        raise TmaflowError(f"{who}: v's head_dim={v.shape[3]} is not supported; use {dims_rule(v_head_dims)}")
    if skv == 0 and sq > 0:
        raise TmaflowError(f"{who}: k and v have no keys (seq 0); softmax over nothing is undefined")
    return b, hq, sq, d, hkv, skv


def _scale(scale, d: int, who: str = "attention") -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    return checks.positive_float(f"{who}: scale", scale, "a positive finite float (the kernel takes "
                                 "row maxima of the unscaled scores)")


def _given_out(out, like, who: str = "attention", field: str = "out", align: int = 4, shape=None):
    """``out`` (or the output ``field``) checked: ``like``'s dtype and shape (or ``shape``),
    contiguous, at an ``align``-byte boundary (the kernels store two elements as one 4-byte word,
    or more)."""
    if out is None:
        return None
    shape = like.shape if shape is None else shape
    O = packed(given_output(who, out, shape, like.dtype, field=field))
    if O.strides != contiguous_strides(shape, 2) or O.ptr % align:
        raise TmaflowError(f"{who}: {field} must be contiguous and {align}-byte aligned (strides "
                           f"{O.strides} B, at 0x{O.ptr:x})")
    return O


@entry_point
def attention(q, k, v, out=None, *, causal: bool = False, scale: float | None = None,
              return_lse: bool = False, stream=None, pdl: bool = False, debug: bool | None = None,
              trace: bool = False):
    """softmax(scale * q @ k^T) @ v for bfloat16 or float16 (batch, heads, seq, head_dim) arrays,
    head_dim a multiple of 16 from 32 to 256; v's head dim may differ from q's and k's (as
    multi-head latent attention's 192 / 128), out has v's. k and v may have fewer heads
    (grouped-query attention: query head h reads key/value head h // (heads / kv_heads)).
    ``causal``: query i sees keys j <= i (as torch's ``is_causal``). ``scale`` defaults to 1 /
    sqrt(head_dim). Returns out (of q's kind), and with ``return_lse`` also the (batch, heads,
    seq) float32 log-sum-exp of the scaled scores."""
    if (type(causal), type(pdl), type(debug), type(trace)) not in _OPTIONS.plain:
        causal, pdl, debug, trace = _OPTIONS.check(causal, pdl, debug, trace)
    if type(return_lse) is not bool:  # a flag: any bool is valid, not part of the key
        (return_lse,) = _RETURN_LSE.check(return_lse)
    Q, K, V = packed(as_array(q)), packed(as_array(k)), packed(as_array(v))
    b, hq, sq, d, hkv, skv = _check(Q, K, V, v_head_dims=HEAD_DIMS)
    dv = V.shape[3]
    scale = _scale(scale, d)
    out_shape = Q.shape if dv == d else (b, hq, sq, dv)
    O = _given_out(out, Q, shape=out_shape)
    ordinal = current_ordinal()
    stream = resolve_stream(stream, (Q, K, V, O), ordinal)
    key = ("attention", Q.dtype.name, Q.shape, K.shape, dv, O is None, causal, stream, pdl, Q.device,
           ordinal, debug, trace, get_ident())
    try:
        st, windows = STATES[key]
    except (KeyError, TypeError):
        st = windows = None
    if O is not None and not checks.apart(O.ptr, (Q.ptr, K.ptr, V.ptr), windows):
        windows = checks.no_aliasing("attention", O, (("q", Q), ("k", K), ("v", V)))
    if st is None:
        st, _ = cached_state(key, lambda: (_state(Q, K, dv, causal, stream, pdl, debug, trace), windows))
    result, O = (out, O) if O is not None else new_output(q, Q, out_shape, None, stream)
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
            st.tv.bind(V._as((b * hkv, skv, dv), V.strides[1:])),
            O, lse, sq, skv, b * hq, hq, hq // hkv, float(scale) * math.log2(math.e))
    return st.launcher, args, ret


_OPTIONS = checks.Options("attention", causal=checks.flag(), pdl=checks.flag(), debug=checks.DEBUG,
                          trace=checks.TRACE)
_RETURN_LSE = checks.Options("attention", return_lse=checks.flag())


def _state(Q, K, dv, causal, stream, pdl, debug, trace) -> SimpleNamespace:
    _OPTIONS.check(causal, pdl, debug, trace)
    on_current_device("attention", Q)
    b, hq, sq, d = Q.shape
    hkv, skv = K.shape[1], K.shape[2]
    plan = attention_plan(d, causal, dv)
    kernel = attention_kernel(plan, Q.dtype.name, debug, trace)
    forced = forced_layout(plan, kernel)
    if forced:
        plan = attention_plan(d, causal, dv, **forced)
        kernel = attention_kernel(plan, Q.dtype.name, debug, trace)
    launcher_of = kernel.launcher
    # Non-causal work tiles are all alike: one CTA an SM striding over them (persistent).
    # Causal ones differ in length: one CTA an SM striding over pairs of row blocks (PAIRED,
    # equal units: attention.cu), or without it (kernels.registry.extra_defines, to compare)
    # one CTA a tile, so the hardware's block scheduler balances.
    blocks = math.ceil(sq / BM)
    units = (blocks + 1) // 2 if kernel.defines.get("PAIRED") else blocks
    work = max(1, units * b * hq)
    grid = work if causal and not kernel.defines.get("PAIRED") else min(work, current_device().sm_count)
    dt = Q.dtype.name
    return SimpleNamespace(launcher=launcher_of(grid=grid, block=384, stream=stream, pdl=pdl),
                           tq=map_template(dt, (b * hq, sq, d), plan.spec_q),
                           tk=map_template(dt, (b * hkv, skv, d), plan.spec_k),
                           tv=map_template(dt, (b * hkv, skv, dv), plan.spec_v))


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
