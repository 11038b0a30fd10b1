"""tmaflow.checks: valid spellings pass, lookalikes are refused by name."""
import math

import numpy as np
import pytest

import tmaflow as tf
from tmaflow import checks


@pytest.mark.parametrize("value", [3, np.int64(3), np.uint8(3), np.array(3)])
def test_int_spellings(value):
    assert checks.as_int("n", value, 1, 8) == 3


@pytest.mark.parametrize("value", [True, np.bool_(True), 3.0, "3", None, float("nan"), [3]])
def test_int_lookalikes(value):
    with pytest.raises(tf.TmaflowError, match=r"n=.* must be an int in \[1, 8\]"):
        checks.as_int("n", value, 1, 8)


def test_int_bounds():
    with pytest.raises(tf.TmaflowError, match=r"n=9 must be in \[1, 8\]"):
        checks.as_int("n", 9, 1, 8)
    with pytest.raises(tf.TensorMapError, match=r"n=0 must be >= 1"):
        checks.as_int("n", 0, 1, error=tf.TensorMapError)


def test_bools():
    assert checks.as_bool("causal", np.bool_(True)) is True
    for bad in (1, 0, "True", None):
        with pytest.raises(tf.TmaflowError, match=r"causal=.* must be True or False"):
            checks.as_bool("causal", bad)


def test_optional_bools():
    assert checks.as_optional_bool("ring", None) is None
    assert checks.as_optional_bool("ring", np.bool_(False)) is False
    for bad in (1, 0, "yes", 1.0):
        with pytest.raises(tf.TmaflowError, match=r"ring=.* must be True, False or None \(got "):
            checks.as_optional_bool("ring", bad)


def test_floats():
    assert checks.as_float("scale", np.float32(0.5)) == 0.5
    assert checks.as_float("scale", 2) == 2.0
    for bad in (True, "1", None, math.nan, math.inf, 10**400):
        with pytest.raises(tf.TmaflowError, match=r"scale=.* must be a finite number"):
            checks.as_float("scale", bad)
    with pytest.raises(tf.TmaflowError, match=r"scale=0.0 must be > 0"):
        checks.as_float("scale", 0.0, lo=0, open_lo=True)


def test_int_sequences():
    assert checks.as_ints("box", (i for i in (8, 64))) == (8, 64)
    assert checks.as_ints("box", np.array([8, 64])) == (8, 64)
    assert checks.as_ints("box", np.int32(8)) == (8,)
    for bad in ("8x64", None, {8: 64}, [[8, 64]], np.ones((2, 2), int), [8, 64.0], [True, 8]):
        with pytest.raises(tf.TmaflowError, match=r"box"):
            checks.as_ints("box", bad)
    with pytest.raises(tf.TmaflowError, match=r"box=\(8,\) has 1 entries; 2 are needed"):
        checks.as_ints("box", [8], rank=2)


def test_choices():
    assert checks.as_choice("layout", "nt", ("nt", "nn")) == "nt"
    for bad in ("NT", None, 1):
        with pytest.raises(tf.TmaflowError, match=r"layout=.* must be one of 'nt', 'nn'"):
            checks.as_choice("layout", bad, ("nt", "nn"))
