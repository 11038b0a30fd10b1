"""Argument packing against fabricated parameter tables (what cuFuncGetParamInfo reports)."""
import struct

import numpy as np
import pytest

import tmaflow as tf
from tmaflow.memory import DeviceArray, free_epoch
from tmaflow.params import ArgPacker, Param
from tmaflow.tensormap import TensorMap, TensorMapSpec


def table(*sizes, align=True):
    out, off = [], 0
    for i, s in enumerate(sizes):
        a = min(s, 8) if align else 1
        off = -(-off // a) * a if s != 128 else -(-off // 64) * 64
        out.append(Param(i, off, s))
        off += s
    return out


def read(packer):
    return bytes(packer.buffer.raw[:packer.total])


def fake_map(tag=0):
    arr = DeviceArray(0x7000_0000, (64, 64), "float32")
    spec = TensorMapSpec.tiled("float32", (64, 64), (8, 8), address=arr.ptr)
    return TensorMap(spec, arr, bytes((tag + i) % 256 for i in range(128)))


def test_layout_and_values():
    params = table(128, 1, 2, 4, 8, 4, 8, 8)
    p = ArgPacker(params)
    tm = fake_map(3)
    arr = DeviceArray(0x1234_5678_9ABC, (4,), "float32")
    p.pack((tm, np.int8(-2), np.uint16(65535), -7, 2**40 + 1, 1.5, np.float64(-3.25), arr))
    raw = read(p)
    assert raw[0:128] == bytes(tm)
    assert struct.unpack_from("<b", raw, params[1].offset)[0] == -2
    assert struct.unpack_from("<H", raw, params[2].offset)[0] == 65535
    assert struct.unpack_from("<i", raw, params[3].offset)[0] == -7
    assert struct.unpack_from("<q", raw, params[4].offset)[0] == 2**40 + 1
    assert struct.unpack_from("<f", raw, params[5].offset)[0] == 1.5
    assert struct.unpack_from("<d", raw, params[6].offset)[0] == -3.25
    assert struct.unpack_from("<Q", raw, params[7].offset)[0] == 0x1234_5678_9ABC


def test_fast_path_repacks_new_values(rng):
    p = ArgPacker(table(128, 4, 4, 8))
    a, b = fake_map(1), fake_map(2)
    for _ in range(5):
        x, y = int(rng.integers(-2**31, 2**31)), float(rng.standard_normal())
        z = int(rng.integers(0, 2**62))
        tm = a if x % 2 else b
        p.pack((tm, x, y, z))
        raw = read(p)
        assert raw[:128] == bytes(tm)
        assert struct.unpack_from("<ifq", raw, 128) == (x, np.float32(y), z)


def test_unsigned_range_and_overflow():
    p = ArgPacker(table(4))
    p.pack((5,))
    p.pack((2**32 - 1,))  # needs the unsigned range: handled by the checked path
    assert struct.unpack_from("<I", read(p))[0] == 2**32 - 1
    with pytest.raises(tf.LaunchError, match=r"argument 0: int 4294967296 does not fit the 4-byte parameter"):
        p.pack((2**32,))


@pytest.mark.parametrize("args,msg", [
    ((1, 2), r"the kernel takes 3 arguments \(128 B, 8 B, 4 B\) but 2 were given"),
    ((DeviceArray(0x1000, (4,), "float32"), DeviceArray(0x1000, (4,), "float32"), 1),
     r"argument 0: a device array passes an 8-byte pointer but the kernel parameter is 128 bytes"),
    ((None, 0, 0), r"argument 0: cannot pass NoneType None to a 128-byte parameter"),
    (("fake", DeviceArray(0x1000, (4,), "float32"), np.float64(1)),
     r"argument 2: numpy.float64 \(8 B\) is 8 bytes but the kernel parameter is 4 bytes"),
    (("fake", np.zeros(3), 1), r"argument 1: a host numpy array \(shape \(3,\)\) cannot be passed"),
    (("fake", fake_map(), 1), r"argument 1: a TensorMap is 128 bytes but the kernel parameter is 8"),
    (("fake", [1], 1), r"argument 1: cannot pass list \[1\] to a 8-byte parameter"),
    (("fake", 0, b"abc"), r"argument 2: 3 raw bytes given for a 4-byte parameter"),
])
def test_mismatches_name_index_and_sizes(args, msg):
    p = ArgPacker(table(128, 8, 4))
    args = tuple(fake_map() if isinstance(a, str) and a == "fake" else a for a in args)
    with pytest.raises(tf.LaunchError, match=msg):
        p.pack(args)


def test_type_change_after_fast_path_is_still_checked():
    p = ArgPacker(table(8, 4))
    p.pack((DeviceArray(0x2000, (4,), "float32"), 1))
    with pytest.raises(tf.LaunchError, match=r"argument 1: numpy.int64 \(8 B\) is 8 bytes"):
        p.pack((DeviceArray(0x2000, (4,), "float32"), np.int64(1)))


def test_freed_array_is_caught_after_fast_path():
    class Owner:  # stands for a tmaflow allocation that can die
        alive = True

    from tmaflow import memory

    arr = DeviceArray(0x3000, (4,), "float32")
    p = ArgPacker(table(8))
    p.pack((arr,))
    memory._Allocation  # the real owner type; emulate its death through the epoch + alive
    arr.owner = object.__new__(memory._Allocation)
    arr.owner.__dict__.update(_finalizer=type("F", (), {"alive": False})(), generation=0,
                              device=type("D", (), {"generation": 0})())
    free_epoch[0] += 1  # what a free does
    with pytest.raises(tf.LaunchError, match=r"argument 0: DeviceArray.* was freed before the launch"):
        p.pack((arr,))


def test_float_sizes():
    p = ArgPacker(table(2, 4, 8))
    p.pack((0.5, 0.25, 0.125))
    assert struct.unpack_from("<e", read(p), 0)[0] == 0.5
    assert struct.unpack_from("<fd", read(p), 4) == (0.25, 0.125)
    with pytest.raises(tf.LaunchError, match=r"argument 0: cannot pack float 0.5 into a 1-byte parameter"):
        ArgPacker(table(1)).pack((0.5,))


def test_parameter_space_limit():
    with pytest.raises(tf.LaunchError, match=r"parameters take 32768 bytes, over the 32764-byte limit"):
        ArgPacker([Param(0, 0, 32768)])


@pytest.mark.parametrize("value,msg", [(0, r"grid=0 must have 1-3 extents"), ("x", r"grid='x' must be an int"),
                                       ((1, 2, 3, 4), r"grid=\(1, 2, 3, 4\) must have"),
                                       ((1.5, "a"), r"grid=\(1.5, 'a'\) must be an int")])
def test_launch_dims_messages(value, msg):
    from tmaflow.kernel import _dims

    with pytest.raises(tf.LaunchError, match=msg):
        _dims("grid", value)
    assert _dims("grid", (4, 2)) == (4, 2, 1) and _dims("grid", 7) == (7, 1, 1)


def _fake_launcher(params):
    """A Launcher whose driver call is recorded instead of made."""
    from tmaflow.kernel import Launcher

    launcher = object.__new__(Launcher)
    launcher.packer = ArgPacker(params)
    launcher._pack, launcher._watch = launcher.packer.pack, None
    launcher.config = launcher._function = None
    launcher.calls = []
    launcher._launch = lambda cfg, fn, kp, extra: (launcher.calls.append(read(launcher.packer)), (0,))[1]
    return launcher


def test_generated_launch_path():
    run = _fake_launcher([Param(0, 0, 8), Param(1, 8, 4)])
    arr = DeviceArray(0x5000, (4,), "float32")
    run(arr, 7)
    run(arr, 8)  # generated path
    assert type(run).__call__.__qualname__ == "__call__" and len(run.calls) == 2
    assert struct.unpack("<Qi", run.calls[1][:12]) == (0x5000, 8)
    run(arr, 2**32 - 1)  # needs the unsigned range: falls back to the checked path
    assert struct.unpack_from("<I", run.calls[2], 8)[0] == 2**32 - 1
    with pytest.raises(tf.LaunchError, match=r"argument 1: numpy.float64"):
        run(arr, np.float64(1))
    with pytest.raises(tf.LaunchError, match=r"takes 2 arguments"):
        run(arr)
    assert len(run.calls) == 3
    free_epoch[0] += 1  # something was freed: the next call is checked again, then fast again
    run(arr, 9)
    run(arr, 10)
    assert struct.unpack_from("<i", run.calls[-1], 8)[0] == 10 and len(run.calls) == 5
