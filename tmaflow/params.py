"""Kernel arguments packed by value into the exact device parameter layout.

The layout (offset and size of every parameter) comes from ``cuFuncGetParamInfo``; this
module is pure Python so it is tested against fabricated tables without a GPU.
"""
from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass

import numpy as np

from .errors import LaunchError
from .memory import free_epoch

MAX_PARAM_BYTES = 32764  # CUDA 12.1+ parameter space


@dataclass(frozen=True)
class Param:
    index: int
    offset: int
    size: int


_INT_CODES = {1: "b", 2: "h", 4: "i", 8: "q"}
_UINT_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}
_FLOAT_CODES = {2: "e", 4: "f", 8: "d"}


def _describe(arg) -> str:
    if isinstance(arg, np.generic):
        return f"numpy.{arg.dtype.name} ({arg.dtype.itemsize} B)"
    return type(arg).__name__


def _kind(arg):
    """Classify an argument: ("tensormap"|"pointer"|"int"|"float"|"bytes", payload-fn)."""
    from .memory import DeviceArray
    from .tensormap import TensorMap

    t = type(arg)
    if t is TensorMap:
        return "tensormap"
    if t is DeviceArray:
        return "pointer"
    if t is bool or t is np.bool_:
        return "bool"
    if t is int:
        return "int"
    if t is float:
        return "float"
    if isinstance(arg, np.generic):
        return "numpy"
    if isinstance(arg, (bytes, bytearray, memoryview)):
        return "bytes"
    if isinstance(arg, np.ndarray):
        return "host"
    if hasattr(arg, "__cuda_array_interface__") or hasattr(arg, "__dlpack__"):
        return "foreign"
    return "unknown"


def convert(param: Param, arg) -> bytes:
    """Bytes of one argument for ``param``, or a LaunchError naming index, size and value."""
    kind = _kind(arg)
    i, size = param.index, param.size
    where = f"argument {i}"
    if kind == "tensormap":
        if size != 128:
            raise LaunchError(f"{where}: a TensorMap is 128 bytes but the kernel parameter is "
                              f"{size} bytes; declare it `const __grid_constant__ CUtensorMap`")
        return arg.to_bytes()
    if kind in ("pointer", "foreign"):
        from .memory import as_array

        arr = as_array(arg)
        if not arr.alive:
            raise LaunchError(f"{where}: {arr!r} was freed before the launch")
        if size != 8:
            raise LaunchError(f"{where}: a device array passes an 8-byte pointer but the kernel "
                              f"parameter is {size} bytes")
        return arr.ptr.to_bytes(8, "little")
    if kind == "host":
        raise LaunchError(f"{where}: a host numpy array (shape {arg.shape}) cannot be passed to a "
                          "kernel; copy it with tf.from_numpy(array)")
    if kind == "bool":
        return int(bool(arg)).to_bytes(size, "little") if size in _INT_CODES else _bad(where, arg, size)
    if kind == "int":
        if size not in _INT_CODES:
            _bad(where, arg, size)
        lo, hi = -(1 << (8 * size - 1)), (1 << (8 * size)) - 1
        if not lo <= arg <= hi:
            raise LaunchError(f"{where}: int {arg} does not fit the {size}-byte parameter "
                              f"(range [{lo}, {hi}])")
        return (arg & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
    if kind == "float":
        if size not in _FLOAT_CODES:
            _bad(where, arg, size)
        return struct.pack("<" + _FLOAT_CODES[size], arg)
    if kind == "numpy":
        if arg.dtype.itemsize != size:
            raise LaunchError(f"{where}: {_describe(arg)} is {arg.dtype.itemsize} bytes but the "
                              f"kernel parameter is {size} bytes; numpy scalars are passed exactly")
        return arg.tobytes()
    if kind == "bytes":
        data = bytes(arg)
        if len(data) != size:
            raise LaunchError(f"{where}: {len(data)} raw bytes given for a {size}-byte parameter")
        return data
    raise LaunchError(f"{where}: cannot pass {_describe(arg)} {arg!r} to a {size}-byte parameter; "
                      "pass an int, float, numpy scalar, device array, TensorMap or bytes")


def _bad(where, arg, size):
    raise LaunchError(f"{where}: cannot pack {_describe(arg)} {arg!r} into a {size}-byte parameter")


class ArgPacker:
    """Packs argument tuples for one kernel into a reusable buffer addressed by a void**.

    ``pack`` checks every argument (``convert``) and records the packing for that tuple of
    argument types; ``fast_call`` turns it into a launcher ``__call__`` with one type test
    per argument and a single ``struct.pack_into``, valid while no tmaflow memory has been
    freed (``memory.free_epoch``). Anything else takes the checked path.
    """

    def __init__(self, params: list[Param]):
        self.params = list(params)
        self.total = max((p.offset + p.size for p in self.params), default=0)
        if self.total > MAX_PARAM_BYTES:
            raise LaunchError(f"parameters take {self.total} bytes, over the {MAX_PARAM_BYTES}-byte limit")
        self.buffer = ctypes.create_string_buffer(max(self.total, 8))
        base = ctypes.addressof(self.buffer)
        self._ptrs = (ctypes.c_void_p * max(len(self.params), 1))(
            *[base + p.offset for p in self.params])
        self.kernel_params = ctypes.addressof(self._ptrs) if self.params else 0
        self.fast = None          # (source lines, scope) of the packer for the last argument types
        self._epoch = -1

    def check_count(self, args: tuple) -> None:
        if len(args) != len(self.params):
            sizes = ", ".join(f"{p.size} B" for p in self.params)
            raise LaunchError(f"the kernel takes {len(self.params)} arguments ({sizes}) but "
                              f"{len(args)} were given")

    def pack(self, args: tuple) -> int:
        """Check ``args``, write them into the buffer; return the ``kernelParams`` pointer."""
        self.check_count(args)
        for p, a in zip(self.params, args):
            data = convert(p, a)
            ctypes.memmove(ctypes.addressof(self.buffer) + p.offset, data, p.size)
        self.fast = self._generate(args)
        self._epoch = free_epoch[0]
        return self.kernel_params

    def fast_call(self, launch, config, function, on_error):
        """A ``__call__(self, *args)`` for the current argument types that packs and launches
        in one Python frame; anything unexpected goes to ``self._checked(args)``."""
        lines, scope = self.fast
        scope = dict(scope, launch=launch, config=config, function=function, kp=self.kernel_params,
                     on_error=on_error, free_epoch=free_epoch, EPOCH=self._epoch, struct=struct)
        body = [ln.replace("return False", "return self._checked(args)") for ln in lines]
        src = ("def __call__(self, *args):\n"
               "    if free_epoch[0] != EPOCH: return self._checked(args)\n"  # something was freed
               + "".join(f"    {ln}\n" for ln in body[:-1])
               + "    try:\n"
               + f"        {body[-1]}\n"
               + "    except (struct.error, OverflowError, ValueError):\n"
               + "        return self._checked(args)\n"
               + "    (err,) = launch(config, function, kp, 0)\n"
               + "    if err: on_error(err)\n")
        exec(src, scope)  # noqa: S102 - generated from the parameter table, no user text
        return scope["__call__"]

    def _generate(self, args: tuple):
        """(body lines, scope) of a packer for exactly these argument types, or None when some
        argument kind always takes the checked path. Generated from the parameter table only."""
        from .memory import DeviceArray
        from .tensormap import TensorMap

        fmt, pos, checks, values = ["<"], 0, [], []
        for i, (p, a) in enumerate(zip(self.params, args)):
            if p.offset > pos:
                fmt.append(f"{p.offset - pos}x")
            t = type(a)
            if t is TensorMap:
                fmt.append("128s")
                checks.append(f"type(a{i}) is TensorMap")
                values.append(f"a{i}._bytes")
            elif t is DeviceArray:
                fmt.append("Q")
                checks.append(f"type(a{i}) is DeviceArray")
                values.append(f"a{i}.ptr")
            elif t is int:
                fmt.append(_INT_CODES[p.size])
                checks.append(f"type(a{i}) is int")
                values.append(f"a{i}")
            elif t is float:
                fmt.append(_FLOAT_CODES[p.size])
                checks.append(f"type(a{i}) is float")
                values.append(f"a{i}")
            else:
                return None  # numpy scalars, bytes, foreign arrays: always the checked path
            pos = p.offset + p.size
        n = len(args)
        names = ", ".join(f"a{i}" for i in range(n)) + ("," if n == 1 else "")
        lines = [f"if len(args) != {n}: return False"]
        if n:
            lines.append(f"{names} = args")
        if checks:
            lines.append(f"if not ({' and '.join(checks)}): return False")
        lines.append(f"pack_into(buf, 0{''.join(', ' + v for v in values)})")
        scope = {"TensorMap": TensorMap, "DeviceArray": DeviceArray,
                 "pack_into": struct.Struct("".join(fmt)).pack_into, "buf": self.buffer}
        return lines, scope
