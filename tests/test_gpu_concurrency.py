"""GPU tier: every entry point launched from many streams at once gives, bit for bit, what the
same call gives alone. Per case (gemm bf16 dense / skinny / split-K / split tail / K in clusters
of four, staged operands, fp8 per-tensor and block-scaled, grouped with device and host offsets, staged
experts and its decode path, attention, decode, softmax, copy, transpose)
and per combination (two torch streams made current with ``stream=None``, the streams passed
explicitly, threads each on its own stream, a tf.Graph captured while a thread launches, a
torch CUDA graph replayed beside eager launches), at least 100 launches a stream, each
compared with ``torch.equal`` against a reference computed first on the default stream. A
subset runs again on the generated Python launch path. Small shapes: seconds in all."""
import threading

import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.launch import native
from tmaflow.kernels import entry, registry
from tmaflow.kernels.matmul import splitk
from tmaflow.kernels.matmul import GemmConfig

from test_threads import _in_threads

try:
    import torch
except ImportError:  # collected without torch; every test skips
    torch = None

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch is None, reason="the concurrency suite launches on torch streams")]

LAUNCHES = 100  # per stream, per combination


# --- the cases: make(gen) -> call(stream=None) -> a new output tensor ----------------------------

def _bf16(gen, *shape):
    return torch.randn(*shape, device="cuda", generator=gen).to(torch.bfloat16)


def _fp8(gen, *shape):
    return (torch.randn(*shape, device="cuda", generator=gen) * 30).to(torch.float8_e4m3fn)


def _gemm(m, n, k, config=None):
    def make(gen):
        a, b = _bf16(gen, m, k), _bf16(gen, n, k)
        return lambda stream=None: kernels.gemm(a, b, config=config, stream=stream)
    return make


def _split_tail(gen):
    from test_gpu_tail_split import _shape_with_partial_wave

    config = GemmConfig(bn=128, cluster_m=1, split_tail=True)
    m, n, k = _shape_with_partial_wave(tf.current_device(), config, 512, 2048, 16)
    return _gemm(m, n, k, config)(gen)


def _fp8_gemm(gen):
    a, b = _fp8(gen, 256, 2048), _fp8(gen, 512, 2048)
    return lambda stream=None: kernels.gemm(a, b, scale_a=0.5, scale_b=0.25, stream=stream)


def _fp8_block_scaled(gen):
    m, n, k = 256, 512, 2048
    a, b = _fp8(gen, m, k), _fp8(gen, n, k)
    sa = torch.rand(m, k // 128, device="cuda", generator=gen) * 0.01 + 0.001
    sb = torch.rand(n // 128, k // 128, device="cuda", generator=gen) * 0.01 + 0.001
    return lambda stream=None: kernels.gemm(a, b, scale_a=sa, scale_b=sb, stream=stream)


def _fp8_row_major_skinny(gen, m=40, n=904):
    """Row-major block scales, N no multiple of the tiles: on the skinny path (M <= 64, or 128
    under 128 k-blocks where the tiles fill more than half the SMs; ceil(K/128) a multiple of 4)
    in the scale ring (the default); at M = 128 and N = 904 (8 tiles), K split in clusters of four."""
    k = 1024
    a, b = _fp8(gen, m, k), _fp8(gen, n, k)
    sa = torch.rand(m, k // 128, device="cuda", generator=gen) * 0.01 + 0.001
    sb = torch.rand(-(-n // 128), k // 128, device="cuda", generator=gen) * 0.01 + 0.001
    return lambda stream=None: kernels.gemm(a, b, scale_a=sa, scale_b=sb, stream=stream)


def _grouped(host_offsets):
    def make(gen):
        a, b = _bf16(gen, 370, 1024), _bf16(gen, 3, 256, 1024)
        offsets = [0, 70, 70, 370]  # an empty group in the middle
        offs = offsets if host_offsets else torch.tensor(offsets, dtype=torch.int32, device="cuda")
        config = GemmConfig(bn=128, cluster_m=1, split_k=4)  # partials and counters per stream
        return lambda stream=None: kernels.grouped_gemm(a, b, offs, config=config, stream=stream)
    return make


def _grouped_staged(gen):
    # K 1020 (no multiple of 8): A and every expert's B staged as rows by one stage_rows
    # launch, the grouped GEMM behind it under PDL; device offsets, an empty group in the middle
    a, b = _bf16(gen, 370, 1020), _bf16(gen, 3, 264, 1020)
    offs = torch.tensor([0, 70, 70, 370], dtype=torch.int32, device="cuda")
    return lambda stream=None: kernels.grouped_gemm(a, b, offs, stream=stream)


def _grouped_decode(gen):
    # the decode path at its default 128-row tiles (8 experts could have rows: 8 x 32 items of
    # 64 rows would take two rounds); N and K not multiples of the tiles, a token an expert
    a, b = _bf16(gen, 8, 520), _bf16(gen, 8, 2000, 520)
    offs = torch.arange(9, dtype=torch.int32, device="cuda")
    return lambda stream=None: kernels.grouped_gemm(a, b, offs, stream=stream)


def _attention(gen):
    q, k, v = (_bf16(gen, 1, 4, 256, 128) for _ in range(3))
    return lambda stream=None: kernels.attention(q, k, v, causal=True, stream=stream)


def _attention_backward(gen):
    # seq 200 (not a multiple of the 64-row blocks), GQA 2:1; deterministic: bit-exact by design
    q = _bf16(gen, 1, 4, 200, 64)
    k, v = _bf16(gen, 1, 2, 200, 64), _bf16(gen, 1, 2, 200, 64)
    out, lse = kernels.attention(q, k, v, causal=True, return_lse=True)
    dout = _bf16(gen, 1, 4, 200, 64)
    cuts = [0, q.numel(), q.numel() + k.numel(), q.numel() + 2 * k.numel()]

    def call(stream=None):
        # one fresh tensor a call holds the three gradients (given as views of it), so a graph
        # replay rewrites what the capture returned, as for the other entry points
        grads = torch.empty(cuts[-1], device="cuda", dtype=q.dtype)
        dq, dk, dv = (grads[a:b].view(t.shape) for a, b, t in zip(cuts, cuts[1:], (q, k, v)))
        kernels.attention_backward(q, k, v, out, dout, lse, causal=True, deterministic=True,
                                   dq=dq, dk=dk, dv=dv, stream=stream)
        return grads
    return call


def _attention_backward_rotated(gen):
    # full attention, head dim 128, seq 200: the deterministic plan's rotated walk (a persistent
    # cooperative grid, two dQ warps); deterministic: bit-exact by design
    q = _bf16(gen, 1, 4, 200, 128)
    k, v = _bf16(gen, 1, 2, 200, 128), _bf16(gen, 1, 2, 200, 128)
    out, lse = kernels.attention(q, k, v, return_lse=True)
    dout = _bf16(gen, 1, 4, 200, 128)
    cuts = [0, q.numel(), q.numel() + k.numel(), q.numel() + 2 * k.numel()]

    def call(stream=None):
        grads = torch.empty(cuts[-1], device="cuda", dtype=q.dtype)
        dq, dk, dv = (grads[a:b].view(t.shape) for a, b, t in zip(cuts, cuts[1:], (q, k, v)))
        kernels.attention_backward(q, k, v, out, dout, lse, deterministic=True, dq=dq, dk=dk, dv=dv, stream=stream)
        return grads
    return call


# 48 sequences of 0-61 tokens, which the plan packs into windows of 128 rows whatever their sequences
SHORT_LENS = (5, 0, 1, 33, 17, 61, 2, 49, 40, 9, 58, 3) * 4


def _attention_varlen(causal, lens=(300, 0, 1, 129, 77, 256), windows=False):
    def make(gen):
        # ragged packed sequences (empty, one token, 129, 300: odd and even row-block counts, so
        # causal CTAs stride over paired units and middle blocks alone), GQA 2:1, head dim 128
        from tmaflow.kernels.attention_varlen_entry import in_windows
        assert in_windows(max(lens), max(lens), len(lens), sum(lens), causal) == windows  # the case's plan
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        q, k, v = _bf16(gen, sum(lens), 4, 128), _bf16(gen, sum(lens), 2, 128), _bf16(gen, sum(lens), 2, 128)
        return lambda stream=None: kernels.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=causal,
                                                             stream=stream)
    return make


def _attention_varlen_backward(gen):
    # ragged packed sequences (an empty one, one of 1 row), GQA 2:1, head dim 128 (the Hopper
    # kernel's VARLEN build); deterministic: bit-exact by design; workspace per call and stream
    lens = [150, 0, 1, 77]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    total = sum(lens)
    q, dout = _bf16(gen, total, 4, 128), _bf16(gen, total, 4, 128)
    k, v = _bf16(gen, total, 2, 128), _bf16(gen, total, 2, 128)
    out, lse = kernels.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True, return_lse=True)
    cuts = [0, q.numel(), q.numel() + k.numel(), q.numel() + 2 * k.numel()]

    def call(stream=None):
        grads = torch.empty(cuts[-1], device="cuda", dtype=q.dtype)
        dq, dk, dv = (grads[a:b].view(t.shape) for a, b, t in zip(cuts, cuts[1:], (q, k, v)))
        kernels.attention_varlen_backward(q, k, v, out, dout, lse, cu, cu, max(lens), max(lens), causal=True,
                                          deterministic=True, dq=dq, dk=dk, dv=dv, stream=stream)
        return grads
    return call


def _decode(gen):
    # ragged lengths (not page multiples, one of 1), shuffled pages, splits from the heuristic
    # (their partials and counters are per stream)
    batch, pages, page = 3, 48, 16
    q = _bf16(gen, batch, 8, 128)
    k_cache, v_cache = _bf16(gen, pages, page, 2, 128), _bf16(gen, pages, page, 2, 128)
    table = torch.randperm(pages, device="cuda", generator=gen).to(torch.int32).reshape(batch, pages // batch)
    lens = torch.tensor([77, 1, 250], dtype=torch.int32, device="cuda")
    return lambda stream=None: kernels.attention_decode(q, k_cache, v_cache, table, lens, stream=stream)


def _decode_head_groups(gen):
    # half the SMs' requests at 8 kv heads: four kv heads a CTA, one CTA an SM (the default there);
    # ragged lengths, shuffled pages
    batch, width, page = tf.current_device().sm_count // 2, 20, 16
    q = _bf16(gen, batch, 32, 128)
    k_cache, v_cache = (_bf16(gen, batch * width, page, 8, 128) for _ in range(2))
    table = torch.randperm(batch * width, device="cuda", generator=gen).to(torch.int32).reshape(batch, width)
    lens = torch.randint(0, width * page + 1, (batch,), device="cuda", generator=gen, dtype=torch.int32)
    return lambda stream=None: kernels.attention_decode(q, k_cache, v_cache, table, lens, stream=stream)


def _softmax(gen):
    x = torch.randn(64, 1024, device="cuda", generator=gen)
    return lambda stream=None: kernels.softmax(x, stream=stream)


def _copy(gen):
    x = torch.randn(256, 1024, device="cuda", generator=gen)
    return lambda stream=None: kernels.copy(x, stream=stream)


def _transpose(gen):
    x = torch.randn(256, 512, device="cuda", generator=gen)
    return lambda stream=None: kernels.transpose(x, stream=stream)

def _decode_slices(gen):
    # one request of 2999 keys (not a page multiple): 24 splits merged by slices, a cooperative
    # launch per call (the plan's at batch 1 from 16 splits)
    pages, page = 188, 16
    q = _bf16(gen, 1, 16, 128)
    k_cache, v_cache = _bf16(gen, pages, page, 8, 128), _bf16(gen, pages, page, 8, 128)
    table = torch.randperm(pages, device="cuda", generator=gen).to(torch.int32).reshape(1, pages)
    lens = torch.tensor([2999], dtype=torch.int32, device="cuda")
    return lambda stream=None: kernels.attention_decode(q, k_cache, v_cache, table, lens, stream=stream)


CASES = {
    "gemm dense": _gemm(256, 512, 1024),
    "gemm skinny": _gemm(64, 512, 4096),               # M <= 128: the skinny kernel, K split 16 ways
    "gemm skinny 5 stages": _gemm(16, 8704, 1008),     # 136 tiles of 64 rows: several CTAs an SM
    "gemm 128-column pairs": _gemm(2048, 5120, 512),   # over a wave: pairs sharing B
    "gemm split_k=8": _gemm(256, 512, 4096, GemmConfig(split_k=8)),
    "gemm K in clusters of four": _gemm(129, 264, 4096),     # the default there; M past one tile
    "gemm one M tile, K in clusters of four": _gemm(96, 776, 4096),  # N not a multiple of 64
    "gemm split_tail": _split_tail,
    "gemm staged (K 4095): one stage_rows launch, the GEMM under PDL": _gemm(129, 257, 4095),
    "fp8 gemm": _fp8_gemm,
    "fp8 block-scaled": _fp8_block_scaled,
    "fp8 block-scaled skinny row-major": _fp8_row_major_skinny,
    "fp8 block-scaled row-major M=128, K in clusters of four": lambda gen: _fp8_row_major_skinny(gen, 128),
    "fp8 block-scaled skinny row-major M=128": lambda gen: _fp8_row_major_skinny(gen, 128, 8712),  # 69 tiles
    "grouped device offsets": _grouped(False),
    "grouped host offsets": _grouped(True),
    "grouped decode path, 128-row tiles": _grouped_decode,
    "grouped staged (K 1020)": _grouped_staged,
    "attention": _attention,
    "attention backward": _attention_backward,
    "attention backward rotated": _attention_backward_rotated,
    "attention varlen": _attention_varlen(False),
    "attention varlen causal (paired)": _attention_varlen(True),
    "attention varlen windows": _attention_varlen(False, SHORT_LENS, windows=True),
    "attention varlen windows causal": _attention_varlen(True, SHORT_LENS, windows=True),
    "attention varlen backward": _attention_varlen_backward,
    "attention decode": _decode,
    "attention decode slice merge": _decode_slices,
    "attention decode head groups one CTA an SM": _decode_head_groups,
    "softmax": _softmax,
    "copy": _copy,
    "transpose": _transpose,
}


@pytest.fixture
def gen(rng):
    g = torch.Generator(device="cuda")
    g.manual_seed(int(rng.integers(2**62)))
    return g


def _alone(call):
    """The reference: the call alone on the default stream, finished."""
    torch.cuda.synchronize()
    ref = call()
    torch.cuda.synchronize()
    return ref


def _differing(results, ref) -> list:
    torch.cuda.synchronize()
    return [i for i, got in enumerate(results) if not torch.equal(got, ref)]


def _assert_all_equal(name, results, ref, least):
    bad = _differing(results, ref)
    assert len(results) >= least, f"{name}: only {len(results)} launches"
    assert not bad, f"{name}: {len(bad)} of {len(results)} results differ from the call alone (first: {bad[:8]})"


# --- the combinations --------------------------------------------------------------------------------

def current_streams(call):
    """Two torch streams made current in turn; ``stream=None`` follows them."""
    streams = [torch.cuda.Stream() for _ in range(2)]
    results = []
    for _ in range(LAUNCHES):
        for s in streams:
            with torch.cuda.stream(s):
                results.append(call())
    return results, len(streams) * LAUNCHES


def explicit_streams(call):
    """The same streams passed as ``stream=``; the current stream stays the default one."""
    streams = [torch.cuda.Stream() for _ in range(2)]
    results = []
    for _ in range(LAUNCHES):
        for s in streams:
            results.append(call(stream=s))
    return results, len(streams) * LAUNCHES


def threads_own_streams(call):
    """Three threads, each launching on its own stream: two make it current, one passes it."""
    per_thread = [[] for _ in range(3)]

    def work(i):
        s = torch.cuda.Stream()
        for _ in range(LAUNCHES):
            if i % 2:
                per_thread[i].append(call(stream=s))
            else:
                with torch.cuda.stream(s):
                    per_thread[i].append(call())
        s.synchronize()

    _in_threads(work, 3)
    return [r for rs in per_thread for r in rs], 3 * LAUNCHES


def tf_graph_beside_streams(call):
    """A tf.Graph captured while another thread launches on its stream, then replayed on a
    third stream interleaved with eager launches on two more; every replay's output is copied
    out in order on the replay stream."""
    results, stop = [], threading.Event()
    background, errors = [], []

    def keep_launching():
        try:
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                while not stop.is_set() or len(background) < LAUNCHES:
                    background.append(call())
            s.synchronize()
        except BaseException as exc:  # re-raised in the main thread
            errors.append(exc)

    thread = threading.Thread(target=keep_launching)
    thread.start()
    try:
        with tf.Graph() as g:
            with g.capture():
                y = call()
            stop.set()
            thread.join(timeout=300)
            replay_stream, eager = torch.cuda.Stream(), [torch.cuda.Stream() for _ in range(2)]
            replay_stream.wait_stream(torch.cuda.current_stream())
            snapshots = []
            for _ in range(LAUNCHES):
                with torch.cuda.stream(replay_stream):
                    g.replay(stream=replay_stream)
                    snapshots.append(y.clone())
                for s in eager:
                    with torch.cuda.stream(s):
                        results.append(call())
            replay_stream.synchronize()
    finally:
        stop.set()
        thread.join(timeout=300)
    if errors:
        raise errors[0]
    return snapshots + results + background, 4 * LAUNCHES


def torch_graph_beside_streams(call):
    """A torch CUDA graph (captured on a stream warmed up first: per-stream state exists before
    the capture) replayed on one stream while eager launches run on two others."""
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):
        call()  # warm-up on the capture stream: its state and workspace exist before the capture
    capture.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=capture):
        y = call()
    replay_stream, eager = torch.cuda.Stream(), [torch.cuda.Stream() for _ in range(2)]
    snapshots, results = [], []
    for _ in range(LAUNCHES):
        with torch.cuda.stream(replay_stream):
            g.replay()
            snapshots.append(y.clone())
        for s in eager:
            with torch.cuda.stream(s):
                results.append(call())
    return snapshots + results, 3 * LAUNCHES


COMBINATIONS = {f.__name__: f for f in (current_streams, explicit_streams, threads_own_streams,
                                         tf_graph_beside_streams, torch_graph_beside_streams)}


# Host offsets are refused inside a torch capture (test_host_offsets_refused_in_a_torch_capture):
# that pair is not a case of this suite.
PAIRS = [(case, combination) for case in CASES for combination in COMBINATIONS
         if (case, combination) != ("grouped host offsets", "torch_graph_beside_streams")]


@pytest.mark.parametrize("case,combination", PAIRS)
def test_every_launch_equals_the_call_alone(device, gen, case, combination):
    call = CASES[case](gen)
    ref = _alone(call)
    results, least = COMBINATIONS[combination](call)
    _assert_all_equal(f"{case}, {combination}", results, ref, least)


def test_references_are_right(device, gen):
    """The references the suite compares with are the products they claim (loosely: the
    other GPU suites check accuracy; this one checks that a difference could be seen)."""
    a, b = _bf16(gen, 256, 4096), _bf16(gen, 512, 4096)
    got = _alone(lambda: kernels.gemm(a, b, config=GemmConfig(split_k=8)))
    want = a.float() @ b.float().T
    assert (torch.linalg.norm(got.float() - want) / torch.linalg.norm(want)).item() < 1e-2
    x = torch.randn(64, 1024, device="cuda", generator=gen)
    torch.testing.assert_close(_alone(lambda: kernels.softmax(x)), torch.softmax(x, -1), rtol=1e-5, atol=1e-7)


def test_split_k_workspaces_are_per_stream(device, gen):
    """Two current streams: two split-K workspaces (the bug: one, shared, built for whichever
    stream was current first)."""
    entry.STATES.clear()  # torch's pooled streams recur: states of earlier tests hold workspaces
    splitk._workspaces.__dict__.clear()
    call = CASES["gemm split_k=8"](gen)
    streams = [torch.cuda.Stream() for _ in range(2)]
    for s in streams:
        with torch.cuda.stream(s):
            call()
    torch.cuda.synchronize()
    handles = {key[1] for key in splitk._workspaces.__dict__}
    assert handles == {s.cuda_stream for s in streams}


def test_host_offsets_refused_in_a_torch_capture(device, gen):
    call = CASES["grouped host offsets"](gen)
    capture = torch.cuda.Stream()
    with torch.cuda.stream(capture):
        call()
    capture.synchronize()
    g = torch.cuda.CUDAGraph()
    with pytest.raises(tf.TmaflowError, match=r"offsets given as host values.*device int32 tensor"):
        with torch.cuda.graph(g, stream=capture):
            call()


def _poisoned_replays(g, y, times: int) -> list:
    """``times`` replays of torch graph ``g`` on the current stream, its output ``y`` poisoned
    before each and copied after."""
    results = []
    for _ in range(times):
        y.fill_(float("nan"))
        g.replay()
        results.append(y.clone())
    return results


def test_a_cold_split_k_state_is_captured_with_scratch_of_its_own(device, gen):
    """A split-K call first made on a stream inside a torch capture: its partials come from the
    capture's pool and its counters are its own (it used to need the stream's workspace, made
    by an eager call before the capture). The stream's workspace is never made."""
    entry.STATES.clear()  # torch's pooled streams recur: no state of an earlier test may be warm
    splitk._workspaces.__dict__.clear()
    call = CASES["gemm split_k=8"](gen)
    ref = _alone(call)  # warm on the default stream only
    capture = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=capture):
        y = call()
    _assert_all_equal("a cold split-K state captured", _poisoned_replays(g, y, 10), ref, 10)
    ws = splitk._workspaces.__dict__.get((tf.current_device().ordinal, capture.cuda_stream))
    assert ws is None or ws._buffer is None, "the capture stream's workspace was never allocated"



@pytest.mark.parametrize("case", [c for c in CASES if c != "grouped host offsets"])
def test_torch_graphs_captured_on_one_stream_replay_at_once(device, gen, case):
    """Two torch graphs captured on one stream (as torch.cuda.graph's default capture stream
    does for every graph) replayed at the same time on two streams, with eager calls on the
    capture stream beside them: each captured call keeps scratch of its own (split-K partials
    and counters, decode splits, grouped C-map slots), so every replay equals its call alone
    (the stream's workspace, baked into both, mixed their partials and counts)."""
    calls = [CASES[case](gen) for _ in range(2)]  # two inputs: a mix-up shows
    refs = [_alone(call) for call in calls]
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):
        for call in calls:
            call()  # warm-up: states and the stream's workspace exist (the eager calls below use it)
    capture.synchronize()
    graphs, outs = [], []
    for call in calls:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=capture):
            outs.append(call())
        graphs.append(g)
    replay = [torch.cuda.Stream() for _ in graphs]
    snapshots, eager = [[] for _ in graphs], []
    for _ in range(LAUNCHES):
        for i, (g, s) in enumerate(zip(graphs, replay)):
            with torch.cuda.stream(s):
                g.replay()
                snapshots[i].append(outs[i].clone())
        with torch.cuda.stream(capture):
            eager.append(calls[1]())
    for i in range(len(graphs)):
        _assert_all_equal(f"{case}, graph {i} replayed beside the other", snapshots[i], refs[i], LAUNCHES)
    _assert_all_equal(f"{case}, eager on the capture stream", eager, refs[1], LAUNCHES)


def test_a_graph_keeps_its_split_k_scratch_when_the_stream_workspace_grows(device, gen):
    """Captured, then a larger split-K call on the capture stream replaces the stream's
    workspace and the old buffer goes back to the pool, where the next allocation of its size
    on that stream gets it (filled with 0xFF here): the graph's replays must not read or write
    it (they did, before captured calls had scratch of their own: a use after free)."""
    entry.STATES.clear()
    splitk._workspaces.__dict__.clear()
    small = CASES["gemm split_k=8"](gen)  # 256 x 512, 8 splits: the smallest workspace
    ref = _alone(small)
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):
        small()
    capture.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=capture):
        y = small()
    large = _gemm(1024, 2048, 4096, GemmConfig(split_k=8))(gen)  # 16 M partial floats: a new buffer
    with torch.cuda.stream(capture):
        large()
    capture.synchronize()
    ws = splitk._workspaces.__dict__[(tf.current_device().ordinal, capture.cuda_stream)]
    junk = tf.empty((4096 + (1 << 20),), "float32", stream=capture.cuda_stream)  # the old buffer's size
    junk.fill_bytes(0xFF)
    tf.current_device().synchronize()
    assert ws.floats >= 8 * 1024 * 2048
    _assert_all_equal("the graph after its stream's workspace grew", _poisoned_replays(g, y, 10), ref, 10)


# --- the generated Python launch path ------------------------------------------------------------------

def _forget_launchers():
    """Prepared states and launchers go, so the next calls generate their launch paths again."""
    entry.STATES.clear()
    for kern in registry._kernels.values():
        kern._launchers.clear()


def _paths() -> set:
    """Which paths the entry points' launchers took: "C" (a native Plan) or "Python"."""
    found = set()
    for kern in registry._kernels.values():
        for launcher in list(kern._launchers.values()):
            func = launcher.func
            if func is not tf.Launcher._checked_call:
                found.add("C" if type(func).__name__ == "Plan" else "Python")
    return found


@pytest.fixture(params=["C", "Python"])
def launch_path(request, monkeypatch):
    if request.param == "C" and native.module() is None:
        pytest.skip(native.status())
    if request.param == "Python":  # as TMAFLOW_NATIVE=0 decides it, for this test only
        monkeypatch.setattr(native, "_state", {"reason": "TMAFLOW_NATIVE=0 (test)"})
    _forget_launchers()
    yield request.param
    _forget_launchers()


@pytest.mark.parametrize("combination", ["current_streams", "threads_own_streams"])
@pytest.mark.parametrize("case", ["gemm split_k=8", "gemm skinny", "grouped host offsets", "softmax"])
def test_both_launch_paths(device, gen, launch_path, case, combination):
    call = CASES[case](gen)
    ref = _alone(call)
    results, least = COMBINATIONS[combination](call)
    _assert_all_equal(f"{case}, {combination}, {launch_path} path", results, ref, least)
    paths = _paths()  # C: some argument kinds may still take the generated Python path
    assert launch_path in paths and (launch_path == "C" or paths == {"Python"}), paths
