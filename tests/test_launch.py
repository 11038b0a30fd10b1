"""LaunchConfig normalisation and the generated launch path, with the driver call recorded
instead of made (no GPU)."""
import struct

import numpy as np
import pytest

import tmaflow as tf
from tmaflow.launch.config import LaunchConfig, dims
from tmaflow.launch.launcher import Launcher
from tmaflow.runtime import memory
from tmaflow.runtime.memory import DeviceArray
from tmaflow.launch.params import ArgPacker, Param
from tmaflow.tma.tensormap import TensorMap
from tmaflow.tma.spec import TensorMapSpec

SUCCESS = tf.runtime.driver.cu().CUresult.CUDA_SUCCESS


# --- LaunchConfig ----------------------------------------------------------------------------

def test_config_normalises_lists_and_ints_and_hashes_equal():
    a = LaunchConfig(grid=[8, 2], block=128, cluster=[2], smem=np.int64(1024))
    b = LaunchConfig((8, 2, 1), (128, 1, 1), (2, 1, 1), 1024)
    assert a == b and hash(a) == hash(b)
    assert (a.grid, a.block, a.cluster, a.smem, a.stream) == ((8, 2, 1), (128, 1, 1), (2, 1, 1), 1024, None)
    assert type(a.smem) is int and a.threads == 128 and a.cluster_size == 2
    assert {a: 1}[b] == 1


def test_config_keeps_the_stream_object_alive_and_compares_by_handle():
    class FakeStream:
        def __cuda_stream__(self):
            return (0, 0x1234)

    s = FakeStream()
    c = LaunchConfig(1, 32, stream=s)
    assert c.stream == 0x1234 and c.stream_object is s
    assert c == LaunchConfig(1, 32, stream=0x1234)


@pytest.mark.parametrize("kwargs,msg", [
    (dict(grid=0, block=32), r"grid=0 must have 1-3 extents, each >= 1"),
    (dict(grid="x", block=32), r"grid='x' must be an int or a tuple of 1-3 ints"),
    (dict(grid=(1, 2, 3, 4), block=32), r"grid=\(1, 2, 3, 4\) must have 1-3 extents"),
    (dict(grid=(1.5, 2), block=32), r"grid=\(1.5, 2\) must be an int"),
    (dict(grid=True, block=32), r"grid=True must be an int"),
    (dict(grid=None, block=32), r"grid=None must be an int"),
    (dict(grid=(1, 70000), block=32), r"axis y has 70000 blocks; the limit is 65535"),
    (dict(grid=2**31, block=32), r"axis x has 2147483648 blocks; the limit is 2147483647"),
    (dict(grid=1, block=(32, 64)), r"block=\(32, 64, 1\) has 2048 threads; a block holds at most 1024"),
    (dict(grid=1, block=(1, 1, 65)), r"axis z has 65 threads; the limit is 64"),
    (dict(grid=6, block=32, cluster=4), r"cluster=\(4, 1, 1\) does not divide grid=\(6, 1, 1\).*axis x has 6"),
    (dict(grid=32, block=32, cluster=32), r"cluster=\(32, 1, 1\) has 32 blocks; .* at most 8 \(portable\) or 16"),
    (dict(grid=1, block=32, smem=-1), r"smem=-1 must be a non-negative int"),
    (dict(grid=1, block=32, smem=1.5), r"smem=1.5 must be a non-negative int"),
    (dict(grid=1, block=32, smem=True), r"smem=True must be a non-negative int"),
    (dict(grid=1, block=32, pdl=1), r"pdl=1 must be True or False"),
    (dict(grid=1, block=32, cooperative="yes"), r"cooperative='yes' must be True or False"),
    (dict(grid=1, block=32, stream="s"), r"stream='s' \(str\) is not a stream"),
])
def test_config_rules(kwargs, msg):
    with pytest.raises(tf.LaunchError, match=msg):
        LaunchConfig(**kwargs)


def test_dims():
    assert dims("grid", (4, 2)) == (4, 2, 1) and dims("grid", 7) == (7, 1, 1)
    assert dims("grid", np.int32(3)) == (3, 1, 1) and dims("grid", [2, 2, 2]) == (2, 2, 2)


# --- the generated path --------------------------------------------------------------------

class _Module:
    compiled_cluster = (0, 0, 0)


class _Alloc:
    """Stands for a tmaflow allocation on device ``ordinal``; free() is what memory does to it."""

    def __init__(self, ordinal=0):
        self.live = memory.live_token(None, ordinal)


def fake_launcher(params, stream=0):
    """A Launcher whose driver call is recorded instead of made."""
    run = Launcher.__new__(Launcher, None, None, None)
    run.kernel, run.module, run.config = None, _Module(), LaunchConfig(1, 32, stream=stream)
    run.generation, run.ordinal = 0, 0
    run.packer = ArgPacker(params)
    run._configs = {stream: "cfg"}
    run._plans, run._function, run._watch, run._recorder = {}, None, None, None
    run.calls = []

    def launch(cfg, fn, kp, extra):
        run.calls.append((cfg, bytes(run.packer.buffer.raw[:run.packer.total])))
        return (SUCCESS,)

    run._launch = launch
    run._use(Launcher._checked_call)
    return run


def owned_array(ptr=0x5000, device=None):
    """A tmaflow array on ``device`` (a stand-in with an ``ordinal``; None: device 0 as the
    allocation knows it, unnamed on the array)."""
    arr = DeviceArray(ptr, (64, 64), "float32", device=device)
    arr._alloc = _Alloc(0 if device is None else device.ordinal)
    return arr


def owned_map(arr):
    spec = TensorMapSpec.tiled("float32", (64, 64), (8, 8), address=arr.ptr)
    return TensorMap(spec, arr, bytes(range(128)))


TABLE = [Param(0, 0, 128, "tensormap"), Param(1, 128, 8, "pointer"), Param(2, 136, 4, "int", True),
         Param(3, 140, 4, "float")]


def test_generated_path_packs_new_values_each_call(rng):
    run = fake_launcher(TABLE)
    arr = owned_array()
    tm = owned_map(arr)
    for i in range(5):
        x, y = int(rng.integers(-2**31, 2**31)), float(rng.standard_normal())
        run(tm, arr, x, y)
        raw = run.calls[-1][1]
        assert raw[:128] == bytes(tm)
        assert struct.unpack_from("<Qif", raw, 128) == (arr.ptr, x, np.float32(y))
    assert run.func is not Launcher._checked_call and "pack_into" in run.func.source
    assert len(run._plans) == 1


def test_one_plan_per_type_tuple_reused_when_types_alternate():
    run = fake_launcher(TABLE)
    arr = owned_array()
    tm = owned_map(arr)
    run(tm, arr, 1, 2.0)
    first = run.func
    run(tm, arr, 1, 2)          # int for the float: another type tuple, another plan
    second = run.func
    for _ in range(3):
        run(tm, arr, 1, 2.0)
        assert run.func is first
        run(tm, arr, 1, 3)
        assert run.func is second
    assert len(run._plans) == 2 and first is not second
    assert struct.unpack_from("<f", run.calls[-1][1], 140)[0] == 3.0


@pytest.mark.parametrize("which", ["array", "map"])
def test_freed_memory_is_refused_on_the_generated_path(which):
    run = fake_launcher(TABLE)
    arr = owned_array()
    tm = owned_map(arr)
    run(tm, arr, 1, 2.0)
    run(tm, arr, 1, 2.0)  # generated path
    assert len(run.calls) == 2
    arr._alloc.live = False  # what DeviceArray.free() does
    if which == "map":       # only the map's array died; the pointer argument is another array
        other = owned_array(0x9000)
        with pytest.raises(tf.LaunchError, match=r"argument 0: TensorMap.*its array was freed"):
            run(tm, other, 1, 2.0)
    else:
        with pytest.raises(tf.LaunchError, match=r"argument 1: DeviceArray.*was freed before the launch"):
            run(owned_map(owned_array(0x9000)), arr, 1, 2.0)
    assert len(run.calls) == 2  # nothing was launched


def test_free_of_another_array_leaves_the_path_alone():
    run = fake_launcher(TABLE)
    arr = owned_array()
    tm = owned_map(arr)
    run(tm, arr, 1, 2.0)
    plan = run.func
    unrelated = owned_array(0x7000)
    unrelated._alloc.live = False
    run(tm, arr, 5, 2.0)
    assert run.func is plan and struct.unpack_from("<i", run.calls[-1][1], 136)[0] == 5


def refuses_wrong_values(run, tm, arr):
    """After a good call of TABLE's launcher: a wrong type, an int out of range and a missing
    argument are each refused by name."""
    with pytest.raises(tf.LaunchError, match=r"argument 1: float 1.5 given for a pointer parameter"):
        run(tm, 1.5, 1, 2.0)
    with pytest.raises(tf.LaunchError, match=r"argument 2: int 4294967296 does not fit"):
        run(tm, arr, 2**32, 2.0)
    with pytest.raises(tf.LaunchError, match=r"takes 4 arguments"):
        run(tm, arr, 1)


def test_wrong_types_after_the_fast_path_are_still_checked():
    run = fake_launcher(TABLE)
    arr = owned_array()
    tm = owned_map(arr)
    run(tm, arr, 1, 2.0)
    refuses_wrong_values(run, tm, arr)
    assert len(run.calls) == 1


def test_unsigned_values_past_the_signed_range_fall_back_to_the_checked_path():
    run = fake_launcher([Param(0, 0, 8, "any"), Param(1, 8, 4, "any")])
    arr = owned_array()
    run(arr, 7)
    run(arr, 2**32 - 1)  # 'i' overflows: the checked path packs it unsigned
    assert struct.unpack_from("<I", run.calls[-1][1], 8)[0] == 2**32 - 1
    run(arr, 9)
    assert struct.unpack_from("<i", run.calls[-1][1], 8)[0] == 9 and len(run.calls) == 3


def test_driver_launch_config_carries_cluster_and_pdl():
    """The CUlaunchConfig a launcher builds (no GPU needed to build one)."""
    cu = tf.runtime.driver.cu()
    run = fake_launcher(TABLE)
    run.config = LaunchConfig(grid=8, block=128, cluster=2, smem=1024, pdl=True)
    run._configs = {}
    cfg = run.cu_config(0x1234)
    assert (cfg.gridDimX, cfg.blockDimX, cfg.sharedMemBytes) == (8, 128, 1024)
    ids = [a.id for a in cfg.attrs]
    assert ids == [cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                   cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION]
    assert cfg.attrs[0].value.clusterDim.x == 2 and cfg.numAttrs == 2
    assert cfg.attrs[1].value.programmaticStreamSerializationAllowed == 1
    assert run.cu_config(0x1234) is cfg  # one per stream


def test_driver_launch_config_carries_cooperative():
    """A cooperative configuration asks the driver for every block resident at once; the
    others do not (no GPU needed to build the config)."""
    cu = tf.runtime.driver.cu()
    run = fake_launcher(TABLE)
    for cooperative, want in ((True, [cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE]), (False, [])):
        run.config = LaunchConfig(grid=132, block=384, smem=1024, cooperative=cooperative)
        run._configs = {}
        cfg = run.cu_config(0x1234)
        assert [a.id for a in cfg.attrs] == want and cfg.numAttrs == len(want)
        assert all(a.value.cooperative == 1 for a in cfg.attrs)
    assert LaunchConfig(grid=8, block=32, cooperative=True) != LaunchConfig(grid=8, block=32)


def test_stream_none_follows_the_arrays_framework(monkeypatch):
    """stream=None: torch's current stream for torch arrays, else cupy's, else stream 0
    (fake framework modules: the rule, not the libraries, is under test)."""
    import sys
    import types

    from tmaflow.runtime.device import _current_stream

    fake_torch = types.SimpleNamespace(_C=types.SimpleNamespace(_cuda_getCurrentRawStream=lambda o: 0x7000 + o))
    fake_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(
        get_current_stream=lambda: types.SimpleNamespace(ptr=0x9000)))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    assert _current_stream({None}) is None
    assert _current_stream({"torch", "cupy"})(1) == 0x7001
    assert _current_stream({"cupy", None})(0) == 0x9000
    run = fake_launcher(TABLE, stream=None)
    run.ordinal = 2
    assert run.stream_for({"torch"}) == 0x7002 and run.stream_for({None}) == 0
    run.config = LaunchConfig(1, 32, stream=5)
    assert run.stream_for({"torch"}) == 5
