"""kernels.attention_varlen (packed sequences, flash_attn_varlen_func's layout) against float64
and against kernels.attention run on each sequence, and both kernels at the head dims beyond
64 / 128 / 256 (Q / K and V head dims apart, as multi-head latent attention's 192 / 128): ragged
lengths with empty sequences and sequences of one token, causal and not, grouped-query heads,
poisoned outputs (rows outside every sequence must stay poisoned), device and host lengths,
a CUDA graph replayed with new lengths."""
import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.dtypes import bf16_bits, bf16_to_float32
from tmaflow.kernels.attention_entry import attention_plan
from tmaflow.kernels.registry import extra_defines
from tmaflow.testing import poison, rel_error

from attention_reference import attention_forward

pytestmark = pytest.mark.gpu


def _bf16(rng, shape):
    bits = bf16_bits(rng.standard_normal(shape))
    return tf.from_numpy(bits, dtype="bfloat16"), bf16_to_float32(bits).astype(np.float64)


def _operands(rng, tokens_q, tokens_k, hq, hkv, d, dv, dtype="bfloat16"):
    """Packed q, k, v on the device and their float64 values."""
    shapes = ((tokens_q, hq, d), (tokens_k, hkv, d), (tokens_k, hkv, dv))
    if dtype == "bfloat16":
        return tuple(zip(*(_bf16(rng, s) for s in shapes)))
    host = tuple(rng.standard_normal(s).astype(np.float16) for s in shapes)
    return tuple(tf.from_numpy(h) for h in host), tuple(h.astype(np.float64) for h in host)


def _float(arr):
    host = arr.numpy()
    return bf16_to_float32(host).astype(np.float64) if arr.dtype.name == "bfloat16" else host.astype(np.float64)


def _cu(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _reference(q, k, v, cu_q, cu_k, causal, scale):
    """(out, lse) in float64, sequence by sequence; NaN outside every sequence, zeros and -inf
    for queries of a sequence without keys."""
    tq, hq, _ = q.shape
    out, lse = np.full((tq, hq, v.shape[2]), np.nan), np.full((hq, tq), np.nan)
    for b in range(len(cu_q) - 1):
        (q0, q1), (k0, k1) = cu_q[b:b + 2], cu_k[b:b + 2]
        if q1 == q0:
            continue
        if k1 == k0:
            out[q0:q1], lse[:, q0:q1] = 0.0, -np.inf
            continue
        per_head = [x[None].transpose(0, 2, 1, 3) for x in (q[q0:q1], k[k0:k1], v[k0:k1])]
        o, m = attention_forward(*per_head, causal, scale)
        out[q0:q1], lse[:, q0:q1] = o[0].transpose(1, 0, 2), m[0]
    return out, lse


def _check(got, got_lse, ref, ref_lse, tol, what):
    inside = ~np.isnan(ref[:, 0, 0])
    assert np.isnan(got[~inside]).all(), f"{what}: rows outside every sequence were written"
    assert not np.isnan(got[inside]).any(), f"{what}: rows of a sequence left unwritten"
    assert rel_error(got[inside], ref[inside]) < tol, (what, rel_error(got[inside], ref[inside]))
    if got_lse is not None:
        cols = inside & np.isfinite(ref_lse[0])
        np.testing.assert_allclose(got_lse[:, cols], ref_lse[:, cols], rtol=1e-3, atol=1e-3, err_msg=what)
        assert (got_lse[:, inside & ~np.isfinite(ref_lse[0])] == -np.inf).all(), what


RAGGED = [0, 1, 300, 17, 129, 128, 0, 513, 2]  # empty, one token, tile edges, over four tiles


def _run(rng, lens_q, lens_k, hq, hkv, d, dv, causal, *, pad=5, host=False, dtype="bfloat16", tol=None, skip=0,
         skip_k=None):
    """``skip``: tokens before the first sequence (cu_seqlens start there; never written);
    ``skip_k``: the keys' (``skip`` unless given)."""
    cu_q, cu_k = _cu(lens_q) + skip, _cu(lens_k) + (skip if skip_k is None else skip_k)
    (q, k, v), (qf, kf, vf) = _operands(rng, int(cu_q[-1]) + pad, int(cu_k[-1]) + pad, hq, hkv, d, dv, dtype)
    out = poison(tf.empty((q.shape[0], hq, dv), dtype))
    lens = (cu_q.tolist(), cu_k.tolist()) if host else (tf.from_numpy(cu_q), tf.from_numpy(cu_k))
    _, lse = kernels.attention_varlen(q, k, v, *lens, max(lens_q), max(lens_k), out, causal=causal,
                                      return_lse=True)
    ref, ref_lse = _reference(qf, kf, vf, cu_q, cu_k, causal, 1 / np.sqrt(d))
    _check(_float(out), lse.numpy(), ref, ref_lse, tol or (1e-2 if dtype == "bfloat16" else 5e-3),
           (lens_q, lens_k, hq, hkv, d, dv, causal, host, dtype))


@pytest.mark.parametrize("d,dv", [(64, 64), (128, 128), (192, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_against_float64(device, rng, d, dv, causal):
    """Self-attention over ragged sequences (0 and 1 token among them), GQA 2:1, padding tokens
    after the last sequence (never written), device lengths."""
    _run(rng, RAGGED, RAGGED, 4, 2, d, dv, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_queries_and_keys_of_other_lengths(device, rng, causal):
    """Sequence b's queries and keys differ in length (keys of the next sequence sit right after
    a short one's), a sequence with queries and no keys gives zeros, lengths given on the host."""
    _run(rng, [5, 200, 0, 64, 3, 130], [300, 1, 7, 0, 129, 250], 6, 2, 128, 128, causal, host=True)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_matches_the_dense_kernel_on_each_sequence(device, rng, d, causal):
    """The same tiles in the same order: each sequence's rows are bit-identical to
    kernels.attention on that sequence alone with as many keys a tile (keys of the next
    sequence, masked, count as the zeros past a dense sequence's end)."""
    lens = [300, 1, 128, 0, 77, 257]
    cu = _cu(lens)
    hq, hkv = 4, 2
    (q, k, v), _ = _operands(rng, int(cu[-1]), int(cu[-1]), hq, hkv, d, d)
    out, lse = kernels.attention_varlen(q, k, v, tf.from_numpy(cu), tf.from_numpy(cu), max(lens), max(lens),
                                        causal=causal, return_lse=True)
    got, got_lse = out.numpy(), lse.numpy()
    host = [x.numpy() for x in (q, k, v)]
    for b, n in enumerate(lens):
        if n == 0:
            continue
        rows = slice(cu[b], cu[b + 1])
        dense = [tf.from_numpy(np.ascontiguousarray(x[rows].transpose(1, 0, 2)[None]), dtype="bfloat16")
                 for x in host]
        with extra_defines({"BLOCK_N": attention_plan(d, causal, varlen=True).keys}):  # varlen's key tiles
            o, m = kernels.attention(*dense, causal=causal, return_lse=True)
        assert np.array_equal(got[rows], o.numpy()[0].transpose(1, 0, 2)), (d, causal, b)
        assert np.array_equal(got_lse[:, rows], m.numpy()[0]), (d, causal, b)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_walks_many_sequences_and_strides_over_tiles(device, rng, causal):
    """300 sequences (each warp's walk crosses 128-sequence rounds) of 0 to 40 tokens, then
    three long ones: more tiles than SMs, so CTAs stride over several (causal ones over pairs of
    row blocks), crossing sequences and heads."""
    lens = rng.integers(0, 41, 300).tolist() + [700, 390, 1000]
    _run(rng, lens, lens, 8, 8, 64, 64, causal, pad=0)


@pytest.mark.parametrize("d,paired,q_stages", [(d, p, q) for d in (64, 128, 256) for p, q in ((1, 1), (1, 2), (0, 1))
                                                 if q == 1 or d < 256])  # 256: two Q buffers leave K one stage
def test_varlen_causal_schedules(device, rng, d, paired, q_stages):
    """Causal packed batches under each schedule varlen_ab compares: PAIRED (the plan: one CTA an
    SM striding over units of a sequence's row blocks i and m - 1 - i, an odd count's middle
    unit one tile), with two Q buffers (where K and V keep two stages), and a CTA a tile; odd
    and even block counts, empty and one-token sequences, many more units than SMs, GQA 2:1,
    against float64."""
    assert attention_plan(d, True, varlen=True).defines["PAIRED"] == 1
    lens = RAGGED + [1024, 640, 0, 1, 385] + rng.integers(0, 300, 40).tolist()
    with extra_defines({"PAIRED": paired, "Q_STAGES": q_stages}):
        _run(rng, lens, lens, 4, 2, d, d, True)


NEW_DIMS = [(32, 32), (48, 48), (80, 80), (96, 96), (160, 160), (192, 192), (192, 128), (224, 224), (240, 240)]


@pytest.mark.parametrize("d,dv", NEW_DIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_dense_head_dims_against_float64(device, rng, d, dv, causal):
    """Head dims that are not multiples of 64 (boxes of 32 or 16 columns, 64B / 32B swizzles)
    and V's head dim apart from Q's and K's, at odd sequence lengths; out has V's head dim."""
    b, hq, hkv, sq, skv = 2, 4, 2, 77, (333 if not causal else 77)
    q, qf = _bf16(rng, (b, hq, sq, d))
    k, kf = _bf16(rng, (b, hkv, skv, d))
    v, vf = _bf16(rng, (b, hkv, skv, dv))
    ref, ref_lse = attention_forward(qf, kf, vf, causal, 1 / np.sqrt(d))
    out = poison(tf.empty((b, hq, sq, dv), "bfloat16"))
    _, lse = kernels.attention(q, k, v, out, causal=causal, return_lse=True)
    got = _float(out)
    assert not np.isnan(got).any()
    assert rel_error(got, ref) < 1e-2, (d, dv, causal, rel_error(got, ref))
    np.testing.assert_allclose(lse.numpy(), ref_lse, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("d,dv", NEW_DIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_head_dims_against_float64(device, rng, d, dv, causal):
    _run(rng, [77, 0, 1, 200], [77, 0, 1, 200], 4, 1, d, dv, causal)


@pytest.mark.parametrize("d,dv", [(96, 96), (192, 128)])
@pytest.mark.parametrize("varlen", [False, True])
def test_fp16_head_dims_against_float64(device, rng, d, dv, varlen):
    if varlen:
        _run(rng, RAGGED, RAGGED, 4, 2, d, dv, True, dtype="float16")
        return
    shapes = ((1, 4, 300, d), (1, 2, 300, d), (1, 2, 300, dv))
    host = [rng.standard_normal(s).astype(np.float16) for s in shapes]
    ref, _ = attention_forward(*(h.astype(np.float64) for h in host), False, 1 / np.sqrt(d))
    out = poison(tf.empty((1, 4, 300, dv), "float16"))
    kernels.attention(*(tf.from_numpy(h) for h in host), out)
    got = out.numpy()
    assert got.dtype == np.float16 and not np.isnan(got).any()
    assert rel_error(got, ref) < 5e-3, rel_error(got, ref)


def test_varlen_graph_replay_reads_new_lengths(device, rng):
    """Lengths live on the device: a captured call replayed after the lengths changed in place
    computes the new sequences (rows no sequence covers stay as they were)."""
    torch = pytest.importorskip("torch")
    hq, d, total = 4, 128, 700
    q, k, v = (torch.randn(total, hq, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor(_cu([300, 400]), device="cuda")
    out = torch.empty(total, hq, d, device="cuda", dtype=torch.bfloat16)
    kernels.attention_varlen(q, k, v, cu, cu, 1024, 1024, out)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernels.attention_varlen(q, k, v, cu, cu, 1024, 1024, out)
    host = [x.float().cpu().numpy().astype(np.float64) for x in (q, k, v)]
    for lens in ([1, 699], [0, 700], [350, 200]):
        new = _cu(lens)
        cu.copy_(torch.tensor(new, device="cuda"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref, _ = _reference(*host, new, new, False, 1 / np.sqrt(d))
        _check(out.float().cpu().numpy().astype(np.float64), None, ref, None, 1e-2, lens)


def test_varlen_inside_torch_compile_runs_the_custom_op(device):
    torch = pytest.importorskip("torch")
    import tmaflow.torch  # noqa: F401  registers torch.ops.tmaflow.attention_varlen

    cu = torch.tensor(_cu([100, 0, 37]), device="cuda")

    def f(q, k, v):
        return kernels.attention_varlen(q * 1.0, k, v, cu, cu, 100, 100, causal=True) + 1.0

    q, k, v = (torch.randn(137, 4, 96, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    got, want = torch.compile(f, fullgraph=True)(q, k, v), f(q, k, v)
    assert torch.equal(got, want)
    meta = torch.empty(50, 4, 192, device="meta", dtype=torch.bfloat16)
    meta_v = torch.empty(50, 2, 128, device="meta", dtype=torch.bfloat16)
    cu_meta = torch.empty(3, device="meta", dtype=torch.int32)
    assert torch.ops.tmaflow.attention_varlen(meta, meta[:, :2], meta_v, cu_meta, cu_meta, 25, 25).shape == (50, 4, 128)
    with pytest.raises(Exception, match=r"tmaflow.attention_varlen: needs cu_seqlens_q and cu_seqlens_k as 1-D int32"):
        torch.ops.tmaflow.attention_varlen(meta, meta, meta, cu_meta.long(), cu_meta.long(), 25, 25)


# --- DYNAMIC_TILES: CTAs take their tiles from a counter (the plan's 2, or 1; 0: the stride) --------

DYNAMIC = {"DYNAMIC_TILES": 1}
DYNAMIC_BUILDS = ([(d, c, "bfloat16", {}) for d in (64, 128, 256) for c in (False, True)] +
                  [(128, True, "float16", {}), (128, False, "bfloat16", {"Q_SPLIT": 1, "Q_STAGES": 1}),
                   (64, True, "bfloat16", {"Q_STAGES": 2}), (128, True, "bfloat16", {"PAIRED": 0})])


@pytest.mark.parametrize("mode", [1, 2])  # the take before a tile's last V tile, or a tile ahead
@pytest.mark.parametrize("d,causal,dtype,forced", DYNAMIC_BUILDS)
def test_varlen_dynamic_tiles_against_float64(device, rng, d, causal, dtype, forced, mode):
    """Ragged lengths with empty and one-token sequences, many more tiles (causal: pairs) than
    SMs, GQA 4:1, three launches in a row on one prepared state (a counter left dirty would
    skip tiles, whose rows would stay poisoned); the schedules the CPU tier compiles (two
    64-row Q stages, two Q buffers, a causal build without pairs), one fp16."""
    lens = RAGGED + [1024, 640, 0, 1, 385] + rng.integers(0, 300, 60).tolist()
    with extra_defines({"DYNAMIC_TILES": mode, **forced}):
        for _ in range(3):
            _run(rng, lens, lens, 8, 2, d, d, causal, dtype=dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_dynamic_tiles_queries_and_keys_of_other_lengths(device, rng, causal):
    with extra_defines(DYNAMIC):
        _run(rng, [5, 200, 0, 64, 3, 130], [300, 1, 7, 0, 129, 250], 6, 2, 128, 128, causal, host=True)


def _torch_batch(torch, lens, hq=8, hkv=2, d=128):
    cu = torch.tensor(_cu(lens), device="cuda")
    total = int(cu[-1])
    q = torch.randn(total, hq, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(total, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return q, k, v, cu, max(lens)


@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_dynamic_tiles_equal_the_stride_bit_for_bit(device, rng, d, causal, mode):
    """A tile's work does not depend on the CTA that takes it: out and lse of the counter
    schedule equal the stride's (DYNAMIC_TILES=0) exactly, launch after launch (the counter
    resets)."""
    torch = pytest.importorskip("torch")
    lens = RAGGED + [2048, 1, 0, 700] + rng.integers(0, 500, 100).tolist()
    q, k, v, cu, longest = _torch_batch(torch, lens, d=d)
    with extra_defines({"DYNAMIC_TILES": 0}):
        want, want_lse = kernels.attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal,
                                                  return_lse=True)
    with extra_defines({"DYNAMIC_TILES": mode}):
        for launch in range(3):
            got, got_lse = kernels.attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal,
                                                    return_lse=True)
            torch.cuda.synchronize()
            assert torch.equal(got, want) and torch.equal(got_lse, want_lse), (d, causal, mode, launch)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", [1, 2])
def test_varlen_dynamic_tiles_on_two_streams_at_once(device, rng, causal, mode):
    """Two torch streams made current in turn, each running its own batch 50 times: each
    stream's counter is its own (the split-K workspace of the stream), so every launch equals
    its call alone, bit for bit."""
    torch = pytest.importorskip("torch")
    batches = [_torch_batch(torch, RAGGED + [1024, 2048, 77] * 4),
               _torch_batch(torch, rng.integers(1, 600, 80).tolist())]
    with extra_defines({"DYNAMIC_TILES": mode}):
        calls = [lambda b=b: kernels.attention_varlen(*b[:4], b[3], b[4], b[4], causal=causal) for b in batches]
        torch.cuda.synchronize()
        refs = [call() for call in calls]
        torch.cuda.synchronize()
        streams = [torch.cuda.Stream() for _ in calls]
        results = []
        for _ in range(50):
            for call, s in zip(calls, streams):
                with torch.cuda.stream(s):
                    results.append(call())
        torch.cuda.synchronize()
    bad = [i for i, got in enumerate(results) if not torch.equal(got, refs[i % 2])]
    assert not bad, f"{len(bad)} of {len(results)} launches differ from the call alone (first: {bad[:8]})"


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_dynamic_tiles_in_graphs_replayed_with_new_lengths(device, rng, causal):
    """A tf.Graph and a torch CUDA graph (each captured launch with a counter pair of its own),
    each replayed three times a length set after the lengths changed in place: every replay
    computes the new sequences (the counter returns to zero inside graphs too)."""
    torch = pytest.importorskip("torch")
    hq, d, total = 4, 128, 2000
    q, k, v = (torch.randn(total, hq, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor(_cu([400] * 5), device="cuda")
    host = [x.float().cpu().numpy().astype(np.float64) for x in (q, k, v)]
    outs = {name: torch.empty(total, hq, d, device="cuda", dtype=torch.bfloat16) for name in ("tf", "torch")}
    with extra_defines(DYNAMIC):
        def call(out):
            kernels.attention_varlen(q, k, v, cu, cu, total, total, out, causal=causal)

        graph = tf.Graph()
        with graph.capture():
            call(outs["tf"])
        torch_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(torch_graph):  # torch's capture stream, never used eagerly
            call(outs["torch"])
        replays = {"tf": graph.replay, "torch": torch_graph.replay}
        for lens in ([400] * 5, [1, 1999, 0, 0, 0], [0, 129, 128, 1, 1700], [7, 0, 0, 0, 13]):
            new = _cu(lens)
            cu.copy_(torch.tensor(new, device="cuda"))
            ref, _ = _reference(*host, new, new, causal, 1 / np.sqrt(d))
            for name, replay in replays.items():
                for _ in range(3):
                    outs[name].fill_(float("nan"))
                    replay()
                    torch.cuda.synchronize()
                    _check(outs[name].float().cpu().numpy().astype(np.float64), None, ref, None, 1e-2,
                           (name, lens, causal))
        graph.close()


def test_varlen_captured_launch_keeps_its_counter_beside_eager_calls_on_its_stream(device, rng):
    """A launch captured into a torch graph takes a counter pair of its own (tile_counters), not
    its capture stream's: replays on a second stream, each beside an eager call of another batch
    on the capture stream, all equal their calls alone (a shared counter would skip or repeat
    tiles of one of them). (CUDA 12's NVRTC plans the stride, which takes no pair.)"""
    torch = pytest.importorskip("torch")
    from tmaflow.kernels import tile_counters
    from tmaflow.kernels.attention_entry import varlen_dynamic

    a, b = (_torch_batch(torch, RAGGED + rng.integers(1, 900, 60).tolist()) for _ in range(2))
    outs = [torch.empty_like(a[0]), torch.empty_like(b[0])]

    def call(batch, out):
        kernels.attention_varlen(*batch[:4], batch[3], batch[4], batch[4], out, causal=True)

    call(a, outs[0]), call(b, outs[1])  # eager: states built, the pool reserved
    torch.cuda.synchronize()
    refs = [o.clone() for o in outs]
    before = tile_counters.untaken(tf.current_device())
    capture, replay = torch.cuda.Stream(), torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture):
        call(a, outs[0])
    taken = before - tile_counters.untaken(tf.current_device())
    if taken != (varlen_dynamic() > 0):  # (seen once, session 24)
        from tmaflow.kernels.entry import STATES
        from tmaflow.kernels.registry import _variant
        from tmaflow.launch.compiler import nvrtc_version

        states = [(k[7], hex(k[8]), st.workspace is not None, k[15:]) for k, st in STATES.items()
                  if k[0] == "attention_varlen"]
        pytest.fail(f"the capture took {taken} pairs; NVRTC "
                    f"{nvrtc_version()}, extra defines {_variant}, capture stream 0x{capture.cuda_stream:x}, "
                    f"states (windows, stream, dynamic, suffix): {states}")
    got = []
    for _ in range(30):
        outs[0].fill_(float("nan"))
        outs[1].fill_(float("nan"))
        replay.wait_stream(torch.cuda.current_stream())
        capture.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(replay):
            graph.replay()
        with torch.cuda.stream(capture):
            call(b, outs[1])
        torch.cuda.current_stream().wait_stream(replay)
        torch.cuda.current_stream().wait_stream(capture)
        got.append((torch.equal(outs[0], refs[0]), torch.equal(outs[1], refs[1])))
    torch.cuda.synchronize()
    assert all(x and y for x, y in got), got


def test_varlen_capture_before_any_eager_call(device, rng, monkeypatch):
    """A torch capture before any eager call made a counter chunk: the chunk is made inside
    the capture (allocated and zeroed on a stream of its own, the capture mode relaxed: no
    node), and replays compute the sequences. Where no pair can be had at all, the static
    stride, which needs none; a build forced to DYNAMIC_TILES there is refused by name."""
    torch = pytest.importorskip("torch")
    from tmaflow.kernels import entry, tile_counters
    from tmaflow.kernels.attention_entry import varlen_dynamic

    monkeypatch.setattr(tile_counters, "_slabs", {})
    entry.STATES.clear()  # no state of an earlier test reserved a chunk
    q, k, v, cu, longest = _torch_batch(torch, [100, 300, 0, 129])
    host = [x.float().cpu().numpy().astype(np.float64) for x in (q, k, v)]
    ref, _ = _reference(*host, _cu([100, 300, 0, 129]), _cu([100, 300, 0, 129]), False, 1 / np.sqrt(128))
    for no_pairs in (False, True):
        if no_pairs:
            monkeypatch.setattr(tile_counters, "take", lambda device, words=2: None)
            entry.STATES.clear()
        out = torch.full_like(q, float("nan"))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            kernels.attention_varlen(q, k, v, cu, cu, longest, longest, out)
        if not no_pairs:
            slab = tile_counters._slabs.get(tf.current_device().ordinal)
            made = slab.chunks if slab else []
            assert len(made) == (varlen_dynamic() > 0), "the capture made a chunk for its pair"
        graph.replay()
        torch.cuda.synchronize()
        _check(out.float().cpu().numpy().astype(np.float64), None, ref, None, 1e-2,
               "stride in a capture" if no_pairs else "a pair made in a capture")
    with extra_defines(DYNAMIC):
        with pytest.raises(tf.TmaflowError, match=r"DYNAMIC_TILES, forced through extra_defines, needs a tile "
                                                  r"counter.*being captured.*no counter could be made"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                kernels.attention_varlen(q, k, v, cu, cu, longest, longest, out)


# --- WINDOWS: tiles of 128 packed query rows whatever their sequences ------------------------------
# (the plan's for short sequences, attention_varlen_entry.in_windows; right for any lengths)


@pytest.fixture
def in_windows(monkeypatch):
    """Every call planned in windows, whatever its lengths."""
    from tmaflow.kernels import attention_varlen_entry

    monkeypatch.setattr(attention_varlen_entry, "in_windows", lambda *lengths: True)


@pytest.fixture
def planned_in_windows(monkeypatch):
    """The plan's own gate, which must put every call of the test in windows."""
    from tmaflow.kernels import attention_varlen_entry

    gate, said = attention_varlen_entry.in_windows, []
    monkeypatch.setattr(attention_varlen_entry, "in_windows", lambda *lengths: said.append(gate(*lengths)) or said[-1])
    yield
    assert said and all(said), said


# the plan's (the counter: 2, or 1 at 112-176), the stride, the counter a tile late
SCHEDULES = {"plan": {}, "stride": {"DYNAMIC_TILES": 0}, "late": {"DYNAMIC_TILES": 1}}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("d,causal", [(d, c) for d in (64, 128, 144, 256) for c in (False, True)])
def test_varlen_windows_against_float64(device, rng, in_windows, d, causal, schedule):
    """Ragged lengths with empty and one-token sequences, sequences over eight windows (a
    window's keys then span two long sequences), GQA 4:1, tokens before the first sequence and
    after the last (never written), three launches on one prepared state."""
    lens = RAGGED + [1024, 640, 0, 1, 385] + rng.integers(0, 300, 60).tolist()
    with extra_defines(SCHEDULES[schedule]):
        for _ in range(3):
            _run(rng, lens, lens, 8, 2, d, d, causal, skip=3)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_windows_many_sequences_a_warp(device, rng, planned_in_windows, causal):
    """The plan's windows (max_seqlen_q 5): runs of empty sequences and of one to four tokens,
    so a warp's 16 rows span more than 31 sequence starts (its bound search takes several
    rounds) and a window holds over a hundred sequences; keys of other lengths from another
    first token (up to the gate's longest: 64 keys, causal 200), fp16."""
    lens_q = [0] * 70 + rng.integers(0, 5, 300).tolist() + [0] * 40 + [1] * 50 + [5]
    lens_k = rng.integers(0, 200 if causal else 65, len(lens_q)).tolist()
    _run(rng, lens_q, lens_k, 4, 4, 128, 128, causal, dtype="float16", skip_k=9)
    _run(rng, lens_q, lens_q, 2, 1, 64, 64, causal, host=True, skip=1)


@pytest.mark.parametrize("d,dv", [(192, 128), (96, 96), (176, 176), (240, 240)])
def test_varlen_windows_head_dims(device, rng, in_windows, d, dv):
    for causal in (False, True):
        _run(rng, RAGGED + [40, 90, 17, 300], RAGGED + [40, 90, 17, 300], 4, 2, d, dv, causal)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_windows_counter_equals_the_stride_bit_for_bit(device, rng, in_windows, d, causal):
    """A window's work does not depend on the CTA that takes it, launch after launch."""
    torch = pytest.importorskip("torch")
    lens = RAGGED + rng.integers(0, 200, 200).tolist()
    q, k, v, cu, longest = _torch_batch(torch, lens, d=d)
    assert longest <= 513
    with extra_defines({"DYNAMIC_TILES": 0}):
        want, want_lse = kernels.attention_varlen(q, k, v, cu, cu, 200, 200, causal=causal, return_lse=True)
    for launch in range(3):
        got, got_lse = kernels.attention_varlen(q, k, v, cu, cu, 200, 200, causal=causal, return_lse=True)
        torch.cuda.synchronize()
        assert torch.equal(got, want) and torch.equal(got_lse, want_lse), (d, causal, launch)


def test_varlen_windows_graph_replays_longer_sequences(device, rng, in_windows):
    """A torch graph captured with short lengths (planned in windows) replays lengths past its
    max_seqlen_q: windows hold any sequences."""
    torch = pytest.importorskip("torch")
    hq, d, total = 4, 64, 1500
    q, k, v = (torch.randn(total, hq, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor(_cu([100] * 15), device="cuda")
    out = torch.empty(total, hq, d, device="cuda", dtype=torch.bfloat16)
    kernels.attention_varlen(q, k, v, cu, cu, 100, 100, out, causal=True)  # outside the capture first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernels.attention_varlen(q, k, v, cu, cu, 100, 100, out, causal=True)
    host = [x.float().cpu().numpy().astype(np.float64) for x in (q, k, v)]
    for lens in ([100] * 15, [1400] + [0] * 13 + [100], [1, 1, 700, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 798]):
        new = _cu(lens)
        cu.copy_(torch.tensor(new, device="cuda"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref, _ = _reference(*host, new, new, True, 1 / np.sqrt(d))
        _check(out.float().cpu().numpy().astype(np.float64), None, ref, None, 1e-2, lens)


@pytest.mark.parametrize("windows", [False, True])
def test_varlen_wrong_device_lengths_never_store_outside_out(device, rng, monkeypatch, windows):
    """Device cu_seqlens that break every rule (decreasing, negative, past the tokens, near
    INT_MIN / INT_MAX, random) give wrong rows but no fault and no store outside out, planned in
    windows and not: out sits between two poisoned guards of one buffer. (tools/sanitize.sh runs
    this under memcheck, which also sees loads outside q, k, v and cu_seqlens.)"""
    torch = pytest.importorskip("torch")
    from tmaflow.kernels import attention_varlen_entry

    monkeypatch.setattr(attention_varlen_entry, "in_windows", lambda *lengths: windows)
    tq, tk, hq, hkv, d, guard = 700, 500, 4, 2, 128, 200
    q = torch.randn(tq, hq, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(tk, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    buf = torch.full((guard + tq + guard, hq, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = buf[guard:guard + tq]
    big, small = 2**31 - 1, -2**31
    wrong = [[0, -5, 900, 300, big, 100, small, 700], [700, 600, 500, 0, 0, 0, 0, 0],
             [small, small, big, big, 3, 2, 1, 0], [-1, 699, 699, 701, 10_000, 0, 350, 351]]
    wrong += [rng.integers(small, big, 8, endpoint=True).tolist(), rng.integers(-50, 800, 8).tolist()]
    for causal in (False, True):
        for i, values in enumerate(wrong):
            cu_q = torch.tensor(values, dtype=torch.int32, device="cuda")
            cu_k = torch.tensor(wrong[(i + 1) % len(wrong)], dtype=torch.int32, device="cuda")
            kernels.attention_varlen(q, k, v, cu_q, cu_k, 64, 64, out, causal=causal, return_lse=True)  # lse: memcheck
            torch.cuda.synchronize()
            assert torch.isnan(buf[:guard]).all() and torch.isnan(buf[guard + tq:]).all(), (causal, values)
