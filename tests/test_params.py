"""Argument packing against fabricated parameter tables (what cuFuncGetParamInfo reports)."""
import struct

import numpy as np
import pytest

import tmaflow as tf
from tmaflow.runtime.memory import DeviceArray
from tmaflow.launch.params import ArgPacker, Param
from tmaflow.tma.tensormap import TensorMap
from tmaflow.tma.spec import TensorMapSpec


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
    (("fake", DeviceArray(0x1000, (4,), "float32"), np.float64(1)),
     r"argument 2: numpy.float64 \(8 B\) is 8 bytes but the kernel parameter is 4 bytes"),
    (("fake", np.zeros(3), 1), r"argument 1: a host numpy array \(shape \(3,\)\) cannot be passed"),
    (("fake", fake_map(), 1), r"argument 1: a TensorMap is 128 bytes but the kernel parameter is 8"),
    (("fake", [1], 1), r"argument 1: cannot pass list \[1\] to a 8-byte parameter"),
    ((None, 0, 0), r"argument 0: None can only stand for a null pointer"),
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




SIGNATURE = r"""
#include <tmaflow.cuh>
struct Pair { int a; float b; };
extern "C" __global__ void sig(const __grid_constant__ CUtensorMap m, float* p, const int* q,
                               int i, unsigned u, long long l, float f, double d, char c,
                               bool b, Pair pair, unsigned long long word) {}
"""


@pytest.fixture(scope="module")
def sig_kernel():
    return tf.Kernel(SIGNATURE, "sig")


def test_typed_table_from_ptx_and_source(sig_kernel):
    got = [(p.kind, p.signed, p.offset, p.size) for p in sig_kernel.params]
    assert got == [("tensormap", None, 0, 128), ("pointer", None, 128, 8), ("pointer", None, 136, 8),
                   ("int", True, 144, 4), ("int", False, 148, 4), ("int", True, 152, 8),
                   ("float", None, 160, 4), ("float", None, 168, 8), ("int", True, 176, 1),
                   ("int", False, 177, 1), ("bytes", None, 180, 8), ("int", False, 192, 8)]
    assert sig_kernel.params[1].ctype == "float* p"


def _good(arr, tm):
    return [tm, arr, None, -3, 2**32 - 1, 2**40, 2, 1.5, np.int8(-4), True, b"\1" * 8, 2**64 - 1]


def test_check_args_packs_without_a_gpu(sig_kernel, rng):
    arr = DeviceArray(int(rng.integers(1, 2**40)) * 16, (4,), "float32")
    tm = fake_map(7)
    raw = sig_kernel.check_args(*_good(arr, tm))
    assert raw[:128] == bytes(tm)
    assert struct.unpack_from("<QQiIqfdbB", raw, 128)[:2] == (arr.ptr, 0)  # None: a null pointer
    assert struct.unpack_from("<iI", raw, 144) == (-3, 2**32 - 1)
    assert struct.unpack_from("<f", raw, 160)[0] == 2.0  # an int for a float parameter is a float
    assert struct.unpack_from("<Q", raw, 192)[0] == 2**64 - 1


@pytest.mark.parametrize("index,value,msg", [
    (1, 1.5, r"argument 1 \(float\* p\): float 1.5 given for a pointer parameter"),
    (3, 2.0, r"argument 3 \(int i\): float 2.0 given for an integer parameter"),
    (4, -1, r"argument 4 \(unsigned u\): int -1 does not fit .* \[0, 4294967295\]"),
    (3, 2**31, r"argument 3 \(int i\): int 2147483648 does not fit .* \[-2147483648, 2147483647\]"),
    (6, np.int32(1), r"argument 6 \(float f\): numpy.int32 \(4 B\) given for a float parameter"),
    (1, np.float64(1), r"argument 1 \(float\* p\): numpy.float64 \(8 B\) given for a pointer"),
    (0, "array", r"argument 0 \(const __grid_constant__ CUtensorMap m\): a device array passes an 8-byte pointer"),
    (1, "map", r"argument 1 \(float\* p\): a TensorMap is 128 bytes but the kernel parameter is 8"),
    (3, None, r"argument 3 \(int i\): None can only stand for a null pointer"),
    (7, True, r"argument 7 \(double d\): cannot pack bool True into a 8-byte float"),
    (10, b"123", r"argument 10 \(Pair pair\): 3 raw bytes given for a 8-byte parameter"),
])
def test_check_args_names_kind_mismatches(sig_kernel, index, value, msg):
    arr, tm = DeviceArray(0x10000, (4,), "float32"), fake_map()
    args = _good(arr, tm)
    args[index] = {"array": arr, "map": tm}.get(value, value) if isinstance(value, str) else value
    with pytest.raises(tf.LaunchError, match=msg):
        sig_kernel.check_args(*args)


def test_check_args_counts(sig_kernel):
    with pytest.raises(tf.LaunchError, match=r"the kernel takes 12 arguments \(const __grid_constant__ "
                                             r"CUtensorMap m, float\* p, .*\) but 2 were given"):
        sig_kernel.check_args(1, 2)


def test_signature_reading_falls_back_to_ptx_for_macros():
    k = tf.Kernel("#include <tmaflow.cuh>\n#define ARGS float* p, int n\n"
                  "extern \"C\" __global__ void m(ARGS) {}", "m")
    assert [(p.kind, p.size) for p in k.params] == [("word", 8), ("int", 4)]
    with pytest.raises(tf.LaunchError, match=r"argument 0: float 1.0 given for a 64-bit integer/pointer"):
        k.check_args(1.0, 3)
    assert struct.unpack("<Qi", k.check_args(DeviceArray(0x400, (1,), "float32"), 3)[:12]) == (0x400, 3)
