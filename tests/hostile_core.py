"""The core public surface as rows of the hostile-input table (run by tests/test_hostile.py):
tensor map specs and maps, tf.reference, the shared layout, Kernel, launch configs, arrays,
the watchdog, traces, diagnose and the CLI.

Each row calls one function with every argument valid except the one under test. Left out
(owned by other rows): duck arrays / DLPack (tests/test_dlpack.py), the compile cache and its
env vars (tests/test_native.py, tests/test_cache*.py), ``stream=``/``device=``
(tests/test_streams.py), the store model's overlap and stride rules (tests/test_reference.py).
"""
from __future__ import annotations

import re

import numpy as np

import tmaflow as tf
from hostile_kinds import Param

INTS = frozenset({"np_int"})              # a numpy integer scalar is an int
SEQUENCES = frozenset({"tuple", "generator"})  # any flat iterable of ints is a sequence


def named(name: str) -> str:
    """The message names the field with its value: ``name=...`` or ``name[i]=...``."""
    return rf"(?<![\w-]){re.escape(name)}(\[\d+\])?="


def row(function, name, call, error=tf.TmaflowError, valid=(), skip=(), valid_error="",
        gpu=False, field=None) -> Param:
    return Param(function, name, call, frozenset(valid), error, field or named(name), gpu,
                 frozenset(skip), valid_error)


def _calls(fn, base: dict):
    """``call(name)``: a one-argument function calling ``fn(**base)`` with ``name`` replaced."""
    return lambda name: (lambda value: fn(**{**base, name: value}))


PARAMS: list[Param] = []

# --- TensorMapSpec.tiled / .im2col ----------------------------------------------------------
E = tf.TensorMapError
_tiled = _calls(tf.TensorMapSpec.tiled, dict(dtype="float32", shape=(64, 64), box=(8, 32)))
_NONE_CHOICE = {"none", "zero"}  # None spells "none"; 0 is the driver's code of "none"
PARAMS += [
    row("TensorMapSpec.tiled", "dtype", _tiled("dtype"), E),
    row("TensorMapSpec.tiled", "shape", _tiled("shape"), E, SEQUENCES | INTS,
        valid_error=r"box=.* has 2 entries; the tensor has rank 1"),
    row("TensorMapSpec.tiled", "box", _tiled("box"), E, SEQUENCES),
    # (8, 8) B strides break the contiguity rule of float32: a refusal naming strides
    row("TensorMapSpec.tiled", "strides", _tiled("strides"), E, {"none"}),
    row("TensorMapSpec.tiled", "element_strides", _tiled("element_strides"), E,
        SEQUENCES | {"none"}),
    row("TensorMapSpec.tiled", "swizzle", _tiled("swizzle"), E, _NONE_CHOICE),
    row("TensorMapSpec.tiled", "interleave", _tiled("interleave"), E, _NONE_CHOICE),
    row("TensorMapSpec.tiled", "l2_promotion", _tiled("l2_promotion"), E, _NONE_CHOICE),
    row("TensorMapSpec.tiled", "oob_fill", _tiled("oob_fill"), E, {"zero"}),
    row("TensorMapSpec.tiled", "address", _tiled("address"), E, {"none", "zero"}),
    row("TensorMapSpec.tiled", "arch", _tiled("arch"), E),
]
_im2col = _calls(tf.TensorMapSpec.im2col, dict(
    dtype="float16", shape=(2, 16, 16, 16), lower_corner=(0, 0), upper_corner=(0, 0),
    channels_per_pixel=16, pixels_per_column=32))
PARAMS += [
    row("TensorMapSpec.im2col", "dtype", _im2col("dtype"), E),
    row("TensorMapSpec.im2col", "shape", _im2col("shape"), E),
    row("TensorMapSpec.im2col", "lower_corner", _im2col("lower_corner"), E, SEQUENCES),
    row("TensorMapSpec.im2col", "upper_corner", _im2col("upper_corner"), E, SEQUENCES),
    row("TensorMapSpec.im2col", "channels_per_pixel", _im2col("channels_per_pixel"), E,
        INTS),
    row("TensorMapSpec.im2col", "pixels_per_column", _im2col("pixels_per_column"), E, INTS),
    row("TensorMapSpec.im2col", "element_strides", _im2col("element_strides"), E, {"none"}),
    row("TensorMapSpec.im2col", "swizzle", _im2col("swizzle"), E, _NONE_CHOICE),
    row("TensorMapSpec.im2col", "interleave", _im2col("interleave"), E, _NONE_CHOICE),
    row("TensorMapSpec.im2col", "l2_promotion", _im2col("l2_promotion"), E, _NONE_CHOICE),
    row("TensorMapSpec.im2col", "oob_fill", _im2col("oob_fill"), E, {"zero"}),
    row("TensorMapSpec.im2col", "address", _im2col("address"), E, {"none", "zero"}),
]

# --- the shared layout ----------------------------------------------------------------------
L = tf.LayoutError
SPEC = tf.TensorMapSpec.tiled("bfloat16", (1024, 1024), (128, 64), swizzle="128B")
_barrier = _calls(tf.Barrier, dict(name="b"))
_buffer = _calls(tf.Buffer, dict(name="b", nbytes=64))
_pipeline = _calls(tf.Pipeline, dict(name="p", stages=2, tiles=[SPEC]))
_layout = _calls(tf.SharedLayout, dict(items=[tf.Barrier("b")]))
PARAMS += [
    row("Barrier", "name", _barrier("name"), L),
    row("Barrier", "arrivals", _barrier("arrivals"), L, INTS),
    row("Barrier", "tx_bytes", _barrier("tx_bytes"), L, INTS | {"zero"}),
    row("Buffer", "name", _buffer("name"), L),
    row("Buffer", "nbytes", _buffer("nbytes"), L, INTS),
    row("Buffer", "align", _buffer("align"), L, INTS | {"none"}),
    row("Buffer", "count", _buffer("count"), L, INTS),
    row("Pipeline", "name", _pipeline("name"), L),
    row("Pipeline", "stages", _pipeline("stages"), L, INTS),
    row("Pipeline", "tiles", _pipeline("tiles"), L, field=r"\btiles(\[[^]]+\])?="),
    row("Pipeline", "consumers", _pipeline("consumers"), L, INTS),
    row("Pipeline", "producers", _pipeline("producers"), L, INTS),
    row("Pipeline", "consumer_lanes", _pipeline("consumer_lanes"), L, INTS),
    # (8, 8) is 64 CTAs: over the 16-CTA cluster limit, refused by name
    row("Pipeline", "cluster", _pipeline("cluster"), L, INTS),
    row("Pipeline", "multicast", _pipeline("multicast"), L, {"none"}),
    row("SharedLayout", "items", _layout("items"), L),
    row("SharedLayout", "limit", _layout("limit"), L, INTS),
]

# --- launch configurations (the stream belongs to tests/test_streams.py) --------------------
LE = tf.LaunchError
_launch = _calls(tf.LaunchConfig, dict(grid=(16, 8), block=128))
PARAMS += [
    row("LaunchConfig", "grid", _launch("grid"), LE, SEQUENCES | INTS),
    row("LaunchConfig", "block", _launch("block"), LE, SEQUENCES | INTS),
    # a cluster of (8, 8) is 64 CTAs, over the limit of 16
    row("LaunchConfig", "cluster", _launch("cluster"), LE, INTS),
    row("LaunchConfig", "smem", _launch("smem"), LE, INTS | {"none", "zero"}),
    row("LaunchConfig", "pdl", _launch("pdl"), LE, {"bool", "np_bool"}),
    row("LaunchConfig", "cooperative", _launch("cooperative"), LE, {"bool", "np_bool"}),
]

# --- tf.reference (argument checks; the store model's rules are tests/test_reference.py's) ---
RSPEC = tf.TensorMapSpec.tiled("float32", (16, 64), (8, 32))
_load = _calls(lambda **kw: tf.reference.tma_load(**kw),
               dict(np_global=np.zeros((16, 64), np.float32), spec=RSPEC, coords=(0, 0)))
_store = _calls(lambda **kw: tf.reference.tma_store(**kw),
                dict(np_global=np.zeros((16, 64), np.float32), spec=RSPEC, coords=(0, 0),
                     smem_image=np.zeros(RSPEC.smem_bytes, np.uint8)))
MENTIONED = r"\b{}\b".format  # the message names the argument (its value is an array)
PARAMS += [
    row("reference.tma_load", "np_global", _load("np_global"), field=MENTIONED("np_global")),
    row("reference.tma_load", "spec", _load("spec")),
    # (8, 8) is a legal corner: the inner offset 8 x 4 B is 16-byte aligned
    row("reference.tma_load", "coords", _load("coords"), valid=SEQUENCES),
    row("reference.tma_load", "smem_base", _load("smem_base"), valid={"zero"}),
    row("reference.tma_load", "background", _load("background"), valid=INTS | {"zero"}),
    row("reference.tma_store", "np_global", _store("np_global"), field=MENTIONED("np_global")),
    row("reference.tma_store", "spec", _store("spec")),
    row("reference.tma_store", "coords", _store("coords"), valid=SEQUENCES),
    row("reference.tma_store", "smem_image", _store("smem_image"), field=MENTIONED("smem_image")),
    row("reference.tma_store", "smem_base", _store("smem_base"), valid={"zero"}),
]

# --- Kernel (construction checks every argument; compiling is lazy) ------------------------
K_SOURCE = 'extern "C" __global__ void k() {}'
_kernel = _calls(tf.Kernel, dict(source=K_SOURCE, name="k"))
_TEXT = {"str", "newline_str"}  # any text is a source: NVRTC judges it (tests/battery.py)
PARAMS += [
    row("Kernel", "source", _kernel("source"), skip=_TEXT, field=MENTIONED("source")),
    row("Kernel", "name", _kernel("name")),
    row("Kernel", "arch", _kernel("arch"), valid={"none"}),
    row("Kernel", "defines", _kernel("defines"), valid={"none", "dict"}),
    row("Kernel", "layout", _kernel("layout"), valid={"none"}),
    row("Kernel", "options", _kernel("options"), valid={"none"}, field=r"\boptions?\b"),
    row("Kernel", "debug", _kernel("debug"), valid={"none", "bool", "np_bool"}),
    row("Kernel", "watchdog_seconds", _kernel("watchdog_seconds"),
        valid={"none", "float", "integral_float", "np_float", "np_int"}),
    row("Kernel", "filename", _kernel("filename"), valid={"str"}),
    row("Kernel", "trace", _kernel("trace"), valid={"bool", "np_bool"}),
    # a path that names no file is refused by name, like any other unreadable path
    row("Kernel.from_file", "path", lambda v: tf.Kernel.from_file(v, "k")),
]

# --- traces and diagnose (no GPU: a trace built from events) --------------------------------
from tmaflow.debug import diagnose, trace  # noqa: E402

EMPTY_TRACE = trace.Trace(np.empty(0, trace._SAVED), "k", 4)
PARAMS += [
    # n counts events: any count, however large, is "all of them"
    row("Trace.tail", "n", lambda v: EMPTY_TRACE.tail(v), valid=INTS | {"zero", "huge", "np_uint_huge"}),
    row("Trace.load", "path", lambda v: trace.Trace.load(v)),
    row("diagnose.diagnose", "cluster_size", lambda v: diagnose.diagnose(EMPTY_TRACE, None, v),
        valid=INTS),
    row("diagnose.ledger", "cluster_size",
        lambda v: diagnose.ledger(EMPTY_TRACE, tf.SharedLayout([]), v), valid=INTS),
]

# --- the CLI: each option given each kind as text (what a shell passes) ---------------------
import contextlib  # noqa: E402
import io  # noqa: E402
import tempfile  # noqa: E402

from tmaflow import cli  # noqa: E402


class CliRefusal(tf.TmaflowError):
    """The CLI exited non-zero with a message (its stderr), not a traceback."""


def run_cli(*argv) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = cli.main([str(a) for a in argv])
        except SystemExit as exc:  # argparse refuses with exit code 2
            rc = exc.code
    if rc:
        raise CliRefusal(err.getvalue().strip())


SAVED_TRACE = f"{tempfile.mkdtemp(prefix='tmaflow-hostile-')}/empty.npz"
EMPTY_TRACE.save(SAVED_TRACE)
_NUMBER_TEXT = {"str", "np_int", "zero", "huge", "np_uint_huge"}  # "8", "0", "2**64" as digits
PARAMS += [
    row("cli swizzle", "--dtype", lambda v: run_cli("swizzle", "--dtype", v), CliRefusal,
        field=r"dtype="),
    row("cli swizzle", "--box", lambda v: run_cli("swizzle", "--box", v), CliRefusal,
        {"str", "np_int"}),
    row("cli swizzle", "--swizzle", lambda v: run_cli("swizzle", "--swizzle", v), CliRefusal,
        field=r"--swizzle"),
    # --ctas counts CTAs to draw: any count from 1 up
    row("cli trace", "--ctas", lambda v: run_cli("trace", "--load", SAVED_TRACE, "--ctas", v),
        CliRefusal, _NUMBER_TEXT - {"zero"}, field=r"--ctas"),
    row("cli trace", "--window", lambda v: run_cli("trace", "--load", SAVED_TRACE, "--window", v),
        CliRefusal, _NUMBER_TEXT | {"float", "integral_float", "np_float"}, field=r"--window"),
    row("cli trace", "--load", lambda v: run_cli("trace", "--load", v), CliRefusal,
        field=r"path="),
]

# --- arrays (a valid call allocates: without a GPU it stops at the driver) ------------------
NO_DRIVER = r"no usable CUDA driver|DriverNotFound"
PARAMS += [
    row("empty", "shape", lambda v: tf.empty(v, "float32"), valid=SEQUENCES | INTS | {"zero"},
        valid_error=NO_DRIVER),
    row("empty", "dtype", lambda v: tf.empty((8,), v), field=r"dtype="),
    row("zeros", "shape", lambda v: tf.zeros(v, "float32"), valid=SEQUENCES | INTS | {"zero"},
        valid_error=NO_DRIVER),
    # numbers and sequences of numbers are host data (numpy converts them); strings and
    # objects are not
    row("from_numpy", "host", lambda v: tf.from_numpy(v),
        valid={"bool", "np_bool", "float", "integral_float", "nan", "inf", "np_float", "zero",
               "negative", "np_int", "np_uint_huge", "tuple", "nested", "ndarray_2d"},
        valid_error=NO_DRIVER,
        field=r"from_numpy: host|dtype="),
    row("from_numpy", "dtype", lambda v: tf.from_numpy(np.zeros(4, np.float32), v),
        valid={"none"}, valid_error=NO_DRIVER, field=r"dtype=|cannot hold"),
]

# --- tensor maps of device arrays (GPU) -----------------------------------------------------
def _map(kw):
    return tf.TensorMap.tiled(tf.zeros((64, 64), "float32"), **{"box": (8, 32), **kw})


def _im2col_map(kw):
    return tf.TensorMap.im2col(tf.zeros((2, 16, 16, 16), "float16"), **{
        "lower_corner": (0, 0), "upper_corner": (0, 0), "channels_per_pixel": 16,
        "pixels_per_column": 32, **kw})


PARAMS += [
    row("TensorMap.tiled", "box", lambda v: _map({"box": v}), E, SEQUENCES, gpu=True),
    row("TensorMap.tiled", "dtype", lambda v: _map({"dtype": v}), E, {"none"}, gpu=True),
    row("TensorMap.tiled", "access", lambda v: _map({"access": v}), E, gpu=True),
    row("TensorMap.tiled", "swizzle", lambda v: _map({"swizzle": v}), E, _NONE_CHOICE, gpu=True),
    row("TensorMap.tiled", "element_strides", lambda v: _map({"element_strides": v}), E,
        SEQUENCES | {"none"}, gpu=True),
    row("TensorMap.im2col", "lower_corner", lambda v: _im2col_map({"lower_corner": v}), E,
        SEQUENCES, gpu=True),
    row("TensorMap.im2col", "channels_per_pixel", lambda v: _im2col_map({"channels_per_pixel": v}),
        E, INTS, gpu=True),
    row("TensorMap.im2col", "dtype", lambda v: _im2col_map({"dtype": v}), E, {"none"}, gpu=True),
]
