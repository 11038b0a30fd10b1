"""The bad-input battery: every case is (area, what, action, expected error, message pattern).

``tests/test_battery.py`` runs the cases that need no GPU everywhere, and every case on a
Hopper GPU followed by a correct launch; ``tools/docs/battery_table.py`` renders the table in
docs/bad-input-battery.md.
"""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

import tmaflow as tf
from tmaflow.kernels import examples as ex
from kernel_sources import source
from tmaflow.kernels.attention_entry import attention, attention_cp_async
from tmaflow.kernels.matmul import GemmConfig, gemm, gemm_plan
from tmaflow.runtime.memory import DeviceArray
from tmaflow.launch.params import ArgPacker, Param

T = tf.TensorMapSpec.tiled
I2C = tf.TensorMapSpec.im2col
E = tf.TensorMapError
L = tf.LayoutError
LE = tf.LaunchError
CE = tf.CompileError
TE = tf.TmaflowError


@dataclass
class Case:
    area: str
    what: str
    action: Callable
    error: type
    match: str
    gpu: bool = False


CASES: list[Case] = []


def case(area, what, error, match, gpu=False):
    def register(fn):
        CASES.append(Case(area, what, fn, error, match, gpu))
        return fn
    return register


def cpu(area, what, error, match, action):
    CASES.append(Case(area, what, action, error, match, False))


def gpu(area, what, error, match, action):
    CASES.append(Case(area, what, action, error, match, True))


A = "tensor map"
cpu(A, "unknown dtype name", E, r"dtype='complex64' is not a supported", lambda: T("complex64", (8, 8), (8, 8)))
cpu(A, "dtype that is not a dtype", E, r"dtype=\[1\] is not a supported", lambda: T([1], (8, 8), (8, 8)))
cpu(A, "packed Blackwell type on sm_90", E, r"packed Blackwell type", lambda: T("16u6_align16b", (8, 64), (8, 64)))
cpu(A, "rank 0", E, r"rank=0", lambda: T("float32", (), ()))
cpu(A, "rank 6", E, r"rank=6", lambda: T("float32", (2,) * 5 + (4,), (1,) * 5 + (4,)))
cpu(A, "zero extent", E, r"shape\[0\]=0 must be in \[1, 2\^32\]", lambda: T("float32", (0, 8), (1, 8)))
cpu(A, "negative extent", E, r"shape\[0\]=-4", lambda: T("float32", (-4, 8), (1, 8)))
cpu(A, "extent over 2^32", E, r"shape\[0\]=4294967297", lambda: T("uint8", (2**32 + 1, 16), (1, 16), strides=(16, 1)))
cpu(A, "float in the shape", E, r"shape\[0\]=2.5 must be an int", lambda: T("float32", (2.5, 8), (1, 8)))
cpu(A, "box of the wrong rank", E, r"box=\(4,\) has 1 entries; the tensor has rank 2", lambda: T("float32", (8, 8), (4,)))
cpu(A, "box extent 0", E, r"box\[0\]=0 must be in \[1, 256\]", lambda: T("float32", (8, 8), (0, 4)))
cpu(A, "box extent 257", E, r"box\[0\]=257", lambda: T("float32", (300, 8), (257, 4)))
cpu(A, "inner box not 16 B", E, r"= 12 B must be a multiple of 16 B", lambda: T("float32", (8, 8), (4, 3)))
cpu(A, "inner box wider than the swizzle span", E, r"exceeds the 64B swizzle span", lambda: T("float32", (8, 64), (4, 32), swizzle="64B"))
cpu(A, "box footprint over 228 KB", E, r"at most 233472 B", lambda: T("float32", (512, 64, 8), (229, 64, 4)))
cpu(A, "element stride 0", E, r"element_strides\[1\]=0", lambda: T("float32", (8, 8), (4, 4), element_strides=(1, 0)))
cpu(A, "element stride 9", E, r"element_strides\[0\]=9", lambda: T("float32", (8, 8), (4, 4), element_strides=(9, 1)))
cpu(A, "element strides of the wrong rank", E, r"element_strides=\(1,\) has 1 entries", lambda: T("float32", (8, 8), (4, 4), element_strides=(1,)))
cpu(A, "strides of the wrong rank", E, r"strides=\(4,\) has 1 entries", lambda: T("float32", (8, 8), (4, 4), strides=(4,)))
cpu(A, "non-contiguous inner dim", E, r"inner dim must be contiguous", lambda: T("float32", (8, 8), (4, 4), strides=(64, 8)))
cpu(A, "row stride not a multiple of 16", E, r"strides\[0\]=36 B must be a positive multiple of 16", lambda: T("float32", (8, 8), (4, 4), strides=(36, 4)))
cpu(A, "negative stride", E, r"strides\[0\]=-64", lambda: T("float32", (8, 16), (4, 4), strides=(-64, 4)))
cpu(A, "stride 0 (broadcast rows)", E, r"strides\[0\]=0 B: rows would overlap", lambda: T("float32", (8, 16), (4, 4), strides=(0, 4)))
cpu(A, "rows overlapping", E, r"rows would overlap", lambda: T("float32", (8, 16), (4, 4), strides=(32, 4)))
cpu(A, "stride of 2^40", E, r"must be < 2\^40", lambda: T("uint8", (2, 16), (1, 16), strides=(2**40, 1)))
cpu(A, "32B interleave stride not 32-aligned", E, r"multiple of 32 B", lambda: T("uint8", (2, 4, 48), (1, 4, 32), strides=(192, 48, 1), interleave="32B", swizzle="32B"))
cpu(A, "interleave on rank 2", E, r"needs rank >= 3", lambda: T("float32", (8, 8), (4, 4), interleave="16B"))
cpu(A, "32B interleave without 32B swizzle", E, r"requires swizzle='32B'", lambda: T("float32", (4, 8, 8), (1, 4, 8), interleave="32B"))
cpu(A, "NaN fill on an integer type", E, r"oob_fill='nan' needs a floating-point dtype", lambda: T("uint16", (8, 8), (4, 8), oob_fill="nan"))
cpu(A, "unknown swizzle", E, r"swizzle='256B' is not one of", lambda: T("float32", (8, 8), (4, 4), swizzle="256B"))
cpu(A, "unknown interleave", E, r"interleave='64B' is not one of", lambda: T("float32", (4, 8, 8), (1, 4, 4), interleave="64B"))
cpu(A, "unknown L2 promotion", E, r"l2_promotion='1KB' is not one of", lambda: T("float32", (8, 8), (4, 4), l2_promotion="1KB"))
cpu(A, "unknown OOB fill", E, r"oob_fill='ones' is not one of", lambda: T("float32", (8, 8), (4, 4), oob_fill="ones"))
cpu(A, "misaligned address (offset slice)", E, r"address=4100 must be 16-byte aligned", lambda: T("float32", (8, 8), (4, 4), address=4100))
cpu(A, "negative address", E, r"address=-16", lambda: T("float32", (8, 8), (4, 4), address=-16))
cpu(A, "32B interleave address 16-aligned", E, r"must be 32-byte aligned", lambda: T("float32", (4, 8, 8), (1, 4, 8), interleave="32B", swizzle="32B", address=4112))
IM = dict(lower_corner=(0, 0), upper_corner=(0, 0), channels_per_pixel=16, pixels_per_column=32)
cpu(A, "im2col of rank 2", E, r"rank=2", lambda: I2C("float16", (8, 16), **dict(IM, lower_corner=(), upper_corner=())))
cpu(A, "im2col corner out of range", E, r"lower_corner\[1\]=200 must be in \[-128, 127\]", lambda: I2C("float16", (2, 8, 8, 16), **dict(IM, lower_corner=(0, 200))))
cpu(A, "im2col corners of the wrong rank", E, r"upper_corner=\(0,\) has 1 entries", lambda: I2C("float16", (2, 8, 8, 16), **dict(IM, upper_corner=(0,))))
cpu(A, "im2col 0 channels", E, r"channels_per_pixel=0", lambda: I2C("float16", (2, 8, 8, 16), **dict(IM, channels_per_pixel=0)))
cpu(A, "im2col 2048 pixels per column", E, r"pixels_per_column=2048", lambda: I2C("float16", (2, 8, 8, 16), **dict(IM, pixels_per_column=2048)))
cpu(A, "im2col empty pixel box", E, r"pixel box along spatial dim 1 is empty", lambda: I2C("float16", (2, 8, 8, 16), **dict(IM, lower_corner=(0, 9))))
cpu(A, "im2col channels not 16 B", E, r"channels_per_pixel=6 x 2 B = 12 B", lambda: I2C("float16", (2, 8, 8, 16), **dict(IM, channels_per_pixel=6)))

B = "shared layout"
SPEC = T("bfloat16", (1024, 1024), (128, 64), swizzle="128B")
cpu(B, "pipeline with 0 stages", L, r"stages=0", lambda: tf.Pipeline("p", stages=0, tiles=[SPEC]))
cpu(B, "pipeline with 33 stages", L, r"stages=33", lambda: tf.Pipeline("p", stages=33, tiles=[SPEC]))
cpu(B, "pipeline with 0 consumers", L, r"consumers=0", lambda: tf.Pipeline("p", stages=2, tiles=[SPEC], consumers=0))
cpu(B, "pipeline without tiles", L, r"tiles is empty", lambda: tf.Pipeline("p", stages=2, tiles=[]))
cpu(B, "multicast along z", L, r"multicast\[0\]='z'", lambda: tf.Pipeline("p", stages=2, tiles=[SPEC], cluster=(2, 1, 1), multicast=["z"]))
cpu(B, "multicast without a cluster", L, r"has one CTA along x", lambda: tf.Pipeline("p", stages=2, tiles=[SPEC], multicast=["x"]))
cpu(B, "multicast list of the wrong length", L, r"multicast=\('x', None\) has 2 entries for 1 tiles", lambda: tf.Pipeline("p", stages=2, tiles=[SPEC], cluster=(2, 1, 1), multicast=["x", None]))
cpu(B, "cluster of 32 CTAs", L, r"at most 16 CTAs", lambda: tf.Pipeline("p", stages=2, tiles=[SPEC], cluster=(8, 4, 1)))
cpu(B, "name that is not an identifier", L, r"name='my pipe' must be a C identifier", lambda: tf.Pipeline("my pipe", stages=2, tiles=[SPEC]))
cpu(B, "barrier with 0 arrivals", L, r"arrivals=0", lambda: tf.Barrier("b", arrivals=0))
cpu(B, "barrier with 2^20 tx bytes", L, r"tx_bytes=1048576", lambda: tf.Barrier("b", tx_bytes=1 << 20))
cpu(B, "buffer of 0 bytes", L, r"nbytes=0", lambda: tf.Buffer("b", 0))
cpu(B, "buffer alignment not a power of two", L, r"align=96", lambda: tf.Buffer("b", 64, align=96))
cpu(B, "two items with one name", L, r"name 'x' is used twice", lambda: tf.SharedLayout([tf.Barrier("x"), tf.Buffer("x", 16)]))
cpu(B, "smem over the limit", L, r"over the 232448 B per-block limit", lambda: tf.SharedLayout([tf.Pipeline("p", stages=16, tiles=[SPEC])]))
cpu(B, "something that is not a plan item", L, r"is not a Pipeline, Barrier or Buffer", lambda: tf.SharedLayout([42]))
cpu(B, "stage over the tx-count range", L, r"over the mbarrier tx-count limit", lambda: tf.Pipeline("p", stages=1, tiles=[T("float32", (1024, 1024), (200, 256))] * 6))

C = "compile"
cpu(C, "syntax error", CE, r"NVRTC failed to compile kernel.cu", lambda: tf.Kernel("__global__ void k( { }", "k").cubin)
cpu(C, "undefined identifier", CE, r"\(1 error\)", lambda: tf.Kernel("__global__ void k(int* p) { p[0] = nope; }", "k").cubin)
cpu(C, "missing kernel name", CE, r"kernel name='other' is not a __global__ function of kernel.cu; kernels found: k", lambda: tf.Kernel("__global__ void k(int* p) { p[0] = 1; }", "other").cubin)
cpu(C, "missing include", CE, r"cannot open source file", lambda: tf.Kernel("#include <no_such_header.h>\n__global__ void k() {}", "k").cubin)
cpu(C, "unknown NVRTC option", CE, r"NVRTC refused the compile options of kernel.cu: unrecognized option --no-such-flag", lambda: tf.Kernel("__global__ void k() {}", "k", options=("--no-such-flag",)).cubin)
cpu(C, "empty source", TE, r"source must be non-empty", lambda: tf.Kernel("", "k"))
cpu(C, "kernel name that is not a string", TE, r"name=None must name", lambda: tf.Kernel("__global__ void k() {}", None))
cpu(C, "nonsense arch", TE, r"arch='hopper' must look like 'sm_90a'", lambda: tf.Kernel("__global__ void k() {}", "k", arch="hopper"))
cpu(C, "layout that is not a SharedLayout", TE, r"must be a tf.SharedLayout", lambda: tf.Kernel("__global__ void k() {}", "k", layout={"a": 1}))
cpu(C, "file that does not exist", TE, r"Kernel.from_file: cannot read path='/no/such/kernel.cu'", lambda: tf.Kernel.from_file("/no/such/kernel.cu", "k"))
cpu(C, "template never instantiated", CE, r"kernel|NVRTC", lambda: tf.Kernel("template <int N> __global__ void k(int* p) { p[0] = N; }", "k<>").cubin)

D = "arguments (fabricated parameter table)"
P3 = [Param(0, 0, 128), Param(1, 128, 8), Param(2, 136, 4)]
FAKE = DeviceArray(0x7000_0000, (64, 64), "float32")
cpu(D, "too few arguments", LE, r"takes 3 arguments .* but 1 were given", lambda: ArgPacker(P3).pack((1,)))
cpu(D, "too many arguments", LE, r"takes 3 arguments .* but 4 were given", lambda: ArgPacker(P3).pack((1, 2, 3, 4)))
cpu(D, "pointer where a tensor map goes", LE, r"argument 0: a device array passes an 8-byte pointer", lambda: ArgPacker(P3).pack((FAKE, FAKE, 1)))
cpu(D, "None", LE, r"argument 0: None can only stand for a null pointer; this is a 128-byte parameter", lambda: ArgPacker(P3).pack((None, FAKE, 1)))
cpu(D, "a string", LE, r"argument 2: cannot pass str 'x'", lambda: ArgPacker([Param(0, 0, 4), Param(1, 8, 8), Param(2, 16, 4)]).pack((1, FAKE, "x")))
cpu(D, "int overflowing its parameter", LE, r"int 70000 does not fit the 2-byte parameter", lambda: ArgPacker([Param(0, 0, 2)]).pack((70000,)))
cpu(D, "negative int too small", LE, r"int -129 does not fit the 1-byte parameter", lambda: ArgPacker([Param(0, 0, 1)]).pack((-129,)))
cpu(D, "numpy scalar of the wrong size", LE, r"numpy.float64 \(8 B\) is 8 bytes but the kernel parameter is 4", lambda: ArgPacker([Param(0, 0, 4)]).pack((np.float64(1),)))
cpu(D, "float into a 1-byte parameter", LE, r"cannot pack float 0.5 into a 1-byte parameter", lambda: ArgPacker([Param(0, 0, 1)]).pack((0.5,)))
cpu(D, "raw bytes of the wrong length", LE, r"5 raw bytes given for a 8-byte parameter", lambda: ArgPacker([Param(0, 0, 8)]).pack((b"12345",)))
cpu(D, "host numpy array", LE, r"a host numpy array \(shape \(2, 2\)\) cannot be passed", lambda: ArgPacker([Param(0, 0, 8)]).pack((np.zeros((2, 2)),)))
cpu(D, "a list", LE, r"cannot pass list", lambda: ArgPacker([Param(0, 0, 8)]).pack(([1, 2],)))
cpu(D, "parameters over 32764 bytes", LE, r"over the 32764-byte limit", lambda: ArgPacker([Param(0, 0, 40000)]))

F = "arrays"
cpu(F, "host numpy array as a device array", TE, r"got a host numpy array of shape \(3,\)", lambda: tf.as_array(np.zeros(3)))
cpu(F, "a list as a device array", TE, r"list is not a device array", lambda: tf.as_array([1.0]))
cpu(F, "None as a device array", TE, r"NoneType is not a device array", lambda: tf.as_array(None))
cpu(F, "reshape to the wrong size", TE, r"does not hold 4096 elements", lambda: FAKE.reshape(10, 10))
cpu(F, "reshape of a strided view", TE, r"not contiguous", lambda: DeviceArray(0x1000, (4, 4), "float32", strides=(32, 4)).reshape(16))
cpu(F, "unknown dtype for an array", E, r"dtype='float128' is not a supported", lambda: DeviceArray(0x1000, (4,), "float128"))

# --- cases that need the GPU ------------------------------------------------------------------
G = "launch (GPU)"


def _probe(name):
    return tf.Kernel(source("probe"), name, filename="probe.cu")


def _echo_args():
    base = tf.zeros((64, 64), "float32")
    return [tf.TensorMap.tiled(base, (16, 16)), np.int8(1), np.uint16(1), 1, 1, 1.0, 1.0, base, base,
            tf.empty(24, "uint64")]


def _with(index, value):
    args = _echo_args()
    args[index] = value
    _probe("echo_args").launch(*args, grid=1, block=32)


def _big(**kw):
    out = tf.empty(64, "uint32")
    _probe("big_smem").launch(out, 256, 1, **{"grid": 1, "block": 32, **kw})


gpu(G, "host numpy array as an argument", LE, r"argument 7 \([^)]*\): a host numpy array", lambda: _with(7, np.zeros(4, np.float32)))
gpu(G, "tensor map into a pointer parameter", LE, r"argument 8 \([^)]*\): a TensorMap is 128 bytes but the kernel parameter is 8", lambda: _with(8, _echo_args()[0]))
gpu(G, "array into a tensor-map parameter", LE, r"argument 0 \([^)]*\): a device array passes an 8-byte pointer", lambda: _with(0, tf.zeros(4)))
gpu(G, "int too wide for int8", LE, r"argument 1 \([^)]*\): numpy.int32 \(4 B\) is 4 bytes but the kernel parameter is 1", lambda: _with(1, np.int32(1)))
gpu(G, "int overflowing int32", LE, r"argument 3 \([^)]*\): int 4294967296 does not fit", lambda: _with(3, 2**32))
gpu(G, "wrong argument count", LE, r"takes 10 arguments", lambda: _probe("echo_args").launch(1, 2, grid=1, block=32))
gpu(G, "freed array as an argument", LE, r"argument 7 \([^)]*\): .* was freed", lambda: _with(7, _freed()))
gpu(G, "tensor map whose array was freed", LE, r"its array was freed", lambda: _with(0, _dead_map()))
gpu(G, "new tensor map over a freed array", E, r"was freed", lambda: tf.TensorMap.tiled(_freed((16, 16)), (4, 4)))
gpu(G, "smem over the device limit", LE, r"exceeds the \d+ B per-block limit", lambda: _big(smem=300 * 1024))
gpu(G, "negative smem", LE, r"smem=-1 must be a non-negative int", lambda: _big(smem=-1))
gpu(G, "smem that is not an int", LE, r"smem=1.5 must be a non-negative int", lambda: _big(smem=1.5))
gpu(G, "grid of 0 blocks", LE, r"grid=0 must have 1-3 extents, each >= 1", lambda: _big(grid=0))
gpu(G, "block of 0 threads", LE, r"block=\(0, 1\)", lambda: _big(block=(0, 1)))
gpu(G, "grid with 4 dims", LE, r"grid=\(1, 1, 1, 1\)", lambda: _big(grid=(1, 1, 1, 1)))
gpu(G, "block of 2048 threads", LE, r"block=\(2048, 1, 1\): axis x has 2048 threads; the limit is 1024", lambda: _big(block=2048))
gpu(G, "grid that is not a number", LE, r"grid='x' must be an int or a tuple of 1-3 ints", lambda: _big(grid="x"))
gpu(G, "cluster not dividing the grid", LE, r"cluster=\(4, 1, 1\) does not divide grid=\(6, 1, 1\)", lambda: _big(grid=6, cluster=4))
gpu(G, "cluster of 32", LE, r"at most 8 \(portable\) or 16", lambda: _big(grid=32, cluster=32))
gpu(G, "cluster of 0", LE, r"cluster=0 must have 1-3 extents", lambda: _big(cluster=0))
gpu(G, "cluster conflicting with __cluster_dims__", LE, r"conflicts with __cluster_dims__\(2, 1, 1\)", lambda: tf.Kernel(source("seeds"), "dsmem_kernel", filename="seeds.cu").launch(tf.empty(8, "int32"), grid=8, block=32, cluster=4))
gpu(G, "stream of the wrong type", LE, r"stream='fast' \(str\) is not a stream", lambda: _big(stream="fast"))
gpu(G, "closed stream", LE, r"was closed", lambda: _big(stream=_closed_stream()))
gpu(G, "kernel built for another arch", LE, r"built for sm_100a but device \d+ is", lambda: tf.Kernel("__global__ void k() {}", "k", arch="sm_100a").launch(grid=1, block=1))
gpu(G, "non-Hopper device", LE, r"tmaflow kernels need a Hopper GPU", lambda: _probe("big_smem").bind(grid=1, block=1, device=_FakeAmpere()))
gpu(G, "device ordinal out of range", TE, r"Device\(ordinal=99\): must be an int in \[0, \d+\]", lambda: tf.Device(99))
gpu(G, "device ordinal that is not an int", TE, r"Device\(ordinal='0'\)", lambda: tf.Device("0"))
gpu(G, "no driver at all (simulated)", tf.DriverNotFoundError, r"no usable CUDA driver: simulated", lambda: _without_driver())

H = "arrays and examples (GPU)"
gpu(H, "numpy() of a freed array", TE, r"was freed", lambda: _freed().numpy())
gpu(H, "numpy() of a strided view", TE, r"are not contiguous", lambda: tf.as_array(_torch()[::2]).numpy())
gpu(H, "copy_from of the wrong size", TE, r"does not fit", lambda: tf.empty(4).copy_from(np.zeros(5, np.float32)))
gpu(H, "from_numpy into a narrower dtype", TE, r"cannot hold bfloat16", lambda: tf.from_numpy(np.zeros(4, np.float32), dtype="bfloat16"))
gpu(H, "zero-size tensor map", E, r"is empty; a tensor map needs every extent >= 1", lambda: tf.TensorMap.tiled(tf.empty((0, 16)), (1, 16)))
gpu(H, "misaligned torch view (offset slice)", E, r"must be 16-byte aligned", lambda: tf.TensorMap.tiled(_torch()[:, 1:17], (8, 16)))
gpu(H, "misaligned cupy view (offset slice)", E, r"must be 16-byte aligned", lambda: tf.TensorMap.tiled(_cupy()[:, 3:35], (8, 16)))
gpu(H, "transposed torch view", E, r"inner dim must be contiguous", lambda: tf.TensorMap.tiled(_torch().t(), (8, 16)))
gpu(H, "copy into an output of another shape", TE, r"copy: out must be a \(16, 16\) float32 array \(got \(8, 8\)", lambda: ex.copy(tf.zeros((16, 16)), tf.zeros((8, 8))))
gpu(H, "transpose of int8", TE, r"needs a 2-D 4-byte array", lambda: ex.transpose(tf.zeros((64, 64), "int8")))
gpu(H, "softmax of bfloat16", TE, r"needs a 2-D float32 array", lambda: ex.softmax(tf.zeros((8, 256), "bfloat16")))
gpu(H, "reduce_add with mismatched shapes", TE, r"must be \(P, M, N\) over out", lambda: ex.reduce_add(tf.zeros((2, 8, 8)), tf.zeros((8, 16))))
gpu(H, "axpb of a ragged length", TE, r"multiple of 4096 elements", lambda: ex.axpb(tf.zeros(5000), 1.0, 0.0))
gpu(H, "axpb with an unknown method", TE, r"method='fast' must be one of 'tma', 'ldgsts'", lambda: ex.axpb(tf.zeros(4096), 1.0, 0.0, method="fast"))
gpu(H, "broadcast with a cluster not dividing the CTAs", TE, r"must divide the 3 CTAs|cluster=2", lambda: ex.broadcast_scale(tf.zeros((96, 256)), tf.zeros((64, 256)), cluster=2))
gpu(H, "broadcast with 16-row tiles", TE, r"wrows=16 must be 32 or 64", lambda: ex.broadcast_scale(tf.zeros((64, 256)), tf.zeros((64, 256)), wrows=16))
gpu(H, "replace_address with another shape", E, r"replace_address: array shape=\(8, 16\)", lambda: tf.TensorMap.tiled(tf.zeros((16, 16)), (4, 16)).replace_address(tf.zeros((8, 16))))

G = "gemm"


_FAKE = itertools.count(1 << 32, 1 << 24)


def _bf(shape, dtype="bfloat16", strides=None):
    return DeviceArray(next(_FAKE), shape, dtype, strides=strides)  # never dereferenced: checks fail first; one range each


cpu(G, "unknown layout", TE, r"layout='tn' must be one of \('nt', 'nn'\)", lambda: gemm(_bf((64, 32)), _bf((48, 32)), _bf((64, 48)), layout="tn"))
cpu(G, "float16 operand", TE, r"a must be bfloat16 or float8_e4m3fn \(got float16\)", lambda: gemm(_bf((64, 32), "float16"), _bf((48, 32)), _bf((64, 48))))
cpu(G, "K of a and b differ", TE, r"b must be \(N, K\) for layout 'nt'", lambda: gemm(_bf((64, 32)), _bf((48, 40)), _bf((64, 48))))
cpu(G, "float16 out (the result is bf16)", TE, r"out must be a \(64, 48\) bfloat16 array \(got \(64, 48\) float16\)", lambda: gemm(_bf((64, 32)), _bf((48, 32)), _bf((64, 48), "float16")))
cpu(G, "out of the wrong shape", TE, r"out must be a \(64, 48\) bfloat16 array", lambda: gemm(_bf((64, 32)), _bf((48, 32)), _bf((64, 40))))
cpu(G, "config with 120-column tiles", TE, r"bn=120 must be a multiple of 16 from 64 to 256", lambda: GemmConfig(bn=120))
cpu(G, "192-column tiles with 128-column epilogue rounds", TE, r"epi_cols=128 must be a multiple of 64 dividing bn=192", lambda: GemmConfig(bn=192))
cpu(G, "config with split_k=0", TE, r"split_k=0 must be in \[1, 64\]", lambda: GemmConfig(split_k=0))

A = "attention"
_q = (1, 2, 64, 128)
cpu(A, "float32 operands", TE, r"attention: q must be bfloat16 or float16 \(got float32\)", lambda: attention(_bf(_q, "float32"), _bf(_q, "float32"), _bf(_q, "float32")))
cpu(A, "fp16 q with bf16 k and v", TE, r"k is bfloat16 but q is float16; q, k and v must have one dtype", lambda: attention(_bf(_q, "float16"), _bf(_q), _bf(_q)))
cpu(A, "fp16 out for bf16 operands", TE, r"out must be a \(1, 2, 64, 128\) bfloat16 array", lambda: attention(_bf(_q), _bf(_q), _bf(_q), _bf(_q, "float16")))
cpu(A, "scale NaN", TE, r"scale=nan must be a positive finite float", lambda: attention(_bf(_q), _bf(_q), _bf(_q), scale=float("nan")))
cpu(A, "scale 0", TE, r"scale=0 must be a positive finite float", lambda: attention(_bf(_q), _bf(_q), _bf(_q), scale=0))
cpu(A, "causal as a string", TE, r"causal='yes' must be True or False", lambda: attention(_bf(_q), _bf(_q), _bf(_q), causal="yes"))
cpu(A, "head dim 72", TE, r"head_dim=72 is not supported; use a multiple of 16 from 32 to 256", lambda: attention(*(_bf((1, 2, 64, 72)),) * 3))
cpu(A, "k transposed (not contiguous)", TE, r"attention: k must be contiguous", lambda: attention(_bf(_q), _bf(_q, strides=(32768, 16384, 2, 128)), _bf(_q)))
cpu(A, "cp.async kernel given fp16", TE, r"attention_cp_async: q must be bfloat16 \(got float16\)", lambda: attention_cp_async(*(_bf(_q, "float16"),) * 3))
cpu(A, "cp.async kernel at head dim 256", TE, r"attention_cp_async: head_dim=256 is not supported; use one of \(64, 128\)", lambda: attention_cp_async(*(_bf((1, 2, 64, 256)),) * 3))
cpu(A, "cp.async kernel, 3 query heads over 2 kv heads", TE, r"attention_cp_async: 3 query heads must be a multiple of the 2", lambda: attention_cp_async(_bf((1, 3, 64, 64)), _bf((1, 2, 64, 64)), _bf((1, 2, 64, 64))))


class _FakeAmpere(tf.Device):
    """A device of another architecture (a Device without a driver behind it)."""
    ordinal, name, compute_capability, is_hopper, arch = 0, "NVIDIA A100 (simulated)", (8, 0), False, "sm_80"

    def __new__(cls):  # the real constructor asks the driver
        return object.__new__(cls)

    def __init__(self):
        pass

    def activate(self):
        return self


def _freed(shape=(4,)):
    a = tf.zeros(shape, "float32")
    a.free()
    return a


def _dead_map():
    a = tf.zeros((64, 64), "float32")
    m = tf.TensorMap.tiled(a, (16, 16))
    a.free()
    return m


def _closed_stream():
    s = tf.Stream()
    s.close()
    return s


def _torch():
    import torch

    return torch.zeros((32, 64), device="cuda")


def _cupy():
    import cupy

    return cupy.zeros((32, 64), dtype=cupy.float32)


def _without_driver():
    from tmaflow.runtime import driver

    saved = dict(driver._init_state)
    driver._init_state["reason"] = "simulated"
    try:
        tf.empty((4,), "float32")
    finally:
        driver._init_state.clear()
        driver._init_state.update(saved)


# --- classes of hostile values, generated: every hostile value into every field ---------------
# Each must be a TmaflowError naming the field; none may leak a TypeError, OverflowError,
# AttributeError or numpy error, or pass silently.

def _gen():
    yield 1


HOSTILE = {"None": None, "a string": "abc", "a float": 2.5, "True": True, "NaN": float("nan"),
           "inf": float("inf"), "a generator": _gen(), "a nested list": [[1, 2]],
           "a numpy NaN": np.float64("nan"), "a dict": {"a": 1}}
for _name in ("int", "class", "template", "Smem", "tmaflow_layout", "__x", "a-b", "9lives", "",
              "uint32_t", "align", "total_bytes", "TMAFLOW_DEVICE", "name\n", "a\ud800"):
    cpu("layout names", f"{_name!r} as a name", L, r"name=", lambda n=_name: tf.SharedLayout([tf.Barrier(n)]))
cpu("layout names", "a pipeline whose generated names collide with a barrier", L, r"'ab_full' is used twice",
    lambda: tf.SharedLayout([tf.Pipeline("ab", stages=2, tiles=[SPEC]), tf.Barrier("ab_full")]))
cpu("layout names", "a pipeline and a buffer of one name", L, r"'ab' is used twice",
    lambda: tf.SharedLayout([tf.Pipeline("ab", stages=2, tiles=[SPEC]), tf.Buffer("ab", 64)]))
cpu("layout names", "a tile named after a pipeline constant", L, r"tile name 'tx' generates 'tx_bytes'",
    lambda: tf.Pipeline("ab", stages=2, tiles={"tx": SPEC}))
cpu("layout names", "two tiles generating one symbol", L, r"tile name 'a_box' generates 'a_box_stride'",
    lambda: tf.Pipeline("ab", stages=2, tiles={"a": SPEC, "a_box": SPEC}))
cpu("layout names", "a tile name that is a keyword", L, r"tile name='int'",
    lambda: tf.Pipeline("ab", stages=2, tiles={"int": SPEC}))

# tf.reference: every argument
RSPEC = T("float32", (16, 64), (8, 32))
RG = np.zeros((16, 64), np.float32)
for _what, _g in (("a list", RG.tolist()), ("an object array", RG.astype(object)),
                  ("a float64 array", RG.astype(np.float64)),
                  ("a 1-D array", RG.ravel()), ("None", None)):
    cpu("tf.reference: global arrays", f"np_global {_what}", TE, r"np_global",
        lambda g=_g: tf.reference.tma_load(g, RSPEC, (0, 0)))
cpu("tf.reference: global arrays", "store into a read-only array", TE, r"np_global .*read-only",
    lambda: tf.reference.tma_store(np.broadcast_to(np.float32(0), (16, 64)), RSPEC, (0, 0), np.zeros(RSPEC.smem_bytes, np.uint8)))
cpu("tf.reference: global arrays", "store into a transposed array", TE, r"np_global has strides .* inner axis must be contiguous",
    lambda: tf.reference.tma_store(np.zeros((64, 16), np.float32).T, RSPEC, (0, 0), np.zeros(RSPEC.smem_bytes, np.uint8)))
cpu("tf.reference: global arrays", "smem_base not 128-aligned", TE, r"smem_base=100 must be 128-byte aligned",
    lambda: tf.reference.tma_load(RG, RSPEC, (0, 0), smem_base=100))
cpu("tf.reference: global arrays", "background out of a byte's range", TE, r"background=300",
    lambda: tf.reference.tma_load(RG, RSPEC, (0, 0), background=300))
cpu("tf.reference: global arrays", "a coordinate outside s32", TE, r"coords\[0\]=2147483648 must fit a signed 32-bit int",
    lambda: tf.reference.tma_load(RG, RSPEC, (2**31, 0)))
cpu("tf.reference: global arrays", "a coordinate below s32", TE, r"coords\[1\]=-2147483664 must fit a signed 32-bit int",
    lambda: tf.reference.tma_load(RG, RSPEC, (0, -2**31 - 16)))
cpu("tf.reference: global arrays", "smem_base past the shared window", TE, r"smem_base=233472: the box.s 1024 B from there end past the 233472 B",
    lambda: tf.reference.tma_load(RG, RSPEC, (0, 0), smem_base=228 * 1024))
cpu("tf.reference: global arrays", "smem_base of 2^64", TE, r"smem_base=18446744073709551616: the box.s 1024 B from there end past",
    lambda: tf.reference.tma_load(RG, RSPEC, (0, 0), smem_base=2**64))
cpu("tf.reference: global arrays", "store into a broadcast array", TE, r"np_global is read-only",
    lambda: tf.reference.tma_store(np.broadcast_to(np.zeros(64, np.float32), (16, 64)), RSPEC, (0, 0), np.zeros(RSPEC.smem_bytes, np.uint8)))
cpu("tf.reference: global arrays", "store into a Fortran-order array", TE, r"np_global has strides \(4, 64\)",
    lambda: tf.reference.tma_store(np.zeros((16, 64), np.float32, order="F"), RSPEC, (0, 0), np.zeros(RSPEC.smem_bytes, np.uint8)))
cpu("tf.reference: global arrays", "np_global of another element size", TE, r"np_global dtype float16 \(2 B\) does not match float32",
    lambda: tf.reference.tma_load(RG.astype(np.float16), RSPEC, (0, 0)))


# foreign arrays that lie about themselves
class _CAI:
    def __init__(self, **iface):
        self.__cuda_array_interface__ = iface


_GOOD_CAI = dict(shape=(4, 4), typestr="<f4", data=(0x1000, False), version=3)
for _what, _iface in (("no shape", {k: v for k, v in _GOOD_CAI.items() if k != "shape"}),
                      ("no typestr", {k: v for k, v in _GOOD_CAI.items() if k != "typestr"}),
                      ("no data", {k: v for k, v in _GOOD_CAI.items() if k != "data"}),
                      ("shape of strings", dict(_GOOD_CAI, shape=("4", "4"))),
                      ("negative extent", dict(_GOOD_CAI, shape=(-4, 4))),
                      ("data that is not a pair", dict(_GOOD_CAI, data=0x1000)),
                      ("a pointer that is not an int", dict(_GOOD_CAI, data=("0x1000", False))),
                      ("fp8 typestr", dict(_GOOD_CAI, typestr="<V1")),
                      ("complex typestr", dict(_GOOD_CAI, typestr="<c8")),
                      ("strides of the wrong rank", dict(_GOOD_CAI, strides=(16,))),
                      ("a mask", dict(_GOOD_CAI, mask=object()))):
    cpu("foreign arrays", f"__cuda_array_interface__ with {_what}", TE, r"__cuda_array_interface__",
        lambda i=_iface: tf.as_array(_CAI(**i)))


class _BadDLPack:
    def __dlpack__(self, *a, **k):
        raise RuntimeError("the exporter failed")

    def __dlpack_device__(self):
        return (2, 0)


cpu("foreign arrays", "__dlpack__ that raises", TE, r"__dlpack__ .*the exporter failed", lambda: tf.as_array(_BadDLPack()))
cpu("foreign arrays", "__dlpack__ returning garbage", TE, r"__dlpack__", lambda: tf.as_array(type("D", (), {"__dlpack__": lambda self, *a, **k: 42})()))

# The entry points: hostile arrays (checked before any device work, so these run without a GPU;
# tf.empty / tf.zeros are rows of the generated table)
for _label, _value in HOSTILE.items():
    for _entry in ("copy", "softmax", "transpose"):
        cpu("hostile types: entry points", f"kernels.{_entry}(x = {_label})", TE, r"as_array|not a device array",
            lambda v=_value, e=_entry: getattr(ex, e)(v))
    cpu("hostile types: entry points", f"kernels.gemm(a = {_label})", TE, r"as_array|not a device array",
        lambda v=_value: gemm(v, _bf((64, 32))))
    for _entry, _fn in (("attention", attention), ("attention_cp_async", attention_cp_async)):
        cpu("hostile types: entry points", f"kernels.{_entry}(k = {_label})", TE, r"as_array|not a device array",
            lambda v=_value, f=_fn: f(_bf((1, 2, 64, 64)), v, _bf((1, 2, 64, 64))))
        if _value is not None and not isinstance(_value, (bool, int, float)):
            cpu("hostile types: entry points", f"kernels.{_entry}(scale = {_label})", TE, r"scale=",
                lambda v=_value, f=_fn: f(_bf((1, 2, 64, 64)), _bf((1, 2, 64, 64)), _bf((1, 2, 64, 64)), scale=v))

# Kernel construction: options, defines, flags
_K = "extern \"C\" __global__ void k() {}"
for _what, _kw, _pattern in (
        ("options given as one string", dict(options="-lineinfo"), r"options='-lineinfo' must be a list or tuple of strings"),
        ("an option that is not a string", dict(options=[1]), r"option 1 must be a non-empty one-line string"),
        ("an option with a newline", dict(options=["-DX\n-DY"]), r"must be a non-empty one-line string"),
        ("-dlto (no CUBIN)", dict(options=["-dlto"]), r"option '-dlto' makes NVRTC emit no CUBIN"),
        ("-ptx (no CUBIN)", dict(options=["-ptx"]), r"option '-ptx' makes NVRTC emit no CUBIN"),
        ("options of another type", dict(options=42), r"options=42 must be a list or tuple"),
        ("a define with a newline", dict(defines={"A": "1\n#include <x>"}), r"defines\['A'\]=.* must be one line"),
        ("a define with a NUL", dict(defines={"A": "1\0"}), r"must be one line"),
        ("a define keyed None", dict(defines={None: 1}), r"defines key None must be a C identifier"),
        ("a define keyed by a number", dict(defines={1: 1}), r"defines key 1 must be a C identifier"),
        ("a define name with a space", dict(defines={"A B": 1}), r"defines key 'A B' must be a C identifier"),
        ("a define value that is a list", dict(defines={"X": [1]}), r"defines\['X'\]=\[1\] must be a str"),
        ("defines as a list", dict(defines=[("X", 1)]), r"defines=\[\('X', 1\)\] must be a dict"),
        ("debug as a string", dict(debug="yes"), r"debug='yes' must be True, False or None"),
        ("a negative watchdog", dict(watchdog_seconds=-1), r"watchdog_seconds=-1 must be a positive"),
        ("a NaN watchdog", dict(watchdog_seconds=float("nan")), r"watchdog_seconds=nan must be a finite number"),
        ("a watchdog given as text", dict(watchdog_seconds="1"), r"watchdog_seconds='1' must be a finite number"),
        ("a watchdog under 1 ns", dict(watchdog_seconds=1e-10), r"watchdog_seconds=1e-10 must be a positive number of seconds in \[1e-9"),
        ("a watchdog of 2^64 ns", dict(watchdog_seconds=2.0**64 / 1e9), r"watchdog_seconds=18446744073.709553 must be .* \(1 ns to 2\^64 ns\)"),
        ("a NaN define", dict(defines={"X": float("nan")}), r"defines\['X'\]=nan must be finite"),
        ("a define value with a lone surrogate", dict(defines={"X": "a\ud800"}), r"defines\['X'\]='a\\ud800' is not valid UTF-8"),
        ("an option with a lone surrogate", dict(options=["-DX=\ud800"]), r"option='-DX=\\ud800' is not valid UTF-8"),
        ("arch as an int", dict(arch=90), r"arch=90 must look like 'sm_90a'"),
        ("filename None", dict(filename=None), r"filename=None must be a non-empty one-line name")):
    cpu("Kernel inputs", _what, TE, _pattern, lambda kw=_kw: tf.Kernel(_K, "k", **kw))
cpu("Kernel inputs", "a NUL in the source", TE, r"source has a NUL character", lambda: tf.Kernel("int x\0;" + _K, "k"))
cpu("Kernel inputs", "a NUL in the name", TE, r"must name a __global__ function", lambda: tf.Kernel(_K, "k\0"))
cpu("Kernel inputs", "a lone surrogate in the source", TE, r"source='.*' is not valid UTF-8", lambda: tf.Kernel(_K + "// \ud800", "k"))
cpu("Kernel inputs", "a lone surrogate in the name", TE, r"name='k\\ud800' is not valid UTF-8", lambda: tf.Kernel(_K, "k\ud800"))
cpu("Kernel inputs", "from_file of a binary file", TE, r"is not UTF-8 text \(byte 128\); is it a binary file", lambda: tf.Kernel.from_file(_binary_file(), "k"))
cpu("Kernel inputs", "from_file of a path with a lone surrogate", TE, r"cannot read path='/tmp/\\ud800.cu'", lambda: tf.Kernel.from_file("/tmp/\ud800.cu", "k"))
cpu("Kernel inputs", "from_file of None", TE, r"path=None must be a str or a path", lambda: tf.Kernel.from_file(None, "k"))


def _binary_file():
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".cu", delete=False) as f:
        f.write(bytes(range(256)) * 4)
    return f.name


def _with_env(name, value, action):
    import os

    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        return action()
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


for _name, _value, _action in (
        ("TMAFLOW_WATCHDOG_S", "abc", lambda: tf.Kernel(_K, "k", debug=True)),
        ("TMAFLOW_WATCHDOG_S", "-1", lambda: tf.Kernel(_K, "k", debug=True)),
        ("TMAFLOW_WATCHDOG_S", "inf", lambda: tf.Kernel(_K, "k", debug=True)),
        ("TMAFLOW_DEBUG", "2", lambda: tf.Kernel(_K, "k")),
        ("TMAFLOW_DEBUG", "maybe", lambda: tf.Kernel(_K, "k")),
        ("TMAFLOW_CACHE", "maybe", lambda: tf.Kernel(_K + " ", "k").cubin)):
    cpu("environment", f"{_name}={_value}", TE, rf"{_name}='{_value}' must be",
        lambda n=_name, v=_value, a=_action: _with_env(n, v, a))
for _value in ("1e-12", "1e30"):
    cpu("environment", f"TMAFLOW_WATCHDOG_S={_value}", TE, r"TMAFLOW_WATCHDOG_S=1e[-+]\d+ must be a positive number of seconds in \[1e-9",
        lambda v=_value: _with_env("TMAFLOW_WATCHDOG_S", v, lambda: tf.Kernel(_K, "k", debug=True)))


# --- saved traces and the CLI (files are made in a fresh temporary directory) ---------------
def _file(name: str, content: bytes | None = None) -> str:
    import tempfile

    path = f"{tempfile.mkdtemp(prefix='tmaflow-battery-')}/{name}"
    if content is not None:
        with open(path, "wb") as f:
            f.write(content)
    return path


def _npz(**arrays) -> str:
    path = _file("t.npz")
    np.savez_compressed(path, **arrays)  # compressed, as Trace.save writes
    _check_round_trip(path, arrays)
    return path


def _check_round_trip(path: str, arrays: dict) -> None:
    """Read the archive back before the case uses it. Inside pytest-xdist workers on the GPU
    machine (numpy 2.5.2), members just written read back with null bytes in their headers;
    this says whether the bytes on disk or the reading went wrong, instead of failing later
    as an unrelated tokenizer error."""
    import io
    import zipfile

    with open(path, "rb") as f:
        raw = f.read()
    for name, want in arrays.items():
        with zipfile.ZipFile(io.BytesIO(raw)) as z:
            member = z.read(f"{name}.npy")
        head = member[:10 + int.from_bytes(member[8:10], "little")]  # magic, version 1.0, length
        if b"\0" in head[10:] or not head.startswith(b"\x93NUMPY\x01\x00"):
            where = next((p for p in ("/proc/mounts",) if os.path.exists(p)), None)
            mounts = open(where).read() if where else ""
            fs = [line for line in mounts.splitlines() if " /tmp " in line or " / " in line]
            raise AssertionError(f"np.savez_compressed({path!r}) wrote member {name!r} whose header "
                                 f"reads {head[:96]!r} (file {len(raw)} B, {os.stat(path).st_size} B "
                                 f"on disk; numpy {np.__version__}; filesystems {fs})")
        got = np.lib.format.read_array(io.BytesIO(member), allow_pickle=want.dtype.hasobject)
        if not want.dtype.hasobject and (got.dtype != want.dtype or got.tobytes() != want.tobytes()):
            raise AssertionError(f"np.savez_compressed({path!r}): member {name!r} read back as "
                                 f"{got!r}, written as {want!r}")


def _truncated_trace() -> str:
    from hostile_core import SAVED_TRACE

    with open(SAVED_TRACE, "rb") as f:
        return _file("t.npz", f.read()[:-20])


_TRACE_FILES = (
    ("an empty file", lambda: _file("t.npz", b""), r"is not a readable trace"),
    ("a truncated file", _truncated_trace, r"is not a readable trace"),
    ("a text file", lambda: _file("t.npz", b"hello\n"), r"is not a readable trace"),
    ("a single .npy array", lambda: _file("t.npz", _npy_bytes()), r"is not a trace saved by Trace.save"),
    ("an archive without meta", lambda: _npz(events=np.zeros(3)), r"is not a trace saved by Trace.save"),
    ("events of another dtype", lambda: _npz(events=np.zeros(3), meta=np.array('{}')), r"events of dtype float64"),
    ("meta that is not JSON", lambda: _npz(events=_saved_events(), meta=np.array("{")), r"is not a readable trace \(JSONDecodeError"),
    ("meta without fields", lambda: _npz(events=_saved_events(), meta=np.array("{}")), r"meta=\{\} must hold kernel"),
    ("a pickled object array", lambda: _npz(events=np.array([object()]), meta=np.array("{}")), r"is not a readable trace"),
    ("a directory", lambda: _file(""), r"is not a readable trace"),
    ("a missing file", lambda: _file("missing.npz"), r"is not a readable trace"),
)


def _npy_bytes() -> bytes:
    buf = __import__("io").BytesIO()
    np.save(buf, np.zeros(3))
    return buf.getvalue()


def _saved_events():
    from tmaflow.debug import trace

    return np.zeros(2, trace._SAVED)


for _what, _make, _pattern in _TRACE_FILES:
    cpu("saved traces", f"Trace.load of {_what}", TE, rf"Trace.load: path='.*'.*{_pattern}|{_pattern}",
        lambda m=_make: tf.trace.Trace.load(m()))
    cpu("saved traces", f"python -m tmaflow trace --load of {_what}", TE, rf"^tmaflow: Trace.load: .*{_pattern}",
        lambda m=_make: _cli("trace", "--load", m()))


def _cli(*argv):
    from hostile_core import run_cli

    return run_cli(*argv)


def _cache_is_a_file():
    path = _file("cache", b"")
    return _with_env("TMAFLOW_CACHE_DIR", path, lambda: _cli("cache", "info"))


cpu("CLI", "swizzle --png into a missing directory", TE, r"--png='/.*/no/such/dir/x.png' must be a file in an existing directory",
    lambda: _cli("swizzle", "--png", _file("no/such/dir/x.png")))
cpu("CLI", "swizzle --png of a directory", TE, r"--png='.*' must be a file in an existing directory",
    lambda: _cli("swizzle", "--png", _file("")))
cpu("CLI", "trace --json into a missing directory", TE, r"--json='.*' must be a file in an existing directory",
    lambda: _cli("trace", "--load", _npz(), "--json", _file("no/dir/t.json")))
cpu("CLI", "trace --save into a missing directory", TE, r"--save='.*' must be a file in an existing directory",
    lambda: _cli("trace", "--load", _npz(), "--save", _file("no/dir/t.npz")))
cpu("CLI", "trace --png into a missing directory", TE, r"--png='.*' must be a file in an existing directory",
    lambda: _cli("trace", "--load", _npz(), "--png", _file("no/dir/t.png")))
cpu("CLI", "cache info with a cache directory that is a file", TE, r"TMAFLOW_CACHE_DIR='.*' is a file, not a directory",
    _cache_is_a_file)
cpu("CLI", "swizzle --box of 6 extents", TE, r"--box='1x1x1x1x1x8' must be 1-5 extents", lambda: _cli("swizzle", "--box", "1x1x1x1x1x8"))
cpu("CLI", "swizzle --box of 257 columns", TE, r"--box='8x257' must be 1-5 extents in \[1, 256\]", lambda: _cli("swizzle", "--box", "8x257"))
cpu("CLI", "an unknown command", TE, r"invalid choice: 'frobnicate'", lambda: _cli("frobnicate"))
cpu("diagnose", "cluster_size=0", TE, r"diagnose: cluster_size=0 must be in \[1, 16\]",
    lambda: __import__("tmaflow.debug.diagnose").debug.diagnose.diagnose(tf.trace.Trace(_saved_events(), "k", 1), None, 0))
