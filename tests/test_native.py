"""The C launch path (tmaflow/_launch.c) with dry plans: it packs the same bytes as the checked
path, refuses what the checked path refuses (by handing the call back to it), and leaves no
leak behind (no GPU)."""
import ctypes
import gc
import struct
import sys
import types
import weakref

import numpy as np
import pytest

import tmaflow as tf
from tmaflow import native
from tmaflow.graph import ACTIVE
from tmaflow.launch import LaunchConfig, Launcher
from tmaflow.params import Param

from test_launch import TABLE, fake_launcher, owned_array, owned_map, refuses_wrong_values


@pytest.fixture
def dry(monkeypatch):
    assert native.module() is not None, native.status()  # CI builds it: a compiler is there
    monkeypatch.setattr(Launcher, "_dry_plans", True)

    def make(params=TABLE):
        run = fake_launcher(params)
        run._configs = {}  # a real CUlaunchConfig (the plan copies its struct)
        run.config = LaunchConfig(1, 32, smem=0)
        return run
    return make


def packed(run):
    """What the dry plan of ``run`` packed in its last call."""
    return run.func.last_params


def checked_pack(run, args):
    """What the checked path packs for ``args``."""
    run.packer.pack(args)
    return bytes(run.packer.buffer.raw[:run.packer.total])


def test_a_plan_packs_what_the_checked_path_packs(dry, rng):
    run = dry()
    arr = owned_array(int(rng.integers(1, 2**40)) * 16)
    tm = owned_map(arr)
    run(tm, arr, 1, 2.0)  # checked, installs the plan
    assert type(run.func).__name__ == "Plan"
    for _ in range(20):
        other = owned_array(int(rng.integers(1, 2**40)) * 16)
        x, y = int(rng.integers(-2**31, 2**31)), float(rng.standard_normal() * 1e30)
        run(tm, other, x, y)
        got = packed(run)
        assert got == checked_pack(run, (tm, other, x, y))
        assert got[:128] == bytes(tm) and struct.unpack_from("<Qif", got, 128) == (other.ptr, x, np.float32(y))
    assert len(run.calls) == 1  # only the first call went through the recorded driver call


@pytest.mark.parametrize("which", ["array", "map"])
def test_a_plan_refuses_freed_memory_by_name(dry, which):
    run = dry()
    arr = owned_array()
    tm = owned_map(arr)
    run(tm, arr, 1, 2.0)
    run(tm, arr, 1, 2.0)
    arr._alloc.live = False
    if which == "map":
        with pytest.raises(tf.LaunchError, match=r"argument 0: TensorMap.*its array was freed"):
            run(tm, owned_array(0x9000), 1, 2.0)
    else:
        with pytest.raises(tf.LaunchError, match=r"argument 1: DeviceArray.*was freed before the launch"):
            run(owned_map(owned_array(0x9000)), arr, 1, 2.0)
    assert len(run.calls) == 1


def test_a_plan_hands_wrong_values_and_counts_to_the_checked_path(dry):
    run = dry()
    arr = owned_array()
    tm = owned_map(arr)
    run(tm, arr, 1, 2.0)
    plan = run.func
    refuses_wrong_values(run, tm, arr)
    with pytest.raises(tf.LaunchError, match=r"argument 3: float 1e\+300 does not fit the 4-byte float"):
        run(tm, arr, 1, 1e300)  # past float32's range: struct's 'f' refuses it, so must the plan
    run(tm, arr, -7, 2.0)
    assert run.func is plan and struct.unpack_from("<i", packed(run), 136)[0] == -7


def test_unsigned_values_past_the_signed_range_are_packed_unsigned(dry):
    run = dry([Param(0, 0, 8, "pointer"), Param(1, 8, 4, "int", False), Param(2, 12, 2, "int", True)])
    arr = owned_array()
    run(arr, 7, -3)
    run(arr, 2**32 - 1, -2**15)
    assert type(run.func).__name__ == "Plan"
    assert struct.unpack_from("<QIh", packed(run), 0) == (arr.ptr, 2**32 - 1, -2**15)
    with pytest.raises(tf.LaunchError, match="argument 1"):
        run(arr, -1, 0)
    with pytest.raises(tf.LaunchError, match="argument 2"):
        run(arr, 1, 2**15)


def test_none_for_a_pointer_and_bools_for_ints(dry):
    run = dry([Param(0, 0, 8, "pointer"), Param(1, 8, 4, "int", True)])
    run(None, True)
    run(None, False)
    assert type(run.func).__name__ == "Plan" and packed(run)[:12] == bytes(12)


def test_numpy_scalars_keep_the_generated_python_path(dry):
    run = dry()
    arr = owned_array()
    run(owned_map(arr), arr, np.int32(3), np.float32(1.5))
    assert "pack_into" in run.func.source
    assert struct.unpack_from("<if", run.calls[-1][1], 136) == (3, 1.5)


def test_a_capturing_graph_sends_calls_to_the_checked_path(dry, monkeypatch):
    run = dry()
    arr = owned_array()
    tm = owned_map(arr)
    run(tm, arr, 1, 2.0)
    seen = []
    monkeypatch.setattr(run, "_checked", lambda args: seen.append(args), raising=False)
    ACTIVE.append(object())
    try:
        run(tm, arr, 5, 6.0)
    finally:
        ACTIVE.pop()
    assert seen == [(tm, arr, 5, 6.0)]


def raw_plan(fields, *, dry=True, launch=0, size=8, current_stream=None, on_error=print):
    """A Plan built directly (``launch``: the address of a stand-in for cuLaunchKernelEx)."""
    cfg = tf.driver.cu().CUlaunchConfig()
    cfg.gridDimX = 3
    return native.module().Plan(dry, launch, 0, cfg.getPtr(), size, fields, current_stream, 0, [],
                                on_error, cfg)


NONE = (native.KINDS["none"], 0, 8, None, None)


def test_a_plan_asks_for_the_current_stream_each_call(dry):
    run = dry([Param(0, 0, 8, "pointer")])
    streams = iter([11, 22, 33])
    plan = raw_plan((NONE,), current_stream=lambda ordinal: next(streams))
    for want in (11, 22, 33):
        plan(run, None)
        assert plan.last_stream == want
    assert plan.launches == 3


@pytest.mark.parametrize("field,size,msg", [
    ((native.KINDS["map"], 0, 8, int, None), 8, "field 0: kind 1 size 8 is not a parameter"),
    ((native.KINDS["float"], 0, 2, float, None), 8, "field 0: kind 6 size 2 is not a parameter"),
    ((99, 0, 8, int, None), 8, "field 0: kind 99 size 8 is not a parameter"),
    ((native.KINDS["signed"], 6, 4, int, None), 8, r"field 0: offset 6 \+ size 4 lies outside the 8 bytes"),
    ((native.KINDS["map"], 8, 128, int, None), 128, r"offset 8 \+ size 128 lies outside the 128 bytes"),
    ((native.KINDS["array"], -8, 8, int, None), 64, r"offset -8 \+ size 8 lies outside"),
    ((native.KINDS["array"], 2**31 - 1, 8, int, None), 64, r"offset 2147483647 \+ size 8 lies outside"),
])
def test_a_field_a_plan_cannot_write_is_refused(field, size, msg):
    with pytest.raises(ValueError, match=msg):
        raw_plan((field,), size=size)


@pytest.mark.parametrize("size,msg", [(-1, "size=-1: parameter storage is 0 to 32764 bytes"),
                                      (32765, "size=32765")])
def test_parameter_storage_past_the_driver_limit_is_refused(size, msg):
    with pytest.raises(ValueError, match=msg):
        raw_plan((), size=size)


def test_launchers_with_plans_are_collected(dry):
    run = dry()
    arr = owned_array()
    run(owned_map(arr), arr, 1, 2.0)
    assert type(run.func).__name__ == "Plan"
    gone = weakref.ref(run)
    del run
    gc.collect()
    assert gone() is None
