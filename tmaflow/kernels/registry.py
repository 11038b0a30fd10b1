"""Kernel sources (``source``) and one compiled ``Kernel`` per (source file, kernel name,
defines, generated layout, debug): what the entry points share, so a plan seen twice compiles
and loads once."""
from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

from ..launch.kernel import Kernel
from ..tma.layout import SharedLayout
from .entry import STATES

HERE = Path(__file__).resolve().parent


def source(name: str) -> str:
    """Text of ``tmaflow/kernels/<name>.cu``."""
    return (HERE / f"{name}.cu").read_text()

_kernels: dict[tuple, Kernel] = {}
_variant: dict = {"defines": {}, "patch": None, "sources": {}}  # what extra_defines() adds to kernels built now


@contextlib.contextmanager
def extra_defines(defines: dict, patch=None, sources: dict | None = None):
    """Entry points called inside the block build their kernels with ``defines`` on top of
    their own, with ``patch(cubin, lowered_name) -> cubin`` applied to the CUBIN when given,
    and with ``sources`` ({file: text}, e.g. {"decode": an earlier commit's decode.cu}) in
    place of those files of this tree: for trying a kernel change before it becomes a config,
    or timing it against another version of its source. Prepared states are dropped on entry
    and exit, so none built inside outlives the block or predates it."""
    saved = dict(_variant)
    _variant.update(defines=dict(defines), patch=patch, sources=dict(sources or {}))
    STATES.clear()
    try:
        yield
    finally:
        _variant.update(saved)
        STATES.clear()


_FILES = {"tile_copy": "copy", "transpose": "transpose", "softmax": "softmax",
          "reduce_add": "reduce", "broadcast_scale": "broadcast", "axpb_ldgsts": "axpb",
          "axpb_tma": "axpb", "gemm_bf16": "gemm", "strided_copy": "edge", "softmax_rows": "edge",
          "stage_rows": "edge"}


def get_kernel(name: str, layout: SharedLayout | None, defines: dict | None = None,
               file: str | None = None, debug: bool | None = None, trace: bool = False) -> Kernel:
    """One Kernel per (file, name, defines, generated layout)."""
    file = file or _FILES[name]
    if _variant["defines"]:
        defines = {**(defines or {}), **_variant["defines"]}
    patch, text = _variant["patch"], _variant["sources"].get(file)
    key = (file, name, tuple(sorted((defines or {}).items())),
           layout.header() if layout is not None else "", debug, trace, patch, text)
    k = _kernels.get(key)
    if k is None:
        k = Kernel(source(file) if text is None else text, name, defines=defines, layout=layout, filename=f"{file}.cu",
                   debug=debug, trace=trace)
        if patch is not None:
            program = k.program
            k._program = dataclasses.replace(program, cubin=patch(program.cubin, program.lowered_name))
        _kernels[key] = k
    return k
