"""GPU tier, world size 1: tmaflow.distributed through the same code paths as 2-8 ranks (a
1-rank NCCL group over a FileStore): the symmetric buffer's tables, TMA through a map on the
peer table's pointer, all_gather_gemm / gemm_reduce_scatter against torch.matmul (bf16, fp8,
ragged M, poisoned outputs), graph capture, torch.compile, and a never-signalled wait in a
debug build becoming a DeadlockError that names the rank, the peer and the signal."""
import time

import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels

import tmaflow.distributed as tfd  # first: sets the no-multicast environment
from tmaflow.distributed import ops, protocol

try:
    import torch
    import torch.distributed as dist
except ImportError:  # torch is optional: the tests are collected, and skipped
    torch = dist = None

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    from tmaflow.testing import hopper_reason
    reason = hopper_reason()
    if reason:
        pytest.skip(reason)
    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available")
    torch.cuda.set_device(0)
    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    yield dist.group.WORLD
    torch.cuda.synchronize()
    # (a worker of pytest-xdist may run only tests that plan nothing on the group)
    tfd.release(dist.group.WORLD)
    assert tfd.release() == 0  # nothing left on any other group
    dist.destroy_process_group()


def _poisoned(shape):
    return torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda")


def _close(got, want, tol=1e-2):
    assert not torch.isnan(got).any()
    err = (torch.linalg.norm(got.double() - want.double()) / torch.linalg.norm(want.double())).item()
    assert err < tol, err


def test_buffer_tables_point_at_the_local_buffer_and_pad(group):
    buf = tfd.SymmetricBuffer.allocate((64, 128), torch.float32, group)
    assert (buf.rank, buf.world_size) == (0, 1)
    assert buf.peers.numpy().tolist() == [buf.tensor.data_ptr()] == list(buf.peer_ptrs)
    assert buf.signals.numpy().tolist() == [buf.pad.ptr] == list(buf.pad_ptrs)
    assert not buf.pad.numpy()[:protocol.pad_slots(8)].any()  # the pad starts zeroed
    assert tf.as_array(buf).ptr == buf.tensor.data_ptr()
    assert "rank 0 of 1" in repr(buf)


def test_tma_loads_and_stores_through_the_peer_table(group, rng):
    # World size 1: the peer table's only entry is this GPU's own buffer. What it checks
    # here is the plumbing (pointer from the device table -> DeviceArray -> TensorMap -> TMA);
    # tools/multi_gpu_check.sh checks real peer HBM.
    buf = tfd.SymmetricBuffer.allocate((256, 512), torch.float32, group)
    host = rng.standard_normal((256, 512)).astype(np.float32)
    buf.tensor.copy_(torch.from_numpy(host))
    peer_ptr = int(buf.peers.numpy()[0])
    peer = tf.DeviceArray(peer_ptr, (256, 512), "float32", owner=buf)
    np.testing.assert_array_equal(tf.as_array(kernels.copy(peer)).numpy(), host)  # TMA load from the peer map
    fresh = rng.standard_normal((256, 512)).astype(np.float32)
    kernels.copy(tf.from_numpy(fresh), dst=buf.peer_array(0))        # TMA store to it
    np.testing.assert_array_equal(buf.tensor.cpu().numpy(), fresh)
    tmap = buf.peer_map(0, (64, 64))
    assert tmap.array.ptr == peer_ptr


@pytest.mark.parametrize("m,n,k", [(128, 256, 512), (200, 384, 256), (1, 128, 128), (1000, 512, 1024)])
def test_all_gather_gemm_bf16(group, m, n, k):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    out = _poisoned((m, n))
    got = tfd.all_gather_gemm(a, b, group=group, m=m, out=out)
    torch.cuda.synchronize()
    assert got is out
    _close(out, a.float() @ b.float().T)


@pytest.mark.parametrize("m,n,k", [(256, 256, 512), (130, 128, 1024)])
def test_all_gather_gemm_fp8(group, m, n, k):
    a = (torch.randn(m, k, device="cuda") * 30).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, device="cuda") * 30).to(torch.float8_e4m3fn)
    got = tfd.all_gather_gemm(a, b, group=group, scale_a=0.5, scale_b=0.25)
    _close(got, (a.double() * 0.5) @ (b.double() * 0.25).T)


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize("m,n,k", [(256, 256, 512), (77, 384, 256)])
def test_gemm_reduce_scatter(group, dtype, m, n, k):
    scale = 30 if dtype != "bfloat16" else 1
    a = (torch.randn(m, k, device="cuda") * scale).to(getattr(torch, dtype))
    b = (torch.randn(n, k, device="cuda") * scale).to(getattr(torch, dtype))
    scales = dict(scale_a=0.5, scale_b=0.5) if dtype != "bfloat16" else {}
    out = _poisoned((m, n))
    tfd.gemm_reduce_scatter(a, b, group=group, out=out, **scales)
    s = 0.25 if scales else 1.0
    _close(out, a.double() @ b.double().T * s)


def test_back_to_back_calls_reuse_the_buffers(group):
    b = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    outs, refs = [], []
    for _ in range(4):  # no synchronisation between calls: the protocol orders them
        a = torch.randn(128, 512, device="cuda", dtype=torch.bfloat16)
        outs.append(tfd.all_gather_gemm(a, b, group=group))
        refs.append(a.float() @ b.float().T)
    for got, want in zip(outs, refs):
        _close(got, want)


def test_graph_capture_replays_the_protocol(group):
    a = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(384, 512, device="cuda", dtype=torch.bfloat16)
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):  # warm up on the capture stream: plans, buffers, launchers
        tfd.all_gather_gemm(a, b, group=group)
        tfd.gemm_reduce_scatter(a, b, group=group)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=capture):
        gathered = tfd.all_gather_gemm(a, b, group=group)
        scattered = tfd.gemm_reduce_scatter(a, b, group=group)
    for _ in range(3):
        a.copy_(torch.randn_like(a))
        gathered.fill_(float("nan"))
        scattered.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        _close(gathered, a.float() @ b.float().T)
        _close(scattered, a.float() @ b.float().T)


@pytest.mark.parametrize("op", ["all_gather_gemm", "gemm_reduce_scatter"])
@pytest.mark.parametrize("m,n,k", [(192, 256, 512), (16, 1024, 4096)])  # the second: skinny GEMMs, K split
def test_repeated_calls_replay_captures_that_follow_their_operands(group, op, m, n, k, monkeypatch):
    """Calls whose operands, output and stream come back are captured (the second time) and
    replayed; no host sync between calls, each result checked on the device right after it: new
    values each call in a new tensor at the same address, outputs cycling through more
    addresses than a plan keeps graphs (eviction, capture again), a fresh output every fifth
    call (eager between replays), every fourth call on a second stream (its own graphs)."""
    captured = []
    real = ops._capture
    monkeypatch.setattr(ops, "_capture", lambda *args: captured.append(args[0]) or real(*args))
    fn = getattr(tfd, op)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    backing = torch.empty(m * k, device="cuda", dtype=torch.bfloat16)
    outs = [_poisoned((m, n)) for _ in range(ops.MAX_GRAPHS + 1)]
    second = torch.cuda.Stream()
    checks = []
    for i in range(8 * len(outs)):  # about 15-20 eager calls, 11-14 captures, 9-11 replays
        stream = second if i % 4 == 3 else torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            a = backing.view(m, k)  # a new tensor at the same address every call
            a.normal_()
            out = _poisoned((m, n)) if i % 5 == 0 else outs[i % len(outs)].fill_(float("nan"))
            fn(a, b, group=group, out=out, debug=False)
            want = a.double() @ b.double().T
            checks.append(torch.stack([torch.linalg.norm(out.double() - want) / torch.linalg.norm(want),
                                       torch.isnan(out).any().double()]))
        torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    errs = torch.stack(checks).cpu().numpy()
    assert (errs[:, 1] == 0).all() and errs[:, 0].max() < 1e-2, f"calls' (error, any NaN): {errs.tolist()}"
    assert len(captured) > ops.MAX_GRAPHS and captured[0].graphs, "captured, evicted and captured again"


@pytest.mark.parametrize("count", [1, 2, 3, 8])
@pytest.mark.parametrize("rows,n,offset", [(77, 384, 0), (5, 100, 0), (64, 256, 3)])
def test_partials_are_summed_in_rank_order_and_rounded_once(group, count, rows, n, offset):
    """The reduce-scatter's sum: fp32 adds in rank order from the first partial, one rounding to
    bf16; the kernel where every address is 16-byte aligned and the size a multiple of 8 (77 x
    384), torch's adds elsewhere (5 x 100 elements; partials 3 elements into their storage):
    the same bits either way."""
    import types

    from tmaflow.kernels.registry import get_kernel

    plan = types.SimpleNamespace(sum=get_kernel("sum_partials", None, file="signal"),
                                 sms=tf.current_device().sm_count, trace=False)
    parts = [(torch.randn(rows * n + offset, device="cuda") * 4).to(torch.bfloat16)[offset:].view(rows, n)
             for _ in range(count)]
    acc = parts[0].float()
    for part in parts[1:]:
        acc += part.float()
    out = _poisoned((rows, n))
    ops.sum_partials(plan, parts, out)
    torch.cuda.synchronize()
    assert torch.equal(out, acc.to(torch.bfloat16))


def test_calls_on_two_streams_take_turns(group):
    """Two reduce-scatters of one plan on two torch streams, nothing ordering them: the second
    call's GEMM must not overwrite the partial (the symmetric buffer, read by the sum even at
    world size 1) before the first call's sum read it. A sleep on the plan's comm stream holds
    the first call's sum back; both results are checked, over rounds of fresh inputs."""
    m, n, k = 512, 768, 1024
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    tfd.gemm_reduce_scatter(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), b, group=group)  # plans
    plan = next(p for key, p in ops._PLANS.items() if key[0] == "gemm_reduce_scatter" and key[1] is group
                and key[2] == ops.Shapes((m,), n, k, "bfloat16") and not key[4] and not key[5])
    second = torch.cuda.Stream()
    errs, kept = [], []
    for _ in range(3):
        a1, a2 = (torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        out1, out2 = _poisoned((m, n)), _poisoned((m, n))
        kept += [a1, a2, out1, out2]  # new addresses every round: every call runs its steps
        second.wait_stream(torch.cuda.current_stream())  # its inputs, and nothing of the calls
        with torch.cuda.stream(plan.comm):
            torch.cuda._sleep(20_000_000)  # about 10 ms
        tfd.gemm_reduce_scatter(a1, b, group=group, out=out1)
        with torch.cuda.stream(second):
            tfd.gemm_reduce_scatter(a2, b, group=group, out=out2)
        torch.cuda.synchronize()
        for got, a in ((out1, a1), (out2, a2)):
            want = a.double() @ b.double().T
            errs.append((torch.linalg.norm(got.double() - want) / torch.linalg.norm(want)).item())
    assert all(e < 1e-2 for e in errs), f"each call's relative error, first and second stream, per round: {errs}"


def test_torch_compile_runs_the_custom_ops(group):
    import tmaflow.torch  # noqa: F401 (registers torch.ops.tmaflow.*)
    a = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    name = group.group_name

    @torch.compile(fullgraph=True)
    def layer(x):
        h = torch.ops.tmaflow.all_gather_gemm(x, b, name, x.shape[0] * 1).relu()
        return torch.ops.tmaflow.gemm_reduce_scatter(h, b, name)

    got = layer(a)
    _close(got, (a.float() @ b.float().T).relu().bfloat16().float() @ b.float().T, tol=2e-2)


def test_a_never_signalled_wait_is_a_deadlock_error_naming_rank_peer_and_signal(group):
    shapes = ops.gather_shapes((64, 128), "bfloat16", (64, 128), "bfloat16", None, 1, 0)
    plan = ops._plan("all_gather_gemm", shapes, group, torch.device("cuda", 0), True)
    stream = torch.cuda.current_stream()
    slot = protocol.done(1, 0)
    t0 = time.perf_counter()
    with pytest.raises(tf.DeadlockError, match=rf"all_gather_gemm: rank 0 waited for done from rank 0 "
                                               rf"\(signal {slot}\): .*rank 0: signal {slot} from rank 0 "
                                               r"\(waiting for 1, saw 0"):
        plan.signal(protocol.Step("wait", "comm", peer=0, slot=slot), stream)
    assert time.perf_counter() - t0 < 5.0
    # a put then a wait completes and leaves the slot reset; a whole debug call still works
    plan.signal(protocol.Step("put", "comm", peer=0, slot=slot), stream)
    plan.signal(protocol.Step("wait", "comm", peer=0, slot=slot), stream)
    torch.cuda.synchronize()
    assert plan.buffer.pad.numpy()[slot] == 0
    a = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    _close(tfd.all_gather_gemm(a, b, group=group, debug=True), a.float() @ b.float().T)


def test_traced_call_keeps_its_traces_for_one_timeline(group, tmp_path):
    a = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
    _close(tfd.all_gather_gemm(a, b, group=group, trace=True), a.float() @ b.float().T)
    traces = tfd.last_traces()
    assert traces and all(len(t) for t in traces)  # world size 1: the GEMM of the own shard
    doc = tfd.merge_traces({0: traces}, tmp_path / "run.json")
    assert {e["pid"] for e in doc["traceEvents"]} == {0}


def test_bad_arguments_are_refused_before_anything_runs(group):
    a = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(tf.TmaflowError, match=r"K of a_shard \(128\) and b \(64\) differ"):
        tfd.all_gather_gemm(a, torch.randn(32, 64, device="cuda", dtype=torch.bfloat16), group=group)
    with pytest.raises(tf.TmaflowError, match=r"out must be a contiguous \(64, 32\) bfloat16 tensor"):
        tfd.all_gather_gemm(a, a[:32], group=group, out=torch.empty(64, 32, device="cuda"))
    with pytest.raises(tf.TmaflowError, match=r"a_shard has 64 rows but rank 0's shard of m=65"):
        tfd.all_gather_gemm(a, a, group=group, m=65)
    plans = len(ops._PLANS)
    with pytest.raises(tf.TmaflowError, match=r"b is on device\(type='cpu'\); the collectives take CUDA torch tensors"):
        tfd.all_gather_gemm(a, a.cpu(), group=group)
    with pytest.raises(tf.TmaflowError, match=r"gemm_reduce_scatter: a is on device\(type='cpu'\)"):
        tfd.gemm_reduce_scatter(a.cpu(), a.cpu(), group=group)
    assert len(ops._PLANS) == plans, "refused before a plan was made"
