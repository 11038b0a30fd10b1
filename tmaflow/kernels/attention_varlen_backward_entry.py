"""Attention backward over packed sequences: the entry point ``kernels.attention_varlen_backward``,
built with VARLEN (a CTA a key block of one sequence, found on the device from cu_seqlens_k; the
grid is sized for any lengths, so a captured graph serves them): head dims 64 and 128 (v's the
same) on ``attention_backward_sm90.cu`` (TMA and wgmma), the others on ``attention_backward.cu``."""
from __future__ import annotations

import math
from threading import get_ident
from types import SimpleNamespace

import numpy as np

from ..dtypes import as_dtype
from ..errors import TmaflowError
from ..launch.config import resolve_stream
from ..runtime.device import current_ordinal
from ..runtime.memory import as_array
from . import checks
from .attention_backward_entry import (_PREP_ROWS, _DQ_GRID, BLOCK, THREADS, _check_grads, _given_grads, _Run,
                                       backward_smem, main_defines, slices)
from .attention_entry import _scale
from .attention_backward_sm90 import SM90_HEAD_DIMS, Sm90VarlenPlan
from .attention_varlen_entry import _check, _cu_seqlens, _upload
from .entry import STATES, cached_state, entry_point, new_output, on_current_device, packed, scratch
from .registry import get_kernel

WHO = "attention_varlen_backward"


@entry_point
def attention_varlen_backward(q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                              max_seqlen_k: int, *, causal: bool = False, scale: float | None = None,
                              deterministic: bool = False, dq=None, dk=None, dv=None, stream=None):
    """Gradients (dq, dk, dv) of ``out = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k,
    max_seqlen_q, max_seqlen_k, causal=causal, scale=scale)`` given ``dout`` (out's shape) and
    ``lse``, the (heads, total_q) float32 log-sum-exp that ``attention_varlen(...,
    return_lse=True)`` returns. Shapes, dtypes, cu_seqlens (device arrays read by the kernel,
    host values checked and uploaded) and the causal rule are the forward's; k and v may have
    fewer heads (dk and dv of a kv head sum over its query heads). Rows outside every sequence
    get zero gradients. dQ is summed in fp32 with atomics; ``deterministic=True`` sums it in
    key-block order (bit-identical runs). dq, dk and dv may be given (contiguous, of q's, k's
    and v's shape and dtype); each is returned of q's kind."""
    causal, deterministic = _OPTIONS(causal, deterministic)
    Q, K, V, O, G, L = (packed(as_array(a)) for a in (q, k, v, out, dout, lse))
    tq, hq, d, tk, hkv, d_v = _check(Q, K, V, WHO)
    _check_grads(WHO, Q, K, V, O, G, L, (hq, tq), "(heads, total_q), as attention_varlen(..., "
                 "return_lse=True) returns it")
    max_q = checks.as_int(f"{WHO}: max_seqlen_q", max_seqlen_q, 0, (1 << 31) - 1)
    max_k = checks.as_int(f"{WHO}: max_seqlen_k", max_seqlen_k, 0, (1 << 31) - 1)
    scale = _scale(scale, d, WHO)
    CQ = _cu_seqlens("cu_seqlens_q", cu_seqlens_q, tq, max_q, Q, WHO)
    CK = _cu_seqlens("cu_seqlens_k", cu_seqlens_k, tk, max_k, Q, WHO)
    batch = CQ.shape[0] - 1
    if CK.shape[0] != batch + 1:
        raise TmaflowError(f"{WHO}: cu_seqlens_q has {batch + 1} values but cu_seqlens_k has {CK.shape[0]}; "
                           "both are batch + 1 prefix sums")
    given = _given_grads(WHO, (dq, dk, dv), (Q, K, V, O, G, L))
    ordinal = current_ordinal()
    stream = resolve_stream(stream, (Q, K, V, O, G, L, *given), ordinal)
    if isinstance(CQ, np.ndarray) or isinstance(CK, np.ndarray):
        on_current_device(WHO, Q)
        CQ, CK = (_upload(c, Q.device, stream, WHO) if isinstance(c, np.ndarray) else c for c in (CQ, CK))
    key = (WHO, Q.dtype.name, Q.shape, K.shape, d_v, batch, causal, deterministic, stream, Q.device, ordinal,
           get_ident())
    try:
        st = STATES[key]
    except (KeyError, TypeError):
        st = cached_state(key, lambda: _state(Q, K, d_v, batch, causal, deterministic, stream))
    outs = [(g, arr) if arr is not None else new_output(like, like_arr, like_arr.shape, None, stream)
            for g, arr, like, like_arr in zip((dq, dk, dv), given, (q, k, v), (Q, K, V))]
    result = tuple(o for o, _ in outs)
    DQ, DK, DV = (arr for _, arr in outs)
    if not st.launches:
        return None, (), result
    rows = tq * hq
    if st.sm90 is not None:
        args = st.sm90.args(Q, K, V, O, G, L, DQ, DK, DV, CQ, CK, float(scale), lambda n: scratch(
            q, Q, (n,), as_dtype("float32"), stream))
        return st.run, args, result
    # fp32 workspace, in order on the stream: dQ's accumulator, Delta, then the chain counters.
    ws = scratch(q, Q, (rows * (d + 1) + st.chain_count,), as_dtype("float32"), stream)
    accum, delta, chain = ws.ptr, ws.ptr + 4 * rows * d, ws.ptr + 4 * rows * (d + 1)
    args = ((O, G, delta, accum, chain, rows, st.chain_count, DK, DV, CK, batch, tk, hkv),
            (Q, K, V, G, L, delta, accum, chain, DK, DV, CQ, CK, tq, tk, batch, hq, hq // hkv, float(scale),
             float(scale) * math.log2(math.e)),
            (accum, DQ, rows * d // 2, float(scale)), ws)
    return st.run, args, result


_OPTIONS = checks.Options(WHO, causal=checks.flag(), deterministic=checks.flag())


def key_blocks(total_k: int, batch: int) -> int:
    """Key blocks there can be at most, whatever the lengths: ceil(len / BLOCK) summed over the
    sequences is at most (tokens + batch (BLOCK - 1)) / BLOCK (the main kernel's grid)."""
    return max(1, (total_k + batch * (BLOCK - 1)) // BLOCK)


def _state(Q, K, dv, batch, causal, deterministic, stream) -> SimpleNamespace:
    _OPTIONS.check(causal, deterministic)
    on_current_device(WHO, Q)
    tq, hq, d = Q.shape
    tk, hkv = K.shape[:2]
    defines = main_defines(d, dv, causal, deterministic, Q.dtype.name, varlen=True)
    prep_defines = {k: v for k, v in defines.items() if k != "CAUSAL"}

    def launcher(name, defs, **config):
        return get_kernel(name, None, defines=defs, file="attention_backward").launcher(stream=stream, **config)
    rows = tq * hq
    if rows + tk * hkv == 0:
        return SimpleNamespace(launches=[], chain_count=0, run=None, sm90=None)
    if d in SM90_HEAD_DIMS and dv == d and rows and batch and tk:
        plan = Sm90VarlenPlan(Q, K, batch, causal, deterministic, stream)
        return SimpleNamespace(launches=plan.launches, chain_count=0, run=_Run(plan.launches, True), sm90=plan)
    # prep: Delta, the zeroed accumulator and counters, zero dK and dV outside every sequence
    launches = [launcher("attention_bwd_prep", prep_defines, grid=max(1, -(-rows // _PREP_ROWS)),
                         block=32 * _PREP_ROWS)]
    if batch and tk:  # a key block of a sequence without queries stores zeros
        launches.append(launcher("attention_bwd", defines, grid=(key_blocks(tk, batch), hkv * slices(d, dv), 1),
                                 block=THREADS, smem=backward_smem(d, dv)))
    else:  # no sequence: dK and dV are zero (prep), dQ too (its accumulator)
        launches.append(_skip)
    launches.append(launcher("attention_bwd_dq", {"FP16": 1} if "FP16" in defines else {},
                             grid=max(1, min(_DQ_GRID, -(-rows * d // 512))), block=256))
    chain_count = rows * slices(d, dv) if deterministic else 0  # a counter a query row's block start
    return SimpleNamespace(launches=launches, chain_count=chain_count, run=_Run(launches, True), sm90=None)


def _skip(*args) -> None:
    """The main kernel's place where no CTA has work."""
