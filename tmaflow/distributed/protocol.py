"""The signal protocol of the overlapped collectives, as data: which rank does what, on which
stream, in which order. ``ops.py`` executes these schedules on GPUs; ``simulate`` executes
them on the CPU with numpy, checking that no wait can deadlock, that every shard is read
only after it arrived and before its owner overwrites it, and that the results are right.

Each rank runs two streams: ``comm`` (signals and copy-engine pulls from peers) and
``compute`` (the GEMMs). Signals live in each rank's signal pad: slot ``READY + j`` says
"rank j's data for you is in its buffer", slot ``DONE + j`` "rank j finished reading your
buffer". A wait waits for 1 and resets the slot to 0, so the same values repeat every call
(what a captured CUDA graph replays). A rank's last steps wait for every peer's DONE: the next
call may then overwrite its buffer.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from .. import checks
from ..errors import DeadlockError, TmaflowError

MAX_WORLD = 8
OPS = ("publish", "put", "wait", "pull", "record", "wait_event", "gemm", "reduce")


@dataclass(frozen=True)
class Step:
    """One action of one rank. ``op``: publish (copy my shard into my symmetric buffer), put
    (set ``slot`` in ``peer``'s pad to 1), wait (until my ``slot`` is 1, then reset it), pull
    (copy ``shard`` from ``peer``'s buffer), record / wait_event (``event`` between my two
    streams), gemm (the product of ``shard``), reduce (sum the pulled partials)."""
    op: str
    stream: str
    peer: int = -1
    slot: int = -1
    shard: int = -1
    event: str = ""


def ready(source: int) -> int:
    """Pad slot where ``source`` says its data is ready."""
    return source


def done(world: int, source: int) -> int:
    """Pad slot where ``source`` says it finished reading this rank's buffer."""
    return world + source


def pad_slots(world: int) -> int:
    """uint32 slots of the signal pad the protocol uses."""
    return 2 * world


def describe(world: int, slot: int) -> str:
    """What a pad slot means, for messages: 'ready from rank 1' / 'done from rank 3'."""
    return f"{'ready' if slot < world else 'done'} from rank {slot % world}"


def check_world(world, rank) -> tuple[int, int]:
    world = checks.as_int("world_size", world, 1, MAX_WORLD)
    return world, checks.as_int("rank", rank, 0, world - 1)


def shard_rows(m, world) -> list[int]:
    """Rows of each rank's shard of ``m`` rows: ceil(m / world) each, the last ones ragged
    (what is left, possibly 0)."""
    m = checks.as_int("m", m, 0)
    world = checks.as_int("world_size", world, 1, MAX_WORLD)
    full = -(-m // world)
    return [max(0, min(full, m - i * full)) for i in range(world)]


def _fork() -> list[Step]:
    """The comm stream starts after what the caller queued before the call (the inputs, and
    the previous call's reads of the local copies the pulls will overwrite)."""
    return [Step("record", "compute", event="fork"), Step("wait_event", "comm", event="fork")]


def _finish(world: int, rank: int) -> list[Step]:
    """Wait until every peer read my buffer, then join comm into compute."""
    steps = [Step("wait", "comm", peer=j, slot=done(world, j)) for j in range(world) if j != rank]
    return steps + [Step("record", "comm", event="comm"), Step("wait_event", "compute", event="comm")]


def all_gather_gemm(world, rank) -> list[Step]:
    """out = all_gather(a_shard) @ b^T. My own shard's GEMM starts at once; shard j of peer
    (rank + s) % world is pulled at step s and its GEMM runs once it landed."""
    world, rank = check_world(world, rank)
    peers = [(rank + s) % world for s in range(1, world)]
    steps = _fork() + [Step("publish", "comm")]
    steps += [Step("put", "comm", peer=j, slot=ready(rank)) for j in peers]
    steps.append(Step("gemm", "compute", shard=rank))
    for j in peers:
        steps += [Step("wait", "comm", peer=j, slot=ready(j)),
                  Step("pull", "comm", peer=j, shard=j),
                  Step("put", "comm", peer=j, slot=done(world, rank)),
                  Step("record", "comm", event=f"pulled {j}"),
                  Step("wait_event", "compute", event=f"pulled {j}"),
                  Step("gemm", "compute", shard=j)]
    return steps + _finish(world, rank)


def gemm_reduce_scatter(world, rank) -> list[Step]:
    """out = reduce_scatter(a @ b_shard^T): my partial product, computed row chunk by chunk
    into my symmetric buffer (chunk (rank + s) % world at step s, my own last), is pulled by
    the chunk's owner as soon as it is signalled; I sum my own chunk and the pulled ones."""
    world, rank = check_world(world, rank)
    steps = _fork()
    for s in range(1, world + 1):
        c = (rank + s) % world
        steps.append(Step("gemm", "compute", shard=c))
        if c != rank:
            steps.append(Step("put", "compute", peer=c, slot=ready(rank)))
    for s in range(1, world):  # peer j computes my chunk at its step s = rank - j
        j = (rank - s) % world
        steps += [Step("wait", "comm", peer=j, slot=ready(j)),
                  Step("pull", "comm", peer=j, shard=rank),
                  Step("put", "comm", peer=j, slot=done(world, rank))]
    steps += [Step("record", "comm", event="pulled"), Step("wait_event", "compute", event="pulled"),
              Step("reduce", "compute", shard=rank)]
    return steps + _finish(world, rank)


SCHEDULES = {"all_gather_gemm": all_gather_gemm, "gemm_reduce_scatter": gemm_reduce_scatter}


def streams(steps: list[Step]) -> dict[str, list[Step]]:
    """The schedule split into its two in-order streams."""
    return {name: [s for s in steps if s.stream == name] for name in ("comm", "compute")}


class _Rank:
    """One simulated rank: its streams' positions, pad, buffer and local results."""

    def __init__(self, world: int, steps: list[Step], calls: int):
        # back-to-back calls: each stream runs its part of every call in order
        self.queues = {name: [(call, s) for call in range(calls) for s in q]
                       for name, q in streams(steps).items()}
        self.pos = {name: 0 for name in self.queues}
        self.pad = [0] * pad_slots(world)
        self.buffer: dict = {}      # symmetric buffer: shard index -> (call, data)
        self.pulled: dict = {}      # local copies: shard or source rank -> (call, data)
        self.events: set = set()    # (call, event) recorded
        self.out: dict = {}         # call -> output

    def next(self, stream: str):
        q = self.queues[stream]
        return q[self.pos[stream]] if self.pos[stream] < len(q) else None


def simulate(kind: str, a: list[np.ndarray], b: list[np.ndarray] | np.ndarray, calls: int = 2,
             seed: int = 0) -> list[np.ndarray]:
    """Run ``calls`` back-to-back calls of schedule ``kind`` on every rank, interleaving the
    ranks' streams in a random order (``seed``; a rank may run ahead into its next call), and
    return each rank's output of the last call. all_gather_gemm: ``a`` the row shards, ``b``
    (N x K); gemm_reduce_scatter: ``a[r]`` (M x K_r) and ``b[r]`` (N x K_r). Raises
    DeadlockError when no step can run, TmaflowError when a step would read data that did not
    arrive or was overwritten, or a put would overwrite an unconsumed signal."""
    if kind not in SCHEDULES:
        raise TmaflowError(f"kind={kind!r} must be one of {sorted(SCHEDULES)}")
    world = len(a)
    ranks = [_Rank(world, SCHEDULES[kind](world, r), calls) for r in range(world)]
    gather = kind == "all_gather_gemm"
    m = sum(x.shape[0] for x in a) if gather else a[0].shape[0]
    rows = shard_rows(m, world)
    offsets = np.cumsum([0] + rows)
    n = np.shape(b)[0] if gather else np.shape(b[0])[0]
    for i, r in enumerate(ranks):
        r.out = {call: np.zeros((m if gather else rows[i], n)) for call in range(calls)}
    rng = random.Random(seed)
    while True:
        runnable = [(i, s) for i, r in enumerate(ranks) for s in r.queues
                    if r.next(s) is not None and _can_run(r, *r.next(s))]
        if not runnable:
            stuck = [(i, s, *r.next(s)) for i, r in enumerate(ranks) for s in r.queues
                     if r.next(s) is not None]
            if stuck:
                raise DeadlockError(f"{kind}: no step can run; stuck: " + "; ".join(
                    f"rank {i} {s}: call {call} {st.op} slot {st.slot}" for i, s, call, st in stuck),
                    stuck)
            return [r.out[calls - 1] for r in ranks]
        i, s = rng.choice(runnable)
        call, step = ranks[i].next(s)
        _run(ranks, i, call, step, kind, a, b, offsets)
        ranks[i].pos[s] += 1


def _can_run(r: _Rank, call: int, step: Step) -> bool:
    if step.op == "wait":
        return r.pad[step.slot] == 1
    if step.op == "wait_event":
        return (call, step.event) in r.events
    return True


def _run(ranks, i: int, call: int, step: Step, kind: str, a, b, offsets) -> None:
    r, world = ranks[i], len(ranks)

    def rows(shard):
        return slice(offsets[shard], offsets[shard + 1])

    def fresh(what, entry):
        if entry is None or entry[0] != call:
            raise TmaflowError(f"rank {i} call {call}: {step.op} reads {what} of call "
                               f"{entry and entry[0]} (not arrived, or overwritten)")
        return entry[1]

    if step.op == "publish":
        r.buffer = {i: (call, a[i])}
    elif step.op == "put":
        pad = ranks[step.peer].pad
        if pad[step.slot] != 0:
            raise TmaflowError(f"rank {i} call {call}: put to rank {step.peer} "
                               f"{describe(world, step.slot)} overwrites an unconsumed signal")
        pad[step.slot] = 1
    elif step.op == "wait":
        r.pad[step.slot] = 0
    elif step.op == "pull":
        r.pulled[step.peer if kind == "gemm_reduce_scatter" else step.shard] = \
            ranks[step.peer].buffer.get(step.shard)
    elif step.op == "record":
        r.events.add((call, step.event))
    elif step.op == "gemm" and kind == "all_gather_gemm":
        x = a[i] if step.shard == i else fresh(f"shard {step.shard}", r.pulled.get(step.shard))
        r.out[call][rows(step.shard)] = x @ b.T
    elif step.op == "gemm":
        r.buffer[step.shard] = (call, a[i][rows(step.shard)] @ b[i].T)
    elif step.op == "reduce":
        parts = [fresh(f"rank {j}'s partial", r.pulled.get(j)) for j in range(world) if j != i]
        r.out[call] = sum(parts, fresh("my partial", r.buffer.get(i)))
