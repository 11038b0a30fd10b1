"""The C launch path (tmaflow/launch/_launch.c) with dry plans: it packs the same bytes as the
checked path, refuses what the checked path refuses (by handing the call back to it), and leaves no
leak behind (no GPU)."""
import ctypes
import gc
import os
import struct
import subprocess
import sys
import sysconfig
import types
import weakref
from pathlib import Path

import numpy as np
import pytest

import tmaflow as tf
from tmaflow.launch import kernel as kernel_module
from tmaflow.launch import native
from tmaflow.launch.args import PLAN_ATTRIBUTES, PLAN_KINDS
from tmaflow.runtime.graph import ACTIVE
from tmaflow.launch.config import LaunchConfig
from tmaflow.launch.launcher import Launcher
from tmaflow.runtime import memory
from tmaflow.runtime.memory import DeviceArray
from tmaflow.launch.params import Param
from tmaflow.tma.tensormap import TensorMap
from tmaflow.tma.spec import TensorMapSpec

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


class _FakeTensor:
    """A CUDA torch tensor as a plan reads it: ``get_device()`` and ``data_ptr()``."""
    __module__ = "torch"

    def __init__(self, ptr):
        self.ptr = ptr

    def get_device(self):
        return 0

    def data_ptr(self):
        return self.ptr


class ndarray:  # noqa: N801 - the name a cupy array's type has, which the fast form asks for
    """A cupy array as a plan reads it: ``data.ptr`` and ``data.device_id``."""
    __module__ = "cupy"

    def __init__(self, ptr):
        self.data = types.SimpleNamespace(ptr=ptr, device_id=0)


@pytest.fixture
def frameworks(monkeypatch):
    """torch and cupy stand-ins whose current streams are 0x70 and 0x71 (a plan asks them)."""
    torch = types.ModuleType("torch")
    torch.Tensor = _FakeTensor
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda ordinal: 0x70)
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=0x71))
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(memory, "_TORCH_TYPES", [])


# One argument of each kind a C plan writes: (parameter, the argument from a random int, the
# bytes the plan must pack, the stream it must choose)
KIND_CASES = {
    "array": (Param(0, 0, 8, "pointer"), lambda r: owned_array(r * 16), lambda a: struct.pack("<Q", a.ptr), 0),
    "tensormap": (Param(0, 0, 128, "tensormap"), lambda r: owned_map(owned_array(r * 16)), bytes, 0),
    "torch": (Param(0, 0, 8, "pointer"), _FakeTensor, lambda a: struct.pack("<Q", a.ptr), 0x70),
    "cupy": (Param(0, 0, 8, "pointer"), ndarray, lambda a: struct.pack("<Q", a.data.ptr), 0x71),
    "signed": (Param(0, 0, 4, "int", True), lambda r: -(r % 2**31), lambda a: struct.pack("<i", a), 0),
    "unsigned": (Param(0, 0, 4, "int", False), lambda r: 2**31 + r % 2**31, lambda a: struct.pack("<I", a), 0),
    "float": (Param(0, 0, 8, "float"), lambda r: r / 7, lambda a: struct.pack("<d", a), 0),
    "none": (Param(0, 0, 8, "pointer"), lambda r: None, lambda a: bytes(8), 0),
}


def test_every_plan_kind_has_a_case():
    assert set(KIND_CASES) == set(PLAN_KINDS)


@pytest.mark.parametrize("kind", sorted(PLAN_KINDS))
def test_each_argument_kind_takes_the_c_plan(dry, frameworks, rng, kind):
    """Renaming what a plan reads (args.PLAN_ATTRIBUTES) or a kind would drop these launches
    to the generated Python path without a failure anywhere else: here it fails."""
    param, make, want, stream = KIND_CASES[kind]
    run = dry([param, Param(1, 8 if param.size <= 8 else 128, 4, "int", True)])
    arg = make(int(rng.integers(1, 2**40)))
    fields = run.packer.native_fields((arg, 5), 0)
    assert fields is not None and fields[0][0] == PLAN_KINDS[kind]
    run._install_plan((arg, 5))
    assert type(run.func).__name__ == "Plan", native.status()
    launched = run.func.launches
    run(arg, 5)
    assert run.func.launches == launched + 1 and not run.calls  # the plan packed it, not Python
    assert packed(run)[:param.size] == want(arg)
    assert run.func.last_stream == stream


def test_a_build_reads_the_attributes_args_names():
    """_launch.c reports the attribute names it reads; they are args.PLAN_ATTRIBUTES, and the
    objects it reads them from have them."""
    assert native.module().ATTRIBUTES == PLAN_ATTRIBUTES
    arr = owned_array()
    tm = owned_map(arr)
    have = {"_alloc": (tm, arr), "live": (arr._alloc,), "ptr": (arr,), "_bytes": (tm,),
            "data": (ndarray(0),), "device_id": (ndarray(0).data,), "get_device": (_FakeTensor(0),),
            "data_ptr": (_FakeTensor(0),), "_dispatch": (Launcher,), "_checked": (Launcher,)}
    assert set(have) == set(PLAN_ATTRIBUTES)
    for name, objects in have.items():
        for obj in objects:
            assert hasattr(obj, name) or name in getattr(obj, "__slots__", ()), (obj, name)


def test_a_build_reading_other_attributes_is_refused(monkeypatch):
    path = native.module().__file__
    monkeypatch.setattr(native, "PLAN_ATTRIBUTES", PLAN_ATTRIBUTES[:-1] + ("_checked_renamed",))
    with pytest.raises(native._BadBuild, match=r"reads the attributes .*'_checked'.*not args.PLAN_ATTRIBUTES"):
        native._import(Path(path))


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
    cfg = tf.runtime.driver.cu().CUlaunchConfig()
    cfg.gridDimX = 3
    return native.module().Plan(dry, launch, 0, cfg.getPtr(), size, fields, current_stream, 0, [],
                                on_error, cfg)


NONE = (PLAN_KINDS["none"], 0, 8, None, None)


def test_a_plan_asks_for_the_current_stream_each_call(dry):
    run = dry([Param(0, 0, 8, "pointer")])
    streams = iter([11, 22, 33])
    plan = raw_plan((NONE,), current_stream=lambda ordinal: next(streams))
    for want in (11, 22, 33):
        plan(run, None)
        assert plan.last_stream == want
    assert plan.launches == 3


@pytest.mark.parametrize("field,size,msg", [
    ((PLAN_KINDS["tensormap"], 0, 8, int, None), 8, "field 0: kind 1 size 8 is not a parameter"),
    ((PLAN_KINDS["float"], 0, 2, float, None), 8, "field 0: kind 6 size 2 is not a parameter"),
    ((99, 0, 8, int, None), 8, "field 0: kind 99 size 8 is not a parameter"),
    ((PLAN_KINDS["signed"], 6, 4, int, None), 8, r"field 0: offset 6 \+ size 4 lies outside the 8 bytes"),
    ((PLAN_KINDS["tensormap"], 8, 128, int, None), 128, r"offset 8 \+ size 128 lies outside the 128 bytes"),
    ((PLAN_KINDS["array"], -8, 8, int, None), 64, r"offset -8 \+ size 8 lies outside"),
    ((PLAN_KINDS["array"], 2**31 - 1, 8, int, None), 64, r"offset 2147483647 \+ size 8 lies outside"),
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


# --- the review's findings, each through a dry plan --------------------------------------------

def launcher_on(path, dry):
    """A recorded launcher whose fast path is a dry C plan or the generated Python function."""
    if path == "C":
        return dry()
    run = fake_launcher(TABLE)
    run._dry_plans = False
    return run


def other_device(ordinal):
    """A device object the plan has never seen (the checked path reads only its ordinal)."""
    return types.SimpleNamespace(ordinal=ordinal)


@pytest.mark.parametrize("path", ["C", "Python"])
@pytest.mark.parametrize("which", ["array", "map"])
def test_an_array_on_another_device_is_refused_as_the_checked_path_refuses_it(dry, which, path):
    run = launcher_on(path, dry)
    arr = owned_array(device=other_device(0))
    tm = owned_map(arr)
    run(tm, arr, 1, 2.0)
    run(tm, arr, 1, 2.0)  # the launch device's arrays take the fast path
    assert (type(run.func).__name__ == "Plan") == (path == "C")
    stranger = owned_array(0x9000, other_device(1))
    args = (owned_map(stranger), arr, 1, 2.0) if which == "map" else (tm, stranger, 1, 2.0)
    with pytest.raises(tf.LaunchError, match=rf"argument {0 if which == 'map' else 1}.*the array "
                       r"lives on device 1 but the launch is on device 0; a launch.s arrays live on "
                       r"its device \(for a launch on device 1, call tf.set_device\(1\) first\)"):
        run(*args)
    assert len(run.calls) == (1 if path == "C" else 2)  # dry plans record no launch
    neighbour = owned_array(0xA000, other_device(0))  # another object, the launch device's ordinal
    run(tm, neighbour, 1, 2.0)
    assert len(run.calls) == (1 if path == "C" else 3)
    if path == "C":
        assert run.func.launches == 2 and packed(run) == checked_pack(run, (tm, neighbour, 1, 2.0))


class HookedAlloc:
    """An allocation whose ``live`` runs ``hook`` the first time a path reads it."""

    def __init__(self, hook):
        self.hook = hook

    @property
    def live(self):
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return memory.live_token(None, 0)


def test_a_launch_from_python_run_while_packing_keeps_each_calls_values(dry):
    run = dry()
    arr = owned_array(0x1000)
    tm = owned_map(arr)
    run(tm, arr, 1, 2.0)
    plan = run.func
    inner_arr = owned_array(0x2000)
    inner = (TensorMap(TensorMapSpec.tiled("float32", (64, 64), (8, 8), address=0x2000), inner_arr,
                       bytes(range(128, 256))), inner_arr, -5, -6.0)
    seen = []

    def launch_again():
        run(*inner)
        seen.append(packed(run))

    outer_arr = owned_array(0x3000)
    outer_arr._alloc = HookedAlloc(launch_again)  # read after the outer map was written
    outer = (tm, outer_arr, 7, 8.0)
    run(*outer)
    assert seen == [checked_pack(run, inner)]
    assert packed(run) == checked_pack(run, outer)  # not the inner call's map or values
    assert plan.launches == 2 and run.func is plan and len(run.calls) == 1  # the first: checked


def test_a_plan_dropped_while_packing_finishes_its_call(dry):
    run = dry()
    arr = owned_array()
    tm = owned_map(arr)
    run(tm, arr, 1, 2.0)
    plan = id(run.func)

    def drop_the_plan():  # the launcher's last references to it
        run._plans.clear()
        run._use(Launcher._checked_call)
        gc.collect()
        [bytearray(256) for _ in range(1000)]  # reuse what was freed

    victim = owned_array(0x7000)
    victim._alloc = HookedAlloc(drop_the_plan)
    run(tm, victim, 3, 4.0)
    assert plan not in {id(o) for o in gc.get_objects()}  # freed once its call returned
    assert run.func is Launcher._checked_call and len(run.calls) == 1


def _planned_with_a_failing_argument(dry, failure):
    """A dry launcher with its C plan installed, its arguments, and an array whose pointer read
    raises ``failure`` while the plan packs it."""
    run = dry()
    arr = owned_array()
    tm = owned_map(arr)
    run(tm, arr, 1, 2.0)

    def fail():
        raise failure

    victim = owned_array(0x7000)
    victim._alloc = HookedAlloc(fail)
    return run, tm, arr, victim


@pytest.mark.parametrize("error", [KeyboardInterrupt, MemoryError, RuntimeError])
def test_an_interrupt_or_failure_while_packing_propagates(dry, error):
    run, tm, arr, victim = _planned_with_a_failing_argument(dry, error("raised while the plan reads an argument"))
    run(tm, arr, 1, 2.0)
    with pytest.raises(error, match="raised while the plan reads"):
        run(tm, victim, 1, 2.0)
    assert len(run.calls) == 1 and run.func.launches == 1


@pytest.mark.parametrize("error", [AttributeError, TypeError, ValueError, OverflowError])
def test_an_argument_not_of_the_fast_kind_goes_to_the_checked_path(dry, error):
    run, tm, arr, victim = _planned_with_a_failing_argument(dry, error("not the fast kind"))
    run(tm, victim, 5, 6.0)  # the checked path reads it again (no error now) and launches
    assert len(run.calls) == 2 and run.calls[-1][1] == checked_pack(run, (tm, victim, 5, 6.0))


def test_a_plan_reports_its_size():
    plan_type = native.module().Plan
    one = raw_plan((NONE,))
    five = raw_plan(tuple((PLAN_KINDS["none"], 8 * i, 8, None, None) for i in range(5)), size=40)
    assert sys.getsizeof(five) - sys.getsizeof(one) == 4 * plan_type.__itemsize__
    assert plan_type.__itemsize__ >= 24 and sys.getsizeof(one) < 512


def c_function(name):
    return ctypes.cast(getattr(ctypes.pythonapi, name), ctypes.c_void_p).value


def test_the_driver_call_runs_without_the_gil():
    # PyGILState_Check answers 0 (success, to the plan) only where the caller released the GIL
    errors = []
    plan = raw_plan((NONE,), dry=False, launch=c_function("PyGILState_Check"), on_error=errors.append)
    plan(None, None)
    plan(None, None)
    assert errors == [] and plan.launches == 2 and not plan.dry


def test_a_failed_driver_call_is_reported_and_not_counted():
    errors = []
    plan = raw_plan((NONE,), dry=False, launch=c_function("Py_IsInitialized"), on_error=errors.append)
    plan(None, None)  # Py_IsInitialized answers 1: an error code, to the plan
    assert errors == [1] and plan.launches == 0


FakeDriver = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


def test_the_driver_gets_the_config_and_one_pointer_per_parameter_of_the_call(dry):
    run = dry([Param(0, 0, 8, "pointer"), Param(1, 8, 4, "int", True), Param(2, 16, 8, "float")])
    seen = []

    @FakeDriver
    def driver(config, function, params, extra):
        seen.append((ctypes.c_uint.from_address(config).value,
                     ctypes.c_uint64.from_address(params[0]).value,
                     ctypes.c_int32.from_address(params[1]).value,
                     ctypes.c_double.from_address(params[2]).value, params[2] - params[0], extra))
        return 0

    fields = ((PLAN_KINDS["array"], 0, 8, DeviceArray, memory.live_tokens(None, 0)), (PLAN_KINDS["signed"], 8, 4, int, None),
              (PLAN_KINDS["float"], 16, 8, float, None))
    plan = raw_plan(fields, dry=False, launch=ctypes.cast(driver, ctypes.c_void_p).value, size=24)
    arr = owned_array(0x4000)
    plan(run, arr, -9, 0.25)
    plan(run, arr, 2**31 - 1, -1e300)
    assert seen == [(3, 0x4000, -9, 0.25, 16, None), (3, 0x4000, 2**31 - 1, -1e300, 16, None)]
    assert plan.launches == 2


def test_a_plan_is_dry_or_has_the_drivers_address():
    with pytest.raises(ValueError, match="launch=0: no address of cuLaunchKernelEx"):
        raw_plan((NONE,), dry=False, launch=0)


def test_a_null_launch_address_falls_back_to_the_python_path(monkeypatch):
    monkeypatch.setattr(native, "_state", {"module": native.module()})
    found = tf.runtime.driver.cu().CUdriverProcAddressQueryResult.CU_GET_PROC_ADDRESS_SUCCESS
    real = tf.runtime.driver.call
    monkeypatch.setattr(tf.runtime.driver, "call", lambda name, *a, **k: (0, found) if name == "cuGetProcAddress"
                        else real(name, *a, **k))
    cfg = tf.runtime.driver.cu().CUlaunchConfig()
    made = native.plan((NONE,), dry=False, function=0, size=8, config=cfg.getPtr(), current_stream=None,
                       ordinal=0, capturing=[], on_error=print, keep=cfg)
    assert made is None and native.launch_address() is None
    assert native.status().startswith("generated Python launch path (cuGetProcAddress gave no "
                                      "cuLaunchKernelEx (address 0x0")


@pytest.mark.parametrize("path", ["C", "Python"])
def test_a_retired_launcher_refuses_every_call(dry, path):
    run = launcher_on(path, dry)
    arr = owned_array()
    tm = owned_map(arr)
    run(tm, arr, 1, 2.0)
    run(tm, arr, 1, 2.0)
    run.retire("kernel 'k' was closed; build a new launcher")
    for call in (lambda: run(tm, arr, 1, 2.0), lambda: run._checked((tm, arr, 1, 2.0)),
                 lambda: run._dispatch((tm, arr, 1, 2.0))):
        with pytest.raises(tf.LaunchError, match="kernel 'k' was closed; build a new launcher"):
            call()
    assert len(run.calls) == (1 if path == "C" else 2)


def fake_module(device):
    mod = object.__new__(kernel_module._Module)
    mod.name, mod.device, mod.generation, mod.module, mod.watch, mod.recorder = \
        "k", device, device.generation, None, None, None
    mod.launchers = weakref.WeakSet()
    kernel_module._loaded.add(mod)
    return mod


def test_close_and_reset_retire_every_launcher_of_a_module(dry):
    assert kernel_module._retire_reset_modules in tf.runtime.device._reset_listeners
    closed_device, reset_device = types.SimpleNamespace(generation=0), types.SimpleNamespace(generation=3)
    closed, reset = fake_module(closed_device), fake_module(reset_device)
    arr = owned_array()
    tm = owned_map(arr)
    for mod in (closed, reset):
        for _ in range(2):
            run = dry()
            run(tm, arr, 1, 2.0)
            mod.launchers.add(run)
    closed.unload()  # Kernel.close
    reset_device.generation += 1  # Device.reset, then its listeners
    kernel_module._retire_reset_modules()
    for mod, why in ((closed, "kernel 'k' was closed; build a new launcher"),
                     (reset, "kernel 'k': the context was reset; build a new launcher")):
        assert len(mod.launchers) == 2 and mod not in kernel_module._loaded
        for run in mod.launchers:
            with pytest.raises(tf.LaunchError, match=why):
                run(tm, arr, 1, 2.0)


def test_the_module_reports_the_abi_native_expects():
    assert native.module().ABI == native.ABI


ASAN_CHILD = r"""
import sys
from pathlib import Path

import pytest
from tmaflow.launch import native
from tmaflow.launch.args import PLAN_ATTRIBUTES, PLAN_KINDS

native._state["module"] = native._import(Path(sys.argv[1]))
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-k", "not sanitizer", sys.argv[2]]))
"""


def under_address_sanitizer(tmp_path, test_file):
    """``test_file``'s tests again, with _launch.c built with ASan and every Python allocation
    through malloc (so a plan used after its free is reported)."""
    cc = native._compiler()
    libasan = subprocess.run([*cc, "-print-file-name=libasan.so"], capture_output=True,
                             text=True).stdout.strip()
    if not os.path.isabs(libasan):
        pytest.skip(f"{cc} has no libasan")
    built = tmp_path / "launch-asan.so"
    include = sysconfig.get_paths()["include"]
    subprocess.run([*cc, "-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer", "-shared",
                    "-fPIC", f"-I{include}", str(native.SOURCE), "-o", str(built)], check=True)
    env = dict(os.environ, LD_PRELOAD=libasan, PYTHONMALLOC="malloc",
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=0", PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", ASAN_CHILD, str(built), test_file], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert " passed" in done.stdout and "AddressSanitizer" not in done.stderr


def test_the_dry_plan_tests_pass_under_address_sanitizer(tmp_path):
    under_address_sanitizer(tmp_path, __file__)
