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
    return rf"\b{re.escape(name)}(\[\d+\])?="


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
    row("Pipeline", "name", _pipeline("name"), L),
    row("Pipeline", "stages", _pipeline("stages"), L, INTS),
    row("Pipeline", "tiles", _pipeline("tiles"), L, field=r"\btiles(\[[^]]+\])?="),
    row("Pipeline", "consumers", _pipeline("consumers"), L, INTS),
    row("Pipeline", "producers", _pipeline("producers"), L, INTS),
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
