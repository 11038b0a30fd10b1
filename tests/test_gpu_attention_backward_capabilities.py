"""The backward beyond equal head dims and dense batches, against float64 gradients of the same
bf16 inputs: v's head dim apart from q's (192 / 128, 96 / 64; and 160, whose slices are now two
of 80 columns), causal and not, grouped-query heads; kernels.attention_varlen_backward over ragged sequences (empty ones, one token, tokens
before the first sequence and after the last, lengths off the 64- and 128-row steps), device
and host lengths, deterministic runs, the plan's schedule and the one before it, a CUDA graph
replayed with new lengths; the attention_varlen op under torch autograd and
torch.compile(fullgraph=True) against a float64 torch reference. Gradients are poisoned first."""
import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.dtypes import bf16_bits, bf16_to_float32
from tmaflow.kernels.attention_backward_sm90 import DQ_ROWS_DEFINES, VARLEN_BEFORE
from tmaflow.kernels.registry import extra_defines
from tmaflow.testing import poison, rel_error

from attention_reference import attention_backward

pytestmark = pytest.mark.gpu

TOL = 1e-2  # as the dense backward's


def _bf16(rng, shape):
    bits = bf16_bits(rng.standard_normal(shape))
    return tf.from_numpy(bits, dtype="bfloat16"), bf16_to_float32(bits).astype(np.float64)


def _float(arr):
    return bf16_to_float32(arr.numpy()).astype(np.float64)


def _close(got, want, what):
    assert np.isfinite(got).all(), what
    assert rel_error(got, want) < TOL, (what, rel_error(got, want))


@pytest.mark.parametrize("d,dv", [(192, 128), (96, 64), (160, 160)])  # 160: two slices of 80 columns
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,hq,hkv,sq,skv", [(2, 4, 2, 77, 130), (1, 2, 1, 200, 64)])
def test_unequal_head_dims_against_float64(device, rng, d, dv, causal, b, hq, hkv, sq, skv):
    shapes = ((b, hq, sq, d), (b, hkv, skv, d), (b, hkv, skv, dv), (b, hq, sq, dv))
    (q, k, v, dout), (qf, kf, vf, gf) = zip(*(_bf16(rng, s) for s in shapes))
    out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True)
    grads = [poison(tf.empty(x.shape, "bfloat16")) for x in (q, k, v)]
    kernels.attention_backward(q, k, v, out, dout, lse, causal=causal, dq=grads[0], dk=grads[1], dv=grads[2])
    want = attention_backward(qf, kf, vf, gf, causal, 1 / np.sqrt(d))
    for name, g, w in zip(("dq", "dk", "dv"), grads, want):
        _close(_float(g), w, (name, d, dv, causal, b, hq, hkv, sq, skv))


def _cu(lengths, start=0):
    return (start + np.concatenate([[0], np.cumsum(lengths)])).astype(np.int32)


def _varlen_reference(q, k, v, dout, cu_q, cu_k, causal, scale):
    """(dq, dk, dv) in float64 sequence by sequence; zeros outside every sequence and for
    sequences without queries or keys."""
    grads = [np.zeros(x.shape) for x in (q, k, v)]
    for b in range(len(cu_q) - 1):
        (q0, q1), (k0, k1) = cu_q[b:b + 2], cu_k[b:b + 2]
        if q1 == q0 or k1 == k0:
            continue
        per_head = [x[None].transpose(0, 2, 1, 3) for x in (q[q0:q1], k[k0:k1], v[k0:k1], dout[q0:q1])]
        dq, dk, dv = (x[0].transpose(1, 0, 2) for x in attention_backward(*per_head, causal, scale))
        grads[0][q0:q1], grads[1][k0:k1], grads[2][k0:k1] = dq, dk, dv
    return grads


RAGGED_Q = [77, 0, 1, 130, 64, 5, 200]
RAGGED_K = [77, 3, 1, 130, 0, 70, 1]  # a sequence of queries without keys, one of keys without queries


def _varlen_run(rng, lens_q, lens_k, hq, hkv, d, dv, causal, *, host=False, deterministic=False, before=3,
                after=5, defines=None):
    """The backward's gradients (with ``defines`` over its kernels' when given) against the
    float64 reference, rows outside every sequence zero; (gradients, the call's arguments)."""
    cu_q, cu_k = _cu(lens_q, before), _cu(lens_k, before)
    tq, tk = int(cu_q[-1]) + after, int(cu_k[-1]) + after
    shapes = ((tq, hq, d), (tk, hkv, d), (tk, hkv, dv), (tq, hq, dv))
    (q, k, v, dout), (qf, kf, vf, gf) = zip(*(_bf16(rng, s) for s in shapes))
    lens = (cu_q.tolist(), cu_k.tolist()) if host else (tf.from_numpy(cu_q), tf.from_numpy(cu_k))
    out, lse = kernels.attention_varlen(q, k, v, *lens, max(lens_q), max(lens_k), causal=causal, return_lse=True)
    grads = [poison(tf.empty(x.shape, "bfloat16")) for x in (q, k, v)]
    with extra_defines(defines or {}):
        kernels.attention_varlen_backward(q, k, v, out, dout, lse, *lens, max(lens_q), max(lens_k), causal=causal,
                                          deterministic=deterministic, dq=grads[0], dk=grads[1], dv=grads[2])
    want = _varlen_reference(qf, kf, vf, gf, cu_q, cu_k, causal, 1 / np.sqrt(d))
    got = [_float(g) for g in grads]
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        _close(g, w, (name, lens_q, lens_k, hq, hkv, d, dv, causal, host))
        assert (g[:before] == 0).all() and (g[len(g) - after:] == 0).all(), (name, "rows outside every sequence")
    return got, (q, k, v, out, dout, lse, lens)


@pytest.mark.parametrize("d,dv", [(128, 128), (192, 128), (64, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_backward_against_float64(device, rng, d, dv, causal):
    _varlen_run(rng, RAGGED_Q, RAGGED_K, 4, 2, d, dv, causal)


def test_varlen_backward_host_lengths_and_many_sequences(device, rng):
    """Host lengths are uploaded; 70 sequences take the key-block walk past 32 a step."""
    lens = rng.integers(0, 40, 70).tolist()
    _varlen_run(rng, lens, lens, 2, 1, 96, 64, True, host=True, before=0, after=0)


@pytest.mark.parametrize("count", [70, 1100])
def test_varlen_backward_prep_finds_rows_among_many_sequences(device, rng, count):
    """The Hopper kernel's prep finds a row's sequence by a 32-ary search of two levels below
    1024 sequences (70) and by a binary search from there on (1100); short sequences, some empty."""
    lens = rng.integers(0, 6 if count > 1000 else 40, count).tolist()
    _varlen_run(rng, lens, lens, 2, 1, 64, 64, True, before=2, after=3)


@pytest.mark.parametrize("defines,d,deterministic", [({"PREP_LOADS_FIRST": 0}, 64, False),
                                                     ({**DQ_ROWS_DEFINES[64], "DQ_HEAD_MAJOR": 1}, 64, False),
                                                     ({**DQ_ROWS_DEFINES[128], "DQ_HEAD_MAJOR": 1}, 128, False),
                                                     ({**DQ_ROWS_DEFINES[64], "DQ_HEAD_MAJOR": 1}, 64, True)],
                         ids=["oldprep-64", "headmaj-64", "headmaj-128", "headmaj-64-det"])
def test_varlen_backward_ab_options(device, rng, defines, d, deterministic):
    """The bench's A/B options compute the gradients: the prep's old order and binary search
    (PREP_LOADS_FIRST=0); a head-major dQ accumulator of rows (DQ_HEAD_MAJOR: red adds at head
    dim 64, bulk reductions at 128, chain counters by its rows) with its conversion kernel."""
    _varlen_run(rng, OFF_STEP_Q, OFF_STEP_K, 4, 2, d, d, True, deterministic=deterministic, defines=defines)


@pytest.mark.parametrize("d,causal,lens", [(128, False, RAGGED_Q), (64, True, RAGGED_Q + [520])])
def test_varlen_backward_deterministic_is_bit_identical(device, rng, d, causal, lens):
    """Head dims 64 and 128 (the Hopper kernel); causal chains run a sequence's key blocks last
    first (520 keys: five blocks of 128)."""
    got, (q, k, v, out, dout, lse, cu) = _varlen_run(rng, lens, lens, 4, 1, d, d, causal, deterministic=True)
    for _ in range(2):
        again = kernels.attention_varlen_backward(q, k, v, out, dout, lse, *cu, max(lens), max(lens), causal=causal,
                                                  deterministic=True)
        assert all(np.array_equal(_float(a), g) for a, g in zip(again, got))


# Lengths the steps were not tuned for: ends 1 before, at and 1 past a 128-row step, past a
# 64-row one, an empty sequence, one of a token and a short last one; keys unlike the queries.
# Under DQ_TILE a sequence's last, partial tile takes the next one's rows (zero dQ) past its end.
OFF_STEP_Q = [127, 128, 129, 255, 0, 383, 66, 1, 2]
OFF_STEP_K = [129, 128, 1, 255, 3, 383, 300, 5, 2]
SCHEDULES = {"plan": lambda d: {}, "rows": lambda d: DQ_ROWS_DEFINES[d], "before": lambda d: VARLEN_BEFORE[d]}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_backward_schedules_on_lengths_off_the_steps(device, rng, schedule, d, causal):
    """The plan's schedule (the dense one's: 128-row steps at head dim 64, two dQ buffers at
    128, dQ tiles), its dQ rows (DQ_ROWS_DEFINES) and the one it had before (VARLEN_BEFORE:
    64-row steps, one buffer, rows), grouped-query heads (4 a kv head: steps of one key block
    over several heads), then the deterministic mode bit-identical across two runs."""
    defines = SCHEDULES[schedule](d)
    _varlen_run(rng, OFF_STEP_Q, OFF_STEP_K, 8, 2, d, d, causal, defines=defines)
    lens = OFF_STEP_Q if causal else OFF_STEP_K
    got, (q, k, v, out, dout, lse, cu) = _varlen_run(rng, lens, lens, 4, 1, d, d, causal, deterministic=True,
                                                     defines=defines)
    with extra_defines(defines):
        again = kernels.attention_varlen_backward(q, k, v, out, dout, lse, *cu, max(lens), max(lens), causal=causal,
                                                  deterministic=True)
    assert all(np.array_equal(_float(a), g) for a, g in zip(again, got)), (schedule, d, causal)


@pytest.mark.parametrize("d", [128, 64])
def test_varlen_backward_graph_replay_reads_new_lengths(device, rng, d):
    """A captured backward replayed after the lengths changed in place computes the new
    sequences' gradients (the grid is sized for any lengths)."""
    torch = pytest.importorskip("torch")
    hq, total = 2, 700
    q, k, v, dout = (torch.randn(total, hq, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    cu = torch.tensor(_cu([300, 400]), device="cuda")
    out, lse = kernels.attention_varlen(q, k, v, cu, cu, 1024, 1024, return_lse=True)
    grads = [torch.empty_like(x) for x in (q, k, v)]

    def call():
        kernels.attention_varlen(q, k, v, cu, cu, 1024, 1024, out, return_lse=False)
        kernels.attention_varlen_backward(q, k, v, out, dout, lse, cu, cu, 1024, 1024, dq=grads[0], dk=grads[1],
                                          dv=grads[2])
    call()  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernels.attention_varlen_backward(q, k, v, out, dout, lse, cu, cu, 1024, 1024, dq=grads[0], dk=grads[1],
                                          dv=grads[2])
    host = [x.float().cpu().numpy().astype(np.float64) for x in (q, k, v, dout)]
    for lens in ([1, 699], [0, 700], [350, 200]):
        new = _cu(lens)
        cu.copy_(torch.tensor(new, device="cuda"))
        _, lse_new = kernels.attention_varlen(q, k, v, cu, cu, 1024, 1024, out, return_lse=True)
        lse.copy_(lse_new)
        for g in grads:
            g.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = _varlen_reference(*host, new, new, False, 1 / np.sqrt(d))
        for name, g, w in zip(("dq", "dk", "dv"), grads, want):
            _close(g.float().cpu().numpy().astype(np.float64), w, (name, lens))


@pytest.mark.parametrize("d,dv", [(192, 128), (128, 128)])
def test_varlen_autograd_and_compile_against_float64_torch(device, d, dv):
    """attention_varlen on tensors that require grad: gradients eagerly and in a
    torch.compile(fullgraph=True) step, against torch autograd in float64 per sequence (the
    mma.sync backward at 192 / 128, the Hopper one at 128)."""
    torch = pytest.importorskip("torch")
    import tmaflow.torch  # noqa: F401  registers the ops and their autograd

    lens = [50, 0, 1, 130, 77]
    cu = torch.tensor(_cu(lens), device="cuda")
    total, hq, hkv = int(cu[-1]), 4, 2
    gen = torch.Generator(device="cuda").manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    q, k, v = (torch.randn(total, h, e, device="cuda", dtype=torch.bfloat16, generator=gen)
               for h, e in ((hq, d), (hkv, d), (hkv, dv)))
    weight = torch.randn(total, hq, dv, device="cuda", generator=gen)

    def loss(q, k, v):
        return (kernels.attention_varlen(q, k, v, cu, cu, 130, 130, causal=True).float() * weight).sum()

    ref = [x.double().requires_grad_() for x in (q, k, v)]
    total_ref = 0.0
    for b in range(len(lens)):
        s, e = int(cu[b]), int(cu[b + 1])
        if s == e:
            continue
        qq, kk, vv = (x[s:e].transpose(0, 1) for x in ref)
        kk, vv = (x.repeat_interleave(hq // hkv, 0) for x in (kk, vv))
        scores = (qq @ kk.transpose(1, 2)) / d ** 0.5
        scores = scores.masked_fill(torch.ones(e - s, e - s, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
        o = torch.softmax(scores, -1) @ vv
        total_ref = total_ref + (o.transpose(0, 1) * weight[s:e].double()).sum()
    want = torch.autograd.grad(total_ref, ref)
    for run in (loss, torch.compile(loss, fullgraph=True)):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        for x in leaves:
            x.grad = None
        run(*leaves).backward()
        for name, x, w in zip(("dq", "dk", "dv"), leaves, want):
            _close(x.grad.double().cpu().numpy(), w.cpu().numpy(), (name, run))
