"""CPU tier: the real executor of the collectives (tmaflow/distributed/ops.py) run by W threads,
one per rank, against a stand-in for torch whose streams run each step at once (as a debug
build's synchronous launches do), numpy GEMMs and shared signal pads. It checks that the
executor dispatches every step of the schedules, indexes shards, chunks and staging right
(ragged and empty shards included), and that issuing the steps in host order can never block
a rank forever (the debug build's synchronous waits depend on it)."""
import collections
import contextlib
import sys
import threading
import types

import numpy as np
import pytest

from tmaflow.distributed import ops, protocol, turns as call_turns


Device = collections.namedtuple("Device", "type index")  # hashable, as torch.device


class T:
    """A numpy-backed stand-in for the torch tensors the executor touches."""
    dtype = "bfloat16"
    device = Device("cuda", 0)

    def __init__(self, arr):
        self.arr = arr
        self.shape = arr.shape

    def data_ptr(self):
        return self.arr.ctypes.data

    def stride(self):
        return self.arr.strides

    def is_contiguous(self):
        return self.arr.flags.c_contiguous

    def __getitem__(self, index):
        return T(self.arr[index])

    def copy_(self, src, non_blocking=False):
        self.arr[...] = src.arr
        return self

    def float(self):
        return T(self.arr.astype(np.float64))

    def sum(self, dim):
        return T(self.arr.sum(dim))


class World:
    """Shared state of the simulated ranks: symmetric buffers and signal pads by rank."""

    def __init__(self, world: int):
        self.world = world
        self.buffers: dict = {}
        self.pads = np.zeros((world, 64), dtype=np.int64)
        self.cond = threading.Condition()
        self.dispatched: dict = {r: [] for r in range(world)}


class Group:
    def __init__(self, world: World, rank: int):
        self.w, self._rank = world, rank
        self.group_name = "fake"

    def size(self):
        return self.w.world

    def rank(self):
        return self._rank


class Buffer:
    """SymmetricBuffer's interface over numpy: every rank's buffer by rank, pads shared."""

    def __init__(self, shape, group: Group):
        self.world, self.rank, self.w = group.size(), group.rank(), group.w
        self.tensor = T(np.full(shape, np.nan))
        with self.w.cond:
            self.w.buffers.setdefault(tuple(shape), {})[self.rank] = self.tensor
        self.pad = T(self.w.pads[self.rank])
        self.key = tuple(shape)

    def peer_tensor(self, rank):
        with self.w.cond:
            self.w.cond.wait_for(lambda: rank in self.w.buffers[self.key], timeout=10)
            return self.w.buffers[self.key][rank]

    def pad_slot(self, rank, slot):
        return (rank, slot)

    def close(self):
        self.tensor = None


class Signal:
    """The signal kernels: put sets a peer's slot, wait blocks until its own slot is 1."""

    def __init__(self, name: str, w: World):
        self.name, self.w = name, w

    def launch(self, where, *args, grid, block, stream):
        rank, slot = where
        with self.w.cond:
            if self.name == "signal_put":
                assert self.w.pads[rank, slot] == 0, f"put to rank {rank} slot {slot} overwrites a signal"
                self.w.pads[rank, slot] = 1
                self.w.cond.notify_all()
            else:
                if not self.w.cond.wait_for(lambda: self.w.pads[rank, slot] == 1, timeout=10):
                    raise TimeoutError(f"rank {rank} blocked on slot {slot}")
                self.w.pads[rank, slot] = 0


def _fake_torch():
    class Stream:
        cuda_stream = 1

        def __init__(self, device=None):
            pass

        def wait_event(self, event):
            assert event.recorded

    class Event:
        recorded = False

        def record(self, stream):
            self.recorded = True

    compute = Stream()
    cuda = types.SimpleNamespace(current_stream=lambda: compute, Stream=Stream, Event=Event,
                                 stream=lambda s: contextlib.nullcontext(),
                                 is_current_stream_capturing=lambda: False,
                                 device=lambda d: contextlib.nullcontext())
    return types.SimpleNamespace(
        cuda=cuda, bfloat16="bfloat16", float8_e4m3fn="float8_e4m3fn",
        empty=lambda shape, dtype=None, device=None: T(np.full(shape, np.nan)),
        stack=lambda parts: T(np.stack([p.arr for p in parts])))


def _events_only(name, *args):
    """The driver calls of a plan's turns (turns.py); the executor tests queue no others."""
    assert name in ("cuEventCreate", "cuEventRecord", "cuStreamWaitEvent", "cuEventDestroy"), name
    return "event" if name == "cuEventCreate" else None


@pytest.fixture
def rigged(monkeypatch):
    """Runs ``fn(rank, group)`` on one thread per rank of a fresh World of ``world`` ranks."""
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    monkeypatch.setattr(ops, "_PLANS", {})
    monkeypatch.setattr(call_turns, "_BY_PAD", {})
    monkeypatch.setattr(ops, "_SHORTCUTS", collections.OrderedDict())
    monkeypatch.setattr(ops, "_dtype_name", lambda t: "bfloat16")
    monkeypatch.setattr(ops, "group_of", lambda group: group)
    monkeypatch.setattr(ops, "on_device", lambda device: contextlib.nullcontext())  # the GPU tier runs it
    monkeypatch.setattr(ops.devices, "current_device", lambda: types.SimpleNamespace(sm_count=132))
    monkeypatch.setattr(ops.devices, "framework_stream", lambda framework, ordinal: 1)
    monkeypatch.setattr(ops.driver, "stream_capturing", lambda stream: False)
    monkeypatch.setattr(ops.driver, "call", _events_only)

    def sum_partials(plan, parts, out):  # rank order, as the kernel sums
        out.arr[...] = np.sum([p.arr for p in parts], axis=0)

    monkeypatch.setattr(ops, "sum_partials", sum_partials)
    monkeypatch.setattr(ops, "copy_rows", lambda dst, src, stream: dst.copy_(src))
    monkeypatch.setattr(ops, "_execute", lambda plan, actions, call: ops._run(plan, actions))  # captures: GPU tier
    monkeypatch.setattr(ops, "SymmetricBuffer",
                        types.SimpleNamespace(allocate=lambda shape, dtype, group: Buffer(shape, group)))

    def gemm(a, b, out, debug, trace, scale_a, scale_b):
        out.arr[...] = a.arr @ b.arr.T

    monkeypatch.setattr(ops, "gemm", gemm)

    def run(world, fn):
        w = World(world)
        monkeypatch.setattr(ops, "get_kernel", lambda name, layout, file, debug, trace: Signal(name, w))
        # the driver's stream operations (release builds): the same pads as the kernels
        monkeypatch.setattr(ops, "streamops", types.SimpleNamespace(
            usable=lambda stream, own, peer: True,
            put=lambda stream, where: Signal("signal_put", w).launch(where, 1, grid=1, block=32, stream=stream),
            wait_reset=lambda stream, where: Signal("signal_wait_reset", w).launch(
                where, 1, 0, 0, 0, grid=1, block=32, stream=stream)))
        results, errors = [None] * world, []

        def rank_main(r):
            try:
                results[r] = fn(r, Group(w, r))
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        if errors:
            raise errors[0]
        assert not w.pads.any(), "every signal was consumed"
        return results

    return run


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("m", [64, 37, 3])
def test_all_gather_gemm_executor(rigged, rng, world, m):
    rows = protocol.shard_rows(m, world)
    offsets = np.cumsum([0] + rows)
    full = rng.standard_normal((m, 16))
    b = rng.standard_normal((8, 16))

    def rank(r, group):
        outs = []
        for call in range(3):  # back to back: buffers and signals reused
            shard = T(full[offsets[r]:offsets[r + 1]] * (call + 1))
            outs.append(ops.all_gather_gemm(shard, T(b), group=group, m=m).arr)
        return outs

    for outs in rigged(world, rank):
        for call, out in enumerate(outs):
            np.testing.assert_allclose(out, (full * (call + 1)) @ b.T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("m", [64, 37, 3])
def test_gemm_reduce_scatter_executor(rigged, rng, world, m):
    rows = protocol.shard_rows(m, world)
    offsets = np.cumsum([0] + rows)
    a = [rng.standard_normal((m, 4)) for _ in range(world)]
    b = [rng.standard_normal((8, 4)) for _ in range(world)]
    total = sum(x @ y.T for x, y in zip(a, b))

    def rank(r, group):
        return [ops.gemm_reduce_scatter(T(a[r] * (call + 1)), T(b[r]), group=group).arr
                for call in range(3)]

    for r, outs in enumerate(rigged(world, rank)):
        for call, out in enumerate(outs):
            np.testing.assert_allclose(out, total[offsets[r]:offsets[r + 1]] * (call + 1), rtol=1e-12, atol=1e-12)


def test_release_drops_the_plans_of_a_group(rigged, rng):
    b = rng.standard_normal((8, 16))
    groups = []

    def rank(r, group):
        groups.append(group)
        ops.all_gather_gemm(T(rng.standard_normal((4, 16))), T(b), group=group)
        ops.gemm_reduce_scatter(T(rng.standard_normal((8, 16))), T(b), group=group)

    rigged(2, rank)
    assert len(ops._PLANS) == 4
    assert ops.release(groups[0]) == 2 and len(ops._PLANS) == 2
    assert ops.release() == 2 and not ops._PLANS


def test_repeated_addresses_are_captured_once_then_replayed(monkeypatch):
    """_execute: a call's steps until its addresses came GRAPH_AFTER times, then one capture
    (which runs that call) and replays from then on; the least recently used graph dropped past
    MAX_GRAPHS; the steps under a caller's own capture and where the driver refused the stream
    operations; address sets that never come back (fp8 scales changing every call) counted in
    bounded memory."""
    capturing = [False]
    current = types.SimpleNamespace(cuda_stream=7)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=types.SimpleNamespace(
        current_stream=lambda: current, is_current_stream_capturing=lambda: capturing[0])))
    log = []

    class Graph:
        def __init__(self, key):
            self.key = key

        def replay(self):
            log.append(("replay", self.key))

    def capture(plan, actions, stream):
        assert stream is current
        log.append(("capture", actions["key"]))
        return Graph(actions["key"])

    monkeypatch.setattr(ops, "_run", lambda plan, actions: log.append(("steps", actions["key"])))
    monkeypatch.setattr(ops, "_capture", capture)
    plan = types.SimpleNamespace(stream_ops=True, graphs=collections.OrderedDict(), seen={},
                                 graph_lock=threading.Lock())

    def call(key):
        ops._execute(plan, {"key": key}, (key,))

    for _ in range(4):
        call("a")
    assert log == [("steps", "a"), ("capture", "a"), ("replay", "a"), ("replay", "a")]
    for key in "bcde":
        call(key)
        call(key)
    assert [k[2][0] for k in plan.graphs] == list("bcde"), "a, the least recently used, was dropped"
    log.clear()
    call("a")
    call("b")
    capturing[0] = True  # the caller captures: the steps go into its graph
    call("b")
    capturing[0] = False
    plan.stream_ops = False  # refused: no capture, no replay
    call("b")
    assert log == [("steps", "a"), ("replay", "b"), ("steps", "b"), ("steps", "b")]
    plan.stream_ops = True
    log.clear()
    call("x")
    for i in range(ops.MAX_SEEN - 1):
        call(i)
    call("x")  # counted MAX_SEEN - 1 calls ago: still known
    assert log[-1] == ("capture", "x")
    for i in range(1000):
        call(("fresh", i))
    assert len(plan.seen) <= ops.MAX_SEEN
    log.clear()
    monkeypatch.setattr(ops, "_capture", lambda plan, actions, stream: log.append(("capture", actions["key"])))
    for _ in range(4):  # the capture fails (returns None): that call ran; later ones take the steps
        call("y")
    assert log == [("steps", "y"), ("capture", "y"), ("steps", "y"), ("steps", "y")]
    log.clear()
    for _ in range(3):  # no signature (an unhashable argument): never captured
        ops._execute(plan, {"key": "z"}, None)
    assert log == [("steps", "z")] * 3


def test_a_pad_without_a_spare_slot_is_refused(rigged, monkeypatch):
    init = Buffer.__init__

    def protocol_slots_only(self, shape, group):
        init(self, shape, group)
        self.pad = T(self.w.pads[self.rank][:protocol.pad_slots(2)])

    monkeypatch.setattr(Buffer, "__init__", protocol_slots_only)
    with pytest.raises(ops.TmaflowError, match=r"world_size=2 needs 5 signal slots \(the protocol's 4 and a spare "
                                               r"for the stream operations' probe\); the pad has 4"):
        rigged(2, lambda r, group: ops.all_gather_gemm(T(np.ones((4, 16))), T(np.ones((8, 16))), group=group))


def test_a_failed_capture_still_orders_the_callers_stream_after_the_call(monkeypatch, caplog):
    """_capture runs the call on the side stream, then captures it: where the capture raises,
    the caller's stream still waits for the side stream (the next call would otherwise race
    the call's GEMMs and sum), and the failure is a warning: the call ran."""
    waits, runs = [], []

    class Stream:
        def __init__(self, name):
            self.name = name

        def wait_stream(self, other):
            waits.append((self.name, other.name))

    class Graph:
        def capture_begin(self, capture_error_mode):
            raise RuntimeError("capture refused")

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=types.SimpleNamespace(
        stream=lambda s: contextlib.nullcontext(), CUDAGraph=Graph)))
    monkeypatch.setattr(ops, "_run", lambda plan, actions, stream_ops=None: runs.append(stream_ops))
    plan = types.SimpleNamespace(side=Stream("side"), kind="all_gather_gemm")
    assert ops._capture(plan, {}, Stream("caller")) is None  # the call ran; no graph
    assert runs == [False] and waits == [("side", "caller"), ("caller", "side")]
    assert "all_gather_gemm: capturing a repeated call failed (capture refused)" in caplog.text


class Tensor:
    """What a repeated call's signature reads of a torch tensor."""
    dtype = "bfloat16"
    device = Device("cuda", 0)

    def __init__(self, address, shape):
        self.address, self.shape = address, tuple(shape)

    def data_ptr(self):
        return self.address

    def stride(self):
        return (self.shape[1], 1)

    def is_contiguous(self):
        return True


def test_a_repeated_call_replays_its_capture_without_the_checks(monkeypatch):
    """all_gather_gemm / gemm_reduce_scatter: once a checked call with the same group,
    options, tensors (address, shape, strides, dtype, device), stream and thread was captured,
    the call replays it without the checks and planning (their host time bounded the small
    shapes); anything else takes the checked path: another output, a moved operand, another
    stream, another thread (a dead one's ident too), the caller capturing, a released group or
    plan, a debug call, another value of m at the same address, an unhashable argument."""
    capturing, stream, checked, allocated, address = [False], [7], [], [], [0xE000]

    def empty(shape, dtype, device):
        allocated.append(shape)
        return Tensor(address[0], shape)

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(bfloat16="bfloat16", empty=empty))
    monkeypatch.setattr(ops.driver, "stream_capturing", lambda handle: capturing[0] and handle == stream[0])
    monkeypatch.setattr(ops.driver, "call", _events_only)
    monkeypatch.setattr(ops, "_SHORTCUTS", collections.OrderedDict())
    monkeypatch.setattr(ops, "_PLANS", {})
    monkeypatch.setattr(ops, "group_of", lambda group: group)
    monkeypatch.setattr(ops, "on_device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(ops, "_dtype_name", lambda t: "bfloat16")
    monkeypatch.setattr(ops.devices, "framework_stream", lambda framework, ordinal: stream[0])

    class Graph:
        def replay(self):
            checked.append("replay")

    def plan(kind, shapes, group, device, debug, trace=False):
        key = (kind, group, shapes, debug)
        return ops._PLANS.setdefault(key, types.SimpleNamespace(
            stream_ops=not debug, graphs=collections.OrderedDict(), graph_lock=threading.Lock(),
            rank=group.rank(), released=False, buffer=types.SimpleNamespace(tensor=None, close=lambda: None),
            turns=call_turns.Turns(), pad=(group.rank(), 0),
            out_shape=(shapes.m, shapes.n) if kind == "all_gather_gemm" else (shapes.rows[group.rank()], shapes.n)))

    def execute(plan, actions, call):  # the checked path: captured at once
        checked.append("checked")
        plan.graphs[(stream[0], ops._thread_token(), call)] = Graph()

    monkeypatch.setattr(ops, "_plan", plan)
    monkeypatch.setattr(ops, "_execute", execute)
    group, other = Group(World(2), 0), Group(World(2), 0)
    a, b, out = Tensor(0xA000, (4, 16)), Tensor(0xB000, (8, 16)), Tensor(0xC000, (8, 8))

    def calls(*runs):
        checked.clear()
        for run in runs:
            run()
        return checked[:]

    def gather(**kw):
        return ops.all_gather_gemm(kw.pop("a", a), b, group=kw.pop("group", group), **kw)

    assert calls(lambda: gather(out=out), lambda: gather(out=out)) == ["checked", "replay"]
    assert gather(out=out) is out
    assert calls(lambda: gather()) == ["checked"]  # another output: the allocated one
    assert calls(lambda: gather()).count("replay") == 1 and gather().address == 0xE000
    allocated.clear()
    address[0] = 0xE100  # the caller keeps the last output: the allocator hands out another block
    assert calls(lambda: gather()) == ["checked"] and len(allocated) == 1  # that one, checked
    address[0] = 0xE000
    assert calls(lambda: gather(a=Tensor(0xA100, (4, 16))), lambda: gather(out=out, group=other),
                 lambda: gather(out=out, debug=True), lambda: gather(out=out, debug=True)) == ["checked"] * 4
    stream[0] = 9
    assert calls(lambda: gather(out=out), lambda: gather(out=out)) == ["checked", "replay"]
    capturing[0] = True  # the caller's capture: the steps go into it
    assert calls(lambda: gather(out=out)) == ["checked"]
    capturing[0] = False
    scatter_out = Tensor(0xD000, (4, 8))
    reduce = lambda: ops.gemm_reduce_scatter(Tensor(0xA000, (8, 16)), b, group=group, out=scatter_out)  # noqa: E731
    assert calls(reduce, reduce, reduce) == ["checked", "replay", "replay"]
    ops.release(group)
    assert [s[1] for s in ops._SHORTCUTS] == [other]
    assert calls(lambda: gather(out=out), reduce) == ["checked", "checked"]

    def in_thread(*runs):
        t = threading.Thread(target=lambda: [run() for run in runs])
        t.start()
        t.join()

    twice = (lambda: gather(out=out), lambda: gather(out=out))
    assert calls(lambda: in_thread(*twice), lambda: in_thread(*twice)) == ["checked", "replay"] * 2

    class Scalar(Tensor):  # a 0-d integer tensor: m is read by value, not by address
        def __init__(self, value):
            super().__init__(0x5000, ())
            self.value = value

        def __index__(self):
            return self.value

        def stride(self):
            return ()

    # rank 0's shard of 7 rows over 2 ranks has 4 rows, as of 8: only the checks see that the
    # 8-row output is wrong for m=7 (a replay would fill 8 rows)
    assert calls(lambda: gather(out=out, m=Scalar(8)), lambda: gather(out=out, m=Scalar(8))) == ["checked", "replay"]
    with pytest.raises(ops.TmaflowError, match=r"out must be a contiguous \(7, 8\) bfloat16 tensor"):
        gather(out=out, m=Scalar(7))
    with pytest.raises(ops.TmaflowError, match=r"m=8.0 must be an int >= 0 \(got float\)"):
        gather(out=out, m=8.0)  # hashes as 8, which replays: the checks still refuse it
    dead = types.SimpleNamespace(stream_ops=True, released=True)  # released while its call ran
    ops._remember(("late",), dead)
    assert ("late",) not in ops._SHORTCUTS
    ops._SHORTCUTS[("stale",)] = dead
    assert ops._replayed(("stale",), a, None) == (False, None)
    with pytest.raises(ops.TmaflowError, match=r"m=\[8\] must be an int >= 0 \(got list\)"):
        gather(out=out, m=[8])
    for i in range(ops.MAX_SHORTCUTS + 10):  # signatures that never come back stay bounded
        gather(a=Tensor(0x10000 + 16 * i, (4, 16)))
    assert len(ops._SHORTCUTS) == ops.MAX_SHORTCUTS


def test_calls_of_a_plan_take_turns_across_streams(monkeypatch):
    """turns.Turns: a call on another stream than the previous call's first waits for the
    event recorded at that call's end (else its GEMMs overwrite the partial or staging the
    previous call still reads); a call on the same stream queues no wait; a call inside the
    caller's capture neither waits nor records; a call that raises still records what it
    queued; close destroys the event."""
    log, capturing = [], set()
    monkeypatch.setattr(ops.driver, "stream_capturing", lambda stream: stream in capturing)
    monkeypatch.setattr(ops.driver, "call", lambda name, *args: log.append((name, *args)) or
                        ("event" if name == "cuEventCreate" else None))
    turns = call_turns.Turns()

    def queue(stream, fail=False):
        log.clear()
        with turns.turn(stream):
            log.append(("queued on", stream))
            if fail:
                raise ops.TmaflowError("a GEMM refused its operands")
        return log[:]

    no_timing = ops.driver.cu().CUevent_flags.CU_EVENT_DISABLE_TIMING
    assert queue(7) == [("queued on", 7), ("cuEventCreate", no_timing), ("cuEventRecord", "event", 7)]
    assert queue(7) == [("queued on", 7), ("cuEventRecord", "event", 7)]
    assert queue(9) == [("cuStreamWaitEvent", 9, "event", 0), ("queued on", 9), ("cuEventRecord", "event", 9)]
    capturing.add(5)
    assert queue(5) == [("queued on", 5)]
    assert turns.last == 9, "a captured call is not the latest eager one"
    with pytest.raises(ops.TmaflowError, match="a GEMM refused its operands"):
        queue(7, fail=True)
    assert log == [("cuStreamWaitEvent", 7, "event", 0), ("queued on", 7), ("cuEventRecord", "event", 7)]
    assert queue(9)[0] == ("cuStreamWaitEvent", 9, "event", 0)
    assert queue(5)[0] == ("queued on", 5), "the caller's capture: no turn"
    log.clear()
    with turns.turn(5, capturing=False):  # the caller asked already: not capturing
        pass
    assert log == [("cuStreamWaitEvent", 5, "event", 0), ("cuEventRecord", "event", 5)]
    log.clear()
    turns.close()
    assert log == [("cuEventDestroy", "event")] and turns.event is None and turns.last is None

    def refuse(name, *args):  # a faulted context refuses every call: release still goes on
        raise ops.TmaflowError("the context faulted")

    turns.event = "event"
    monkeypatch.setattr(ops.driver, "call", refuse)
    turns.close()
    assert turns.event is None


def test_plans_sharing_a_signal_pad_share_their_turns(rigged, monkeypatch):
    """Newer torch carves symmetric tensors out of one allocation with one signal pad: two plans
    there (an all-gather and a reduce-scatter, say) must not have calls in flight at once on
    two streams (they would take each other's signals), so they get one Turns; a plan with a
    pad of its own gets its own; the turns close when the last plan using them is released."""
    monkeypatch.setattr(call_turns, "_BY_PAD", {})
    closed = []
    monkeypatch.setattr(call_turns.Turns, "close", lambda self: closed.append(self))
    groups = []

    def rank(r, group):
        groups.append(group)
        ops.all_gather_gemm(T(np.ones((4, 16))), T(np.ones((8, 16))), group=group)
        ops.gemm_reduce_scatter(T(np.ones((8, 16))), T(np.ones((8, 16))), group=group)

    rigged(1, rank)  # the fake buffers of one rank signal through one pad
    plans = list(ops._PLANS.values())
    assert len(plans) == 2 and plans[0].turns is plans[1].turns and plans[0].turns.users == 2
    alone = call_turns.of_pad(("another pad", 0))
    assert alone is not plans[0].turns
    assert ops.release(groups[0]) == 2 and closed == [plans[0].turns] and not ops._PLANS
    call_turns.release(("another pad", 0), alone)
    assert closed == [plans[0].turns, alone] and not call_turns._BY_PAD
