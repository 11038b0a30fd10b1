"""Launch arguments: what kind each argument is, in one vocabulary for the three paths that
turn arguments into parameter bytes: the checked path (``params.convert``, by ``arg_kind``), the
generated Python path (``ArgPacker.plan_source``, by ``arg_fast_form``) and the C plans
(``native.py`` and ``_launch.c``, by ``PLAN_KINDS``), plus the attribute names the C plans read
from Python objects (``PLAN_ATTRIBUTES``): ``_launch.c`` reports the names it was built with and
``native.py`` refuses a build that disagrees, so a rename cannot silently drop launches to the
slow path.
"""
from __future__ import annotations

import numpy as np

from ..runtime.memory import DeviceArray, _origin_of, _torch_types, live_tokens
from ..tma.tensormap import TensorMap

# Argument kinds, as ``arg_kind`` names them
ARG_KINDS = ("tensormap", "array", "int", "float", "bool", "numpy", "bytes", "host", "none", "unknown")

# The fields a C plan writes: ``_launch.c``'s ``enum Kind``, in its order. "tensormap" and
# "array" are tmaflow objects (liveness and device checked through their ``live`` token), "torch"
# and "cupy" those frameworks' arrays, "signed" / "unsigned" / "float" Python numbers packed
# as the parameter says, "none" a null pointer.
PLAN_KINDS = {"array": 0, "tensormap": 1, "torch": 2, "cupy": 3, "signed": 4, "unsigned": 5,
              "float": 6, "none": 7}

# The Python attributes _launch.c reads by name (its interned strings, in its order), by role:
# a TensorMap's or DeviceArray's allocation (``_alloc``) and its ``live`` token (liveness,
# origin and device in one), an array's address (``ptr``), a map's 128 bytes (``_bytes``), a
# cupy array's ``data`` with its ``device_id``, a torch tensor's ``get_device`` and
# ``data_ptr``, and the Launcher methods a plan hands a call back to (``_dispatch`` when a
# check fails, ``_checked`` while a graph captures).
PLAN_ATTRIBUTES = ("_alloc", "live", "ptr", "_bytes", "data", "device_id", "get_device",
                   "data_ptr", "_dispatch", "_checked")


def arg_kind(arg) -> str:
    """The argument's kind (``ARG_KINDS``): how the checked path passes it."""
    t = type(arg)
    if t is TensorMap:
        return "tensormap"
    if t is DeviceArray:
        return "array"
    if t is bool or t is np.bool_:
        return "bool"
    if t is int:
        return "int"
    if t is float:
        return "float"
    if arg is None:
        return "none"
    if isinstance(arg, np.generic):
        return "numpy"
    if isinstance(arg, (bytes, bytearray, memoryview)):
        return "bytes"
    if isinstance(arg, np.ndarray):
        return "host"
    if isinstance(arg, (int, float)) and not isinstance(arg, bool):
        return "int" if isinstance(arg, int) else "float"
    if hasattr(arg, "__cuda_array_interface__") or hasattr(arg, "__dlpack__"):
        return "array"
    return "unknown"


def arg_fast_form(arg, name: str, ordinal: int):
    """(failure test, value expression, struct code, framework, native kind, expected
    ``_alloc.live`` values) for the generated launch path on device ``ordinal`` (the last two
    for the C path's fields), or None for argument kinds that always take the checked path.
    The test is True when the argument cannot take this path (another type, dead memory,
    another device: one identity test of ``live``, see ``memory.LiveToken``); a map or array
    of the wrong kind fails by lacking ``_bytes`` / ``ptr`` (AttributeError). Expressions may
    use ``T_<name>`` (the argument's exact type), ``LIVE_<name>`` (the expected ``live``
    values), ``ORD`` (the launch device's ordinal)."""
    t = type(arg)
    if t is TensorMap or t is DeviceArray:
        value = f"{name}._bytes" if t is TensorMap else f"{name}.ptr"
        return (f"{name}._alloc.live not in LIVE_{name}", value, "128s" if t is TensorMap else "ptr",
                arg._origin, "tensormap" if t is TensorMap else "array",
                live_tokens(arg._origin, ordinal))
    if t in (int, float, bool) or (isinstance(arg, np.generic) and arg.dtype.kind in "iufb"):
        return f"type({name}) is not T_{name}", name, "num", None, "num", None
    if arg is None:
        return f"{name} is not None", "0", "ptr", None, "none", None
    if _origin_of(arg) == "torch" and isinstance(arg, _torch_types()):
        return (f"type({name}) is not T_{name} or {name}.get_device() != ORD",
                f"{name}.data_ptr()", "ptr", "torch", "torch", None)
    if _origin_of(arg) == "cupy" and t.__name__ == "ndarray":
        return (f"type({name}) is not T_{name} or {name}.data.device_id != ORD",
                f"{name}.data.ptr", "ptr", "cupy", "cupy", None)
    return None
