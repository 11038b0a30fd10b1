"""CPU tier: the signal protocol of the overlapped collectives, executed by the reference model
for world sizes 1-8 and ragged shards against numpy, and broken schedules caught."""
import numpy as np
import pytest

import tmaflow as tf
from tmaflow.distributed import protocol

WORLDS = range(1, protocol.MAX_WORLD + 1)


def _gather_case(rng, world, m, k=16, n=8):
    a = [rng.standard_normal((r, k)) for r in protocol.shard_rows(m, world)]
    return a, rng.standard_normal((n, k))


def _scatter_case(rng, world, m, k=4, n=8):
    return ([rng.standard_normal((m, k)) for _ in range(world)],
            [rng.standard_normal((n, k)) for _ in range(world)])


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("m", [1, 7, 64, 101])
def test_all_gather_gemm_matches_numpy(rng, world, m):
    a, b = _gather_case(rng, world, m)
    want = np.concatenate(a) @ b.T
    for seed in range(4):
        outs = protocol.simulate("all_gather_gemm", a, b, calls=3, seed=seed)
        for out in outs:
            np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("m", [1, 7, 64, 101])
def test_gemm_reduce_scatter_matches_numpy(rng, world, m):
    a, b = _scatter_case(rng, world, m)
    full = sum(x @ y.T for x, y in zip(a, b))
    offsets = np.cumsum([0] + protocol.shard_rows(m, world))
    for seed in range(4):
        outs = protocol.simulate("gemm_reduce_scatter", a, b, calls=3, seed=seed)
        for r, out in enumerate(outs):
            np.testing.assert_allclose(out, full[offsets[r]:offsets[r + 1]], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("m,world,want", [(8, 1, [8]), (10, 4, [3, 3, 3, 1]), (5, 4, [2, 2, 1, 0]),
                                          (0, 3, [0, 0, 0]), (64, 8, [8] * 8), (3, 8, [1, 1, 1] + [0] * 5)])
def test_shard_rows_are_ceil_then_ragged(m, world, want):
    assert protocol.shard_rows(m, world) == want


@pytest.mark.parametrize("kind", sorted(protocol.SCHEDULES))
@pytest.mark.parametrize("world", WORLDS)
def test_every_slot_is_put_once_and_waited_once(kind, world):
    puts, waits = [], []
    for r in range(world):
        for s in protocol.SCHEDULES[kind](world, r):
            if s.op == "put":
                puts.append((s.peer, s.slot))
            elif s.op == "wait":
                waits.append((r, s.slot))
            assert s.op in protocol.OPS and s.stream in ("comm", "compute")
    assert sorted(puts) == sorted(waits) and len(set(puts)) == len(puts)
    assert max((slot for _, slot in puts), default=-1) < protocol.pad_slots(world)


def _without(kind, drop):
    real = protocol.SCHEDULES[kind]
    return lambda world, rank: [s for i, s in enumerate(real(world, rank)) if not drop(rank, i, s)]


@pytest.mark.parametrize("kind", sorted(protocol.SCHEDULES))
def test_a_missing_put_deadlocks(monkeypatch, rng, kind):
    broken = _without(kind, lambda rank, i, s: rank == 1 and s.op == "put" and s.peer == 0)
    monkeypatch.setitem(protocol.SCHEDULES, kind, broken)
    a, b = _gather_case(rng, 3, 9) if kind == "all_gather_gemm" else _scatter_case(rng, 3, 9)
    with pytest.raises(tf.DeadlockError, match=r"no step can run; stuck: rank 0 comm: call 0 wait slot"):
        protocol.simulate(kind, a, b)


@pytest.mark.parametrize("kind", sorted(protocol.SCHEDULES))
def test_reading_before_the_ready_signal_is_caught(monkeypatch, rng, kind):
    broken = _without(kind, lambda rank, i, s: s.op == "wait" and s.slot < 4)
    monkeypatch.setitem(protocol.SCHEDULES, kind, broken)
    a, b = _gather_case(rng, 4, 16) if kind == "all_gather_gemm" else _scatter_case(rng, 4, 16)
    with pytest.raises(tf.TmaflowError, match=r"not arrived, or overwritten|unconsumed signal"):
        for seed in range(20):
            protocol.simulate(kind, a, b, seed=seed)


@pytest.mark.parametrize("kind", sorted(protocol.SCHEDULES))
def test_overwriting_before_peers_are_done_is_caught(monkeypatch, rng, kind):
    broken = _without(kind, lambda rank, i, s: s.op in ("put", "wait") and s.slot >= 4)
    monkeypatch.setitem(protocol.SCHEDULES, kind, broken)
    a, b = _gather_case(rng, 4, 16) if kind == "all_gather_gemm" else _scatter_case(rng, 4, 16)
    with pytest.raises(tf.TmaflowError, match=r"not arrived, or overwritten|unconsumed signal"):
        for seed in range(50):
            protocol.simulate(kind, a, b, calls=3, seed=seed)


def test_describe_names_the_slot():
    assert protocol.describe(4, protocol.ready(2)) == "ready from rank 2"
    assert protocol.describe(4, protocol.done(4, 3)) == "done from rank 3"


@pytest.mark.parametrize("world,rank,match", [(0, 0, r"world_size=0 must be in \[1, 8\]"),
                                              (9, 0, r"world_size=9 must be in \[1, 8\]"),
                                              (4, 4, r"rank=4 must be in \[0, 3\]"),
                                              (2.0, 0, r"world_size=2.0 must be an int")])
def test_bad_world_or_rank(world, rank, match):
    with pytest.raises(tf.TmaflowError, match=match):
        protocol.all_gather_gemm(world, rank)


def test_unknown_kind():
    with pytest.raises(tf.TmaflowError, match=r"kind='gather' must be one of"):
        protocol.simulate("gather", [np.zeros((1, 1))], np.zeros((1, 1)))


def test_pulling_before_the_previous_reduce_is_caught(monkeypatch, rng):
    # without the fork, the comm stream's next-call pulls overwrite the partials the previous
    # call's reduce has not read yet
    kind = "gemm_reduce_scatter"
    broken = _without(kind, lambda rank, i, s: s.event == "fork")
    monkeypatch.setitem(protocol.SCHEDULES, kind, broken)
    a, b = _scatter_case(rng, 4, 16)
    with pytest.raises(tf.TmaflowError, match=r"reduce reads rank \d's partial of call \d"):
        for seed in range(50):
            protocol.simulate(kind, a, b, calls=3, seed=seed)
