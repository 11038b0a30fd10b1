"""GEMM written with tmaflow (``gemm.cu``, ``skinny.cu``): configurations (``config``), the
measured heuristics that choose one (``heuristics``), plans (``plan``), operand and scale checks
(``operands``), the split-K workspace (``splitk``) and the entry points ``gemm`` (``dense``) and
``grouped_gemm`` (``grouped``). The public names below are imported on first use, so a module
that needs only the configurations (``edge.py``) does not import the entry points."""
from __future__ import annotations

import importlib

_PUBLIC = {
    "config": ("BM", "BK", "FP8_BK", "BF16", "LAYOUTS", "SCALE_STRIDE", "SCALE_MODES", "GemmConfig",
               "SKINNY_MP", "SKINNY_M", "SKINNY_FP8_PROMOTE", "SkinnyConfig"),
    "heuristics": ("skinny_splits", "choose_config", "fp8_config", "block_scale_config", "dense_config",
                   "tail_splits"),
    "plan": ("GemmPlan", "gemm_plan", "SkinnyPlan", "skinny_plan"),
    "dense": ("gemm", "block_scale_default"),
    "grouped": ("grouped_gemm",),
}
_HOME = {name: module for module, names in _PUBLIC.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    return value  # kept as a module attribute: later lookups skip this hook
