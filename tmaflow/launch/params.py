"""Kernel parameters: the typed table of a kernel's signature, and packing arguments into it.

The table comes from the PTX ``.entry`` (sizes, alignments, offsets, integer vs float vs
aggregate) refined by the C++ signature in the source (pointer vs integer, signedness,
``CUtensorMap``), so every check runs without a GPU (``Kernel.check_args``). This module is
pure Python: it is tested against fabricated tables.
"""
from __future__ import annotations

import ctypes
import re
import struct
from dataclasses import dataclass

import numpy as np

from ..errors import LaunchError
from ..runtime.memory import as_array
from .args import PLAN_KINDS, arg_fast_form, arg_kind

MAX_PARAM_BYTES = 32764  # CUDA 12.1+ parameter space

# kind: "pointer" | "int" | "float" | "tensormap" | "bytes" | "word" (a 64-bit integer the
# source did not say is a pointer: ints and arrays go) | "any" (size only: fabricated tables)
KINDS = ("pointer", "int", "float", "tensormap", "bytes", "word", "any")


@dataclass(frozen=True)
class Param:
    index: int
    offset: int
    size: int
    kind: str = "any"
    signed: bool | None = None     # integers: from the C++ type; None when unknown
    ctype: str | None = None       # the C++ parameter as written in the source
    align: int = 1

    def describe(self) -> str:
        what = self.ctype or {"any": f"{self.size}-byte parameter"}.get(self.kind, f"{self.kind}")
        return f"argument {self.index} ({what})" if self.ctype else f"argument {self.index}"

    def __repr__(self) -> str:
        sign = "" if self.signed is None else (" signed" if self.signed else " unsigned")
        return (f"Param({self.index}, {self.ctype or self.kind!r}: {self.kind}{sign}, "
                f"offset {self.offset}, {self.size} B)")


# --- the table ---------------------------------------------------------------------------------

_PTX_PARAM = re.compile(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+[\w$]+(?:\[(\d+)\])?")
_PTX_SIZES = {"u8": 1, "s8": 1, "b8": 1, "u16": 2, "s16": 2, "b16": 2, "f16": 2, "u32": 4,
              "s32": 4, "b32": 4, "f32": 4, "u64": 8, "s64": 8, "b64": 8, "f64": 8}


def ptx_entry_params(ptx: str, lowered_name: str) -> list[tuple[str, int, int]] | None:
    """[(ptx type, size, align)] of ``.entry lowered_name``, or None if the entry is absent."""
    m = re.search(rf"\.entry\s+{re.escape(lowered_name)}\s*\((.*?)\)\s*(?:\.\w+[^{{]*)?\{{", ptx, re.S)
    if m is None:
        if re.search(rf"\.entry\s+{re.escape(lowered_name)}\s*(?:\.\w+[^{{]*)?\{{", ptx):
            return []
        return None
    out = []
    for align, ty, count in _PTX_PARAM.findall(m.group(1)):
        size = _PTX_SIZES.get(ty, 1) * (int(count) if count else 1)
        out.append((ty, size, int(align) if align else _PTX_SIZES.get(ty, 1)))
    return out


def _split_top(text: str) -> list[str]:
    """Split a parameter list at commas outside (), <>, [] and {}."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return [p.strip() for p in parts]


def source_signature(source: str, name: str) -> list[str] | None:
    """The C++ parameter declarations of ``__global__ ... name(...)``, or None if not found
    exactly once (templates, macros)."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", source, flags=re.S)
    text = re.sub(r"^[ \t]*#.*$", " ", text, flags=re.M)  # directives (parameters under #if)
    text = re.sub(r"__(?:launch_bounds|cluster_dims|maxnreg)__\s*\([^)]*\)", " ", text)
    found = [m for m in re.finditer(rf"__global__\b[^;{{}}()]*?\b{re.escape(name)}\s*\(", text)]
    if len(found) != 1:
        return None
    i, depth = found[0].end(), 1
    start = i
    while i < len(text) and depth:
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
    body = text[start:i - 1].strip()
    if body in ("", "void"):
        return []
    return [" ".join(p.split()) for p in _split_top(body)]


_UNSIGNED = re.compile(r"\bunsigned\b|\buint\d*_t\b|\bsize_t\b|\buintptr_t\b|\bbool\b")


def _classify(ptx_type: str, size: int, align: int, ctype: str | None) -> tuple[str, bool | None]:
    decl = re.sub(r"=.*$", "", ctype or "")  # default arguments
    if ptx_type in ("f32", "f64", "f16"):
        return "float", None
    if ptx_type == "b8" or size > 8:
        if "CUtensorMap" in decl or (ctype is None and size == 128 and align == 64):
            return "tensormap", None
        return "bytes", None
    if "*" in decl or "[" in decl:
        return "pointer", None
    if ctype is None:
        return ("word" if size == 8 else "int"), None
    if re.search(r"\bfloat\b|\bdouble\b", decl):
        return "float", None
    return "int", not _UNSIGNED.search(decl)


def param_table(ptx: str, lowered_name: str, source: str | None = None,
                name: str | None = None) -> list[Param] | None:
    """The typed parameter table of a compiled kernel, offsets laid out as the ABI does
    (each parameter at the next multiple of its alignment). None if the entry is absent."""
    entry = ptx_entry_params(ptx, lowered_name)
    if entry is None:
        return None
    ctypes_ = source_signature(source, name) if source and name else None
    if ctypes_ is not None and len(ctypes_) != len(entry):
        ctypes_ = None  # macros or templates changed the signature: trust the PTX alone
    params, pos = [], 0
    for i, (ty, size, align) in enumerate(entry):
        ctype = ctypes_[i] if ctypes_ else None
        kind, signed = _classify(ty, size, align, ctype)
        pos = -(-pos // align) * align
        params.append(Param(i, pos, size, kind, signed, ctype, align))
        pos += size
    return params


# --- one argument --------------------------------------------------------------------------------

_INT_CODES = {1: "b", 2: "h", 4: "i", 8: "q"}
_UINT_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}
_FLOAT_CODES = {2: "e", 4: "f", 8: "d"}


def _describe(arg) -> str:
    if isinstance(arg, np.generic):
        return f"numpy.{arg.dtype.name} ({arg.dtype.itemsize} B)"
    return type(arg).__name__


def _pack_float(where: str, value, size: int) -> bytes:
    try:
        return struct.pack("<" + _FLOAT_CODES[size], float(value))
    except OverflowError:  # finite but past the parameter's range (inf and nan pack)
        top = {2: "65504", 4: "3.4028235e38", 8: "1.8e308"}[size]
        raise LaunchError(f"{where}: {type(value).__name__} {value!r} does not fit the {size}-byte "
                          f"float parameter (finite values up to ±{top})") from None


def _int_range(param: Param) -> tuple[int, int]:
    bits = 8 * param.size
    if param.kind in ("pointer", "word") or param.signed is False:
        lo = 0 if param.kind == "pointer" or param.signed is False else -(1 << (bits - 1))
        return lo, (1 << bits) - 1
    if param.signed:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return -(1 << (bits - 1)), (1 << bits) - 1  # sign unknown: either reading


def convert(param: Param, arg) -> bytes:
    """Bytes of one argument for ``param``, or a LaunchError naming index, type and value."""
    kind, pk, size = arg_kind(arg), param.kind, param.size
    where = param.describe()
    if kind == "tensormap":
        if pk not in ("tensormap", "any") or size != 128:
            raise LaunchError(f"{where}: a TensorMap is 128 bytes but the kernel parameter is "
                              f"{size} bytes; declare it `const __grid_constant__ CUtensorMap`")
        if not arg._alloc.live:
            raise LaunchError(f"{where}: {arg!r}: its array was freed; encode a map for a live array")
        return arg._bytes
    if kind == "array":
        if pk not in ("pointer", "word", "any") or size != 8:
            raise LaunchError(f"{where}: a device array passes an 8-byte pointer but the kernel "
                              f"parameter is {size} bytes")
        arr = as_array(arg)
        if not arr.alive:
            raise LaunchError(f"{where}: {arr!r} was freed before the launch")
        return arr.ptr.to_bytes(8, "little")
    if kind == "host":
        raise LaunchError(f"{where}: a host numpy array (shape {arg.shape}) cannot be passed to a "
                          "kernel; copy it with tf.from_numpy(array)")
    if kind == "none":
        if pk == "pointer":
            return bytes(8)  # nullptr
        what = f"a {size}-byte parameter" if param.kind == "any" else f"{_an(param)} parameter"
        raise LaunchError(f"{where}: None can only stand for a null pointer; this is {what}")
    if kind in ("bool", "int"):
        if pk in ("float",) and kind == "int":
            return _pack_float(where, arg, size)
        if pk not in ("int", "pointer", "word", "any") or size not in _INT_CODES:
            _bad(where, arg, param)
        value = int(arg)
        lo, hi = _int_range(param)
        if not lo <= value <= hi:
            raise LaunchError(f"{where}: int {value} does not fit the {size}-byte parameter "
                              f"(range [{lo}, {hi}])")
        return (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
    if kind == "float":
        if pk in ("pointer", "word", "int"):
            raise LaunchError(f"{where}: float {arg!r} given for {_an(param)} parameter; pass "
                              + ("a device array or an int address" if pk != "int" else "an int"))
        if pk not in ("float", "any") or size not in _FLOAT_CODES:
            _bad(where, arg, param)
        return _pack_float(where, arg, size)
    if kind == "numpy":
        if arg.dtype.itemsize != size:
            raise LaunchError(f"{where}: {_describe(arg)} is {arg.dtype.itemsize} bytes but the "
                              f"kernel parameter is {size} bytes; numpy scalars are passed exactly")
        if pk in ("pointer", "word", "int") and arg.dtype.kind not in "iub":
            raise LaunchError(f"{where}: {_describe(arg)} given for {_an(param)} parameter")
        if pk == "float" and arg.dtype.kind != "f":
            raise LaunchError(f"{where}: {_describe(arg)} given for a float parameter; pass a "
                              f"numpy float{8 * size} or a Python number")
        return arg.tobytes()
    if kind == "bytes":
        data = bytes(arg)
        if len(data) != size:
            raise LaunchError(f"{where}: {len(data)} raw bytes given for a {size}-byte parameter")
        return data
    raise LaunchError(f"{where}: cannot pass {_describe(arg)} {_short(arg)} to a {size}-byte "
                      "parameter; pass an int, float, numpy scalar, device array, TensorMap or bytes")


def _an(param: Param) -> str:
    return {"pointer": "a pointer", "word": "a 64-bit integer/pointer", "int": "an integer"}.get(
        param.kind, f"a {param.kind}")


def _short(arg) -> str:
    text = repr(arg)
    return text if len(text) <= 60 else text[:57] + "..."


def _bad(where, arg, param):
    raise LaunchError(f"{where}: cannot pack {_describe(arg)} {_short(arg)} into a "
                      f"{param.size}-byte {param.kind if param.kind != 'any' else ''}"
                      f"{' ' if param.kind != 'any' else ''}parameter".replace("  ", " "))


def _check_devices(params: list[Param], args: tuple, ordinal: int) -> None:
    for p, a in zip(params, args):
        kind = arg_kind(a)
        if kind == "tensormap":
            a = a.array
        elif kind != "array":
            continue
        dev = as_array(a).device
        if dev is not None and dev.ordinal != ordinal:
            raise LaunchError(f"{p.describe()}: the array lives on device {dev.ordinal} but the "
                              f"launch is on device {ordinal}; a launch's arrays live on its device "
                              f"(for a launch on device {dev.ordinal}, call tf.set_device({dev.ordinal}) first)")


# --- a whole argument tuple ---------------------------------------------------------------------


class ArgPacker:
    """Packs argument tuples for one kernel into a reusable buffer addressed by a ``void**``.

    ``pack`` checks every argument (``convert``). ``plan_source`` generates, once per tuple of
    argument types, the body of a fast path: one type test per argument, liveness of tmaflow
    memory, and a single ``struct.pack_into``.
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

    def check_count(self, args: tuple) -> None:
        if len(args) != len(self.params):
            sizes = ", ".join(p.ctype or f"{p.size} B" for p in self.params)
            raise LaunchError(f"the kernel takes {len(self.params)} arguments ({sizes}) but "
                              f"{len(args)} were given")

    def convert_all(self, args: tuple, ordinal: int | None = None) -> list[bytes]:
        self.check_count(args)
        out = [convert(p, a) for p, a in zip(self.params, args)]
        if ordinal is not None:
            _check_devices(self.params, args, ordinal)
        return out

    def pack(self, args: tuple, ordinal: int | None = None) -> int:
        """Check ``args`` (and, given the launch device's ``ordinal``, that every array lives
        there), write them into the buffer; return the ``kernelParams`` pointer."""
        base = ctypes.addressof(self.buffer)
        for p, data in zip(self.params, self.convert_all(args, ordinal)):
            ctypes.memmove(base + p.offset, data, p.size)
        return self.kernel_params

    def plan_source(self, args: tuple, ordinal: int):
        """(condition, values, format, frameworks, names) for a fast path on device ``ordinal``
        specialised to the types of ``args`` (already checked by ``pack``), or None when some
        argument always takes the checked path. ``frameworks`` names the array libraries among
        the arguments; ``names`` the values the conditions refer to (``LIVE_a<i>``)."""
        fmt, pos, checks, values, frameworks, names = ["<"], 0, [], [], set(), {}
        for i, (p, a) in enumerate(zip(self.params, args)):
            if p.offset > pos:
                fmt.append(f"{p.offset - pos}x")
            form = arg_fast_form(a, f"a{i}", ordinal)
            if form is None:
                return None
            check, value, code, framework = form[:4]
            if form[5] is not None:
                names[f"LIVE_a{i}"] = form[5]
            if code == "num":  # Python/numpy number: the parameter decides the encoding
                if p.kind == "float" or (p.kind == "any" and isinstance(a, float)):
                    code = _FLOAT_CODES.get(p.size)
                elif p.kind in ("pointer", "word") or p.signed is False:
                    code = _UINT_CODES.get(p.size)
                else:
                    code = _INT_CODES.get(p.size)
                if code is None:
                    return None
            elif code == "ptr":
                code = "Q"
            fmt.append(code)
            checks.append(check)
            values.append(value)
            if framework:
                frameworks.add(framework)
            pos = p.offset + p.size
        return checks, values, "".join(fmt), frameworks, names

    def native_fields(self, args: tuple, ordinal: int):
        """``((kind, offset, size, type, live), ...)`` for a C plan (``native.py``) of these
        argument types on device ``ordinal``, mirroring ``plan_source`` (``live``: the expected
        ``_alloc.live`` tokens, or None); None where some argument is outside
        what a plan writes (numpy scalars, 2-byte floats, a float for an integer parameter):
        those take the generated Python path."""
        fields = []
        for p, a in zip(self.params, args):
            form = arg_fast_form(a, "a", ordinal)
            if form is None:
                return None
            kind, live = form[4:]
            t = type(a)
            if kind == "num":
                if t not in (int, float, bool):
                    return None
                if p.kind == "float" or (p.kind == "any" and t is float):
                    kind = "float"
                elif t is float:
                    return None  # a float for an integer: the checked path names it
                elif p.kind in ("pointer", "word") or p.signed is False:
                    kind = "unsigned"
                else:
                    kind = "signed"
            size_ok = {"tensormap": p.size == 128, "float": p.size in (4, 8),
                       "signed": p.size in (1, 2, 4, 8), "unsigned": p.size in (1, 2, 4, 8)}
            if not size_ok.get(kind, p.size == 8):
                return None
            fields.append((PLAN_KINDS[kind], p.offset, p.size, None if kind == "none" else t, live))
        return tuple(fields) if len(fields) == len(self.params) == len(args) else None

