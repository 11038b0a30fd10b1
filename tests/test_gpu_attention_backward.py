"""kernels.attention_backward against the float64 reference (computed from the same bf16 or fp16
inputs): causal and not, grouped-query heads, head dims 64, 128 and others, lengths of 1 and
odd lengths, more keys than queries and fewer, poisoned gradients, the deterministic mode
bit-identical across runs; gradients through torch autograd and a torch.compile training step."""
import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.dtypes import bf16_bits, bf16_to_float32
from tmaflow.kernels.attention_backward_sm90 import (DQ_TILE_DEFINES, ROTATE_ONE_BUFFER, ROTATE_ONE_DQ_WARP,
                                                     TWO_DQ_WARPS, persistent_slots)
from tmaflow.kernels.registry import extra_defines
from tmaflow.testing import poison, rel_error

from attention_reference import attention_backward, attention_forward

pytestmark = pytest.mark.gpu

TOL = 1e-2  # as the forward's; bf16 P and dS feed the gradient GEMMs (about 3e-3 in a lane-level emulation)


def _inputs(rng, b, hq, hkv, sq, skv, d, dtype):
    """(device arrays, their float64 values) of q, k, v and dout."""
    shapes = ((b, hq, sq, d), (b, hkv, skv, d), (b, hkv, skv, d), (b, hq, sq, d))
    if dtype == "bfloat16":
        bits = [bf16_bits(rng.standard_normal(s)) for s in shapes]
        return ([tf.from_numpy(x, dtype="bfloat16") for x in bits],
                [bf16_to_float32(x).astype(np.float64) for x in bits])
    halves = [rng.standard_normal(s).astype(np.float16) for s in shapes]
    return [tf.from_numpy(x) for x in halves], [x.astype(np.float64) for x in halves]


def _values(arr, dtype):
    host = arr.numpy()
    return bf16_to_float32(host) if dtype == "bfloat16" else host.astype(np.float64)


def _check_grads(got, want, case):
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert np.isfinite(g).all(), (name, case)
        assert rel_error(g, w) < TOL, (name, case, rel_error(g, w))


def _run(rng, b, hq, hkv, sq, skv, d, causal, dtype="bfloat16", deterministic=False):
    (q, k, v, dout), (qf, kf, vf, gf) = _inputs(rng, b, hq, hkv, sq, skv, d, dtype)
    out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True)
    grads = [poison(tf.empty(x.shape, dtype)) for x in (q, k, v)]
    result = kernels.attention_backward(q, k, v, out, dout, lse, causal=causal, deterministic=deterministic,
                                        dq=grads[0], dk=grads[1], dv=grads[2])
    assert all(r is g for r, g in zip(result, grads))
    got = [_values(g, dtype) for g in grads]
    _check_grads(got, attention_backward(qf, kf, vf, gf, causal, 1 / np.sqrt(d)), (b, hq, hkv, sq, skv, d, causal))
    return (q, k, v, out, dout, lse), got


@pytest.mark.parametrize("b,hq,hkv,sq,skv", [(1, 1, 1, 1, 1), (2, 2, 1, 77, 77), (1, 4, 1, 300, 513),
                                             (3, 2, 2, 513, 300), (1, 4, 2, 1, 77)])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward_against_float64(device, rng, b, hq, hkv, sq, skv, d, causal):
    _run(rng, b, hq, hkv, sq, skv, d, causal)


@pytest.mark.parametrize("d", [80, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward_other_head_dims(device, rng, d, causal):
    """Head dim 80 (no forward kernel: the reference's out and lse feed the backward) and 256
    (two 128-column slices a key block)."""
    if d == 256:
        _run(rng, 2, 4, 2, 130, 200, d, causal)
        return
    (q, k, v, dout), (qf, kf, vf, gf) = _inputs(rng, 1, 2, 1, 150, 220, d, "bfloat16")
    out_f, lse_f = attention_forward(qf, kf, vf, causal, 1 / np.sqrt(d))
    out = tf.from_numpy(bf16_bits(out_f), dtype="bfloat16")
    lse = tf.from_numpy(lse_f.astype(np.float32))
    dq, dk, dv = kernels.attention_backward(q, k, v, out, dout, lse, causal=causal)
    _check_grads([bf16_to_float32(g.numpy()) for g in (dq, dk, dv)],
                 attention_backward(qf, kf, vf, gf, causal, 1 / np.sqrt(d)), (d, causal))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward_fp16(device, rng, causal):
    _run(rng, 2, 4, 2, 200, 333, 128, causal, dtype="float16")
    _run(rng, 1, 2, 2, 77, 64, 64, causal, dtype="float16")


@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward_deterministic_is_bit_identical(device, rng, causal):
    """Key blocks add dQ in their order: two runs agree to the bit (and with the reference);
    the atomic mode agrees with it to rounding."""
    inputs, first = _run(rng, 2, 4, 2, 333, 400, 128, causal, deterministic=True)
    again = kernels.attention_backward(*inputs, causal=causal, deterministic=True)
    for a, b in zip(first, again):
        assert np.array_equal(a, _values(b, "bfloat16"))
    fast = kernels.attention_backward(*inputs, causal=causal)
    for a, b in zip(first, fast):
        assert rel_error(_values(b, "bfloat16"), a) < 1e-2


@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward_head_dim_64_in_64_row_steps(device, rng, causal):
    """Head dim 64's former schedule (BLOCK_M=64, the A/B's "red"; the plan takes 128-row
    steps): lengths off the tiles, GQA, the deterministic mode bit-identical."""
    for b, hq, hkv, sq, skv, det in ((1, 4, 2, 300, 513, False), (2, 4, 1, 333, 400, True)):
        (q, k, v, dout), (qf, kf, vf, gf) = _inputs(rng, b, hq, hkv, sq, skv, 64, "bfloat16")
        out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True)
        want = attention_backward(qf, kf, vf, gf, causal, 1 / 8)
        runs = []
        with extra_defines({"BLOCK_M": 64}):
            for _ in range(1 + det):
                grads = [poison(tf.empty(x.shape, "bfloat16")) for x in (q, k, v)]
                kernels.attention_backward(q, k, v, out, dout, lse, causal=causal, deterministic=det,
                                           dq=grads[0], dk=grads[1], dv=grads[2])
                runs.append([_values(g, "bfloat16") for g in grads])
        _check_grads(runs[0], want, (b, hq, hkv, sq, skv, causal, det))
        for a, again in zip(runs[0], runs[-1]):
            assert np.array_equal(a, again)


# Head dim 128's A/B variants (attention_backward_sm90.cu): two dQ buffers in packed rows with
# two Q / dO stages; dV issued before dP is waited for (240 registers a consumer); both; each
# CTA's walk over the query blocks rotated (full attention; the others ignore it).
HD128_VARIANTS = {"2buf": {"STAGES": 2, "DQ_BUFS": 2, "DQ_PACK": 1}, "dvf": {"DV_FIRST": 1, "CONSUMER_REGS": 240},
                  "both": {"STAGES": 2, "DQ_BUFS": 2, "DQ_PACK": 1, "DV_FIRST": 1, "CONSUMER_REGS": 240},
                  "rot": {"ROTATE": 1}}


@pytest.mark.parametrize("variant", sorted(HD128_VARIANTS))
@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward_head_dim_128_variants(device, rng, variant, causal):
    """Lengths off the tiles, GQA, more steps than stages and dQ buffers; the deterministic mode
    (not "both": it spills) bit-identical."""
    cases = [(1, 4, 2, 300, 513, False)] + ([] if variant == "both" else [(2, 4, 1, 333, 400, True)])
    for b, hq, hkv, sq, skv, det in cases:
        (q, k, v, dout), (qf, kf, vf, gf) = _inputs(rng, b, hq, hkv, sq, skv, 128, "bfloat16")
        out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True)
        want = attention_backward(qf, kf, vf, gf, causal, 1 / np.sqrt(128))
        runs = []
        with extra_defines(HD128_VARIANTS[variant]):
            for _ in range(1 + det):
                grads = [poison(tf.empty(x.shape, "bfloat16")) for x in (q, k, v)]
                kernels.attention_backward(q, k, v, out, dout, lse, causal=causal, deterministic=det,
                                           dq=grads[0], dk=grads[1], dv=grads[2])
                runs.append([_values(g, "bfloat16") for g in grads])
        _check_grads(runs[0], want, (variant, b, hq, hkv, sq, skv, causal, det))
        for a, again in zip(runs[0], runs[-1]):
            assert np.array_equal(a, again)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward_dq_tiles(device, rng, d, causal):
    """DQ_TILE (the dQ accumulator in tiles of the shared buffer's layout, one bulk reduction a
    step, un-permuted by the tile conversion): lengths off the tiles, GQA, a single row, fp16,
    the deterministic mode (one dQ buffer, padded rows at head dim 128) bit-identical."""
    cases = [(1, 4, 2, 300, 513, False, "bfloat16"), (2, 4, 1, 333, 400, True, "bfloat16"),
             (1, 1, 1, 1, 77, False, "bfloat16"), (1, 2, 1, 200, 130, False, "float16")]
    for b, hq, hkv, sq, skv, det, dtype in cases:
        (q, k, v, dout), (qf, kf, vf, gf) = _inputs(rng, b, hq, hkv, sq, skv, d, dtype)
        out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True)
        want = attention_backward(qf, kf, vf, gf, causal, 1 / np.sqrt(d))
        runs = []
        with extra_defines(DQ_TILE_DEFINES[d]):
            for _ in range(1 + det):
                grads = [poison(tf.empty(x.shape, dtype)) for x in (q, k, v)]
                kernels.attention_backward(q, k, v, out, dout, lse, causal=causal, deterministic=det,
                                           dq=grads[0], dk=grads[1], dv=grads[2])
                runs.append([_values(g, dtype) for g in grads])
        _check_grads(runs[0], want, (d, b, hq, hkv, sq, skv, causal, det, dtype))
        for a, again in zip(runs[0], runs[-1]):
            assert np.array_equal(a, again)


def test_attention_backward_without_queries_zeroes_dk_and_dv(device, rng):
    (q, k, v, dout), _ = _inputs(rng, 1, 2, 2, 0, 70, 64, "bfloat16")
    out, lse = kernels.attention(q, k, v, return_lse=True)
    dk, dv = poison(tf.empty(k.shape, "bfloat16")), poison(tf.empty(v.shape, "bfloat16"))
    dq, _, _ = kernels.attention_backward(q, k, v, out, dout, lse, dk=dk, dv=dv)
    assert dq.shape == q.shape
    assert not dk.numpy().any() and not dv.numpy().any()


def _torch_case(torch, rng, shape_q, shape_kv, dtype=None):
    dtype = dtype or torch.bfloat16
    q, k, v = (torch.tensor(rng.standard_normal(s), dtype=dtype, device="cuda", requires_grad=True)
               for s in (shape_q, shape_kv, shape_kv))
    grad = torch.tensor(rng.standard_normal(shape_q), dtype=dtype, device="cuda")
    want = attention_backward(*(t.detach().double().cpu().numpy() for t in (q, k, v, grad)), True,
                              1 / np.sqrt(shape_q[-1]))
    return q, k, v, grad, want


def _torch_grads(q, k, v):
    return [t.grad.double().cpu().numpy() for t in (q, k, v)]


def test_attention_backward_through_torch_autograd(device, rng):
    """kernels.attention on tensors that require grad records the op: out.backward(grad)
    fills q.grad, k.grad and v.grad (GQA 4:1, causal); torch.ops.tmaflow.attention too."""
    torch = pytest.importorskip("torch")
    import tmaflow.torch  # noqa: F401  (registers the autograd ops)

    q, k, v, grad, want = _torch_case(torch, rng, (2, 4, 300, 128), (2, 1, 300, 128))
    out = kernels.attention(q, k, v, causal=True)
    assert out.requires_grad
    out.backward(grad)
    _check_grads(_torch_grads(q, k, v), want, "kernels.attention")
    for t in (q, k, v):
        t.grad = None
    torch.ops.tmaflow.attention(q, k, v, True).backward(grad)
    _check_grads(_torch_grads(q, k, v), want, "torch.ops.tmaflow.attention")


def test_attention_backward_through_autograd_takes_a_misaligned_gradient(device, rng):
    """The gradient of out may be a contiguous view at an odd element (a slice of a concatenation's
    gradient): the backward copies it to an aligned one instead of refusing it."""
    torch = pytest.importorskip("torch")
    import tmaflow.torch  # noqa: F401  (registers the autograd ops)

    q, k, v, grad, want = _torch_case(torch, rng, (1, 2, 77, 64), (1, 1, 77, 64))
    shift = int(rng.integers(1, 8))
    shifted = torch.empty(grad.numel() + shift, dtype=grad.dtype, device="cuda")[shift:].view(grad.shape)
    shifted.copy_(grad)
    assert shifted.is_contiguous() and shifted.data_ptr() % 16
    kernels.attention(q, k, v, causal=True).backward(shifted)
    _check_grads(_torch_grads(q, k, v), want, "misaligned gradient")


def test_attention_backward_in_a_torch_compile_training_step(device, rng):
    """A fullgraph-compiled step (projection, attention, loss) gives the eager step's gradients."""
    torch = pytest.importorskip("torch")
    import tmaflow.torch  # noqa: F401

    q, k, v, grad, want = _torch_case(torch, rng, (1, 2, 257, 64), (1, 2, 257, 64))
    weight = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def step(q, k, v, weight):
        out = kernels.attention(q @ weight, k, v, causal=True)
        return (out.float() * grad.float()).sum()

    step(q, k, v, weight).backward()
    eager = _torch_grads(q, k, v) + [weight.grad.double().cpu().numpy()]
    for t in (q, k, v, weight):
        t.grad = None
    torch.compile(step, fullgraph=True)(q, k, v, weight).backward()
    compiled = _torch_grads(q, k, v) + [weight.grad.double().cpu().numpy()]
    for name, a, b in zip(("dq", "dk", "dv", "dweight"), compiled, eager):
        assert rel_error(a, b) < 1e-2, (name, rel_error(a, b))


def test_attention_backward_matches_torch_sdpa_backward(device):
    torch = pytest.importorskip("torch")
    import tmaflow.torch  # noqa: F401

    for dtype in (torch.bfloat16, torch.float16):
        q = torch.randn(2, 8, 1000, 128, device="cuda", dtype=dtype, requires_grad=True)
        k, v = (torch.randn(2, 2, 1000, 128, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
        grad = torch.randn_like(q)
        torch.autograd.backward(kernels.attention(q, k, v, causal=True), grad)
        ours = [t.grad.float() for t in (q, k, v)]
        q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
        torch.nn.functional.scaled_dot_product_attention(q32, k32, v32, is_causal=True,
                                                         enable_gqa=True).backward(grad.float())
        for name, a, b in zip("qkv", ours, (q32.grad, k32.grad, v32.grad)):
            assert (torch.linalg.norm(a - b) / torch.linalg.norm(b)).item() < TOL, (name, dtype)


@pytest.mark.parametrize("sq,skv", [(17, 17), (1000, 1000), (1023, 1023), (1023, 130), (64, 1000)])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward_lengths_off_the_tiles(device, rng, sq, skv, d, causal):
    """Lengths that end inside a 64-row query block and a 128-key block (the Hopper kernel's
    tiles), more keys than queries and fewer, GQA 2:1."""
    _run(rng, 1, 2, 1, sq, skv, d, causal)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward_deterministic_multi_query(device, rng, d, causal):
    """One kv head for four query heads, deterministic: bit-identical twice, fp16 too."""
    inputs, first = _run(rng, 2, 4, 1, 700, 1000, d, causal, deterministic=True)
    again = kernels.attention_backward(*inputs, causal=causal, deterministic=True)
    for a, b in zip(first, again):
        assert np.array_equal(a, _values(b, "bfloat16"))
    _run(rng, 1, 4, 1, 300, 300, d, causal, dtype="float16", deterministic=True)


def _main_launch(inputs, causal=False):
    """The main kernel's launcher of the deterministic plan for ``inputs``."""
    return kernels.attention_backward.prepare(*inputs, causal=causal, deterministic=True).launcher.launches[1]


@pytest.mark.parametrize("d", [64, 128])
def test_attention_backward_deterministic_rotated_walk(device, rng, d):
    """Full attention where a (batch, kv head)'s key blocks fit the GPU at once: the persistent
    rotated walk (DET_ROTATE), cooperative, whole groups a wave (40 key blocks: 3 groups a wave
    on 132 SMs, 8 groups in waves of 3, 3, 2; GQA 2:1; lengths off the tiles), against the float64
    reference, bit-identical twice (and, head dim 128, with one dQ buffer instead of the plan's
    two), and within rounding of the chain from key block 0 (DET_ROTATE=0)."""
    b, hq, hkv, sq, skv = 2, 8, 4, 333, 40 * 128 - 50
    inputs, first = _run(rng, b, hq, hkv, sq, skv, d, False, deterministic=True)
    main = _main_launch(inputs)
    slots = persistent_slots(40, b * hkv, main.max_active_clusters())
    assert slots and main.grid == (slots * 40, 1, 1) and main.config.cooperative, (slots, main.grid)
    for _ in range(2):
        again = kernels.attention_backward(*inputs, deterministic=True)
        for a, g in zip(first, again):
            assert np.array_equal(a, _values(g, "bfloat16"))
    with extra_defines({"DET_ROTATE": 0}):
        assert not _main_launch(inputs).config.cooperative
        chain = kernels.attention_backward(*inputs, deterministic=True)
    for a, g in zip(first, chain):
        assert rel_error(_values(g, "bfloat16"), a) < 1e-2
    if d == 128:  # one dQ buffer, one dQ warp (the A/B's): the same adds in the same order, to the bit
        for defines in (ROTATE_ONE_BUFFER, ROTATE_ONE_DQ_WARP):
            with extra_defines(defines):
                assert _main_launch(inputs).config.cooperative
                one = kernels.attention_backward(*inputs, deterministic=True)
            for a, g in zip(first, one):
                assert np.array_equal(a, _values(g, "bfloat16")), defines


@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward_deterministic_two_dq_warps_keep_the_bits(device, rng, causal):
    """Two dQ warps (DQ_WARPS=2, every other step each) in the chain from key block 0 (full:
    DET_ROTATE=0) and the causal last-first chain (SPT): the plan's one warp's sums to the bit
    (the same adds in the same order), twice, head dim 128 (lengths off the tiles, GQA)."""
    walk = {} if causal else {"DET_ROTATE": 0}
    inputs = _run(rng, 2, 4, 2, 700, 900, 128, causal, deterministic=True)[0]
    with extra_defines(walk):
        assert not _main_launch(inputs, causal).config.cooperative
        first = [_values(g, "bfloat16") for g in kernels.attention_backward(*inputs, causal=causal, deterministic=True)]
    with extra_defines({**walk, **TWO_DQ_WARPS}):
        assert int(_main_launch(inputs, causal).kernel.defines["DQ_WARPS"]) == 2
        for _ in range(2):
            again = kernels.attention_backward(*inputs, causal=causal, deterministic=True)
            for a, g in zip(first, again):
                assert np.array_equal(a, _values(g, "bfloat16"))


def test_attention_backward_deterministic_chain_where_a_group_does_not_fit(device, rng):
    """More key blocks than the GPU holds CTAs: the plan takes the chain from key block 0 (a
    plain grid), bit-identical twice; DET_ROTATE=1 forced there is refused, naming the counts."""
    resident = _main_launch(_run(rng, 1, 1, 1, 64, 128, 128, False, deterministic=True)[0]).max_active_clusters()
    skv = (resident + 1) * 128 - 3
    inputs, first = _run(rng, 1, 2, 1, 100, skv, 128, False, deterministic=True)
    main = _main_launch(inputs)
    assert main.grid == (resident + 1, 1, 1) and not main.config.cooperative
    again = kernels.attention_backward(*inputs, deterministic=True)
    for a, g in zip(first, again):
        assert np.array_equal(a, _values(g, "bfloat16"))
    with extra_defines({"DET_ROTATE": 1}):
        with pytest.raises(tf.TmaflowError, match=rf"DET_ROTATE=1 \(an override\) needs .*'s {resident + 1} key "
                                                  rf"blocks resident at once; the GPU holds {resident} CTAs"):
            kernels.attention_backward(*inputs, deterministic=True)


def test_attention_backward_deterministic_rotated_walk_in_a_graph(device, rng):
    """The rotated walk's cooperative launch, captured into a tf.Graph, replays to the eager
    run's bits (into poisoned gradients, twice)."""
    inputs, first = _run(rng, 1, 4, 2, 200, 700, 128, False, deterministic=True)
    assert _main_launch(inputs).config.cooperative
    grads = [tf.empty(x.shape, "bfloat16") for x in inputs[:3]]
    with tf.Graph() as g:
        with g.capture():
            kernels.attention_backward(*inputs, deterministic=True, dq=grads[0], dk=grads[1], dv=grads[2])
        for _ in range(2):
            for x in grads:
                poison(x)
            g.replay()
            for a, x in zip(first, grads):
                assert np.array_equal(a, _values(x, "bfloat16"))
