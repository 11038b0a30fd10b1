"""kernels.attention's argument checks and plan (no GPU)."""
import itertools

import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.kernels.attention_entry import attention_plan
from tmaflow.tma.layout import HOPPER_SMEM_LIMIT
from tmaflow.runtime.memory import DeviceArray


_FAKE = itertools.count(1 << 32, 1 << 24)


def arr(shape, dtype="bfloat16", strides=None):
    return DeviceArray(next(_FAKE), shape, dtype, strides)  # one range each: no aliasing


@pytest.mark.parametrize("q,k,v,kw,match", [
    (arr((2, 64, 128)), arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), {}, r"q must be 4-D"),
    (arr((1, 2, 64, 128), "float32"), arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), {}, r"q must be bfloat16 or float16 \(got float32\)"),
    (arr((1, 2, 64, 128), "float16"), arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), {}, r"k is bfloat16 but q is float16; q, k and v must have one dtype"),
    (arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), arr((1, 2, 64, 128), "float16"), {}, r"v is float16 but q is bfloat16"),
    (arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), arr((1, 2, 65, 128)), {}, r"k \(1, 2, 64, 128\) and v \(1, 2, 65, 128\)"),
    (arr((1, 3, 64, 128)), arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), {}, r"3 query heads must be a multiple of the 2"),
    (arr((1, 2, 64, 96)), arr((1, 2, 64, 96)), arr((1, 2, 64, 96)), {}, r"head_dim=96 is not supported"),
    (arr((1, 2, 64, 128)), arr((1, 2, 0, 128)), arr((1, 2, 0, 128)), {}, r"k and v have no keys"),
    (arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), {"scale": float("inf")}, r"scale=inf must be a positive finite float"),
    (arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), {"scale": -0.1}, r"scale=-0.1 must be a positive"),
    (arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), {"causal": 1}, r"causal=1 must be True or False"),
    (arr((1, 2, 64, 64), strides=(16384 * 2, 8192 * 2, 128, 2)), arr((1, 2, 64, 64)), arr((1, 2, 64, 64)), {},
     r"q must be contiguous"),
])
def test_attention_refuses_bad_arguments_by_name(q, k, v, kw, match):
    with pytest.raises(tf.TmaflowError, match=match):
        kernels.attention(q, k, v, **kw)


@pytest.mark.parametrize("d,causal,keys,k_stages,v_stages",
                         [(64, False, 128, 4, 4), (128, False, 176, 2, 2), (128, True, 128, 3, 3),
                          (256, False, 64, 3, 2)])
def test_attention_plan_fits_shared_memory_with_several_stages(d, causal, keys, k_stages, v_stages):
    """Separate K and V pipelines with equal stages (up to four), K taking any bytes left over;
    176-key tiles at head dim 128 without a causal mask."""
    spec_q, spec_kv, layout = attention_plan(d, causal)
    assert layout.total_bytes <= HOPPER_SMEM_LIMIT and spec_kv.box == (1, keys, 64)
    assert [(p.name, p.stages) for p in layout.items[:3]] == [("qp", 1), ("kp", k_stages), ("vp", v_stages)]


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [0, 1])
def test_cp_async_attention_compiles_without_spills(d, causal):
    """The pre-Hopper kernel kept from seed 002: mma.sync and ldmatrix, no local memory."""
    from tmaflow.kernels.registry import get_kernel
    k = get_kernel("attention_cp_async", None, defines={"HEAD_DIM": d, "CAUSAL": causal}, file="attention_cp_async")
    sass = k.sass()
    assert k.resources.spills == 0 and k.resources.stack_frame == 0, k.resources
    assert "HMMA" in sass and "LDSM" in sass and "LDGSTS" in sass


def test_cp_async_attention_refuses_head_dim_256():
    with pytest.raises(tf.TmaflowError, match=r"attention_cp_async: head_dim=256 is not supported; use one of \(64, 128\)"):
        kernels.attention_cp_async(arr((1, 2, 64, 256)), arr((1, 2, 64, 256)), arr((1, 2, 64, 256)))


@pytest.mark.parametrize("entry", ["attention", "attention_cp_async"])
def test_attention_refuses_an_out_that_is_not_4_byte_aligned(entry, rng):
    """A lane stores two elements of out as one 4-byte word: an out at an odd element would
    fault on the GPU."""
    q, k, v = (arr((1, 2, 64, 128)) for _ in range(3))
    out = DeviceArray(next(_FAKE) + 2 + 4 * int(rng.integers(0, 4)), q.shape, "bfloat16")
    with pytest.raises(tf.TmaflowError, match=rf"{entry}: out must be contiguous and 4-byte aligned "
                                              rf"\(strides .* at 0x{out.ptr:x}\)"):
        getattr(kernels, entry)(q, k, v, out)
