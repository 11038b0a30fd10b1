"""Attention backward: the entry point ``kernels.attention_backward``, three launches a call
(Delta = rowsum(dO * O) with the fp32 dQ accumulator zeroed; dK, dV and dQ's partial sums per
key block; dQ in the output dtype), and their shapes. Head dims 64 and 128 (v's the same) run
``attention_backward_sm90.cu`` (TMA and wgmma, FlashAttention-3's schedule); the others
``attention_backward.cu`` (mma.sync, any multiples of 16 up to 256, v's apart from q's)."""
from __future__ import annotations

import math
from threading import get_ident
from types import SimpleNamespace

from ..dtypes import as_dtype
from ..errors import TmaflowError
from ..launch.config import resolve_stream
from ..runtime.device import current_ordinal
from ..runtime.memory import as_array
from . import checks
from .attention_entry import _check, _given_out, _scale
from .entry import (STATES, cached_state, contiguous_strides, entry_point, new_output, on_current_device,
                    packed, scratch)
from .attention_backward_sm90 import SM90_HEAD_DIMS, Sm90Plan
from .registry import get_kernel

HEAD_DIMS = tuple(range(16, 257, 16))
BLOCK = 64      # keys a CTA, and query rows a step (as attention_backward.cu's BN and BM)
SLICE = 128     # head-dim columns of the gradients a CTA owns (DS): larger head dims take slices
THREADS = 128
_PREP_ROWS = 8  # query rows a CTA of the Delta kernel (a warp each)
_DQ_GRID = 1024


def backward_smem(head_dim: int, head_dim_v: int | None = None) -> int:
    """Dynamic shared memory of the main kernel: K and Q tiles of padded q/k rows, V and dO of
    padded v rows, dS^T, the log-sum-exp and Delta of a query block."""
    dv = head_dim if head_dim_v is None else head_dim_v
    return 2 * BLOCK * (head_dim + 8) * 2 + 2 * BLOCK * (dv + 8) * 2 + BLOCK * (BLOCK + 8) * 2 + 2 * BLOCK * 4


def slices(head_dim: int, head_dim_v: int | None = None) -> int:
    """The parts of at most SLICE columns the gradients are computed in (a CTA each): the wider
    head dim's (each slice owns its columns of dQ and dK and of dV where they exist)."""
    return -(-max(head_dim, head_dim_v or 0) // SLICE)


def main_defines(head_dim: int, head_dim_v: int, causal: bool, deterministic: bool, dtype: str,
                 varlen: bool = False) -> dict:
    """The defines of ``attention_backward.cu``'s prep and main kernels."""
    return {"HEAD_DIM": head_dim, "HEAD_DIM_V": head_dim_v, "DETERMINISTIC": int(deterministic),
            "CAUSAL": int(causal), **({"VARLEN": 1} if varlen else {}), **({"FP16": 1} if dtype == "float16" else {})}


def _check_grads(who, Q, K, V, out, dout, lse, lse_shape=None, lse_rule="(batch, heads, seq_q), as "
                 "attention(..., return_lse=True) returns it"):
    """out and dout: q's shape with v's head dim, q's dtype, contiguous; lse: ``lse_shape`` (q's
    first three dims) float32."""
    want = (*Q.shape[:-1], V.shape[-1])
    lse_shape = Q.shape[:3] if lse_shape is None else lse_shape
    for name, arr in (("out", out), ("dout", dout)):
        if arr.shape != want or arr.dtype != Q.dtype:
            raise TmaflowError(f"{who}: {name} must be {want} {Q.dtype.name}, q's shape with v's head_dim "
                               f"(got {arr.shape} {arr.dtype.name})")
        if arr.strides != contiguous_strides(arr.shape, 2):
            raise TmaflowError(f"{who}: {name} must be contiguous; strides {arr.strides} B (call "
                               ".contiguous() first)")
    if lse.shape != lse_shape or lse.dtype.name != "float32" or lse.strides != contiguous_strides(lse.shape, 4):
        raise TmaflowError(f"{who}: lse must be a contiguous {lse_shape} float32 array {lse_rule}; got "
                           f"{lse.shape} {lse.dtype.name}")
    for name, arr in (("q", Q), ("k", K), ("v", V), ("out", out), ("dout", dout)):
        if arr.ptr % 16:
            raise TmaflowError(f"{who}: {name} at 0x{arr.ptr:x} must be 16-byte aligned (rows are read "
                               "in 16-byte pieces)")


def _given(who, grad, name, like, inputs):
    arr = _given_out(grad, like, who, name, 16)
    if arr is not None:
        checks.no_aliasing(f"{who}: {name}", arr, inputs)
    return arr


def _given_grads(who: str, grads: tuple, arrays: tuple) -> list:
    """The DeviceArrays of dq, dk and dv as given (None where not), each checked against q, k
    and v and apart from the inputs (q, k, v, out, dout, lse) and the gradients before it."""
    inputs = tuple(zip(("q", "k", "v", "out", "dout", "lse"), arrays))
    given: list = []
    for grad, name, like in zip(grads, ("dq", "dk", "dv"), arrays[:3]):
        given.append(_given(who, grad, name, like, inputs + tuple(zip(("dq", "dk"), given))))
    return given


@entry_point
def attention_backward(q, k, v, out, dout, lse, *, causal: bool = False, scale: float | None = None,
                       deterministic: bool = False, dq=None, dk=None, dv=None, stream=None):
    """Gradients (dq, dk, dv) of ``out = attention(q, k, v, causal=causal, scale=scale)`` given
    ``dout``, the gradient of out, and ``lse``, the forward's log-sum-exp (``attention(...,
    return_lse=True)``). bfloat16 or float16, head dims any multiples of 16 from 16 to 256 (v's
    may differ from q's and k's, as in multi-head latent attention: out, dout and dv have v's); k and
    v may have fewer heads (grouped-query attention: dk and dv of a kv head sum over its query
    heads); seq_q and seq_k may differ (causal masks are top-left aligned, as the forward's and
    torch's ``is_causal``). dQ is summed in fp32 with atomics, in an order that varies from run
    to run; ``deterministic=True`` sums it in key-block order instead (bit-identical runs).
    dq, dk and dv may be given (contiguous, of q's, k's and v's shape and dtype); each is
    returned of q's kind."""
    causal, deterministic = _OPTIONS(causal, deterministic)
    who = "attention_backward"
    Q, K, V, O, G, L = (packed(as_array(a)) for a in (q, k, v, out, dout, lse))
    b, hq, sq, d, hkv, skv = _check(Q, K, V, HEAD_DIMS, who, v_head_dims=HEAD_DIMS)
    d_v = V.shape[3]
    _check_grads(who, Q, K, V, O, G, L)
    scale = _scale(scale, d, who)
    given = _given_grads(who, (dq, dk, dv), (Q, K, V, O, G, L))
    ordinal = current_ordinal()
    stream = resolve_stream(stream, (Q, K, V, O, G, L, *given), ordinal)
    key = (who, Q.dtype.name, Q.shape, K.shape, d_v, causal, deterministic, stream, Q.device, ordinal, get_ident())
    try:
        st = STATES[key]
    except (KeyError, TypeError):
        st = cached_state(key, lambda: _state(Q, K, d_v, causal, deterministic, stream))
    outs = [(g, arr) if arr is not None else new_output(like, like_arr, like_arr.shape, None, stream)
            for g, arr, like, like_arr in zip((dq, dk, dv), given, (q, k, v), (Q, K, V))]
    result = tuple(o for o, _ in outs)
    DQ, DK, DV = (arr for _, arr in outs)
    if not st.launches:
        return None, (), result
    rows = b * hq * sq
    if st.sm90 is not None:
        args = st.sm90.args(Q, K, V, O, G, L, DQ, DK, DV, float(scale), lambda n: scratch(
            q, Q, (n,), as_dtype("float32"), stream))
        return st.run, args, result
    # fp32 workspace, in order on the stream: dQ's accumulator, Delta, then the chain counters.
    ws = scratch(q, Q, (rows * (d + 1) + st.chain_count,), as_dtype("float32"), stream)
    accum, delta, chain = ws.ptr, ws.ptr + 4 * rows * d, ws.ptr + 4 * rows * (d + 1)
    args = ((O, G, delta, accum, chain, rows, st.chain_count),
            (Q, K, V, G, L, delta, accum, chain, DK, DV, sq, skv, hq, hq // hkv, float(scale),
             float(scale) * math.log2(math.e)),
            (accum, DQ, rows * d // 2, float(scale)), ws)
    return st.run, args, result


_OPTIONS = checks.Options("attention_backward", causal=checks.flag(), deterministic=checks.flag())


def _state(Q, K, dv, causal, deterministic, stream) -> SimpleNamespace:
    who = "attention_backward"
    _OPTIONS.check(causal, deterministic)
    on_current_device(who, Q)
    b, hq, sq, d = Q.shape
    hkv, skv = K.shape[1], K.shape[2]
    fp16 = {"FP16": 1} if Q.dtype.name == "float16" else {}
    defines = main_defines(d, dv, causal, deterministic, Q.dtype.name)
    prep_defines = {k: v for k, v in defines.items() if k != "CAUSAL"}

    def launcher(name, defines, **config):  # each kernel built with the defines it reads
        return get_kernel(name, None, defines=defines, file="attention_backward").launcher(stream=stream, **config)
    rows = b * hq * sq
    if d in SM90_HEAD_DIMS and dv == d and rows:
        plan = Sm90Plan(Q, K, causal, deterministic, stream)
        return SimpleNamespace(launches=plan.launches, chain_count=0, run=_Run(plan.launches, True), sm90=plan)
    launches = []
    if rows:  # Delta and the zeroed accumulator
        launches.append(launcher("attention_bwd_prep", prep_defines, grid=-(-rows // _PREP_ROWS),
                                 block=32 * _PREP_ROWS))
    if b * hkv * skv:  # dK and dV (zero where no query sees a key), dQ's sums
        launches.append(launcher("attention_bwd", defines, grid=(-(-skv // BLOCK), hkv * slices(d, dv), b),
                                 block=THREADS, smem=backward_smem(d, dv)))
    if rows:
        launches.append(launcher("attention_bwd_dq", fp16, grid=min(_DQ_GRID, -(-rows * d // 512)), block=256))
    chain_count = b * hq * -(-sq // BLOCK) * slices(d, dv) if deterministic else 0
    return SimpleNamespace(launches=launches, chain_count=chain_count, run=_Run(launches, rows > 0), sm90=None)


class _Run:
    """The call's launches in order; ``args`` are (prep, main, dq) arguments and the workspace
    they point into (kept alive by the call's arguments until the launches are queued)."""

    def __init__(self, launches: list, has_rows: bool):
        self.launches, self.has_rows = launches, has_rows

    def __call__(self, prep, main, dq, workspace) -> None:
        for launch, args in zip(self.launches, (prep, main, dq) if self.has_rows else (main,)):
            launch(*args)

    def __repr__(self) -> str:
        return f"attention_backward({len(self.launches)} launches)"
