"""tmaflow's kernel sources (``*.cu``), its device headers and the example entry points."""
from __future__ import annotations

import functools
from pathlib import Path

HERE = Path(__file__).resolve().parent


def source(name: str) -> str:
    """Text of ``tmaflow/kernels/<name>.cu``."""
    return (HERE / f"{name}.cu").read_text()


@functools.lru_cache(maxsize=None)
def kernel(file: str, name: str, **kwargs):
    """A cached ``tf.Kernel`` for kernel ``name`` of ``<file>.cu``."""
    from ..kernel import Kernel

    extra = {k: (dict(v) if k == "defines" else v) for k, v in kwargs.items()}
    return Kernel(source(file), name, filename=f"{file}.cu", **extra)


_EXAMPLES = ("copy", "transpose", "softmax", "reduce_add", "broadcast_scale", "axpb", "gemm")


def __getattr__(name):  # the example entry points are imported on first use
    if name not in _EXAMPLES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module = importlib.import_module(f"{__name__}.{'gemm' if name == 'gemm' else 'examples'}")
    return getattr(module, name)
