"""Attention forward over packed sequences of different lengths (``attention.cu`` built with
VARLEN, the layout of ``flash_attn_varlen_func``): the entry point ``kernels.attention_varlen``.
The plan is the dense kernel's (``attention_entry.attention_plan``); the maps are 3-D
(tokens, heads, head dim) and the sequences' bounds are read on the device."""
from __future__ import annotations

import math
from threading import get_ident
from types import SimpleNamespace

import numpy as np

from ..dtypes import as_dtype
from ..errors import TmaflowError
from ..launch.config import resolve_stream
from ..runtime import driver
from ..runtime.device import current_device, current_ordinal
from ..runtime.graph import capturing
from ..runtime.memory import DeviceArray, as_array, empty, from_numpy
from . import checks, tile_counters
from .attention_entry import (BM, DTYPES, HEAD_DIMS, _given_out, _scale, attention_kernel, attention_plan,
                              dims_rule, forced_layout, map_template)
from .entry import STATES, cached_state, contiguous_strides, entry_point, new_output, on_current_device, packed
from .matmul.splitk import _foreign_capture, _stream_buffers, _with_split_k

WHO = "attention_varlen"


@entry_point
def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, out=None, *,
                     causal: bool = False, scale: float | None = None, return_lse: bool = False, stream=None,
                     pdl: bool = False, debug: bool | None = None, trace: bool = False):
    """Attention of each sequence of a packed batch, as ``flash_attn_varlen_func``: q (total_q,
    heads, head_dim), k (total_k, kv_heads, head_dim) and v (total_k, kv_heads, head_dim_v),
    bfloat16 or float16, head dims multiples of 16 from 32 to 256; sequence b's queries are
    rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q, its keys and values those rows of
    cu_seqlens_k in k and v, and out (total_q, heads, head_dim_v) gets
    softmax(scale * q_b k_b^T) v_b in q_b's rows (rows outside every sequence are not written).
    Query head h reads kv head h // (heads / kv_heads). ``causal``: query i of a sequence sees
    its keys j <= i (top-left aligned, as ``kernels.attention`` and torch's ``is_causal``;
    flash-attn aligns bottom-right when a sequence has more keys than queries). A query with no
    key gets zeros (log-sum-exp -inf).

    cu_seqlens_q / cu_seqlens_k: batch + 1 int32 prefix sums. A device array is read by the
    kernel (a captured graph serves any lengths; values are clamped into the tensors, so wrong
    ones give wrong rows, never stores outside out); host values (a list, numpy array or CPU
    tensor) are checked (never decreasing, within the tensors, no sequence longer than
    max_seqlen_q / max_seqlen_k) and uploaded at each call. The kernel sizes its grid from the
    token count and the batch, not from max_seqlen, so a length past it still computes.
    Returns out (of q's kind), and with ``return_lse`` also the (heads, total_q) float32
    log-sum-exp of the scaled scores."""
    if (type(causal), type(pdl), type(debug), type(trace)) not in _OPTIONS.plain:
        causal, pdl, debug, trace = _OPTIONS.check(causal, pdl, debug, trace)
    if type(return_lse) is not bool:
        (return_lse,) = _RETURN_LSE.check(return_lse)
    Q, K, V = packed(as_array(q)), packed(as_array(k)), packed(as_array(v))
    tq, hq, d, tk, hkv, dv = _check(Q, K, V)
    max_q = checks.as_int(f"{WHO}: max_seqlen_q", max_seqlen_q, 0, (1 << 31) - 1)
    max_k = checks.as_int(f"{WHO}: max_seqlen_k", max_seqlen_k, 0, (1 << 31) - 1)
    scale = _scale(scale, d, WHO)
    O = _given_out(out, Q, WHO, shape=(tq, hq, dv))
    CQ = _cu_seqlens("cu_seqlens_q", cu_seqlens_q, tq, max_q, Q)
    CK = _cu_seqlens("cu_seqlens_k", cu_seqlens_k, tk, max_k, Q)
    batch = CQ.shape[0] - 1
    if CK.shape[0] != batch + 1:
        raise TmaflowError(f"{WHO}: cu_seqlens_q has {batch + 1} values but cu_seqlens_k has {CK.shape[0]}; "
                           "both are batch + 1 prefix sums")
    ordinal = current_ordinal()
    stream = resolve_stream(stream, (Q, K, V, O), ordinal)
    if isinstance(CQ, np.ndarray) or isinstance(CK, np.ndarray):  # refused elsewhere before any upload
        on_current_device(WHO, Q)
        CQ, CK = (_upload(c, Q.device, stream) if isinstance(c, np.ndarray) else c for c in (CQ, CK))
    if O is not None:
        checks.no_aliasing(WHO, O, (("q", Q), ("k", K), ("v", V), ("cu_seqlens_q", CQ), ("cu_seqlens_k", CK)))
    windows = in_windows(max_q, max_k, batch, tq, causal)
    key = (WHO, Q.dtype.name, Q.shape, K.shape, dv, batch, causal, windows, stream, pdl, Q.device, ordinal, debug,
           trace, get_ident())
    try:
        st = STATES[key]
    except (KeyError, TypeError):
        st = cached_state(key, lambda: _state(Q, K, dv, batch, causal, stream, pdl, debug, trace, windows=windows))
    result, O = (out, O) if O is not None else new_output(q, Q, (tq, hq, dv), None, stream)
    lse_out, lse = (None, 0)
    if return_lse:
        lse_out, lse = new_output(q, Q, (hq, tq), as_dtype("float32"), stream)
    ret = (result, lse_out) if return_lse else result
    if batch * tq * hq == 0:
        return None, (), ret
    counter = 0  # DYNAMIC_TILES: two zeroed counters no concurrent launch shares; else null (unused)
    if st.workspace is not None:
        if capturing() is None and not _foreign_capture(stream):
            _, counter = _stream_buffers(st)  # eager: the stream's (its launches run in order)
        else:
            pair = tile_counters.take(current_device())  # captured: a pair of its own (tile_counters)
            if pair is None:  # no counter chunk could be made (out of memory)
                st = cached_state(key + ("static",), lambda: _state(Q, K, dv, batch, causal, stream, pdl, debug, trace,
                                                                     static=True, windows=windows))
            counter = pair or 0
    args = (st.tq.bind(Q), st.tk.bind(K), st.tv.bind(V), O, lse, CQ, CK, tq, tk, batch, hq, hq // hkv,
            float(scale) * math.log2(math.e), counter)
    return st.launcher, args, ret


_OPTIONS = checks.Options(WHO, causal=checks.flag(), pdl=checks.flag(), debug=checks.DEBUG, trace=checks.TRACE)
_RETURN_LSE = checks.Options(WHO, return_lse=checks.flag())


def _check(Q, K, V, who: str = WHO) -> tuple:
    """(total_q, heads, head_dim, total_k, kv_heads, head_dim_v) after the rules."""
    for name, arr in (("q", Q), ("k", K), ("v", V)):
        if arr.ndim != 3:
            raise TmaflowError(f"{who}: {name} must be 3-D (tokens, heads, head_dim), the packed layout; got "
                               f"shape {arr.shape}")
        if arr.dtype.name not in DTYPES:
            raise TmaflowError(f"{who}: {name} must be {' or '.join(DTYPES)} (got {arr.dtype.name})")
        if arr.dtype is not Q.dtype:
            raise TmaflowError(f"{who}: {name} is {arr.dtype.name} but q is {Q.dtype.name}; q, k and v must "
                               "have one dtype")
        if arr.strides != contiguous_strides(arr.shape, 2) or arr.ptr % 16:
            raise TmaflowError(f"{who}: {name} must be contiguous (tokens, heads, head_dim) at a 16-byte "
                               f"boundary (TMA reads it); strides {arr.strides} B at 0x{arr.ptr:x}")
    (tq, hq, d), (tk, hkv, dk), dv = Q.shape, K.shape, V.shape[2]
    if V.shape[:2] != K.shape[:2]:
        raise TmaflowError(f"{who}: k {K.shape} and v {V.shape} must have one token count and head count")
    if dk != d:
        raise TmaflowError(f"{who}: q's head_dim={d} but k's is {dk}; they must match")
    if hkv == 0 or hq % hkv:
        raise TmaflowError(f"{who}: {hq} query heads must be a multiple of the {hkv} key/value heads "
                           "(grouped-query attention)")
    for name, dim in (("q and k's head_dim", d), ("v's head_dim", dv)):
        if dim not in HEAD_DIMS:
            raise TmaflowError(f"{who}: {name}={dim} is not supported; use {dims_rule(HEAD_DIMS)}")
    if tk == 0 and tq > 0:
        raise TmaflowError(f"{who}: k and v have no tokens; softmax over nothing is undefined")
    if max(tq, tk) * max(hq, 1) >= 1 << 31:
        raise TmaflowError(f"{who}: {max(tq, tk)} tokens x {hq} heads must stay below 2^31 (the kernel "
                           "indexes rows and the log-sum-exp with 32-bit ints)")
    return tq, hq, d, tk, hkv, dv


def _host_values(name: str, value, who: str = WHO):
    """The values of host lengths (a sequence or generator of ints, a numpy array, a CPU
    tensor) as a numpy array, or None for a device array."""
    if isinstance(value, np.ndarray):
        return value
    device = getattr(value, "device", None)
    if getattr(device, "type", None) == "cpu" and hasattr(value, "numpy"):
        return value.numpy()
    if isinstance(value, DeviceArray) or device is not None or hasattr(value, "__cuda_array_interface__") or \
            hasattr(value, "__dlpack__"):
        return None
    if isinstance(value, (str, bytes, dict, set)) or not hasattr(value, "__iter__"):
        raise TmaflowError(f"{who}: {name}={value!r} must be batch + 1 int32 prefix sums: a device array, or "
                           "host ints")
    try:
        return np.asarray(list(value))
    except (TypeError, ValueError, OverflowError):
        return np.asarray(list(value), dtype=object)


def _cu_seqlens(name: str, value, total: int, max_len: int, Q, who: str = WHO):
    """``name`` as batch + 1 int32 prefix sums: a device array as given (its values are the
    kernel's to clamp), or host values checked, as an int32 numpy array to upload."""
    host = _host_values(name, value, who)
    if host is None:
        try:
            arr = packed(as_array(value))
        except TmaflowError as exc:
            raise TmaflowError(f"{who}: {name}: {exc}") from None
        if arr.dtype.name != "int32" or arr.ndim != 1 or arr.shape[0] == 0:
            raise TmaflowError(f"{who}: {name} must be a 1-D int32 array of batch + 1 prefix sums (got "
                               f"{arr.shape} {arr.dtype.name})")
        if arr.strides != (4,) and arr.shape[0] > 1:
            raise TmaflowError(f"{who}: {name} must be contiguous (strides {arr.strides} B): the kernel "
                               "reads packed int32 values")
        if arr.device is not None and Q.device is not None and arr.device.ordinal != Q.device.ordinal:
            raise TmaflowError(f"{who}: {name} lives on device {arr.device.ordinal} but q on device "
                               f"{Q.device.ordinal}; every operand must be on one device")
        if not arr.alive:
            raise TmaflowError(f"{who}: {name} {arr!r} was freed")
        return arr
    if host.ndim != 1 or host.size == 0 or host.dtype.kind not in "iu":
        raise TmaflowError(f"{who}: {name} must be batch + 1 int32 prefix sums (got {host.shape} {host.dtype})")
    wide = host.astype(np.int64)  # compared as given, before the narrowing to int32
    drops = np.flatnonzero(np.diff(wide) < 0)
    if drops.size:
        b = int(drops[0])
        raise TmaflowError(f"{who}: {name} must never decrease; {name}[{b + 1}]={wide[b + 1]} is below "
                           f"{name}[{b}]={wide[b]}")
    if wide[0] < 0 or wide[-1] > total:
        raise TmaflowError(f"{who}: {name} runs from {wide[0]} to {wide[-1]}; it must stay within the "
                           f"{total} tokens of its tensor")
    lengths = np.diff(wide)
    if lengths.size and lengths.max() > max_len:
        b = int(np.argmax(lengths))
        raise TmaflowError(f"{who}: sequence {b} of {name} has {lengths[b]} tokens, more than "
                           f"max_seqlen_{name[-1]}={max_len}")
    return wide.astype(np.int32)


def _upload(host: np.ndarray, device, stream: int, who: str = WHO) -> DeviceArray:
    """``host`` in memory allocated and filled in order on ``stream`` (pageable memory is
    staged at once), so its free, also on ``stream``, waits for the launch reading it. While a
    tf.Graph captures: eagerly, as the graph's own array."""
    if capturing() is not None:
        return from_numpy(host, device=device)
    if _foreign_capture(stream):
        raise TmaflowError(f"{who}: cu_seqlens given as host values are uploaded at each call, which a "
                           "CUDA graph capture cannot hold; pass them as device int32 tensors (a replay "
                           "then reads their new values)")
    arr = empty(host.shape, "int32", device, stream=stream)
    driver.call("cuMemcpyHtoDAsync", arr.ptr, host.ctypes.data, arr.nbytes, stream)
    return arr


# Shared memory a DYNAMIC_TILES launch takes past the layout (attention.cu's kSchedBytes): where
# the producer tells the consumers their tiles (with WINDOWS a Tile has one more int).
SCHED_BYTES = 128
WINDOW_SCHED_BYTES = 192


def sched_bytes(defines: dict) -> int:
    return WINDOW_SCHED_BYTES if int(defines.get("WINDOWS", 0)) else SCHED_BYTES


# Packed batches of short sequences are planned in windows (attention.cu's WINDOWS): tiles of
# 128 packed query rows whatever their sequences, each row masking the keys outside its own, so
# sequences shorter than a tile share one. A window reads the keys of every sequence it touches
# (128 one-query sequences with long keys would be one CTA's long walk), so max_seqlen_q and
# max_seqlen_k both bound it: by causal, at most WINDOWS_UP_TO[causal]. And a row's key bounds
# cost its warp a search (about 150 instructions a tile, measured with ncu): windows pay only
# where sequences may leave tiles a third empty or more (batch x ceil(max_seqlen_q / 128) at least
# 1.5 x the windows; 128 sequences of 128 tokens fill theirs). H200 (session 23,
# tools/experiments/varlen_ab.py, cold, x dense at equal tokens, head dim 64 / 128, a
# sequence's tiles -> windows): lengths 8-56 1.37 -> 3.52 / 1.57 -> 3.57, causal 1.23 -> 3.63 /
# 1.30 -> 3.03; 16-112 1.27 -> 1.16 / 1.49 -> 1.46, causal 1.31 -> 1.57 / 1.27 -> 1.53; 32-224
# 0.70 -> 0.67 / 0.94 -> 0.99, causal 0.79 -> 0.82 / 1.00 -> 1.12; 128 x 128 1.03 -> 0.85 / 1.03 ->
# 1.00, causal 0.99 -> 0.75 / 1.01 -> 0.95; 128-1024 0.94 -> 0.84, causal 0.88 -> 0.76. The
# kernel is right for any lengths (a captured graph may replay longer ones); these only choose.
WINDOWS_UP_TO = {False: 64, True: 256}


def in_windows(max_q: int, max_k: int, batch: int, tokens: int, causal: bool) -> bool:
    """Whether a packed batch is planned in windows (above)."""
    return max(max_q, max_k) <= WINDOWS_UP_TO[causal] and 2 * batch * -(-max_q // BM) >= 3 * -(-tokens // BM)
# Q / K head dims whose window builds take their next tile before a tile's last V load
# (DYNAMIC_TILES=1), not a tile ahead: a window's Tile holds one int more, and with 7-11 boxes of
# 16 columns the tile ahead spills 12 B of the producer's 40 registers (NVRTC 13.0).
_WINDOWS_TAKE_LATE = {112, 144, 176}

# True: a CTA a tile at every plan (the block scheduler balances unequal tiles; each pays its
# loads' latency). Off; tools/experiments/varlen_ab.py's "tiles" rows set it to compare.
A_TILE_A_CTA = False


def varlen_plan(d: int, causal: bool, dv: int, tokens: int, heads: int, static: bool = False,
                windows: bool = False, **forced):
    """``attention_plan(..., varlen=True)`` for ``tokens`` query rows of ``heads`` heads. PAIRED
    numbers two slots a unit, so its tile numbers reach about 2 x tokens x heads (sequences of
    one token), and the counter of DYNAMIC_TILES runs a grid past the last tile: from 2^31 on
    (the kernel's tile numbers are 32-bit) the plan keeps a CTA a tile, whose numbers stay below
    tokens x heads (``_check``). ``static``: the stride, without the counter. ``windows``: tiles
    of 128 packed query rows (WINDOWS, unpaired), whose numbers stay below tokens x heads / 128."""
    plan = attention_plan(d, causal, dv, varlen=True, **forced)
    drop: tuple[str, ...] = (("PAIRED", "DYNAMIC_TILES") if 2 * tokens * heads >= 1 << 31 else
                             ("DYNAMIC_TILES",) if static else ())
    drop += ("PAIRED",) if windows else ()
    late = windows and d in _WINDOWS_TAKE_LATE and "DYNAMIC_TILES" in plan.defines and "DYNAMIC_TILES" not in drop
    defines = {**{k: v for k, v in plan.defines.items() if k not in drop},
               **({"WINDOWS": 1} if windows else {}), **({"DYNAMIC_TILES": 1} if late else {})}
    return plan._replace(defines=defines)


def _state(Q, K, dv, batch, causal, stream, pdl, debug, trace, static=False, windows=False) -> SimpleNamespace:
    _OPTIONS.check(causal, pdl, debug, trace)
    on_current_device(WHO, Q)
    tq, hq, d = Q.shape
    tk, hkv = K.shape[:2]
    plan = varlen_plan(d, causal, dv, tq, hq, static=static, windows=windows)
    kernel = attention_kernel(plan, Q.dtype.name, debug, trace)
    forced = forced_layout(plan, kernel)
    if forced:
        plan = varlen_plan(d, causal, dv, tq, hq, static=static, windows=windows, **forced)
        kernel = attention_kernel(plan, Q.dtype.name, debug, trace)
    # Sequence b has ceil(len_b / BM) row blocks a head: at most (tokens + batch (BM - 1)) / BM
    # in all, whatever the lengths on the device. CTAs past the last tile leave at once. One CTA
    # an SM strides over them, or with a causal mask over pairs of a sequence's blocks (PAIRED,
    # equal units within a sequence, as dense causal plans); a causal plan without pairs (V
    # head dims 208 and 240) takes a CTA a tile, so the block scheduler balances. H200 (session
    # 21, tools/experiments/varlen_ab.py, cold, x the dense kernel at equal tokens, a CTA a tile
    # -> paired): head dim 128, 4 x 4096 tokens 0.891 -> 0.989, lengths 256-5120 0.981 -> 1.000,
    # 128-1024 0.684 -> 0.755, 32-224 0.631 -> 0.929; head dim 64 0.892 -> 0.982, 0.945 ->
    # 1.050, 0.613 -> 0.768, 0.417 -> 0.689; head dim 256 (call 8) 4 x 4096 0.884 -> 0.975,
    # 32-224 0.922 -> 1.020, but ragged 0.952 -> 0.901 (8 heads: few units a CTA, and a stride
    # balances unequal ones worse than the block scheduler does).
    # DYNAMIC_TILES (the plan's, attention_entry.varlen_dynamic): one CTA an SM, each taking its
    # later tiles (PAIRED: units) from a counter, two uint32 zero between launches (the grid's
    # last CTA resets them): an eager call's are its stream's (two words of the split-K
    # workspace), a captured call's a pair of its own (tile_counters), or, where no pair could be
    # had (out of memory), the static stride (``static``).
    # WINDOWS: ceil(tokens / BM) windows a head, whatever the lengths.
    windowed = bool(int(kernel.defines.get("WINDOWS", 0)))
    tiles = max(1, hq * (-(-tq // BM) if windowed else (tq + batch * (BM - 1)) // BM))
    dynamic = bool(int(kernel.defines.get("DYNAMIC_TILES", 0)))
    if dynamic and static:
        raise TmaflowError(f"{WHO}: DYNAMIC_TILES, forced through extra_defines, needs a tile counter, but the "
                           f"stream 0x{int(stream):x} is being captured into a CUDA graph and no counter could "
                           "be made for it (out of device memory?); free memory, or capture without the define")
    device = current_device()
    if dynamic and not _foreign_capture(stream):
        tile_counters.reserve(device)  # for calls captured later
    one_a_tile = not dynamic and (causal and not kernel.defines.get("PAIRED") or A_TILE_A_CTA)
    grid = tiles if one_a_tile else min(tiles, device.sm_count)
    smem = {"smem": plan.layout.total_bytes + sched_bytes(kernel.defines)} if dynamic else {}
    launcher, workspace = _with_split_k(kernel.launcher(grid=grid, block=384, stream=stream, pdl=pdl, **smem),
                                        dynamic, device, stream)
    dt = Q.dtype.name
    return SimpleNamespace(launcher=launcher, workspace=workspace, workspace_sizes=(2, 0),
                           tq=map_template(dt, (tq, hq, d), plan.spec_q, varlen=True),
                           tk=map_template(dt, (tk, hkv, d), plan.spec_k, varlen=True),
                           tv=map_template(dt, (tk, hkv, dv), plan.spec_v, varlen=True))
