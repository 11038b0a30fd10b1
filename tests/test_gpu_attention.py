"""kernels.attention against a float64 reference: bf16 and fp16, head dims 64, 128 and 256, causal
and not, ragged sequences, more keys than queries, grouped-query heads, poisoned outputs, the
log-sum-exp; and kernels.attention_cp_async, seed 002's pre-Hopper schedule."""
import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.dtypes import bf16_bits, bf16_to_float32
from tmaflow.testing import poison, rel_error

pytestmark = pytest.mark.gpu


def _reference(q, k, v, causal, scale):
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = (q @ k.swapaxes(-1, -2)) * scale  # matmul, not einsum: BLAS keeps large cases quick
    if causal:
        s = np.where(np.triu(np.ones(s.shape[-2:], bool), 1), -np.inf, s)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    total = p.sum(-1, keepdims=True)
    return (p / total) @ v, (m + np.log(total))[..., 0]


def _bf16(rng, shape):
    bits = bf16_bits(rng.standard_normal(shape))
    return tf.from_numpy(bits, dtype="bfloat16"), bf16_to_float32(bits).astype(np.float64)


@pytest.mark.parametrize("b,hq,hkv,sq,skv", [(1, 2, 2, 128, 128), (2, 4, 2, 300, 300), (1, 2, 1, 77, 513),
                                             (1, 1, 1, 1, 1000), (2, 2, 2, 640, 640)])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_against_float64(device, rng, b, hq, hkv, sq, skv, d, causal):
    q, qf = _bf16(rng, (b, hq, sq, d))
    k, kf = _bf16(rng, (b, hkv, skv, d))
    v, vf = _bf16(rng, (b, hkv, skv, d))
    scale = 1 / np.sqrt(d)
    ref, ref_lse = _reference(qf, kf, vf, causal, scale)
    for debug in (True, False):
        out = poison(tf.empty((b, hq, sq, d), "bfloat16"))
        _, lse = kernels.attention(q, k, v, out, causal=causal, return_lse=True, debug=debug)
        got = bf16_to_float32(out.numpy())
        assert not np.isnan(got).any(), (debug, causal)
        assert rel_error(got, ref) < 1e-2, (b, hq, hkv, sq, skv, d, causal, debug, rel_error(got, ref))
        np.testing.assert_allclose(lse.numpy(), ref_lse, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("b,hq,hkv,sq,skv", [(2, 4, 2, 300, 300), (1, 2, 1, 77, 513), (3, 12, 4, 520, 520)])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_fp16_against_float64(device, rng, b, hq, hkv, sq, skv, d, causal):
    """fp16 Q, K, V and O (the fp16 wgmmas); the last shape has more work tiles than SMs."""
    q, k, v = (rng.standard_normal(shape).astype(np.float16)
               for shape in ((b, hq, sq, d), (b, hkv, skv, d), (b, hkv, skv, d)))
    ref, ref_lse = _reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), causal,
                              1 / np.sqrt(d))
    out = poison(tf.empty((b, hq, sq, d), "float16"))
    _, lse = kernels.attention(tf.from_numpy(q), tf.from_numpy(k), tf.from_numpy(v), out, causal=causal,
                               return_lse=True)
    got = out.numpy()
    assert got.dtype == np.float16 and not np.isnan(got).any()
    assert rel_error(got, ref) < 5e-3, (b, hq, hkv, sq, skv, d, causal, rel_error(got, ref))
    np.testing.assert_allclose(lse.numpy(), ref_lse, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_attention_persistent_ctas_cross_heads_and_blocks(device, rng, d):
    """More work tiles than SMs: non-causal CTAs stride over them, so one CTA runs several
    (batch, head, row block)s in turn through the same pipelines and Q buffer."""
    b, hq, hkv, sq = 3, 12, 4, 520
    assert -(-sq // 128) * b * hq > device.sm_count
    q, qf = _bf16(rng, (b, hq, sq, d))
    k, kf = _bf16(rng, (b, hkv, sq, d))
    v, vf = _bf16(rng, (b, hkv, sq, d))
    ref, ref_lse = _reference(qf, kf, vf, False, 1 / np.sqrt(d))
    out = poison(tf.empty((b, hq, sq, d), "bfloat16"))
    _, lse = kernels.attention(q, k, v, out, return_lse=True)
    got = bf16_to_float32(out.numpy())
    assert not np.isnan(got).any()
    assert rel_error(got, ref) < 1e-2, rel_error(got, ref)
    np.testing.assert_allclose(lse.numpy(), ref_lse, rtol=1e-3, atol=1e-3)


# Schedules beside the default (attention.cu's PAIRED, Q_STAGES, Q_SPLIT, L2_PREFETCH, STORE16 and
# BLOCK_N), through extra defines.
# name -> (defines, head dims, causal or not)
_SCHEDULES = {"default": ({}, (64, 128, 256), (True, False)),
              "one CTA a causal tile": ({"PAIRED": 0}, (64, 128, 256), (True,)),
              "one Q buffer": ({"Q_STAGES": 1}, (64,), (True, False)),
              "two Q buffers, fewer K and V": ({"Q_STAGES": 2}, (128,), (True,)),
              "L2 prefetch of the next tile": ({"L2_PREFETCH": 1}, (128, 256), (True, False)),
              "4-byte stores": ({"STORE16": 0}, (64, 128, 256), (True, False)),
              "round 1: whole Q, no prefetch": ({"L2_PREFETCH": 0, "Q_SPLIT": 0, "STORE16": 0}, (128, 256),
                                                (True, False)),
              "128 keys a tile": ({"BLOCK_N": 128}, (128,), (False,)),
              "80 keys a tile, whole Q": ({"BLOCK_N": 80, "Q_SPLIT": 0, "STORE16": 0}, (256,), (False,))}


@pytest.mark.parametrize("d", [64, 128, 256])
def test_attention_schedules_against_float64(device, rng, d):
    """Every schedule, causal and not, on shapes that cross its edges: more pairs of row blocks
    than SMs (CTAs take several, the next one's Q loading under the last), an odd number of row
    blocks (the middle one has no partner), rows and keys not multiples of the tiles, fewer keys
    than queries and more."""
    from tmaflow.kernels.registry import extra_defines

    shapes = [(3, 12, 4, 1000, 1000), (2, 4, 2, 300, 300), (1, 2, 1, 520, 300), (1, 2, 1, 77, 513)]
    assert -(-1000 // 256) * 3 * 12 > device.sm_count  # more pairs than SMs
    for b, hq, hkv, sq, skv in shapes:
        q, qf = _bf16(rng, (b, hq, sq, d))
        k, kf = _bf16(rng, (b, hkv, skv, d))
        v, vf = _bf16(rng, (b, hkv, skv, d))
        for causal in (True, False):
            ref, ref_lse = _reference(qf, kf, vf, causal, 1 / np.sqrt(d))
            for name, (defines, dims, modes) in _SCHEDULES.items():
                if d not in dims or causal not in modes:
                    continue
                with extra_defines(defines):
                    out = poison(tf.empty((b, hq, sq, d), "bfloat16"))
                    _, lse = kernels.attention(q, k, v, out, causal=causal, return_lse=True)
                got = bf16_to_float32(out.numpy())
                assert not np.isnan(got).any(), (name, b, hq, sq, skv, causal)
                assert rel_error(got, ref) < 1e-2, (name, b, hq, sq, skv, causal, rel_error(got, ref))
                np.testing.assert_allclose(lse.numpy(), ref_lse, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_attention_out_only_4_byte_aligned_takes_word_stores(device, rng, d):
    """STORE16 stores 16 B a lane only where out is 16-byte aligned: an out 4 bytes past such a
    boundary (allowed) takes the word-a-column-pair stores; the bytes around it stay poisoned."""
    b, hq, sq = 2, 3, 200
    q, qf = _bf16(rng, (b, hq, sq, d))
    k, kf = _bf16(rng, (b, hq, sq, d))
    v, vf = _bf16(rng, (b, hq, sq, d))
    n = b * hq * sq * d
    for causal in (False, True):
        ref, _ = _reference(qf, kf, vf, causal, 1 / np.sqrt(d))
        base = poison(tf.empty((n + 8,), "bfloat16"))
        out = tf.DeviceArray(base.ptr + 4, (b, hq, sq, d), "bfloat16", owner=base)
        assert out.ptr % 16 == 4
        kernels.attention(q, k, v, out, causal=causal)
        whole = base.numpy().view(np.uint16)
        assert (whole[:2] == 0xFFFF).all() and (whole[2 + n:] == 0xFFFF).all(), causal  # nothing outside out
        got = bf16_to_float32(whole[2:2 + n].reshape(b, hq, sq, d))
        assert rel_error(got, ref) < 1e-2, (d, causal, rel_error(got, ref))


@pytest.mark.parametrize("b,hq,hkv,sq,skv", [(1, 2, 2, 128, 128), (2, 4, 2, 300, 300), (1, 2, 1, 77, 513),
                                             (1, 1, 1, 1, 1000)])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_cp_async_against_float64(device, rng, b, hq, hkv, sq, skv, d, causal):
    """Seed 002's pre-Hopper schedule (cp.async double buffering, mma.sync), kept beside it."""
    q, qf = _bf16(rng, (b, hq, sq, d))
    k, kf = _bf16(rng, (b, hkv, skv, d))
    v, vf = _bf16(rng, (b, hkv, skv, d))
    ref, _ = _reference(qf, kf, vf, causal, 1 / np.sqrt(d))
    out = poison(tf.empty((b, hq, sq, d), "bfloat16"))
    kernels.attention_cp_async(q, k, v, out, causal=causal)
    got = bf16_to_float32(out.numpy())
    assert not np.isnan(got).any()
    assert rel_error(got, ref) < 1e-2, (b, hq, hkv, sq, skv, d, causal, rel_error(got, ref))


def test_attention_scale_and_allocated_output(device, rng):
    q, qf = _bf16(rng, (1, 2, 200, 64))
    k, kf = _bf16(rng, (1, 2, 333, 64))
    v, vf = _bf16(rng, (1, 2, 333, 64))
    out = kernels.attention(q, k, v, scale=0.3)
    ref, _ = _reference(qf, kf, vf, False, 0.3)
    assert rel_error(bf16_to_float32(out.numpy()), ref) < 1e-2


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_attention_matches_torch_sdpa(device, dtype):
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype)
    q = torch.randn(2, 8, 1000, 128, device="cuda", dtype=dtype)
    k = torch.randn(2, 2, 1000, 128, device="cuda", dtype=dtype)
    v = torch.randn(2, 2, 1000, 128, device="cuda", dtype=dtype)
    for causal in (False, True):
        out = kernels.attention(q, k, v, causal=causal)
        assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == dtype
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                                               enable_gqa=True)
        assert (torch.linalg.norm(out.float() - ref) / torch.linalg.norm(ref)).item() < 1e-2


def test_attention_inside_torch_compile_runs_the_custom_op(device):
    torch = pytest.importorskip("torch")
    import tmaflow.torch  # noqa: F401  registers torch.ops.tmaflow.attention

    def f(q, k, v):
        return kernels.attention(q * 1.0, k, v, causal=True) + 1.0

    q, k, v = (torch.randn(1, 4, 300, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    got, want = torch.compile(f, fullgraph=True)(q, k, v), f(q, k, v)
    assert torch.equal(got, want)
    meta = torch.empty(2, 4, 100, 64, device="meta", dtype=torch.bfloat16)
    assert torch.ops.tmaflow.attention(meta, meta, meta).shape == (2, 4, 100, 64)
    m192, m128 = (torch.empty(2, 4, 100, d, device="meta", dtype=torch.bfloat16) for d in (192, 128))
    assert torch.ops.tmaflow.attention(m192, m192, m128).shape == (2, 4, 100, 128)  # v's head dim
    with pytest.raises(Exception, match=r"tmaflow.attention: head_dim 72 \(the same in k\) and v's 72 must be a "
                                        r"multiple of 16 from 32 to 256"):
        m72 = torch.empty(1, 1, 8, 72, device="meta", dtype=torch.bfloat16)
        torch.ops.tmaflow.attention(m72, m72, m72)
