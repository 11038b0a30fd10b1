"""GPU tier, 2-8 ranks under torchrun (tools/multi_gpu_check.sh; skipped otherwise): TMA loads
from and stores to a peer's HBM through peer maps, peer tables, all_gather_gemm and
gemm_reduce_scatter against torch.matmul of the whole problem (bf16, fp8, ragged and empty
shards, back to back, graph replays), and a never-signalled wait raising DeadlockError on
every rank, naming the rank, the peer and the signal.

    torchrun --nproc-per-node 4 -m pytest tests/test_gpu_multirank.py -q -p no:cacheprovider

Every rank runs the same tests in the same order (each test is collective)."""
import os
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

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch"),
              pytest.mark.skipif(int(os.environ.get("WORLD_SIZE", "1")) < 2,
                                 reason="multi-rank test: run under torchrun with 2-8 ranks "
                                        "(tools/multi_gpu_check.sh)")]


@pytest.fixture(scope="module")
def group():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    yield dist.group.WORLD
    dist.barrier()
    assert tfd.release(dist.group.WORLD) > 0
    dist.destroy_process_group()


def _same_everywhere(shape, dtype, seed, scale=1.0):
    """The same random tensor on every rank (one seed)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, device="cuda", generator=g) * scale).to(dtype)


def _close(got, want, tol=1e-2):
    assert not torch.isnan(got).any()
    err = (torch.linalg.norm(got.double() - want.double()) / torch.linalg.norm(want.double())).item()
    assert err < tol, err


def _sync():
    torch.cuda.synchronize()
    dist.barrier()


def test_peer_tables_and_copies_reach_every_rank(group):
    buf = tfd.SymmetricBuffer.allocate((128, 256), torch.float32, group)
    me, world = buf.rank, buf.world_size
    buf.tensor.fill_(float(me))
    _sync()
    assert buf.peers.numpy().tolist() == list(buf.peer_ptrs)
    assert buf.signals.numpy().tolist() == list(buf.pad_ptrs)
    for j in range(world):
        assert buf.peer_tensor(j).clone().eq(float(j)).all(), f"rank {me} reading rank {j}"
    _sync()


def test_tma_loads_from_and_stores_to_peer_hbm(group, rng):
    buf = tfd.SymmetricBuffer.allocate((256, 512), torch.float32, group)
    me, world = buf.rank, buf.world_size
    data = [np.random.default_rng(j).standard_normal((256, 512)).astype(np.float32) for j in range(world)]
    buf.tensor.copy_(torch.from_numpy(data[me]))
    _sync()
    for j in range(world):  # TMA loads through a map over each peer's pointer
        got = tf.as_array(kernels.copy(buf.peer_array(j)))
        np.testing.assert_array_equal(got.numpy(), data[j], err_msg=f"rank {me} TMA-loading rank {j}")
    _sync()
    nxt = (me + 1) % world  # TMA stores into the next rank's buffer
    kernels.copy(tf.from_numpy(data[me] * 2), dst=buf.peer_array(nxt))
    _sync()
    np.testing.assert_array_equal(buf.tensor.cpu().numpy(), data[(me - 1) % world] * 2)
    _sync()


def _gather_case(world, me, m, n, k, dtype, seed):
    scale = 30.0 if dtype is torch.float8_e4m3fn else 1.0
    full = _same_everywhere((m, k), dtype, seed, scale)
    b = _same_everywhere((n, k), dtype, seed + 1, scale)
    span = ops.Shapes(tuple(protocol.shard_rows(m, world)), n, k, "").span(me)
    return full, full[span].clone(), b  # a copy: a view of full would change with the shard


@pytest.mark.parametrize("m,n,k", [(1024, 512, 1024), (1000, 384, 512), (3, 256, 256)],
                         ids=["even", "ragged", "empty-shards"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_all_gather_gemm(group, m, n, k, dtype):
    dtype = getattr(torch, dtype)
    me, world = group.rank(), group.size()
    full, shard, b = _gather_case(world, me, m, n, k, dtype, seed=m + n)
    scales = dict(scale_a=0.5, scale_b=0.5) if dtype is torch.float8_e4m3fn else {}
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    tfd.all_gather_gemm(shard, b, group=group, m=m, out=out, **scales)
    torch.cuda.synchronize()
    _close(out, full.double() @ b.double().T * (0.25 if scales else 1.0))
    _sync()


@pytest.mark.parametrize("m,n,k", [(1024, 512, 2048), (1001, 256, 512), (5, 256, 512)],
                         ids=["even", "ragged", "empty-shards"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_gemm_reduce_scatter(group, m, n, k, dtype):
    dtype = getattr(torch, dtype)
    me, world = group.rank(), group.size()
    scale = 30.0 if dtype is torch.float8_e4m3fn else 1.0
    a = _same_everywhere((m, k), dtype, m, scale)
    b = _same_everywhere((n, k), dtype, m + 1, scale)
    kl = k // world
    scales = dict(scale_a=0.5, scale_b=0.5) if dtype is torch.float8_e4m3fn else {}
    rows = protocol.shard_rows(m, world)
    out = torch.full((rows[me], n), float("nan"), device="cuda", dtype=torch.bfloat16)
    tfd.gemm_reduce_scatter(a[:, me * kl:(me + 1) * kl].contiguous(), b[:, me * kl:(me + 1) * kl].contiguous(),
                            group=group, out=out, **scales)
    torch.cuda.synchronize()
    want = a[:, :kl * world].double() @ b[:, :kl * world].double().T * (0.25 if scales else 1.0)
    start = sum(rows[:me])
    if rows[me]:
        _close(out, want[start:start + rows[me]])
    _sync()


def test_back_to_back_and_graph_replays(group):
    me, world = group.rank(), group.size()
    m, n, k = 512 * world, 512, 1024
    full, shard, b = _gather_case(world, me, m, n, k, torch.bfloat16, seed=7)
    outs = [tfd.all_gather_gemm(shard * (i + 1), b, group=group) for i in range(4)]  # no sync between
    for i, got in enumerate(outs):
        _close(got, (full.double() * (i + 1)) @ b.double().T)
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):  # warm up on the capture stream: its launchers exist
        tfd.all_gather_gemm(shard, b, group=group)
    _sync()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=capture):
        out = tfd.all_gather_gemm(shard, b, group=group)
    for i in range(3):
        shard.copy_(full[ops.Shapes(tuple(protocol.shard_rows(m, world)), n, k, "").span(me)] * (i + 2))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        want = full.double() * (i + 2) @ b.double().T
        rows = protocol.shard_rows(m, world)
        spans = [ops.Shapes(tuple(rows), n, k, "").span(j) for j in range(world)]
        errs = [(torch.linalg.norm(out[s].double() - want[s]) / torch.linalg.norm(want[s])).item() for s in spans]
        assert max(errs) < 1e-2, f"replay {i}, rank {me}: error of each rank's rows {errs}"
        _sync()


@pytest.mark.parametrize("op", ["all_gather_gemm", "gemm_reduce_scatter"])
def test_repeated_addresses_run_eager_then_captured_then_replayed(group, op, monkeypatch):
    """The same operands and output five times, new values each time: the first calls run
    step by step, then the call is captured, and the later ones replay it without the checks
    (ops._replayed); every result is right."""
    checked = []
    name = "gather_shapes" if op == "all_gather_gemm" else "scatter_shapes"
    real = getattr(ops, name)
    monkeypatch.setattr(ops, name, lambda *args, **kw: checked.append(1) or real(*args, **kw))
    me, world = group.rank(), group.size()
    n, k = 256, 512
    a = _same_everywhere((256, k), torch.bfloat16, 21 + me)
    b = _same_everywhere((n, k), torch.bfloat16, 22 + me)
    m = 256 * world
    out = torch.empty((m, n) if op == "all_gather_gemm" else (256 // world, n), device="cuda",
                      dtype=torch.bfloat16)
    fn = getattr(tfd, op)
    for i in range(5):
        a.normal_()
        out.fill_(float("nan"))
        fn(a, b, group=group, out=out)
        if op == "all_gather_gemm":
            want = torch.cat(_gathered(a, group)).double() @ b.double().T
        else:
            parts = [x.double() @ y.double().T for x, y in zip(_gathered(a, group), _gathered(b, group))]
            want = sum(parts)[me * (256 // world):(me + 1) * (256 // world)]
        torch.cuda.synchronize()
        _close(out, want)
        _sync()
    plan = next(p for key, p in ops._PLANS.items()
                if key[0] == op and key[1] is group and key[2].n == n and key[2].k == k and not key[4] and not key[5])
    assert len(plan.graphs) >= 1, "the repeated call was captured"
    assert len(checked) <= ops.GRAPH_AFTER, f"checked {len(checked)} of 5 calls: the replays did too"


@pytest.mark.parametrize("op", ["all_gather_gemm", "gemm_reduce_scatter"])
def test_calls_on_two_streams_take_turns(group, op):
    """Two calls of one plan on two torch streams, nothing ordering them, the first call's
    pulls held back by a sleep on the plan's comm stream: the second call's pulls must not
    overwrite the staging the first call's GEMMs read (all-gather), nor its GEMMs the partial
    the peers still pull (reduce-scatter). Fresh inputs every round, both results checked."""
    me, world = group.rank(), group.size()
    m, n, k = 1024 * world, 2048, 2048
    fn = getattr(tfd, op)
    second = torch.cuda.Stream()
    errs, kept = [], []
    for r in range(3):
        rows = 1024 if op == "all_gather_gemm" else m
        a1, a2 = (_same_everywhere((rows, k), torch.bfloat16, 40 + 10 * r + 2 * me + i) for i in range(2))
        b = _same_everywhere((n, k), torch.bfloat16, 60 + r + me)
        outs = [torch.full((m, n) if op == "all_gather_gemm" else (m // world, n), float("nan"), device="cuda",
                           dtype=torch.bfloat16) for _ in range(2)]
        kept += [a1, a2, b, *outs]  # new addresses every round: every call runs its steps
        fn(a1, b, group=group)  # plans (the first round), and a call the sleep does not hold
        plan = next(p for key, p in ops._PLANS.items() if key[0] == op and key[1] is group
                    and key[2].n == n and key[2].k == k and not key[4] and not key[5])
        second.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(plan.comm):
            torch.cuda._sleep(20_000_000)
        fn(a1, b, group=group, out=outs[0])
        with torch.cuda.stream(second):
            fn(a2, b, group=group, out=outs[1])
        torch.cuda.current_stream().wait_stream(second)
        for a, out in zip((a1, a2), outs):
            if op == "all_gather_gemm":
                want = torch.cat(_gathered(a, group)).double() @ b.double().T
            else:
                parts = [x.double() @ y.double().T for x, y in zip(_gathered(a, group), _gathered(b, group))]
                want = sum(parts)[me * (m // world):(me + 1) * (m // world)]
            errs.append((torch.linalg.norm(out.double() - want) / torch.linalg.norm(want)).item())
        _sync()
    assert all(e < 1e-2 for e in errs), f"rank {me}: each call's relative error, per round: {errs}"


def test_m_in_a_tensor_is_read_by_value_on_a_repeated_call(group):
    """m passed as a 0-d tensor whose value changes in place: the call with the new value is
    checked and planned again, not replayed from the capture of the old one. Every rank but the
    last keeps its shard (the same view) from m = 64 W to 64 W - 1; the last one's shrinks.
    Taken by address, the others would replay the old capture (an output of the old m) while
    the last one waited in a new plan's rendezvous."""
    me, world = group.rank(), group.size()
    n, k = 256, 512
    b = _same_everywhere((n, k), torch.bfloat16, 41)
    full = torch.empty((64 * world, k), device="cuda", dtype=torch.bfloat16)
    m_tensor = torch.tensor(0)
    for m in (64 * world, 64 * world, 64 * world, 64 * world - 1):
        m_tensor.fill_(m)
        full.copy_(_same_everywhere(full.shape, torch.bfloat16, 42 + m))
        rows = protocol.shard_rows(m, world)
        start = sum(rows[:me])
        got = tfd.all_gather_gemm(full[start:start + rows[me]], b, group=group, m=m_tensor)
        torch.cuda.synchronize()
        assert tuple(got.shape) == (m, n)
        _close(got, full[:m].double() @ b.double().T)
        del got
        _sync()


@pytest.mark.parametrize("op", ["all_gather_gemm", "gemm_reduce_scatter"])
def test_eager_calls_on_one_rank_meet_replays_on_the_others(group, op):
    """Rank 0 passes a new output every call (its calls never repeat: eager stream operations),
    the others one output (captured, then replayed: the signal kernels); back to back with no
    host sync, every call's result right on every rank."""
    me, world = group.rank(), group.size()
    n, k = 256, 512
    a = _same_everywhere((256, k), torch.bfloat16, 31 + me)
    b = _same_everywhere((n, k), torch.bfloat16, 32 + me)
    shape = (256 * world, n) if op == "all_gather_gemm" else (256 // world, n)
    mine = torch.empty(shape, device="cuda", dtype=torch.bfloat16)
    fn = getattr(tfd, op)
    alive, results = [], []  # rank 0's outputs stay alive: a new address every call
    for _ in range(6):
        a.normal_()
        out = torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16) if me == 0 else mine.fill_(float("nan"))
        alive.append(out)
        fn(a, b, group=group, out=out, debug=False)
        if op == "all_gather_gemm":
            want = torch.cat(_gathered(a, group)).double() @ b.double().T
        else:
            parts = [x.double() @ y.double().T for x, y in zip(_gathered(a, group), _gathered(b, group))]
            want = sum(parts)[me * (256 // world):(me + 1) * (256 // world)]
        results.append((out.clone(), want))
    torch.cuda.synchronize()
    for got, want in results:
        _close(got, want)
    _sync()


def _gathered(x, group):
    parts = [torch.empty_like(x) for _ in range(group.size())]
    dist.all_gather(parts, x.contiguous(), group=group)
    return parts


@pytest.mark.parametrize("m", [1536, 1001])
def test_all_gather_gemm_is_bit_exact_with_nccl_then_gemm(group, m):
    """The sequential program: NCCL's all-gather of the shards, then tmaflow's GEMM of each
    shard; the overlapped call's bits are the same."""
    me, world = group.rank(), group.size()
    n, k = 384, 768
    full, shard, b = _gather_case(world, me, m, n, k, torch.bfloat16, seed=m + 3)
    rows = protocol.shard_rows(m, world)
    padded = torch.zeros((max(rows), k), dtype=torch.bfloat16, device="cuda")
    padded[:rows[me]] = shard
    shards = [p[:r] for p, r in zip(_gathered(padded, group), rows)]
    want = torch.cat([kernels.gemm(x, b) if len(x) else x.new_empty((0, n)) for x in shards])
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    tfd.all_gather_gemm(shard, b, group=group, m=m, out=out)
    torch.cuda.synchronize()
    assert torch.equal(out, want)
    _sync()


@pytest.mark.parametrize("m", [2048, 1001])
def test_gemm_reduce_scatter_is_bit_exact_with_gemm_then_ordered_sum(group, m):
    """The sequential program: each rank's partial product by tmaflow's GEMM (row chunk by
    chunk), gathered by NCCL, summed in fp32 in rank order and rounded once: the same bits."""
    me, world = group.rank(), group.size()
    n, kl = 256, 384
    a = _same_everywhere((m, kl * world), torch.bfloat16, m + 5)
    b = _same_everywhere((n, kl * world), torch.bfloat16, m + 6)
    mine = slice(me * kl, (me + 1) * kl)
    a_local, b_local = a[:, mine].contiguous(), b[:, mine].contiguous()
    rows = protocol.shard_rows(m, world)
    spans = [ops.Shapes(tuple(rows), n, kl, "").span(c) for c in range(world)]
    partial = torch.cat([kernels.gemm(a_local[spans[c]], b_local) for c in range(world)])  # no empty chunk here
    parts = _gathered(partial, group)
    acc = parts[0][spans[me]].float()
    for p in parts[1:]:
        acc += p[spans[me]].float()
    out = torch.full((rows[me], n), float("nan"), device="cuda", dtype=torch.bfloat16)
    tfd.gemm_reduce_scatter(a_local, b_local, group=group, out=out)
    torch.cuda.synchronize()
    assert torch.equal(out, acc.to(torch.bfloat16))
    _sync()


def test_a_thousand_graph_replays_are_bit_exact(group):
    """Both collectives captured in one CUDA graph, replayed 1000 times: every replay's
    outputs equal the eager call's bits (compared on the device, one sync at the end)."""
    me, world = group.rank(), group.size()
    m, n, k = 256 * world + 3, 256, 512
    full, shard, b = _gather_case(world, me, m, n, k, torch.bfloat16, seed=13)
    a_rs = _same_everywhere((512, 256), torch.bfloat16, 14 + me)
    b_rs = _same_everywhere((384, 256), torch.bfloat16, 15 + me)
    want_ag = tfd.all_gather_gemm(shard, b, group=group, m=m).clone()
    want_rs = tfd.gemm_reduce_scatter(a_rs, b_rs, group=group).clone()
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):
        tfd.all_gather_gemm(shard, b, group=group, m=m)
        tfd.gemm_reduce_scatter(a_rs, b_rs, group=group)
    _sync()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=capture):
        ag = tfd.all_gather_gemm(shard, b, group=group, m=m)
        rs = tfd.gemm_reduce_scatter(a_rs, b_rs, group=group)
    mismatches = torch.zeros((), dtype=torch.int64, device="cuda")
    for _ in range(1000):
        ag.fill_(float("nan"))
        rs.fill_(float("nan"))
        g.replay()
        mismatches += (ag != want_ag).sum() + (rs != want_rs).sum()
    torch.cuda.synchronize()
    assert mismatches.item() == 0
    _sync()


def test_traces_of_every_rank_merge_into_one_timeline(group, tmp_path_factory):
    me, world = group.rank(), group.size()
    full, shard, b = _gather_case(world, me, 256 * world, 256, 512, torch.bfloat16, seed=11)
    _close(tfd.all_gather_gemm(shard, b, group=group, trace=True), full.double() @ b.double().T)
    traces = tfd.last_traces()
    waits = [e for t in traces for e in t.to_chrome()["traceEvents"] if e.get("cat") == "signal wait"]
    assert len(waits) >= 2 * (world - 1), "a ready and a done wait per peer"
    paths = [None] * world
    mine = tmp_path_factory.mktemp(f"rank{me}")
    for i, t in enumerate(traces):
        t.save(mine / f"{i}.npz")
    dist.all_gather_object(paths, [str(mine / f"{i}.npz") for i in range(len(traces))])
    if me == 0:
        # TMAFLOW_MERGED_TRACE: where the GPU script keeps the merged timeline, for Perfetto
        doc = tfd.merge_traces(dict(enumerate(paths)), os.environ.get("TMAFLOW_MERGED_TRACE"))
        assert {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X"} == set(range(world))
    _sync()


def test_a_missing_signal_raises_deadlock_on_every_rank(group):
    me, world = group.rank(), group.size()
    shapes = ops.gather_shapes((64, 128), "bfloat16", (64, 128), "bfloat16", None, world, me)
    plan = ops._plan("all_gather_gemm", shapes, group, torch.device("cuda", torch.cuda.current_device()), True)
    peer = (me + 1) % world
    slot = protocol.ready(peer)  # nobody puts it
    _sync()
    t0 = time.perf_counter()
    with pytest.raises(tf.DeadlockError, match=rf"rank {me}: signal {slot} from rank {peer} \(waiting for 1, saw 0"):
        plan.signal(protocol.Step("wait", "comm", peer=peer, slot=slot), torch.cuda.current_stream())
    assert time.perf_counter() - t0 < 3.0  # the issue asks for about 2 s
    _sync()
    # the pad holds no stale signal, so the next correct call (debug, bounded waits) works
    full, shard, b = _gather_case(world, me, 64 * world, 64, 128, torch.bfloat16, seed=17)
    _close(tfd.all_gather_gemm(shard, b, group=group, debug=True), full.double() @ b.double().T)
    _sync()
