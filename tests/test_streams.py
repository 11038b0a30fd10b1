"""Streams resolved once per call (no GPU): ``stream=None`` becomes torch's or cupy's current
stream (fake framework modules: the rule, not the libraries, is under test), a capturing
tf.Graph's stream, or the legacy stream; prepared states and split-K workspaces belong to the
resolved handle; hostile stream and device values are refused by name."""
import itertools
import inspect
import re
import sys
import threading
import types

import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.runtime.device import StreamHandle, stream_handle
from tmaflow.dtypes import as_dtype
from tmaflow.runtime.graph import ACTIVE
from tmaflow.kernels import attention_entry, attention_varlen_entry, entry, examples
from tmaflow.kernels.matmul import dense, grouped, splitk
from tmaflow.launch.config import LaunchConfig, resolve_stream
from tmaflow.runtime.memory import DeviceArray, _contiguous_strides
from tmaflow.launch.params import Param

from test_launch import TABLE, fake_launcher


_next_address = itertools.count(1)


def view(shape, dtype="bfloat16", origin="torch", ptr=None):
    """A fake device array; each gets its own 1 GiB-aligned range (entry points refuse aliasing)."""
    dt = as_dtype(dtype)
    shape = tuple(shape)
    ptr = next(_next_address) << 30 if ptr is None else ptr
    return DeviceArray._view(ptr, shape, dt, _contiguous_strides(shape, dt.itemsize), None, None, origin)


@pytest.fixture
def current(monkeypatch):
    """Fake torch and cupy modules whose current streams the test sets: ``current["torch"]``
    is torch's handle on device 0 (device d adds d), ``current["cupy"]`` cupy's."""
    now = {"torch": 0x7000, "cupy": 0x9000}
    fake_torch = types.SimpleNamespace(_C=types.SimpleNamespace(
        _cuda_getCurrentRawStream=lambda ordinal: now["torch"] + ordinal))
    fake_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(
        get_current_stream=lambda: types.SimpleNamespace(ptr=now["cupy"])))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    return now


# --- the resolution ------------------------------------------------------------------------------

def test_none_follows_the_arrays_framework(current):
    t, c, f = view((8, 8)), view((8, 8), origin="cupy"), view((8, 8), origin=None)
    assert resolve_stream(None, (t,), 0) == 0x7000 and resolve_stream(None, (f, t), 3) == 0x7003
    assert resolve_stream(None, (c, f), 0) == 0x9000
    assert resolve_stream(None, (c, t), 0) == 0x7000  # torch first, as the launch path does
    assert resolve_stream(None, (f, None), 0) == 0  # tmaflow arrays (and an out not given)
    current["torch"] = 0x8000
    assert resolve_stream(None, (t,), 0) == 0x8000  # asked at every call, never cached


def test_explicit_streams_win_and_keep_their_object(current):
    class CoreStream:
        def __cuda_stream__(self):
            return (0, 0x1234)

    s = CoreStream()
    got = resolve_stream(s, (view((8, 8)),), 0)
    assert got == 0x1234 and type(got) is StreamHandle and got.owner is s
    assert {got: 1}[0x1234] == 1  # a cache key equal to the plain handle
    assert resolve_stream(5, (view((8, 8)),), 0) == 5 and resolve_stream(np.uint64(2**64 - 1), (), 0) == 2**64 - 1
    assert stream_handle(got) is got  # resolved once: passed on as it is


def test_a_capturing_graph_takes_none_launches_of_its_thread(current):
    graph = types.SimpleNamespace(_thread=threading.get_ident(), stream=types.SimpleNamespace(handle=0xABC))
    other = types.SimpleNamespace(_thread=-1, stream=types.SimpleNamespace(handle=0xDEF))
    ACTIVE.extend([other, graph])
    try:
        assert resolve_stream(None, (view((8, 8)),), 0) == 0xABC
        assert resolve_stream(7, (view((8, 8)),), 0) == 7  # an explicit stream runs eagerly
    finally:
        ACTIVE.remove(other), ACTIVE.remove(graph)
    assert resolve_stream(None, (view((8, 8)),), 0) == 0x7000


def test_a_launcher_bound_with_none_follows_the_current_stream(current):
    run = fake_launcher(TABLE, stream=None)
    assert run.stream_for({"torch"}) == 0x7000
    current["torch"] = 0x7100
    assert run.stream_for({"torch", "cupy"}) == 0x7100 and run.stream_for({None}) == 0


# --- states and workspaces per resolved stream ---------------------------------------------------

class Recorder:
    """Stands for a launcher: records each launch with the stream its state was built for."""

    def __init__(self, stream, calls):
        self.stream, self.calls = stream, calls

    def __call__(self, *args):
        self.calls.append(self.stream)


class Template:
    def bind(self, arr):
        return arr


@pytest.fixture
def fake_states(monkeypatch):
    """Every entry point's state builder replaced by one that records the stream it was given
    (the real builders compile and need a GPU); ``built`` lists them, ``calls`` the launches."""
    built, calls = [], []
    entry.STATES.clear()
    splitk._workspaces.__dict__.clear()
    monkeypatch.setattr(splitk.driver, "stream_capturing", lambda stream: False)  # eager calls (no driver here)

    def fake(real):
        signature = inspect.signature(real)

        def build(*args, **kwargs):
            stream = signature.bind(*args, **kwargs).arguments["stream"]
            launcher, ws = splitk._with_split_k(Recorder(stream, calls), True,
                                                types.SimpleNamespace(ordinal=0), stream)
            built.append((stream, ws))
            t = Template()
            return types.SimpleNamespace(launcher=launcher, ta=t, tb=t, tc=t, tq=t, tk=t, tv=t,
                                         src=t, dst=t, extra=(), flat=False, tail=(), ts=None, tr=None,
                                         workspace=None, split=1, slots=types.SimpleNamespace(array=0))
        return build

    for module, name in ((dense, "_gemm_state"), (grouped, "_grouped_state"), (examples, "_softmax_state"),
                         (examples, "_copy_state"), (examples, "_transpose_state"), (attention_entry, "_state"),
                         (attention_varlen_entry, "_state")):
        monkeypatch.setattr(module, name, fake(getattr(module, name)))
    yield built, calls
    entry.STATES.clear()
    splitk._workspaces.__dict__.clear()


CALLS = {
    "gemm": lambda: kernels.gemm(view((256, 4096)), view((512, 4096)), view((256, 512)),
                                 config=kernels.GemmConfig(split_k=8)),
    "grouped_gemm": lambda: kernels.grouped_gemm(view((256, 512)), view((2, 128, 512)), view((3,), "int32"),
                                                 view((256, 128))),
    "softmax": lambda: kernels.softmax(view((64, 512), "float32"), view((64, 512), "float32")),
    "copy": lambda: kernels.copy(view((64, 512), "float32"), view((64, 512), "float32")),
    "attention": lambda: kernels.attention(*(view((1, 2, 128, 64)),) * 3, view((1, 2, 128, 64))),
    "attention_varlen": lambda: kernels.attention_varlen(view((700, 4, 64)), view((700, 2, 64)), view((700, 2, 64)),
                                                         view((4,), "int32"), view((4,), "int32"), 512, 512,
                                                         view((700, 4, 64))),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_two_current_streams_get_two_states(fake_states, current, name):
    built, calls = fake_states
    call = CALLS[name]
    call()
    current["torch"] = 0x8000
    call()
    call()
    current["torch"] = 0x7000
    call()
    assert [s for s, _ in built] == [0x7000, 0x8000]  # one state per stream, each built once
    assert calls == [0x7000, 0x8000, 0x8000, 0x7000]  # every launch used its own stream's state
    (_, ws_a), (_, ws_b) = built
    assert ws_a is not ws_b and (ws_a.stream, ws_b.stream) == (0x7000, 0x8000)


def test_an_explicit_stream_shares_the_state_of_the_same_handle(fake_states, current):
    built, calls = fake_states
    CALLS["gemm"]()
    kernels.gemm(view((256, 4096)), view((512, 4096)), view((256, 512)),
                 config=kernels.GemmConfig(split_k=8), stream=0x7000)
    assert len(built) == 1 and calls == [0x7000, 0x7000]


def test_a_prepared_launch_stays_on_the_stream_it_was_prepared_for(fake_states, current):
    _, calls = fake_states
    prepared = kernels.softmax.prepare(view((64, 512), "float32"), view((64, 512), "float32"))
    current["torch"] = 0x8000
    prepared()
    assert calls == [0x7000]


def test_workspaces_are_per_thread_and_per_stream():
    splitk._workspaces.__dict__.clear()
    dev = types.SimpleNamespace(ordinal=0)
    a = splitk._workspace(dev, 0x10)
    assert splitk._workspace(dev, 0x10) is a and splitk._workspace(dev, 0x20) is not a
    other = []
    thread = threading.Thread(target=lambda: other.append(splitk._workspace(dev, 0x10)))
    thread.start(), thread.join()
    assert other[0] is not a and other[0].stream == 0x10
    splitk._workspaces.__dict__.clear()


def test_debug_and_trace_launches_of_a_module_go_one_at_a_time():
    run = fake_launcher([Param(0, 0, 4, "int", True)])
    run.module.instrumented = threading.Lock()
    held = []
    run._watch = types.SimpleNamespace(arm=lambda: held.append(run.module.instrumented.locked()),
                                       check=lambda *a, **k: held.append(run.module.instrumented.locked()))
    run(7)
    assert held == [True, True] and not run.module.instrumented.locked()


# --- hostile streams -------------------------------------------------------------------------------

class Proto:
    def __init__(self, result):
        self.result = result

    def __cuda_stream__(self):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


class Attr:
    @property
    def cuda_stream(self):
        raise RuntimeError("no device")


HOSTILE = [
    (-1, r"stream=-1: a stream handle is an int in \[0, 2\^64 - 1\]"),
    (2**64, r"stream=18446744073709551616: a stream handle is an int in \[0, 2\^64 - 1\]"),
    (-2**70, r"stream=-1180591620717411303424: a stream handle is an int"),
    (np.int64(-5), re.escape(f"stream={np.int64(-5)!r}: a stream handle is an int in [0, 2^64 - 1]")),
    (1.0, r"stream=1.0 \(float\) is not a stream"),
    (float("nan"), r"stream=nan \(float\) is not a stream"),
    (np.float32(3), re.escape(f"stream={np.float32(3)!r} (float32) is not a stream")),
    (True, r"stream=True \(bool\) is not a stream"),
    (False, r"stream=False \(bool\) is not a stream"),
    (np.bool_(True), re.escape(f"stream={np.bool_(True)!r} ({type(np.bool_(True)).__name__}) is not a stream")),
    ("0", r"stream='0' \(str\) is not a stream"),
    (b"0", r"stream=b'0' \(bytes\) is not a stream"),
    (object(), r"stream=<object.*\(object\) is not a stream"),
    ([0], r"stream=\[0\] \(list\) is not a stream"),
    (Proto(RuntimeError("boom")), r"__cuda_stream__ raised RuntimeError\('boom'\); it must return \(0, handle\)"),
    (Proto([0, 5]), r"__cuda_stream__ returned \[0, 5\]; the protocol \(version 0\) is a tuple \(0, handle\)"),
    (Proto((0,)), r"__cuda_stream__ returned \(0,\); the protocol"),
    (Proto((0, 5, 6)), r"__cuda_stream__ returned \(0, 5, 6\); the protocol"),
    (Proto((1, 5)), r"__cuda_stream__ returned \(1, 5\); the protocol \(version 0\)"),
    (Proto(("0", 5)), r"__cuda_stream__ returned \('0', 5\); the protocol"),
    (Proto((0, "5")), r"its __cuda_stream__ handle is '5' \(str\); a stream handle is an int"),
    (Proto((0, 5.0)), r"its __cuda_stream__ handle is 5.0 \(float\); a stream handle is an int"),
    (Proto((0, True)), r"its __cuda_stream__ handle is True \(bool\); a stream handle is an int"),
    (Proto((0, -1)), r"its __cuda_stream__ handle is -1: a stream handle is an int in \[0, 2\^64 - 1\]"),
    (Proto((0, 2**64)), r"its __cuda_stream__ handle is 18446744073709551616: a stream handle"),
    (Proto(None), r"__cuda_stream__ returned None; the protocol"),
    (Attr(), r"reading .cuda_stream raised RuntimeError\('no device'\)"),
    (types.SimpleNamespace(ptr=1.5), r"\.ptr is 1.5 \(float\); a stream handle is an int"),
    (types.SimpleNamespace(cuda_stream=-3), r"\.cuda_stream is -3: a stream handle is an int"),
]


@pytest.mark.parametrize("value,msg", HOSTILE, ids=[f"h{i}" for i in range(len(HOSTILE))])
def test_hostile_streams_are_refused_everywhere(current, value, msg):
    for refuse in (lambda: stream_handle(value),
                   lambda: LaunchConfig(1, 32, stream=value),
                   lambda: resolve_stream(value, (view((8, 8)),), 0),
                   lambda: kernels.softmax(view((64, 512), "float32"), stream=value),
                   lambda: kernels.gemm(view((256, 512)), view((256, 512)), stream=value),
                   lambda: tf.Kernel('extern "C" __global__ void k() {}', "k").launch(grid=1, block=32,
                                                                                   stream=value)):
        with pytest.raises(tf.LaunchError, match=msg):
            refuse()


def test_a_float_or_bool_never_reaches_the_launcher_of_an_equal_int():
    """1.0 == 1 == True as dict keys: the launcher cached for stream=1 must not take them."""
    k = tf.Kernel('extern "C" __global__ void k() {}', "k")
    calls = []

    class Cached:
        generation, module = 0, types.SimpleNamespace(device=types.SimpleNamespace(generation=0))

        def __call__(self, *args):
            calls.append(args)

    cached = Cached()
    k._launchers[(1, 32, (1, 1, 1), None, 1, False, 0, threading.get_ident())] = cached
    k.launch(grid=1, block=32, stream=1)
    assert calls == [()]
    for value in (True, 1.0, np.float64(1)):
        with pytest.raises(tf.LaunchError, match="is not a stream"):
            k.launch(grid=1, block=32, stream=value)
    assert calls == [()]


def test_valid_stream_spellings_are_accepted():
    assert stream_handle(None) == 0 and stream_handle(0) == 0 and stream_handle(2**64 - 1) == 2**64 - 1
    assert stream_handle(np.uint64(7)) == 7 and type(stream_handle(np.int32(7))) is int
    assert stream_handle(Proto((0, 0x55))) == 0x55 and stream_handle(Proto((np.int64(0), np.uint64(9)))) == 9
    torch_like = types.SimpleNamespace(cuda_stream=0x66)
    got = stream_handle(torch_like)
    assert got == 0x66 and got.owner is torch_like and stream_handle(types.SimpleNamespace(ptr=0x77)) == 0x77


def test_a_closed_tf_stream_is_refused():
    s = tf.Stream.__new__(tf.Stream)
    s._handle, s.handle, s.device = None, 0x99, types.SimpleNamespace(ordinal=0)
    with pytest.raises(tf.LaunchError, match=r"was closed; create a new tf.Stream\(\)"):
        stream_handle(s)


# --- hostile devices ---------------------------------------------------------------------------------

HOSTILE_DEVICES = [("cuda:0", "str"), (1.0, "float"), (True, "bool"), (np.float32(0), "float32"),
                   ([0], "list"), (None.__class__, "type")]


@pytest.mark.parametrize("value,kind", HOSTILE_DEVICES)
def test_hostile_devices_are_refused_before_the_driver(value, kind):
    for refuse in (lambda: tf.empty((4,), "float32", device=value),
                   lambda: tf.zeros((4,), device=value),
                   lambda: tf.from_numpy(np.zeros(4, np.float32), device=value)):
        with pytest.raises(tf.TmaflowError, match=re.escape(
                f"device={value!r} must be None, a tf.Device or a device ordinal (int; got {kind})")):
            refuse()
    if kind != "type":
        for refuse in (lambda: tf.Device(value), lambda: tf.set_device(value)):
            with pytest.raises(tf.TmaflowError, match=rf"Device\(ordinal=.*\): must be an int \(a device ordinal; got {kind}\)"):
                refuse()


@pytest.fixture
def two_devices(monkeypatch):
    """A driver that reports two devices (and is never asked anything else)."""
    def call(name, *args, **kwargs):
        if name == "cuDeviceGetCount":
            return 2
        raise AssertionError(f"unexpected driver call {name}")

    monkeypatch.setattr(tf.runtime.driver, "init", lambda: None)
    monkeypatch.setattr(tf.runtime.driver, "call", call)


@pytest.mark.parametrize("ordinal", [2, 7, -1, 2**70, np.int64(5)])
def test_out_of_range_ordinals_are_refused(two_devices, ordinal):
    want = rf"Device\(ordinal={int(ordinal)}\): must be an int in \[0, 1\]"
    for refuse in (lambda: tf.Device(ordinal), lambda: tf.set_device(ordinal)):
        with pytest.raises(tf.TmaflowError, match=want):
            refuse()
    for refuse in (lambda: tf.empty((4,), device=ordinal), lambda: tf.zeros(4, device=ordinal),
                   lambda: tf.from_numpy(np.zeros(4, np.float32), device=ordinal)):
        with pytest.raises(tf.TmaflowError, match=re.escape(f"device={ordinal!r}: ") + want):
            refuse()


def test_captured_split_k_calls_get_scratch_of_their_own(monkeypatch):
    """splitk._split_k_buffers: an eager call takes its stream's workspace; a captured call of
    torch arrays (or any call in a tf.Graph capture) partials from the capture's scratch and
    counters taken for it alone; a captured call of other arrays, or one no counters could be
    taken for, the workspace, kept for the process (the graph may replay after it is replaced)."""
    capturing, kept, taken = [False], [], [0xC000]
    ws = types.SimpleNamespace(stream=0x10, device="dev", views=lambda counters, floats: ("counters", "partials"),
                               keep=lambda: kept.append(1))
    st = types.SimpleNamespace(workspace=ws, workspace_sizes=(64, 1000))
    monkeypatch.setattr(splitk.driver, "stream_capturing", lambda stream: capturing[0] and stream == 0x10)
    monkeypatch.setattr(splitk.tile_counters, "take", lambda device, words: taken[0] if words == 64 else None)
    monkeypatch.setattr(splitk, "scratch", lambda like, like_arr, shape, dtype, stream: ("scratch", shape, dtype.name,
                                                                                        stream))
    torch_arr, other = types.SimpleNamespace(_origin="torch"), types.SimpleNamespace(_origin="cupy")
    assert splitk._split_k_buffers(st, "a", torch_arr) == ("partials", "counters") and not kept
    capturing[0] = True
    assert splitk._split_k_buffers(st, "a", torch_arr) == (("scratch", (1000,), "float32", 0x10), 0xC000)
    assert not kept
    assert splitk._split_k_buffers(st, "a", other) == ("partials", "counters") and kept == [1]
    taken[0] = None
    assert splitk._split_k_buffers(st, "a", torch_arr) == ("partials", "counters") and kept == [1, 1]
    assert splitk._split_k_buffers(types.SimpleNamespace(workspace=None), "a", torch_arr) == (0, 0)
    assert splitk._split_k_buffers(st, "a", torch_arr, captured=None) == ("partials", "counters")  # asked already
    # a tf.Graph capturing on the call's stream owns the scratch of any arrays; a launch on
    # another stream inside its capture runs eagerly (the driver is asked about that stream)
    taken[0], capturing[0] = 0xC000, False
    graph = types.SimpleNamespace(stream=types.SimpleNamespace(handle=0x10))
    monkeypatch.setattr(splitk, "CAPTURING", [graph])
    monkeypatch.setattr(splitk, "capturing", lambda: graph)
    assert splitk._split_k_buffers(st, "a", other) == (("scratch", (1000,), "float32", 0x10), 0xC000)
    graph.stream.handle = 0x20
    assert splitk._split_k_buffers(st, "a", other) == ("partials", "counters") and kept == [1, 1]
    monkeypatch.setattr(splitk, "CAPTURING", [])
    capturing[0] = True
    with splitk.serial_capture():  # the collectives' own captures: replays one at a time
        assert splitk._split_k_buffers(st, "a", torch_arr) == ("partials", "counters") and kept == [1, 1, 1]
    assert splitk._split_k_buffers(st, "a", torch_arr) == (("scratch", (1000,), "float32", 0x10), 0xC000)


def test_captured_counters_are_handed_out_once(monkeypatch):
    """tile_counters.take: a bump pointer over zeroed chunks (nothing handed out twice), a pair
    where the last ended, a larger take on a 128-byte line of its own, a new chunk when the
    current one cannot hold a take, None where none can be made."""
    from tmaflow.kernels import tile_counters

    made = []

    def add(self, device, words):
        base = 0x100000 * (len(made) + 1)
        made.append(words)
        self.chunks.append(types.SimpleNamespace(alive=True))
        self.next, self.end = base, base + 4 * words

    monkeypatch.setattr(tile_counters._Slab, "add", add)
    monkeypatch.setattr(tile_counters, "_slabs", {})
    dev = types.SimpleNamespace(ordinal=0)
    assert tile_counters.take(dev) == 0x100000 and tile_counters.take(dev) == 0x100008
    assert tile_counters.take(dev, 100) == 0x100080  # the next 128-byte line
    assert tile_counters.take(dev) == 0x100080 + 400
    assert tile_counters.untaken(dev) == (4 * tile_counters.CHUNK - 408 - 0x80) // 8
    big = tile_counters.CHUNK + 1
    assert tile_counters.take(dev, big) == 0x200000 and made == [tile_counters.CHUNK, big + tile_counters.LINE]

    def refused(self, device, words):
        raise tile_counters.TmaflowError("out of device memory")

    monkeypatch.setattr(tile_counters._Slab, "add", refused)
    assert tile_counters.take(dev, 2 * tile_counters.CHUNK) is None


def test_a_counter_chunk_restores_the_capture_mode_even_when_it_fails(monkeypatch):
    """tile_counters._Slab.add relaxes this thread's capture mode for its allocation, zeroing and
    synchronisation (legal inside another library's global-mode capture), and puts the previous
    mode back whether or not the allocation succeeds."""
    from tmaflow.kernels import tile_counters

    calls = []

    def call(name, *args):
        calls.append((name, *args))
        return "the previous mode" if name == "cuThreadExchangeStreamCaptureMode" else None

    monkeypatch.setattr(tile_counters.driver, "call", call)
    stream = types.SimpleNamespace(handle=0x5, synchronize=lambda: None)
    monkeypatch.setattr(tile_counters, "Stream", lambda device: stream)

    def refused(nbytes, device, stream):
        raise tile_counters.TmaflowError("out of device memory")

    monkeypatch.setattr(tile_counters, "unowned_block", refused)
    slab = tile_counters._Slab()
    with pytest.raises(tile_counters.TmaflowError, match="out of device memory"):
        slab.add(types.SimpleNamespace(ordinal=0), 64)
    relaxed = tile_counters.driver.cu().CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    assert calls == [("cuThreadExchangeStreamCaptureMode", relaxed),
                     ("cuThreadExchangeStreamCaptureMode", "the previous mode")]
    assert not slab.chunks and slab.next == slab.end == 0
    calls.clear()
    monkeypatch.setattr(tile_counters, "unowned_block", lambda nbytes, device, stream: types.SimpleNamespace(
        ptr=0x9000, nbytes=nbytes))
    slab.add(types.SimpleNamespace(ordinal=0), 64)
    assert [c[0] for c in calls] == ["cuThreadExchangeStreamCaptureMode", "cuMemsetD32Async",
                                     "cuThreadExchangeStreamCaptureMode"]
    assert calls[1] == ("cuMemsetD32Async", 0x9000, 0, 64, 0x5) and (slab.next, slab.end) == (0x9000, 0x9000 + 256)


def fake_pool():
    from tmaflow.runtime import pool as pools

    pool = object.__new__(pools.MemoryPool)
    pool._cache, pool._order, pool._owners, pool._lock = {}, pools.OrderedDict(), {}, pools.threading.RLock()
    pool.cached_bytes, pool.budget, pool.handle = 0, 1 << 20, 0
    pool.device = types.SimpleNamespace(context=1)
    pool.device.activate = lambda: pool.device
    return pool


def test_per_thread_default_stream_blocks_stay_with_their_thread(monkeypatch):
    """Handle 2 is another stream in each thread: a block freed there is handed out again only
    to the allocating thread (in its stream's order), and goes back to the driver on the
    legacy stream, which waits for every blocking stream, from whichever thread frees it."""
    from tmaflow.runtime import pool as pools

    calls, fresh = [], iter(range(0x1000, 0x100000, 0x1000))

    class Driver:
        CUresult = types.SimpleNamespace(CUDA_ERROR_OUT_OF_MEMORY=2)

        def cuMemAllocFromPoolAsync(self, size, handle, stream):
            calls.append(("alloc", stream))
            return 0, next(fresh)

        def cuMemFreeAsync(self, ptr, stream):
            calls.append(("free", ptr, stream))
            return (0,)

        def cuCtxGetCurrent(self):
            return 0, 1

    monkeypatch.setattr(pools.driver, "cu", Driver)
    monkeypatch.setattr(pools.driver, "check", lambda name, result: None)
    pool = fake_pool()

    main = pools.thread_token()
    mine, kept = pool.allocate(512, 2), pool.allocate(512, 2)
    pool.release(mine, 512, 2)
    pool.release(pool.allocate(512, 7), 512, 7)     # another stream's block: never handed to 2
    theirs = {}

    def other_thread():
        theirs["ptr"] = pool.allocate(512, 2)       # not the main thread's cached block
        theirs["token"] = pools.thread_token()
        pool.release(kept, 512, 2, main)            # the main thread's block, freed from here

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert theirs["ptr"] not in (mine, kept)
    assert {pool.allocate(512, 2), pool.allocate(512, 2)} == {mine, kept}  # no driver call
    pool.release(theirs["ptr"], 512, 2, theirs["token"])
    pool.budget = 0                                 # past the budget: every block goes back
    pool.release(pool.allocate(512, 7), 512, 7)
    frees = {ptr: stream for kind, *rest in calls if kind == "free" for ptr, stream in [rest]}
    assert frees[theirs["ptr"]] == 0, "a per-thread stream's block is freed on the legacy stream"
    assert set(frees.values()) == {0, 7}
    assert [c for c in calls if c[0] == "alloc"] == [("alloc", 2)] * 2 + [("alloc", 7), ("alloc", 2)]


def test_a_stream_object_outlives_what_tmaflow_keeps_for_its_handle(monkeypatch):
    """A destroyed stream's handle can come back as a new stream's while the old one's work is
    queued: cached blocks and cupy's current stream keep the stream object (so its handle)
    alive until nothing tmaflow keeps for the handle is left."""
    import gc
    import weakref
    from tmaflow.runtime import device as devices, pool as pools

    class CupyStream:  # cupy's Stream: the handle is .ptr; destroyed when the object dies
        def __init__(self, ptr):
            self.ptr = ptr

    freed = []
    monkeypatch.setattr(pools.driver, "cu", lambda: types.SimpleNamespace(
        cuMemFreeAsync=lambda ptr, stream: freed.append((ptr, stream)) or (0,), cuCtxGetCurrent=lambda: (0, 1)))
    monkeypatch.setattr(pools.driver, "check", lambda name, result: None)
    pool = fake_pool()
    s = CupyStream(0x7000)
    gone = weakref.ref(s)
    pool.release(0x1000, 512, s.ptr, None, s)
    del s
    gc.collect()
    assert gone() is not None, "a block cached for the stream keeps it"
    assert pool.allocate(512, 0x7000) == 0x1000 and gone() is None
    s = CupyStream(0x7000)
    gone = weakref.ref(s)
    pool.release(0x2000, 512, s.ptr, None, s)
    del s
    pool.budget = 0
    pool.release(0x3000, 512, 5, None, 5)  # past the budget: both blocks go back to the driver
    assert freed == [(0x2000, 0x7000), (0x3000, 5)] and gone() is None

    current = CupyStream(0x9000)
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(get_current_stream=lambda: current))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(devices, "_CURRENT", {})
    handle = devices.framework_stream("cupy", 0)
    assert handle == 0x9000 and handle.owner is current
    current = CupyStream(0)
    handle = devices.framework_stream("cupy", 0)
    assert handle == 0 and type(handle) is int
