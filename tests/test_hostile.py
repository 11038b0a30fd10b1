"""The hostile-input table: every public parameter (``PARAMS`` of each tests/hostile_*.py
module) crossed with every hostile value kind (``KINDS`` of tests/hostile_kinds.py).

A kind the parameter lists as valid must be accepted; every other kind must raise the
parameter's TmaflowError subclass with a message naming the parameter, and nothing else: a
TypeError, an OverflowError, a numpy error or a silent acceptance fails the case.
``tools/docs/battery_table.py`` renders the same table into docs/bad-input-battery.md.
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import numpy as np
import pytest

import tmaflow as tf
from hostile_kinds import KINDS, Param


def hostile_params() -> list[Param]:
    """Every ``Param`` of every tests/hostile_*.py module (the axes module aside)."""
    here = Path(__file__).resolve().parent
    names = sorted(p.stem for p in here.glob("hostile_*.py") if p.stem != "hostile_kinds")
    return [param for name in names for param in importlib.import_module(name).PARAMS]


def field_pattern(param: Param) -> str:
    return param.field or re.escape(param.name)


def expected(param: Param, kind: str) -> str:
    """The outcome the table promises: "skip", "valid" or the error's class name."""
    if kind in param.skip:
        return "skip"
    return "valid" if kind in param.valid else param.error.__name__


def check(param: Param, kind: str) -> None:
    value = KINDS[kind]()
    if kind in param.valid:
        try:
            param.call(value)
        except param.error as e:
            if not (param.valid_error and re.search(param.valid_error, str(e))):
                raise AssertionError(f"{param.function}({param.name}={kind}) is a valid spelling "
                                     f"but was refused: {e}") from e
        return
    with pytest.raises(param.error) as info:
        param.call(value)
    assert isinstance(info.value, tf.TmaflowError), type(info.value)
    assert re.search(field_pattern(param), str(info.value)), \
        f"the message does not name {param.name!r}: {info.value}"


PARAMS = hostile_params()
CASES = [(p, k) for p in PARAMS for k in KINDS if k not in p.skip]
IDS = [f"{p.function}:{p.name}={k}" for p, k in CASES]


@pytest.fixture(scope="module")
def table_cache(tmp_path_factory):
    """One private compile cache for the whole table (a per-case cache would recompile)."""
    from tmaflow import cache

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMAFLOW_CACHE_DIR", str(tmp_path_factory.mktemp("hostile-cache")))
        cache.clear_memory()
        yield
    cache.clear_memory()


def test_every_module_declares_params():
    assert PARAMS and all(isinstance(p, Param) for p in PARAMS)
    assert all(issubclass(p.error, tf.TmaflowError) for p in PARAMS)
    unknown = {(p.function, p.name, k) for p in PARAMS for k in p.valid | p.skip if k not in KINDS}
    assert not unknown, unknown


@pytest.mark.parametrize("param, kind", [c for c in CASES if not c[0].gpu],
                         ids=[i for c, i in zip(CASES, IDS) if not c[0].gpu])
def test_cpu(param, kind, table_cache):
    check(param, kind)


@pytest.mark.gpu
@pytest.mark.parametrize("param, kind", [c for c in CASES if c[0].gpu],
                         ids=[i for c, i in zip(CASES, IDS) if c[0].gpu])
def test_gpu(param, kind, device):
    check(param, kind)


@pytest.mark.parametrize("dtype", ["float32", np.dtype("float32"), np.float32, "FP32",
                                   tf.as_dtype("float32")], ids=repr)
def test_dtype_spellings(dtype):
    spec = tf.TensorMapSpec.tiled(dtype, (64, 64), (8, 32), swizzle=None)
    assert spec.dtype.name == "float32" and spec.swizzle == "none"
