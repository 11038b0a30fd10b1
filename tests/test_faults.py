"""Sticky faults reported once (no GPU): the driver's bindings answer with fake results, launches
go through fake launchers, and the report must name the kernels launched since the last
successful synchronize, say the context is unusable, and come back up front on later calls."""
import gc
import pickle
import re
import types
import weakref

import numpy as np
import pytest

import tmaflow as tf
from tmaflow.runtime import driver, faults
from tmaflow.launch import native
from tmaflow.tma import tensormap
from tmaflow.runtime.device import Device
from tmaflow.launch.config import LaunchConfig
from tmaflow.launch.launcher import Launcher
from tmaflow.launch.params import Param

from test_launch import TABLE, fake_launcher, owned_array, owned_map

cu = driver.cu()
R = cu.CUresult


@pytest.fixture
def door(monkeypatch):
    """The driver door on a machine without a GPU: the driver is "up", device 0's context is
    current, and ``fake(name, result)`` makes ``cuda.bindings.driver.<name>`` answer ``result``
    (recording its calls in ``door.calls``)."""
    monkeypatch.setattr(driver, "init", lambda: None)
    monkeypatch.setattr(faults, "_context_ordinal", lambda: door.ordinal)
    faults.forget(0)
    faults.forget(1)

    def fake(name, *result):
        def binding(*args):
            door.calls.append((name, args))
            return result
        monkeypatch.setattr(cu, name, binding, raising=False)

    door = types.SimpleNamespace(fake=fake, calls=[], ordinal=0)
    yield door
    faults.forget(0)
    faults.forget(1)


def launcher(name, stream=0, grid=(4, 1, 1), params=TABLE):
    """A fake launcher named ``name`` whose launch configs carry a real stream handle."""
    run = fake_launcher(params, stream)
    run.kernel = types.SimpleNamespace(name=name)
    run.config = LaunchConfig(grid, 32, smem=0, stream=stream)
    cfg = cu.CUlaunchConfig()
    cfg.hStream = cu.CUstream(stream)
    run._configs = {stream: cfg}
    return run


def fault_on_sync(door, code=R.CUDA_ERROR_ILLEGAL_ADDRESS):
    door.fake("cuCtxSynchronize", code)
    with pytest.raises(tf.KernelFaultError) as info:
        driver.call("cuCtxSynchronize")
    return info.value


def test_a_sticky_error_names_the_kernels_since_the_last_synchronize(door, rng, monkeypatch):
    arr = owned_array(int(rng.integers(1, 2**36)) * 16)
    tm = owned_map(arr)
    spec = tf.TensorMapSpec.tiled("float32", (64, 64), (8, 8), address=arr.ptr)
    monkeypatch.setitem(tensormap._encode_cache, ("test",), (spec, bytes(tm)))
    first, second = launcher("wild_write", stream=0x10), launcher("innocent", stream=0x20, grid=(8, 2, 1))
    x, y = int(rng.integers(-2**31, 2**31)), float(np.float32(rng.standard_normal()))
    first(tm, arr, x, y)      # the checked path
    second(tm, arr, 7, 0.5)
    first(tm, arr, x + 1, y)  # the generated path
    assert first.func is not Launcher._checked_call and "note(" in first.func.source

    err = fault_on_sync(door)
    assert isinstance(err, tf.CudaError) and err.code == 700 and err.call == "cuCtxSynchronize"
    assert err.kernels == ("wild_write", "innocent", "wild_write")
    text = str(err)
    assert text.startswith("cuCtxSynchronize failed with CUDA_ERROR_ILLEGAL_ADDRESS (700): a kernel "
                           "loaded or stored at an invalid address")
    assert "context of device 0 is unusable" in text
    launches = [line.strip() for line in text.splitlines() if line.startswith("  wild_write")]
    assert len(launches) == 2
    assert launches[0].startswith("wild_write grid=(4, 1, 1) block=(32, 1, 1) cluster=(1, 1, 1) "
                                  "smem=0 stream=0x10 (")
    assert f"argument 1=0x{arr.ptr:x}" in launches[0] and f"argument 2={x}," in launches[0]
    assert f"argument 2={x + 1}," in launches[1] and f"argument 3={y!r})" in launches[1]
    assert f"argument 0: float32 shape (64, 64) box (8, 8) at 0x{arr.ptr:x}" in launches[0]
    assert "  innocent grid=(8, 2, 1)" in text and "stream=0x20" in text
    assert "restart the process" in text and "tf.Device(0).reset()" in text
    assert "compute-sanitizer --tool memcheck" in text and "debug=True" in text and "-lineinfo" in text


def test_arguments_are_described_by_their_declared_type(door):
    table = [Param(0, 0, 128, "tensormap", ctype="const __grid_constant__ CUtensorMap in"),
             Param(1, 128, 8, "pointer", ctype="float* out"),
             Param(2, 136, 4, "int", False, ctype="unsigned n"),
             Param(3, 144, 8, "float", ctype="double  scale")]
    run = launcher("typed", params=table)
    run(bytes(range(128)), 0xABC0, 2**32 - 1, -1.5)
    text = str(fault_on_sync(door))
    assert ("typed grid=(4, 1, 1) block=(32, 1, 1) cluster=(1, 1, 1) smem=0 stream=0x0 ("
            "const __grid_constant__ CUtensorMap in: a tensor map not in tmaflow's encode cache, "
            "float* out=0xabc0, unsigned n=4294967295, double scale=-1.5)") in text


def test_later_calls_raise_the_same_fault_up_front(door):
    run = launcher("wild_write")
    arr = owned_array()
    run(owned_map(arr), arr, 1, 2.0)
    first = fault_on_sync(door)
    door.fake("cuMemAlloc", R.CUDA_SUCCESS, 0x1000)
    door.calls.clear()
    with pytest.raises(tf.KernelFaultError, match=r"^cuMemAlloc was not run: this context faulted "
                       r"earlier in wild_write \(CUDA_ERROR_ILLEGAL_ADDRESS \(700\), first reported "
                       r"by cuCtxSynchronize\): a kernel loaded or stored") as later:
        driver.call("cuMemAlloc", 64)
    assert door.calls == []  # refused before the driver saw it
    assert later.value.kernels == first.kernels and later.value.detail == first.detail
    assert later.value.code == 700 and later.value.call == "cuMemAlloc"
    # a call made around the door (a raw binding, then check) names the same fault
    with pytest.raises(tf.KernelFaultError, match=r"^cuMemFreeAsync failed: this context faulted earlier in wild_write"):
        driver.check("cuMemFreeAsync", (R.CUDA_ERROR_ILLEGAL_ADDRESS,))
    # and so does a launch, which the driver refuses with the sticky code (here: the fake's)
    run._launch = lambda *a: (R.CUDA_ERROR_ILLEGAL_ADDRESS,)
    run._plans.clear()
    run._use(Launcher._checked_call)
    with pytest.raises(tf.KernelFaultError, match=r"^cuLaunchKernelEx failed: this context faulted earlier in wild_write"):
        run(owned_map(arr), arr, 1, 2.0)
    # device queries still answer: a reset needs them
    door.fake("cuDeviceGetCount", R.CUDA_SUCCESS, 1)
    assert driver.call("cuDeviceGetCount") == 1


def test_a_fault_on_one_device_leaves_the_others_alone(door):
    fault_on_sync(door)
    door.ordinal = 1
    door.fake("cuMemAlloc", R.CUDA_SUCCESS, 0x1000)
    assert driver.call("cuMemAlloc", 64) == 0x1000


def test_device_reset_clears_the_fault_and_the_record(door):
    run = launcher("wild_write")
    arr = owned_array()
    run(owned_map(arr), arr, 1, 2.0)
    fault_on_sync(door)
    dev = object.__new__(Device)  # device 0 as _setup leaves it, without a driver
    dev.ordinal, dev.handle, dev.context, dev.generation = 0, 0, 0x1234, 0
    dev._pool, dev._allocations = None, weakref.WeakSet()
    door.fake("cuDevicePrimaryCtxReset", R.CUDA_SUCCESS)
    door.fake("cuDevicePrimaryCtxRetain", R.CUDA_SUCCESS, 0x5678)
    door.fake("cuCtxGetCurrent", R.CUDA_SUCCESS, 0x5678)
    dev.reset()
    assert not faults.faulted and not faults.ring(0)
    door.fake("cuCtxSynchronize", R.CUDA_SUCCESS)
    driver.call("cuCtxSynchronize")  # runs again
    # a later fault is a new one: it names only what ran after the reset
    launcher("after_reset")(owned_map(arr), arr, 1, 2.0)
    assert fault_on_sync(door).kernels == ("after_reset",)


def test_a_non_sticky_error_is_unchanged(door):
    launcher("k")(owned_map(owned_array()), owned_array(), 1, 2.0)
    door.fake("cuCtxSynchronize", R.CUDA_ERROR_INVALID_VALUE)
    with pytest.raises(tf.CudaError) as info:
        driver.call("cuCtxSynchronize")
    assert type(info.value) is tf.CudaError
    assert str(info.value) == "cuCtxSynchronize failed with CUDA_ERROR_INVALID_VALUE (1)"
    assert not faults.faulted
    door.fake("cuMemAlloc", R.CUDA_SUCCESS, 0x1000)
    assert driver.call("cuMemAlloc", 64) == 0x1000


@pytest.mark.parametrize("code", sorted(faults.STICKY))
def test_every_sticky_code_is_a_fault(door, code):
    err = fault_on_sync(door, R(code))
    assert err.code == code and "is unusable" in str(err)


def test_a_successful_synchronize_clears_the_record(door):
    arr = owned_array()
    launcher("before_sync")(owned_map(arr), arr, 1, 2.0)
    door.fake("cuCtxSynchronize", R.CUDA_SUCCESS)
    driver.call("cuCtxSynchronize")
    err = fault_on_sync(door)
    assert err.kernels == () and "tmaflow launched nothing on it since its last successful synchronize" in str(err)
    assert "faulted earlier in a kernel tmaflow did not launch" in str(faults._again(err, "cuMemAlloc", "was not run"))


def test_a_stream_synchronize_clears_that_streams_launches_only(door):
    arr = owned_array()
    on_a, on_b = launcher("on_a", stream=0xA0), launcher("on_b", stream=0xB0)
    for _ in range(3):
        on_a(owned_map(arr), arr, 1, 2.0)
        on_b(owned_map(arr), arr, 1, 2.0)
    door.fake("cuStreamSynchronize", R.CUDA_SUCCESS)
    driver.call("cuStreamSynchronize", cu.CUstream(0xA0))
    assert fault_on_sync(door).kernels == ("on_b",) * 3


def test_a_copy_to_the_host_clears_the_legacy_streams_launches(door):
    arr = owned_array()
    legacy, other = launcher("legacy", stream=0), launcher("other", stream=0xB0)
    legacy(owned_map(arr), arr, 1, 2.0)
    other(owned_map(arr), arr, 1, 2.0)
    door.fake("cuMemcpyDtoH", R.CUDA_SUCCESS)
    driver.call("cuMemcpyDtoH", 0, arr.ptr, 16)  # what DeviceArray.numpy() does
    assert fault_on_sync(door).kernels == ("other",)


def test_the_record_is_a_bounded_ring(door):
    arr = owned_array()
    run = launcher("hot_loop")
    for i in range(faults.RING + 36):
        run(owned_map(arr), arr, i, 2.0)
    assert len(faults.ring(0)) == faults.RING
    err = fault_on_sync(door)
    assert len(err.kernels) == faults.RING and f"only the last {faults.RING} Python-path launches" in str(err)
    assert f"argument 2={faults.RING + 35}," in str(err) and "argument 2=35," not in str(err)


class _Plan:  # stands for a C plan: the native branch gives plans a ``launches`` counter
    def __init__(self):
        self.launches = 0


def test_c_path_launches_are_named_with_their_count(door):
    arr = owned_array()
    run = launcher("c_path")
    run(owned_map(arr), arr, 5, 2.0)  # packs the buffer the C plan packs into too
    plan, countless = _Plan(), object()
    run._plans = {"types": plan, "others": countless}
    faults.track_native(run)
    quiet = launcher("quiet")
    quiet._plans = {"types": _Plan()}
    faults.track_native(quiet)
    plan.launches = 40
    door.fake("cuCtxSynchronize", R.CUDA_SUCCESS)
    driver.call("cuCtxSynchronize")  # the counts so far ran without a fault
    plan.launches += 3
    err = fault_on_sync(door)
    assert err.kernels == ("c_path",)
    assert re.search(r"  c_path grid=\(4, 1, 1\) .*stream=0x0 \(arguments not recorded on the C launch "
                     r"path\) \[C launch path: 3 launches\]", str(err)), str(err)


def test_launchers_with_a_c_plan_are_tracked(door, monkeypatch):
    if native.module() is None:
        pytest.skip(native.status())
    monkeypatch.setattr(Launcher, "_dry_plans", True)
    run = launcher("dry")
    run._configs = {}
    arr = owned_array()
    run(owned_map(arr), arr, 1, 2.0)
    assert type(run.func).__name__ == "Plan" and run in faults._native[0]
    for _ in range(4):
        run(owned_map(arr), arr, 3, 2.0)
    if getattr(run.func, "launches", None) is None:
        pytest.skip("plan.launches comes with the native branch (_launch.c)")
    err = fault_on_sync(door)
    assert "[C launch path: 4 launches]" in str(err), str(err)


def test_the_fault_pickles_with_its_report(door):
    launcher("wild_write")(owned_map(owned_array()), owned_array(), 1, 2.0)
    err = fault_on_sync(door)
    later = faults._again(err, "cuMemAlloc", "was not run")
    for e in (err, later):
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is tf.KernelFaultError and str(back) == str(e) and back.kernels == e.kernels



def test_the_record_keeps_no_launcher_alive(door):
    run = launcher("short_lived")
    plan = _Plan()
    plan.on_error = run._raise  # as a C plan does: it holds its launcher
    run._plans["types"] = plan
    faults.track_native(run)
    door.fake("cuCtxSynchronize", R.CUDA_SUCCESS)
    driver.call("cuCtxSynchronize")  # the plan's count is taken
    arr = owned_array()
    run(owned_map(arr), arr, 1, 2.0)
    run(owned_map(arr), arr, 1, 2.0)
    assert len(faults.ring(0)) == 2 and run in faults._native[0] and run in faults._at_sync
    gone = weakref.ref(run)
    del run, plan
    gc.collect()
    assert gone() is None
