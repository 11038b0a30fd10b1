"""Kernel sources (``source``) and one compiled ``Kernel`` per (source file, kernel name,
defines, generated layout, debug): what the entry points share, so a plan seen twice compiles
and loads once."""
from __future__ import annotations

from pathlib import Path

from ..launch.kernel import Kernel
from ..tma.layout import SharedLayout

HERE = Path(__file__).resolve().parent


def source(name: str) -> str:
    """Text of ``tmaflow/kernels/<name>.cu``."""
    return (HERE / f"{name}.cu").read_text()

_kernels: dict[tuple, Kernel] = {}


_FILES = {"tile_copy": "copy", "transpose": "transpose", "softmax": "softmax",
          "reduce_add": "reduce", "broadcast_scale": "broadcast", "axpb_ldgsts": "axpb",
          "axpb_tma": "axpb", "gemm_bf16": "gemm", "strided_copy": "edge", "softmax_rows": "edge"}


def get_kernel(name: str, layout: SharedLayout | None, defines: dict | None = None,
               file: str | None = None, debug: bool | None = None, trace: bool = False) -> Kernel:
    """One Kernel per (file, name, defines, generated layout)."""
    file = file or _FILES[name]
    key = (file, name, tuple(sorted((defines or {}).items())),
           layout.header() if layout is not None else "", debug, trace)
    k = _kernels.get(key)
    if k is None:
        k = Kernel(source(file), name, defines=defines, layout=layout, filename=f"{file}.cu",
                   debug=debug, trace=trace)
        _kernels[key] = k
    return k
