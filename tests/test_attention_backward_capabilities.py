"""The backward beyond equal head dims and dense batches, without a GPU: v's head dim apart from
q's (192 / 128, 96 / 64) and kernels.attention_varlen_backward (packed sequences): argument
checks, plans, and every new variant compiling for sm_90a without spills."""
import itertools

import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.kernels.attention_backward_entry import backward_smem, main_defines, slices
from tmaflow.kernels.attention_varlen_backward_entry import key_blocks
from tmaflow.kernels.registry import get_kernel
from tmaflow.runtime.memory import DeviceArray
from tmaflow.tma.layout import HOPPER_SMEM_LIMIT

_FAKE = itertools.count(1 << 36, 1 << 24)


def arr(shape, dtype="bfloat16"):
    return DeviceArray(next(_FAKE), shape, dtype)


def dense(d=192, dv=128, hq=2, hkv=1, sq=64, skv=64):
    return [arr((1, hq, sq, d)), arr((1, hkv, skv, d)), arr((1, hkv, skv, dv)), arr((1, hq, sq, dv)),
            arr((1, hq, sq, dv)), arr((1, hq, sq), "float32")]


def varlen(d=192, dv=128, hq=2, hkv=1, tq=10, tk=12):
    return [arr((tq, hq, d)), arr((tk, hkv, d)), arr((tk, hkv, dv)), arr((tq, hq, dv)), arr((tq, hq, dv)),
            arr((hq, tq), "float32")]


def _with(base, index, value):
    base[index] = value
    return base


@pytest.mark.parametrize("given,match", [
    (dense(dv=72), r"attention_backward: v's head_dim=72 is not supported"),
    (_with(dense(), 3, arr((1, 2, 64, 192))), r"attention_backward: out must be \(1, 2, 64, 128\) bfloat16, q's "
     r"shape with v's head_dim \(got \(1, 2, 64, 192\) bfloat16\)"),
    (_with(dense(), 4, arr((1, 2, 64, 192))), r"dout must be \(1, 2, 64, 128\) bfloat16"),
    (_with(dense(), 1, arr((1, 1, 64, 128))), r"q is \(1, 2, 64, 192\) but k is \(1, 1, 64, 128\)"),
])
def test_unequal_head_dims_are_checked_by_name(given, match):
    with pytest.raises(tf.TmaflowError, match=match):
        kernels.attention_backward(*given)


@pytest.mark.parametrize("given,cu_q,cu_k,kw,match", [
    (varlen(), [0, 4, 10], [0, 5, 12], {"causal": 2}, r"attention_varlen_backward: causal=2 must be True or False"),
    (varlen(), [0, 4, 10], [0, 5, 12], {"deterministic": None}, r"deterministic=None must be True or False"),
    (_with(varlen(), 5, arr((10, 2), "float32")), [0, 4, 10], [0, 5, 12], {},
     r"attention_varlen_backward: lse must be a contiguous \(2, 10\) float32 array \(heads, total_q\), as "
     r"attention_varlen\(..., return_lse=True\) returns it; got \(10, 2\) float32"),
    (_with(varlen(), 3, arr((10, 2, 192))), [0, 4, 10], [0, 5, 12], {}, r"out must be \(10, 2, 128\) bfloat16"),
    (varlen(), [0, 6, 4], [0, 5, 12], {}, r"attention_varlen_backward: cu_seqlens_q must never decrease; "
     r"cu_seqlens_q\[2\]=4 is below cu_seqlens_q\[1\]=6"),
    (varlen(), [0, 4, 11], [0, 5, 12], {}, r"cu_seqlens_q runs from 0 to 11; it must stay within the 10 tokens"),
    (varlen(), [0, 4, 10], [0, 12], {}, r"cu_seqlens_q has 3 values but cu_seqlens_k has 2"),
    (varlen(), [0, 4, 10], [0, 5, 12], {"max_seqlen_k": 6}, r"sequence 1 of cu_seqlens_k has 7 tokens, more than "
     r"max_seqlen_k=6"),
    (varlen(dv=40), [0, 4, 10], [0, 5, 12], {}, r"attention_varlen_backward: v's head_dim=40 is not supported"),
    (varlen(hq=3, hkv=2), [0, 4, 10], [0, 5, 12], {}, r"3 query heads must be a multiple of the 2"),
    (varlen(), [0, 4, 10], [0, 5, 12], {"dk": arr((12, 1, 128))}, r"attention_varlen_backward: dk must be a "
     r"\(12, 1, 192\) bfloat16 array"),
])
def test_varlen_backward_refuses_bad_arguments_by_name(given, cu_q, cu_k, kw, match):
    kw = {"max_seqlen_q": 16, "max_seqlen_k": 16, **kw}
    with pytest.raises(tf.TmaflowError, match=match):
        kernels.attention_varlen_backward(*given, cu_q, cu_k, kw.pop("max_seqlen_q"), kw.pop("max_seqlen_k"), **kw)


def test_plans_of_unequal_head_dims():
    """Slices follow the wider head dim; shared memory holds K and Q of q's rows, V and dO of v's."""
    assert slices(192, 128) == 2 and slices(96, 64) == 1 and slices(64, 256) == 2 and slices(128) == 1
    assert backward_smem(192, 128) == 2 * 64 * 200 * 2 + 2 * 64 * 136 * 2 + 64 * 72 * 2 + 512
    assert backward_smem(128, 128) == backward_smem(128)
    for d, dv in itertools.product(range(16, 257, 16), repeat=2):
        assert backward_smem(d, dv) <= HOPPER_SMEM_LIMIT
    # at most ceil(len / 64) key blocks a sequence, however the tokens split
    assert key_blocks(0, 0) == 1 and key_blocks(130, 1) == 3 and key_blocks(130, 3) == 4
    rng = np.random.default_rng(0)
    for _ in range(50):
        lens = rng.integers(0, 200, rng.integers(1, 20))
        assert sum(-(-n // 64) for n in lens) <= key_blocks(int(lens.sum()), len(lens))


@pytest.mark.parametrize("d,dv", [(192, 128), (96, 64), (64, 128), (128, 64)])
@pytest.mark.parametrize("varlen_", [False, True])
@pytest.mark.parametrize("causal,deterministic,dtype", [(False, False, "bfloat16"), (True, True, "float16")])
def test_unequal_and_varlen_kernels_compile_without_spills(d, dv, varlen_, causal, deterministic, dtype):
    defines = main_defines(d, dv, causal, deterministic, dtype, varlen=varlen_)
    for name in ("attention_bwd_prep", "attention_bwd"):
        res = get_kernel(name, None, defines=defines, file="attention_backward").program.resources
        assert res.spills == 0 and res.stack_frame == 0, (name, defines, res)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_kernels_at_equal_head_dims_compile(d, causal):
    """The mma.sync VARLEN build at equal head dims 64 and 128 (the varlen backward runs the
    Hopper kernel there; this one is what other routes fall back to) compiles, with at most light
    spills (NVRTC 13.5: a 24-byte stack at 128 causal; 13.0, the GPU image's: 16)."""
    defines = main_defines(d, d, causal, False, "bfloat16", varlen=True)
    res = get_kernel("attention_bwd", None, defines=defines, file="attention_backward").program.resources
    assert res.registers <= 255 and res.stack_frame <= 32, res


def test_varlen_ops_trace_and_differentiate_on_meta_tensors():
    """torch.ops.tmaflow.attention_varlen_lse / attention_varlen_backward give torch their shapes
    (lse (heads, total_q)), refuse a transposed lse by name, and kernels.attention_varlen on
    tensors that require grad records an autograd node whose backward gives q, k and v grads
    of their shapes (meta tensors: the fake implementations run, no GPU)."""
    torch = pytest.importorskip("torch")
    import tmaflow.torch  # noqa: F401  registers the ops

    def meta(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, device="meta", dtype=dtype)
    cu = meta(4, dtype=torch.int32)
    q, k, v = meta(50, 4, 192), meta(50, 2, 192), meta(50, 2, 128)
    out, lse = torch.ops.tmaflow.attention_varlen_lse(q, k, v, cu, cu, 25, 25)
    assert out.shape == (50, 4, 128) and lse.shape == (4, 50) and lse.dtype == torch.float32
    grads = torch.ops.tmaflow.attention_varlen_backward(q, k, v, out, out, lse, cu, cu, 25, 25, True)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    with pytest.raises(Exception, match=r"tmaflow.attention_varlen_backward: needs out and dout of \(50, 4, 128\) "
                       r"and a float32 lse of \(4, 50\)"):
        torch.ops.tmaflow.attention_varlen_backward(q, k, v, out, out, lse.t(), cu, cu, 25, 25)
    leaves = [x.requires_grad_() for x in (q, k, v)]
    kernels.attention_varlen(*leaves, cu, cu, 25, 25, causal=True).sum().backward()
    assert [x.grad.shape for x in leaves] == [q.shape, k.shape, v.shape]
