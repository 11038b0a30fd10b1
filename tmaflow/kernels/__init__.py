"""tmaflow's kernel sources (``*.cu``), its device headers and the example entry points."""
from __future__ import annotations

from .registry import source  # noqa: F401 (re-exported)

_EXAMPLES = ("copy", "transpose", "softmax", "reduce_add", "broadcast_scale", "axpb")
_MATMUL = ("gemm", "grouped_gemm", "GemmConfig", "SkinnyConfig")  # in the matmul package: a module named gemm would shadow the function


_ATTENTION = ("attention", "attention_cp_async")
_VARLEN = ("attention_varlen",)
_VARLEN_BACKWARD = ("attention_varlen_backward",)
_DECODE = ("attention_decode", "append_kv")
_BACKWARD = ("attention_backward",)


def __getattr__(name):  # the example entry points are imported on first use
    if name not in _EXAMPLES + _MATMUL + _ATTENTION + _VARLEN + _VARLEN_BACKWARD + _DECODE + _BACKWARD:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module = ("matmul" if name in _MATMUL else "attention_entry" if name in _ATTENTION
              else "attention_varlen_entry" if name in _VARLEN
              else "attention_varlen_backward_entry" if name in _VARLEN_BACKWARD else "decode_entry" if name in _DECODE else "attention_backward_entry" if name in _BACKWARD
              else "examples")
    value = globals()[name] = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    return value  # kept as a module attribute: later lookups skip this hook (entry points are hot)
