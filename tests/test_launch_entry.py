"""``kernel.launch`` in C (``native.Entry``, tmaflow/launch/_launch_entry.c) against the Python
method it stands in for (no GPU): the launcher it finds for each call is the one the method's
key names, and every call it does not take reaches the method with its arguments unchanged."""
import inspect
import threading

import pytest

from tmaflow.launch import kernel as kernel_module
from tmaflow.launch import native
from tmaflow.launch.kernel import Kernel
from tmaflow.launch.launcher import Launcher
from tmaflow.launch.params import Param

from test_launch import fake_launcher
from test_native import under_address_sanitizer

PARAMS = [Param(0, 0, 4, "int", True), Param(1, 4, 4, "int", True)]


def key(grid=1, block=32, cluster=(1, 1, 1), smem=None, stream=None, pdl=False, thread=None):
    """The key Kernel.launch looks its launcher up with (device 0)."""
    return (grid, block, cluster, smem, stream, pdl, 0, thread or threading.get_ident())


class Setup:
    """An Entry over a dict of recording launchers, with a recording Python method."""

    def __init__(self, switched=None):
        assert native.module() is not None, native.status()
        self.launchers = {}
        self.slow = []
        self.switched = [False] if switched is None else switched
        self.entry = native.module().Entry(self.launchers, self.switched, Launcher._retired_call,
                                           lambda *args, **kw: self.slow.append((args, kw)), (1, 1, 1))

    def launcher(self, *parts, **named):
        run = fake_launcher(PARAMS)
        self.launchers[key(*parts, **named)] = run
        return run


def launched(run):
    """The (a, b) values of each call a recording launcher launched."""
    return [tuple(int.from_bytes(raw[i:i + 4], "little", signed=True) for i in (0, 4)) for _, raw in run.calls]


def test_the_method_has_the_keywords_and_defaults_the_entry_assumes():
    sig = inspect.signature(Kernel.launch)
    kw = {n: p.default for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY}
    assert list(kw) == ["grid", "block", "cluster", "smem", "stream", "pdl"]
    assert {n: d for n, d in kw.items() if d is not inspect.Parameter.empty} == kernel_module._LAUNCH_DEFAULTS


def test_a_cached_launcher_is_called_with_the_arguments(rng):
    s = Setup()
    plain, streamed, clustered = s.launcher(), s.launcher(stream=5), s.launcher(4, 128, (2, 1, 1), 1024)
    values = [tuple(int(v) for v in rng.integers(-2**31, 2**31, 2)) for _ in range(4)]
    s.entry(*values[0], grid=1, block=32)
    s.entry(*values[1], block=32, grid=1, stream=5, pdl=False, smem=None)
    s.entry(*values[2], grid=4, block=128, cluster=(2, 1, 1), smem=1024)
    s.entry(*values[3], grid=1, block=32)
    assert launched(plain) == [values[0], values[3]] and launched(streamed) == [values[1]]
    assert launched(clustered) == [values[2]] and s.slow == []


@pytest.mark.parametrize("call", [
    dict(args=(1, 2), kw=dict(grid=1)),                                  # block missing
    dict(args=(1, 2), kw=dict(grid=1, block=32, stream=5.0)),            # not an int: stream_handle's
    dict(args=(1, 2), kw=dict(grid=1, block=32, stream=True)),
    dict(args=(1, 2), kw=dict(grid=1, block=32, other=3)),               # the method names the error
    dict(args=(1, 2), kw=dict(grid=1, block=33)),                        # not cached
    dict(args=(1, 2), kw=dict(grid=[1], block=32)),                      # unhashable
    dict(args=(1, 2), kw={}),
])
def test_every_other_call_reaches_the_method_unchanged(call):
    s = Setup()
    runs = [s.launcher(), s.launcher(stream=5), s.launcher(stream=1)]  # 5.0 == 5, True == 1
    s.entry(*call["args"], **call["kw"])
    assert s.slow == [(call["args"], call["kw"])] and all(run.calls == [] for run in runs)


def test_another_device_in_use_sends_calls_to_the_method():
    s = Setup(switched=[True])  # current_ordinal() decides the key: the method's job
    run = s.launcher()
    s.entry(1, 2, grid=1, block=32)
    assert s.slow == [((1, 2), dict(grid=1, block=32))] and run.calls == []


def test_another_thread_gets_its_own_launcher():
    s = Setup()
    mine = s.launcher()
    threads = []

    def other():
        threads.append(s.launcher(thread=threading.get_ident()))
        s.entry(3, 4, grid=1, block=32)

    s.entry(1, 2, grid=1, block=32)  # remembered for this thread
    t = threading.Thread(target=other)
    t.start()
    t.join()
    s.entry(5, 6, grid=1, block=32)
    assert launched(mine) == [(1, 2), (5, 6)] and launched(threads[0]) == [(3, 4)] and s.slow == []


def test_equal_keys_of_new_objects_find_their_launchers():
    """The remembered key's objects are held: a freed tuple's address is never mistaken."""
    s = Setup()
    four, eight = s.launcher((4, 1)), s.launcher((8, 1))
    for n in (4, 4, 8, 4, 8, 8):
        s.entry(n, 0, grid=(n, int("1")), block=32)  # a new tuple each call
    assert launched(four) == [(4, 0)] * 3 and launched(eight) == [(8, 0)] * 3 and s.slow == []


def test_a_retired_launcher_is_left_to_the_method():
    s = Setup()
    run = s.launcher()
    s.entry(1, 2, grid=1, block=32)
    run.retire("the context was reset")
    s.entry(3, 4, grid=1, block=32)
    s.entry(5, 6, grid=1, block=32)
    assert launched(run) == [(1, 2)] and [args for args, _ in s.slow] == [(3, 4), (5, 6)]


def test_a_cleared_dict_is_seen(rng):
    s = Setup()
    run = s.launcher()
    s.entry(1, 2, grid=1, block=32)
    s.launchers.clear()  # Kernel.close and a module reload clear it, and retire the launchers
    run.retire("kernel closed")
    s.entry(3, 4, grid=1, block=32)
    assert launched(run) == [(1, 2)] and len(s.slow) == 1


def test_a_kernel_installs_its_entry_once_it_has_a_launcher(monkeypatch):
    k = Kernel.__new__(Kernel)
    k._launchers = {}
    k._install_entry()
    assert type(k.__dict__["launch"]).__name__ == "Entry" and k.launch is k.__dict__["launch"]
    run = fake_launcher(PARAMS)
    k._launchers[key()] = run
    k.launch(7, 8, grid=1, block=32)
    assert launched(run) == [(7, 8)]
    assert inspect.signature(k.launch) == inspect.signature(Kernel.launch.__get__(k))  # help() too
    other = Kernel.__new__(Kernel)
    other._launchers = {}
    monkeypatch.setenv("TMAFLOW_NATIVE", "0")
    other._install_entry()
    assert "launch" not in other.__dict__  # the Python method only


def test_the_entry_calls_the_kernels_method_for_the_rest(monkeypatch):
    k = Kernel.__new__(Kernel)
    k._launchers = {}
    seen = []
    monkeypatch.setattr(Kernel, "launch", lambda self, *args, **kw: seen.append((self, args, kw)))
    monkeypatch.setattr(Kernel.launch, "__kwdefaults__", dict(kernel_module._LAUNCH_DEFAULTS), raising=False)
    k._install_entry()
    k.launch(1, 2, grid=1, block=32, stream=object)
    assert seen == [(k, (1, 2), dict(grid=1, block=32, stream=object))]


def test_these_tests_pass_under_address_sanitizer(tmp_path):
    under_address_sanitizer(tmp_path, __file__)


def test_a_subclass_with_its_own_launch_keeps_it():
    class Mine(Kernel):
        def launch(self, *args, **kw):
            return ("mine", args, kw)

    k = Mine.__new__(Mine)
    k._launchers = {}
    k._install_entry()
    assert "launch" not in k.__dict__ and k.launch(1, grid=1, block=32) == ("mine", (1,), dict(grid=1, block=32))
