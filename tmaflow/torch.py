"""tmaflow kernels as torch custom ops, so they run inside ``torch.compile(fullgraph=True)``
and CUDA graphs like any torch operator.

    import tmaflow.torch  # registers torch.ops.tmaflow.{copy, softmax, gemm, gemm_block_scaled, attention,
                          #   attention_lse, attention_backward, attention_varlen, attention_varlen_lse,
                          #   attention_varlen_backward, attention_decode, append_kv,
                          #   all_gather_gemm, gemm_reduce_scatter}
    y = torch.ops.tmaflow.softmax(x)

    @tmaflow.torch.op("mylib::scale", fake=lambda x, s: torch.empty_like(x))
    def scale(x: torch.Tensor, s: float) -> torch.Tensor:
        y = torch.empty_like(x)
        my_kernel.launch(x, y, s, x.numel(), grid=..., block=...)
        return y

A fake (meta) implementation gives torch the output's shape, dtype and strides without
running anything: torch.compile traces with it. Once this module is imported,
``kernels.copy / softmax / gemm / attention / attention_backward / attention_varlen / attention_decode /
append_kv`` called inside a compiled function become these ops too (their default forms: no ``out=`` or tuning options
there). ``kernels.attention`` on tensors that require grad becomes ``attention_lse`` (out and the
log-sum-exp, saved for ``attention_backward``), ``kernels.attention_varlen`` likewise
``attention_varlen_lse`` (for ``attention_varlen_backward``): gradients flow, eagerly and compiled (training
steps under ``torch.compile(fullgraph=True)``); with ``torch.use_deterministic_algorithms(True)``
the backward sums dQ in a fixed order. The real implementation launches on the
current torch stream (tmaflow's ``stream=None`` rule for torch tensors), so a graph captured
by torch (``torch.cuda.graph``, ``mode="reduce-overhead"``) captures the kernel too.
"""
from __future__ import annotations

from typing import Any

import torch

from .errors import TmaflowError
from .kernels import (attention_backward_entry, attention_entry, attention_varlen_backward_entry,
                      attention_varlen_entry, decode_entry, entry, examples, matmul)

__all__ = ["op", "copy", "softmax", "gemm", "gemm_block_scaled", "attention", "attention_lse", "attention_backward",
           "attention_varlen", "attention_varlen_lse", "attention_varlen_backward", "attention_decode", "append_kv",
           "all_gather_gemm", "gemm_reduce_scatter"]


def op(qualname: str, *, fake, schema: str | None = None, mutates_args=()):
    """Register ``fn`` as the torch custom op ``qualname`` ("namespace::name") with ``fake``
    as its fake (meta) implementation; returns the op (callable like ``fn``). Without
    ``schema`` torch infers it from ``fn``'s type annotations."""

    def register(fn):
        custom = torch.library.custom_op(qualname, fn, mutates_args=mutates_args, schema=schema)
        custom.register_fake(fake)
        return custom

    return register


def _check(name: str, cond: bool, message: str) -> None:
    torch._check(cond, lambda: f"tmaflow.{name}: {message}")


def _copy_fake(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


@op("tmaflow::copy", fake=_copy_fake)
def copy(x: torch.Tensor) -> torch.Tensor:
    """``kernels.copy(x)``: a TMA tile copy into a new contiguous tensor."""
    return examples.copy(x)


def _softmax_fake(x: torch.Tensor) -> torch.Tensor:
    _check("softmax", x.dtype == torch.float32, f"needs a float32 tensor (got {tuple(x.shape)} {x.dtype})")
    return x.new_empty(x.shape)


@op("tmaflow::softmax", fake=_softmax_fake)
def softmax(x: torch.Tensor) -> torch.Tensor:
    """``kernels.softmax(x)``: softmax over the last dim of a float32 tensor."""
    return examples.softmax(x)


_GEMM_DTYPES = (torch.bfloat16, torch.float8_e4m3fn)


def _gemm_shape(name: str, a: torch.Tensor, b: torch.Tensor, layout: str) -> tuple:
    _check(name, a.dim() == 2 and b.dim() == 2 and a.dtype == b.dtype and a.dtype in _GEMM_DTYPES,
           f"needs 2-D bfloat16 or float8_e4m3fn operands of one dtype (got {tuple(a.shape)} {a.dtype}, "
           f"{tuple(b.shape)} {b.dtype})")
    _check(name, layout in matmul.LAYOUTS, f"layout={layout!r} must be one of {matmul.LAYOUTS}")
    _check(name, a.dtype == torch.bfloat16 or layout == "nt", f"fp8 operands take layout 'nt' (got {layout!r})")
    n = b.shape[0] if layout == "nt" else b.shape[1]
    k_b = b.shape[1] if layout == "nt" else b.shape[0]
    _check(name, a.shape[1] == k_b, f"K of a ({a.shape[1]}) and b ({k_b}) differ")
    return a.shape[0], n


def _gemm_fake(a: torch.Tensor, b: torch.Tensor, layout: str = "nt", scale_a: float | None = None,
               scale_b: float | None = None) -> torch.Tensor:
    m, n = _gemm_shape("gemm", a, b, layout)
    _check("gemm", a.dtype == torch.float8_e4m3fn or (scale_a is None and scale_b is None),
           "scale_a / scale_b dequantise fp8 operands; a and b are bfloat16")
    return a.new_empty((m, n), dtype=torch.bfloat16)


@op("tmaflow::gemm", fake=_gemm_fake,
    schema="(Tensor a, Tensor b, str layout='nt', float? scale_a=None, float? scale_b=None) -> Tensor")
def gemm(a: torch.Tensor, b: torch.Tensor, layout: str = "nt", scale_a: float | None = None,
         scale_b: float | None = None) -> torch.Tensor:
    """``kernels.gemm(a, b, layout=layout, scale_a=scale_a, scale_b=scale_b)``: bf16, or fp8
    with per-tensor scales; fp32 accumulation, bf16 out."""
    return matmul.gemm(a, b, layout=layout, scale_a=scale_a, scale_b=scale_b)


def _gemm_block_scaled_fake(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                            scale_b: torch.Tensor) -> torch.Tensor:
    m, n = _gemm_shape("gemm_block_scaled", a, b, "nt")
    kb = -(-a.shape[1] // 128)
    _check("gemm_block_scaled", a.dtype == torch.float8_e4m3fn, f"needs float8_e4m3fn operands (got {a.dtype})")
    _check("gemm_block_scaled", scale_a.dtype == scale_b.dtype == torch.float32 and
           tuple(scale_a.shape) == (m, kb) and tuple(scale_b.shape) == (-(-n // 128), kb),
           f"scale_a must be ({m}, {kb}) and scale_b ({-(-n // 128)}, {kb}) float32 (got "
           f"{tuple(scale_a.shape)} {scale_a.dtype}, {tuple(scale_b.shape)} {scale_b.dtype})")
    return a.new_empty((m, n), dtype=torch.bfloat16)


@op("tmaflow::gemm_block_scaled", fake=_gemm_block_scaled_fake)
def gemm_block_scaled(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                      scale_b: torch.Tensor) -> torch.Tensor:
    """``kernels.gemm(a, b, scale_a=scale_a, scale_b=scale_b)`` with fp8 operands and block
    scales (1 x 128 for a, 128 x 128 for b): bf16 out."""
    return matmul.gemm(a, b, scale_a=scale_a, scale_b=scale_b)


def _attention_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    _check("attention", q.dim() == 4 and k.dim() == 4 and v.dim() == 4 and k.shape[:3] == v.shape[:3] and
           q.dtype == k.dtype == v.dtype and q.dtype in (torch.bfloat16, torch.float16),
           f"needs 4-D bfloat16 or float16 q, k, v of one dtype, k and v of one batch, heads and seq (got "
           f"{tuple(q.shape)} {q.dtype}, {tuple(k.shape)} {k.dtype}, {tuple(v.shape)} {v.dtype})")
    _head_dims("attention", q, k, v)
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


def _head_dims(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    dims = attention_entry.HEAD_DIMS
    _check(name, q.shape[-1] in dims and k.shape[-1] == q.shape[-1] and v.shape[-1] in dims,
           f"head_dim {q.shape[-1]} (the same in k) and v's {v.shape[-1]} must be {attention_entry.dims_rule(dims)}")


@op("tmaflow::attention", fake=_attention_fake,
    schema="(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None) -> Tensor")
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: float | None = None) -> torch.Tensor:
    """``kernels.attention(q, k, v, causal=causal, scale=scale)``: attention forward, bf16 or fp16.
    Differentiable, at the cost of a second forward in the backward (for the log-sum-exp):
    ``attention_lse`` saves it instead (``kernels.attention`` with grads takes that one)."""
    return attention_entry.attention.prepare(q, k, v, causal=causal, scale=scale)()


def _attention_lse_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                        scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return _attention_fake(q, k, v, causal, scale), q.new_empty(q.shape[:3], dtype=torch.float32)


@op("tmaflow::attention_lse", fake=_attention_lse_fake,
    schema="(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None) -> (Tensor, Tensor)")
def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                  scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``kernels.attention(q, k, v, causal=causal, scale=scale, return_lse=True)``: (out, the
    float32 log-sum-exp); gradients flow to q, k and v through out (lse takes none)."""
    # prepare(): launched here, never routed back to an op (q may require grad)
    return attention_entry.attention.prepare(q, k, v, causal=causal, scale=scale, return_lse=True)()


def _attention_backward_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                             dout: torch.Tensor, lse: torch.Tensor, causal: bool = False,
                             scale: float | None = None, deterministic: bool = False) -> tuple:
    _check("attention_backward", out.shape == dout.shape == q.shape and tuple(lse.shape) == tuple(q.shape[:3])
           and lse.dtype == torch.float32, f"needs out and dout of q's shape {tuple(q.shape)} and a float32 "
           f"lse of {tuple(q.shape[:3])} (got {tuple(out.shape)}, {tuple(dout.shape)}, {tuple(lse.shape)} {lse.dtype})")
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@op("tmaflow::attention_backward", fake=_attention_backward_fake,
    schema="(Tensor q, Tensor k, Tensor v, Tensor out, Tensor dout, Tensor lse, bool causal=False, "
           "float? scale=None, bool deterministic=False) -> (Tensor, Tensor, Tensor)")
def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, dout: torch.Tensor,
                       lse: torch.Tensor, causal: bool = False, scale: float | None = None,
                       deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``kernels.attention_backward(...)``: (dq, dk, dv). ``dout`` may have any layout: autograd
    hands over expanded scalars' gradients and slices of a concatenation's, and the kernels read
    16-byte pieces, so it is copied where it is not contiguous and 16-byte aligned (here, where
    the tensors are real: under torch.compile the caller only traces)."""
    dout = dout.contiguous()
    if dout.data_ptr() % 16:
        dout = dout.clone()
    return attention_backward_entry.attention_backward(q, k, v, out, dout, lse, causal=causal, scale=scale,
                                                       deterministic=deterministic)


def _grads(q, k, v, out, lse, dout, causal, scale) -> tuple:
    return attention_backward(q, k, v, out, dout, lse, causal, scale, torch.are_deterministic_algorithms_enabled())


def _save_lse(ctx, inputs, output) -> None:
    q, k, v, ctx.causal, ctx.scale = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(q, k, v, *output)


def _attention_lse_backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    return (*_grads(q, k, v, out, lse, dout, ctx.causal, ctx.scale), None, None)


def _save_inputs(ctx, inputs, output) -> None:
    q, k, v, ctx.causal, ctx.scale = inputs
    ctx.save_for_backward(q, k, v)


def _attention_backward_recomputing(ctx, dout):
    q, k, v = ctx.saved_tensors
    out, lse = attention_lse(q, k, v, ctx.causal, ctx.scale)
    return (*_grads(q, k, v, out, lse, dout, ctx.causal, ctx.scale), None, None)


attention_lse.register_autograd(_attention_lse_backward, setup_context=_save_lse)
attention.register_autograd(_attention_backward_recomputing, setup_context=_save_inputs)


def _attention_varlen_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                           scale: float | None = None) -> torch.Tensor:
    _check("attention_varlen", q.dim() == 3 and k.dim() == 3 and v.dim() == 3 and k.shape[:2] == v.shape[:2] and
           q.dtype == k.dtype == v.dtype and q.dtype in (torch.bfloat16, torch.float16),
           f"needs packed (tokens, heads, head_dim) bfloat16 or float16 q, k, v of one dtype, k and v of one "
           f"token and head count (got {tuple(q.shape)} {q.dtype}, {tuple(k.shape)} {k.dtype}, {tuple(v.shape)} "
           f"{v.dtype})")
    _head_dims("attention_varlen", q, k, v)
    _check("attention_varlen", cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32 and cu_seqlens_q.dim() == 1
           and cu_seqlens_q.shape == cu_seqlens_k.shape, f"needs cu_seqlens_q and cu_seqlens_k as 1-D int32 tensors "
           f"of batch + 1 values (got {tuple(cu_seqlens_q.shape)} {cu_seqlens_q.dtype}, {tuple(cu_seqlens_k.shape)} "
           f"{cu_seqlens_k.dtype})")
    return q.new_empty((q.shape[0], q.shape[1], v.shape[2]))


@op("tmaflow::attention_varlen", fake=_attention_varlen_fake,
    schema="(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
           "int max_seqlen_k, bool causal=False, float? scale=None) -> Tensor")
def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                     scale: float | None = None) -> torch.Tensor:
    """``kernels.attention_varlen(...)``: attention over packed sequences, bf16 or fp16.
    Differentiable, at the cost of a second forward in the backward (for the log-sum-exp):
    ``attention_varlen_lse`` saves it instead (``kernels.attention_varlen`` with grads takes that one)."""
    return attention_varlen_entry.attention_varlen.prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                           max_seqlen_k, causal=causal, scale=scale)()


def _attention_varlen_lse_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                               cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                               causal: bool = False, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    out = _attention_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale)
    return out, q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@op("tmaflow::attention_varlen_lse", fake=_attention_varlen_lse_fake,
    schema="(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
           "int max_seqlen_k, bool causal=False, float? scale=None) -> (Tensor, Tensor)")
def attention_varlen_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                         cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                         scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``kernels.attention_varlen(..., return_lse=True)``: (out, the (heads, total_q) float32
    log-sum-exp); gradients flow to q, k and v through out (lse takes none)."""
    return attention_varlen_entry.attention_varlen.prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                           max_seqlen_k, causal=causal, scale=scale,
                                                           return_lse=True)()


def _attention_varlen_backward_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                                    dout: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                                    cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                                    causal: bool = False, scale: float | None = None,
                                    deterministic: bool = False) -> tuple:
    want = (q.shape[0], q.shape[1], v.shape[2])
    _check("attention_varlen_backward", tuple(out.shape) == tuple(dout.shape) == want and
           tuple(lse.shape) == (q.shape[1], q.shape[0]) and lse.dtype == torch.float32,
           f"needs out and dout of {want} and a float32 lse of {(q.shape[1], q.shape[0])} (got {tuple(out.shape)}, "
           f"{tuple(dout.shape)}, {tuple(lse.shape)} {lse.dtype})")
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@op("tmaflow::attention_varlen_backward", fake=_attention_varlen_backward_fake,
    schema="(Tensor q, Tensor k, Tensor v, Tensor out, Tensor dout, Tensor lse, Tensor cu_seqlens_q, "
           "Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, bool causal=False, float? scale=None, "
           "bool deterministic=False) -> (Tensor, Tensor, Tensor)")
def attention_varlen_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                              dout: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                              cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                              causal: bool = False, scale: float | None = None,
                              deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``kernels.attention_varlen_backward(...)``: (dq, dk, dv); ``dout`` of any layout (copied
    where it is not contiguous and 16-byte aligned, as ``attention_backward``)."""
    dout = dout.contiguous()
    if dout.data_ptr() % 16:
        dout = dout.clone()
    return attention_varlen_backward_entry.attention_varlen_backward(
        q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
        scale=scale, deterministic=deterministic)


def _save_varlen_lse(ctx, inputs, output) -> None:
    q, k, v, cu_q, cu_k, ctx.max_q, ctx.max_k, ctx.causal, ctx.scale = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(q, k, v, cu_q, cu_k, *output)


def _varlen_grads(ctx, q, k, v, cu_q, cu_k, out, lse, dout) -> tuple:
    grads = attention_varlen_backward(q, k, v, out, dout, lse, cu_q, cu_k, ctx.max_q, ctx.max_k, ctx.causal,
                                      ctx.scale, torch.are_deterministic_algorithms_enabled())
    return (*grads, None, None, None, None, None, None)


def _attention_varlen_lse_backward(ctx, dout, _dlse):
    q, k, v, cu_q, cu_k, out, lse = ctx.saved_tensors
    return _varlen_grads(ctx, q, k, v, cu_q, cu_k, out, lse, dout)


def _save_varlen_inputs(ctx, inputs, output) -> None:
    q, k, v, cu_q, cu_k, ctx.max_q, ctx.max_k, ctx.causal, ctx.scale = inputs
    ctx.save_for_backward(q, k, v, cu_q, cu_k)


def _attention_varlen_backward_recomputing(ctx, dout):
    q, k, v, cu_q, cu_k = ctx.saved_tensors
    out, lse = attention_varlen_lse(q, k, v, cu_q, cu_k, ctx.max_q, ctx.max_k, ctx.causal, ctx.scale)
    return _varlen_grads(ctx, q, k, v, cu_q, cu_k, out, lse, dout)


attention_varlen_lse.register_autograd(_attention_varlen_lse_backward, setup_context=_save_varlen_lse)
attention_varlen.register_autograd(_attention_varlen_backward_recomputing, setup_context=_save_varlen_inputs)


def _attention_decode_fake(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float | None = None,
                           num_splits: int | None = None, evict_first: bool | None = None) -> torch.Tensor:
    _check("attention_decode", q.dim() in (3, 4) and k_cache.dim() == 4 and k_cache.shape == v_cache.shape
           and k_cache.shape[-1] == q.shape[-1] and q.dtype == k_cache.dtype == v_cache.dtype,
           f"needs q (batch, [tokens,] heads_q, head_dim) and caches (pages, page_size, heads_kv, head_dim) "
           f"of one dtype and head dim (got {tuple(q.shape)} {q.dtype}, {tuple(k_cache.shape)} {k_cache.dtype})")
    return q.new_empty(q.shape)


@op("tmaflow::attention_decode", fake=_attention_decode_fake,
    schema="(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor seq_lens, "
           "float? scale=None, int? num_splits=None, bool? evict_first=None) -> Tensor")
def attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                     seq_lens: torch.Tensor, scale: float | None = None, num_splits: int | None = None,
                     evict_first: bool | None = None) -> torch.Tensor:
    """``kernels.attention_decode(...)``: one decode step over a paged KV cache."""
    return decode_entry.attention_decode(q, k_cache, v_cache, block_table, seq_lens, scale=scale,
                                         num_splits=num_splits, evict_first=evict_first)


def _append_kv_fake(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    seq_lens: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
    return None


@op("tmaflow::append_kv", fake=_append_kv_fake, mutates_args=("k_cache", "v_cache"))
def append_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
              k_new: torch.Tensor, v_new: torch.Tensor) -> None:
    """``kernels.append_kv(...)``: the new keys and values into their pages, in place."""
    decode_entry.append_kv(k_cache, v_cache, block_table, seq_lens, k_new, v_new)


def _distributed():
    """tmaflow.distributed's ops, imported on first use (a local import: importing
    tmaflow.distributed sets the no-multicast environment of NCCL and torch, which
    single-GPU users of tmaflow.torch must not get)."""
    from .distributed import ops  # first use only: its import sets NCCL / torch variables

    return ops


def _group(group_name: str):
    from torch.distributed.distributed_c10d import _resolve_process_group  # torch-private, stable since 2.2

    resolve: Any = _resolve_process_group  # newer torch types its argument as GroupName, a str
    return resolve(group_name)


def _all_gather_gemm_fake(a_shard: torch.Tensor, b: torch.Tensor, group_name: str, m: int,
                          scale_a: float | None = None, scale_b: float | None = None) -> torch.Tensor:
    return a_shard.new_empty((m, b.shape[0]), dtype=torch.bfloat16)


@op("tmaflow::all_gather_gemm", fake=_all_gather_gemm_fake,
    schema="(Tensor a_shard, Tensor b, str group_name, int m, float? scale_a=None, "
           "float? scale_b=None) -> Tensor")
def all_gather_gemm(a_shard: torch.Tensor, b: torch.Tensor, group_name: str, m: int,
                    scale_a: float | None = None, scale_b: float | None = None) -> torch.Tensor:
    """``tmaflow.distributed.all_gather_gemm`` over the process group named ``group_name``."""
    return _distributed().all_gather_gemm(a_shard, b, group=_group(group_name), m=m, scale_a=scale_a,
                                       scale_b=scale_b, debug=False)


def _gemm_reduce_scatter_fake(a: torch.Tensor, b_shard: torch.Tensor, group_name: str,
                              scale_a: float | None = None, scale_b: float | None = None) -> torch.Tensor:
    group = _group(group_name)
    rows = _distributed().protocol.shard_rows(a.shape[0], group.size())[group.rank()]
    return a.new_empty((rows, b_shard.shape[0]), dtype=torch.bfloat16)


@op("tmaflow::gemm_reduce_scatter", fake=_gemm_reduce_scatter_fake,
    schema="(Tensor a, Tensor b_shard, str group_name, float? scale_a=None, float? scale_b=None) -> Tensor")
def gemm_reduce_scatter(a: torch.Tensor, b_shard: torch.Tensor, group_name: str,
                        scale_a: float | None = None, scale_b: float | None = None) -> torch.Tensor:
    """``tmaflow.distributed.gemm_reduce_scatter`` over the process group named ``group_name``."""
    return _distributed().gemm_reduce_scatter(a, b_shard, group=_group(group_name), scale_a=scale_a,
                                           scale_b=scale_b, debug=False)


def _only(name: str, given: dict) -> None:
    extra = sorted(k for k, v in given.items() if v is not None and v is not False)
    if extra:
        raise TmaflowError(f"kernels.{name}(...) inside torch.compile (or, for attention, on tensors that "
                           f"require grad) runs as a torch.ops.tmaflow op, which takes no {', '.join(extra)}; "
                           "call it outside the compiled region (on detached tensors), or wrap your own "
                           "call with tmaflow.torch.op")


def _as_op(name: str, args: tuple, kwargs: dict) -> bool:
    """Does this entry-point call run as its torch op? While torch.compile traces; and for
    attention, while autograd records a tensor that requires grad (the op has the backward)."""
    if torch.compiler.is_compiling():
        return True
    return name in ("attention", "attention_varlen") and torch.is_grad_enabled() and any(
        isinstance(a, torch.Tensor) and a.requires_grad for a in (*args, *kwargs.values()))


def _copy_call(src, dst=None, **options):
    _only("copy", {"dst": dst, **options})
    return copy(src)


def _softmax_call(x, out=None, **options):
    _only("softmax", {"out": out, **options})
    return softmax(x)


def _gemm_call(a, b, out=None, *, layout: str = "nt", scale_a=None, scale_b=None, **options):
    _only("gemm", {"out": out, **options})
    blocks = [isinstance(s, torch.Tensor) for s in (scale_a, scale_b)]
    if all(blocks):
        if layout != "nt":
            raise TmaflowError(f"gemm: fp8 operands take layout 'nt' (got {layout!r})")
        return gemm_block_scaled(a, b, scale_a, scale_b)
    if any(blocks):
        raise TmaflowError("kernels.gemm(...) inside torch.compile: block scales need both scale_a "
                           "and scale_b as tensors (per-tensor scales: both floats)")
    return gemm(a, b, layout, scale_a, scale_b)


def _attention_call(q, k, v, out=None, *, causal: bool = False, scale: float | None = None,
                    return_lse: bool = False, **options):
    _only("attention", {"out": out, **options})
    result = attention_lse(q, k, v, causal, scale)
    return result if return_lse else result[0]


def _attention_backward_call(q, k, v, out, dout, lse, *, causal: bool = False, scale: float | None = None,
                             deterministic: bool = False, **options):
    _only("attention_backward", options)
    return attention_backward(q, k, v, out, dout, lse, causal, scale, deterministic)


def _attention_varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out=None, *,
                           causal: bool = False, scale: float | None = None, return_lse: bool = False,
                           **options):
    _only("attention_varlen", {"out": out, **options})
    # the op's schema takes tensors: host lengths (a list, numpy) become a CPU int32 tensor,
    # which the entry point uploads as it uploads them given directly
    cu_q, cu_k = (c if isinstance(c, torch.Tensor) else torch.as_tensor(c, dtype=torch.int32)
                  for c in (cu_seqlens_q, cu_seqlens_k))
    result = attention_varlen_lse(q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, causal, scale)
    return result if return_lse else result[0]


def _attention_varlen_backward_call(q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, *, causal: bool = False, scale: float | None = None,
                                    deterministic: bool = False, **options):
    _only("attention_varlen_backward", options)
    return attention_varlen_backward(q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                     max_seqlen_k, causal, scale, deterministic)


def _attention_decode_call(q, k_cache, v_cache, block_table, seq_lens, *, scale: float | None = None,
                           num_splits: int | None = None, evict_first: bool | None = None, **options):
    _only("attention_decode", options)
    return attention_decode(q, k_cache, v_cache, block_table, seq_lens, scale, num_splits, evict_first)


def _append_kv_call(k_cache, v_cache, block_table, seq_lens, k_new, v_new, **options):
    _only("append_kv", options)
    return append_kv(k_cache, v_cache, block_table, seq_lens, k_new, v_new)


# kernels.copy / softmax / gemm / attention / attention_backward / attention_varlen / attention_decode /
# append_kv called while torch.compile traces become these ops (and kernels.attention and
# attention_varlen on tensors that require grad: their _lse forms, whose backward runs the kernels').
entry.torch_route = _as_op
entry.TORCH_OPS.update({"copy": _copy_call, "softmax": _softmax_call, "gemm": _gemm_call,
                        "attention": _attention_call, "attention_backward": _attention_backward_call,
                        "attention_varlen": _attention_varlen_call,
                        "attention_varlen_backward": _attention_varlen_backward_call,
                        "attention_decode": _attention_decode_call, "append_kv": _append_kv_call})
