"""The entry points and their configurations as rows of the hostile-input table (run by
tests/test_hostile.py): every option of ``kernels.gemm`` (bf16 and fp8 scales),
``grouped_gemm``, ``attention``, ``attention_cp_async``, ``attention_varlen``, ``copy``, ``transpose``, ``softmax``
(and its plan), ``reduce_add``, ``broadcast_scale``, ``axpb``, and every field of
``GemmConfig`` and ``SkinnyConfig``.

The operands are views of memory that is never touched, on a device no machine has (ordinal
99): every argument check runs first, and a call whose arguments all pass stops where the
entry point first asks for its device ("lives on device 99"), on the CPU and on a GPU alike,
before anything is compiled or launched. ``stream=`` is left to tests/test_streams.py and the
operand arrays to the foreign-array rows.
"""
from __future__ import annotations

import itertools

from hostile_core import INTS, SEQUENCES, row

from tmaflow import kernels
from tmaflow.kernels.examples import softmax_plan
from tmaflow.runtime.memory import DeviceArray


class _Elsewhere:
    """A device no machine has: entry points refuse its arrays after checking the rest."""

    ordinal = 99

    def __repr__(self) -> str:
        return "Device(99, simulated)"


_ELSEWHERE = _Elsewhere()
_ADDRESSES = itertools.count(1 << 32, 1 << 24)  # one 16 MiB range each: no view aliases another
REACHED = r"lives on device 99"  # every argument passed; the device was next
FLAGS = frozenset({"bool", "np_bool"})
OPTIONAL = frozenset({"none"})
NUMBERS = frozenset({"float", "integral_float", "np_float", "np_int", "huge", "np_uint_huge"})


def fake(shape, dtype="bfloat16"):
    return DeviceArray(next(_ADDRESSES), shape, dtype, device=_ELSEWHERE)


def _entry(fn, operands, **base):
    """``call(name)``: ``fn(*operands(), **base)`` with option ``name`` replaced (fresh operands
    each call: a view never aliases another)."""
    return lambda name: (lambda value: fn(*operands(), **{**base, name: value}))


def options(function: str, call, **valid) -> list:
    """Rows for ``function``'s options: name -> the kinds that are valid spellings."""
    return [row(function, name, call(name), valid=kinds, valid_error=REACHED)
            for name, kinds in valid.items()]


PARAMS = []
LAUNCH = dict(pdl=FLAGS, debug=FLAGS | OPTIONAL, trace=FLAGS)

# --- GEMM -------------------------------------------------------------------------------------
_bf16 = _entry(kernels.gemm, lambda: (fake((256, 128)), fake((256, 128))))
PARAMS += options("gemm", _bf16, layout=(), config=OPTIONAL, **LAUNCH)
# fp8 per-tensor scales: finite floats > 0 (ints and numpy numbers too); zero, negatives, NaN
# and inf are refused, and so is a product outside float32 (tests/test_entry_checks.py)
_fp8 = _entry(kernels.gemm, lambda: (fake((256, 128), "float8_e4m3fn"), fake((256, 128), "float8_e4m3fn")))
PARAMS += options("gemm (fp8)", _fp8, scale_a=NUMBERS | OPTIONAL, scale_b=NUMBERS | OPTIONAL)

_grouped = _entry(kernels.grouped_gemm, lambda: (fake((256, 128)), fake((2, 128, 128)), fake((3,), "int32")))
PARAMS += options("grouped_gemm", _grouped, layout=(), config=OPTIONAL, max_tokens_per_group=INTS | OPTIONAL,
                  **LAUNCH)
# host offsets: G + 1 = 3 ints from 0 to the 256 rows; no hostile kind is such a sequence
PARAMS.append(row("grouped_gemm", "offsets",
                  lambda value: kernels.grouped_gemm(fake((256, 128)), fake((2, 128, 128)), value),
                  field=r"offsets"))

_GEMM_CONFIG = dict(bn=(), cluster_m=(), epi_cols=(), group_m=INTS, stages=INTS | OPTIONAL,
                    split_k=INTS, l2_promotion=(), promote=INTS | {"zero"}, split_tail=FLAGS, cluster_k=(),
                    patch_full_tiles=FLAGS)
PARAMS += [row("GemmConfig", name, lambda value, name=name: kernels.GemmConfig(**{name: value}), valid=kinds)
           for name, kinds in _GEMM_CONFIG.items()]
_SKINNY_CONFIG = dict(rows=(), split_k=INTS | OPTIONAL, stages=INTS | OPTIONAL, l2_promotion=(), cluster=(),
                      tile_fastest=FLAGS, scale_ring=FLAGS | OPTIONAL)
PARAMS += [row("SkinnyConfig", name, lambda value, name=name: kernels.SkinnyConfig(**{name: value}), valid=kinds)
           for name, kinds in _SKINNY_CONFIG.items()]

# --- attention ----------------------------------------------------------------------------------
_QKV = (1, 2, 128, 64)
_attention = _entry(kernels.attention, lambda: (fake(_QKV), fake(_QKV), fake(_QKV)))
PARAMS += options("attention", _attention, causal=FLAGS, scale=NUMBERS | OPTIONAL, return_lse=FLAGS,
                  **LAUNCH)
_cp_async = _entry(kernels.attention_cp_async, lambda: (fake(_QKV), fake(_QKV), fake(_QKV)))
PARAMS += options("attention_cp_async", _cp_async, causal=FLAGS, scale=NUMBERS | OPTIONAL)


def _packed():
    return fake((300, 4, 64)), fake((300, 2, 64)), fake((300, 2, 64)), fake((3,), "int32"), fake((3,), "int32")


_varlen = _entry(kernels.attention_varlen, _packed, max_seqlen_q=256, max_seqlen_k=256)
PARAMS += options("attention_varlen", _varlen, causal=FLAGS, scale=NUMBERS | OPTIONAL, return_lse=FLAGS,
                  max_seqlen_q=INTS | {"zero"}, max_seqlen_k=INTS | {"zero"}, **LAUNCH)
# host lengths: batch + 1 ints within the 300 tokens; no hostile kind is such a sequence
PARAMS.append(row("attention_varlen", "cu_seqlens_q",
                  lambda value: kernels.attention_varlen(*_packed()[:3], value, fake((3,), "int32"), 256, 256),
                  field=r"cu_seqlens_q"))

# --- the example kernels ---------------------------------------------------------------------------
_copy = _entry(kernels.copy, lambda: (fake((64, 256), "float32"),), stages=16)
PARAMS += options("copy", _copy, box=SEQUENCES | OPTIONAL, stages=INTS | OPTIONAL, ctas_per_sm=INTS,
                  l2_promotion=(), flatten=FLAGS | OPTIONAL, evict_first=FLAGS, stores=INTS, **LAUNCH)
_transpose = _entry(kernels.transpose, lambda: (fake((64, 64), "float32"),))
PARAMS += options("transpose", _transpose, debug=FLAGS | OPTIONAL)
_softmax = _entry(kernels.softmax, lambda: (fake((64, 1024), "float32"),))
PARAMS += options("softmax", _softmax, **LAUNCH)
PARAMS += [row("softmax_plan", name, lambda value, name=name: softmax_plan((64, 1024), **{name: value}),
               valid=INTS) for name in ("rows", "stages")]
_reduce = _entry(kernels.reduce_add, lambda: (fake((2, 64, 64), "float32"), fake((64, 64), "float32")))
PARAMS += options("reduce_add", _reduce, box=SEQUENCES, debug=FLAGS | OPTIONAL)
# x: 8 CTAs of 32 rows; w: 8 tiles of 32 rows (np_int is 8: a cluster, group or sparsity of 8 fits)
_broadcast = _entry(kernels.broadcast_scale, lambda: (fake((256, 256), "float32"), fake((256, 256), "float32")))
PARAMS += options("broadcast_scale", _broadcast, cluster=INTS, stages=INTS, wrows=(),
                  group_size=INTS | OPTIONAL, iters=INTS | OPTIONAL, sparse=INTS, debug=FLAGS | OPTIONAL)
_axpb = _entry(kernels.axpb, lambda: (fake((4096,), "float32"),), a=2.0, b=1.0)
# a and b: any finite number (zero and negatives included)
PARAMS += options("axpb", _axpb, a=NUMBERS | {"zero", "negative"}, b=NUMBERS | {"zero", "negative"},
                  method=(), debug=FLAGS | OPTIONAL)
