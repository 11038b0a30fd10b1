"""Argument rules the entry points share: their options (``Options``), ``out`` aliasing an
input, fp8 per-tensor scales, and host group offsets. Every refusal names the entry point,
the field, the value and the rule (the vocabulary is ``tmaflow.checks``).

Entry points look their prepared state up by a key that holds the options as given, so a
lookalike (``True`` for 1, ``2.0`` for 2) would find the state of the value it imitates.
``Options`` therefore checks each option's *type* on every call (one ``type()`` test each)
and its value when a state is built: a state is only ever cached under checked values.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..checks import as_bool, as_choice, as_int, as_ints
from ..errors import TmaflowError

_NONE = type(None)
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32
L2_PROMOTIONS = ("none", "64B", "128B", "256B")


def spelled(values) -> str:
    """``64, 128, 192 or 256``."""
    items = [str(v) for v in values]
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def int_in(field: str, value, allowed: tuple) -> int:
    """``value`` as an int that is one of ``allowed``."""
    out = as_int(field, value)
    if out not in allowed:
        raise TmaflowError(f"{field}={out} must be {spelled(allowed)}")
    return out


def positive_float(field: str, value, rule: str = "a positive finite float") -> float:
    """A finite float > 0 (numpy floats and ints too; bools, strings and NaN refused)."""
    if type(value) is float and 0.0 < value < math.inf:  # the common spelling, per call
        return value
    if not isinstance(value, (bool, np.bool_, str, bytes)):
        try:
            out = float(value)
        except (TypeError, ValueError, OverflowError):
            out = math.nan
        if math.isfinite(out) and out > 0:
            return out
    raise TmaflowError(f"{field}={value!r} must be {rule}")


def settle(config, **fields) -> None:
    """Store checked, normalised fields on a frozen dataclass (its equality and hash then
    see ``128``, never ``np.int64(128)``)."""
    for name, value in fields.items():
        object.__setattr__(config, name, value)


# --- entry-point options ----------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    """One option: ``check(field, value)`` returns the value as keys hold it; ``plain`` are the
    exact types that skip the check on the hot path (the value is checked when a state is
    built, and no lookalike has one of them)."""

    check: Callable[[str, object], object]
    plain: tuple


def integer(lo: int | None = None, hi: int | None = None, optional: bool = False) -> Rule:
    def check(field, value):
        return None if optional and value is None else as_int(field, value, lo, hi)
    return Rule(check, (int, _NONE) if optional else (int,))


def one_of_ints(*allowed: int) -> Rule:
    return Rule(lambda field, value: int_in(field, value, allowed), (int,))


def flag(optional: bool = False) -> Rule:
    def check(field, value):
        return None if optional and value is None else as_bool(field, value)
    return Rule(check, (bool, _NONE) if optional else (bool,))


def choice(*names: str, optional: bool = False) -> Rule:
    def check(field, value):
        return None if optional and value is None else as_choice(field, value, names)
    return Rule(check, (str, _NONE) if optional else (str,))


def box(optional: bool = False) -> Rule:
    """A 2-D TMA box: two extents in [1, 256]. Tuples are checked on every call (a tuple of
    floats equals the tuple of ints it imitates)."""
    def check(field, value):
        return None if optional and value is None else as_ints(field, value, 2, 1, 256)
    return Rule(check, (_NONE,) if optional else ())


def _trace(field, value):
    if value is True or value is False or isinstance(value, str) and value in ("stage", "all"):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise TmaflowError(f"{field}={value!r} must be False, True (= 'stage') or 'all'")


TRACE = Rule(_trace, (bool, str))
DEBUG = flag(optional=True)


class Options:
    """The options of one entry point, in call order: ``opts(*values)`` on every call returns
    them as the cache key holds them (as given when each has a plain type, else checked and
    normalised: ``np.int64(3)`` becomes 3, ``np.bool_(True)`` True); ``opts.check(*values)``
    checks every value, when a state is built. ``opts.plain`` holds every tuple of plain types,
    so a hot entry point tests its options' types in one set lookup, inline:
    ``if (type(pdl), type(debug)) not in OPTS.plain: pdl, debug = OPTS.check(pdl, debug)``."""

    def __init__(self, who: str, **rules: Rule):
        self.fields = tuple(f"{who}: {name}" for name in rules)
        self.rules = tuple(rules.values())
        self.plain = frozenset(itertools.product(*(rule.plain for rule in self.rules)))

    def __call__(self, *values) -> tuple:
        if tuple(map(type, values)) in self.plain:
            return values
        return self.check(*values)

    def check(self, *values) -> tuple:
        return tuple(rule.check(field, value) for field, rule, value in zip(self.fields, self.rules, values))


# --- out aliasing an input --------------------------------------------------------------------

def span(arr) -> tuple[int, int]:
    """[first, end) of the bytes ``arr``'s elements occupy; (ptr, ptr) when it is empty."""
    lo = hi = arr.ptr
    for n, stride in zip(arr.shape, arr.strides):
        if n == 0:
            return arr.ptr, arr.ptr
        if stride < 0:
            lo += (n - 1) * stride
        else:
            hi += (n - 1) * stride
    return lo, hi + arr.dtype.itemsize


def same_layout(a, b) -> bool:
    return a.ptr == b.ptr and a.shape == b.shape and a.strides == b.strides and a.dtype.itemsize == b.dtype.itemsize


def no_aliasing(who: str, out, inputs: tuple, in_place: str | None = None) -> tuple:
    """Refuse an ``out`` whose bytes overlap an input's ((name, array or None) pairs): the
    kernel would read what it already wrote. ``in_place`` names the input ``out`` may be
    exactly (same address and layout) where the kernel reads each element before writing it.

    Returns the overlap windows of these layouts, which a state keyed by them keeps: a
    repeated call then tests its addresses with ``apart``, and only a call that may overlap
    comes back here. Input i's window is (windows[2i], windows[2i + 1]): the bytes overlap
    exactly when windows[2i] < out.ptr - input.ptr < windows[2i + 1] ((0, 0), which holds
    nothing, for no input or an empty out).
    """
    lo, hi = span(out)
    windows = tuple(bound for _, arr in inputs for bound in _window(lo - out.ptr, hi - out.ptr, arr))
    if lo == hi:
        return windows
    for name, arr in inputs:
        if arr is None:
            continue
        a_lo, a_hi = span(arr)
        if a_lo < hi and lo < a_hi and not (name == in_place and same_layout(out, arr)):
            exact = f"; only out={name} itself (same address and strides) is computed in place" \
                if in_place == name else ""
            raise TmaflowError(
                f"{who}: out (bytes {lo:#x}..{hi:#x}) overlaps {name} (bytes {a_lo:#x}..{a_hi:#x}): "
                f"the kernel would read {name} after writing out over it{exact}; pass an out of "
                "its own")
    return windows


def _window(lo: int, hi: int, arr) -> tuple[int, int]:
    """(low, high): the bytes [out.ptr + lo, out.ptr + hi) overlap ``arr``'s exactly when
    low < out.ptr - arr.ptr < high."""
    if arr is None or lo == hi:
        return 0, 0
    a_lo, a_hi = span(arr)
    return a_lo - arr.ptr - hi, a_hi - arr.ptr - lo


def apart(out_ptr: int, ptrs: tuple, windows: tuple | None) -> bool:
    """True when an out at ``out_ptr`` overlaps none of the inputs at ``ptrs`` whose layouts
    gave ``windows`` (``no_aliasing``'s return); False when it may, or without windows."""
    if windows is None:
        return False
    i = 0
    for ptr in ptrs:
        if windows[i] < out_ptr - ptr < windows[i + 1]:
            return False
        i += 2
    return True


# --- fp8 per-tensor scales --------------------------------------------------------------------

_SCALE_RULE = ("a finite float > 0 (a per-tensor dequantisation factor) or a float32 device "
               "array of block scales")


def tensor_scale(who: str, scale_a, scale_b) -> float:
    """The factor the fp8 epilogue multiplies by: scale_a * scale_b (each a finite float > 0,
    1 when None), refused where the float32 the kernel receives would be inf, 0 or subnormal."""
    product = 1.0
    for name, value in (("scale_a", scale_a), ("scale_b", scale_b)):
        if value is not None:
            product *= positive_float(f"{who}: {name}", value, _SCALE_RULE)
    if not FLOAT32_TINY <= product <= FLOAT32_MAX:
        raise TmaflowError(
            f"{who}: scale_a * scale_b = {scale_a!r} * {scale_b!r} = {product!r} is outside "
            f"float32's normal range [{FLOAT32_TINY!r}, {FLOAT32_MAX!r}]; the kernel takes the "
            "product as one float32 and every output would be inf or 0. Fold part of the "
            "scale into the operands or the output")
    return product


def same_device(who: str, name: str, arr, like) -> None:
    if arr.device is not None and like.device is not None and arr.device.ordinal != like.device.ordinal:
        raise TmaflowError(f"{who}: {name} lives on device {arr.device.ordinal} but a on device "
                           f"{like.device.ordinal}; every operand must be on one device")


# --- grouped GEMM offsets ---------------------------------------------------------------------

def host_offsets(who: str, offsets, groups: int, rows: int) -> np.ndarray:
    """Host offsets (a sequence, generator or numpy array of ints) as int32, checked: G + 1
    values from 0 to ``rows``, never decreasing. Values are compared as given, before the
    narrowing (an unsigned 2^32 + 5 must not become 5)."""
    if isinstance(offsets, (str, bytes, dict, set)):
        raise TmaflowError(f"{who}: offsets={offsets!r} must be {groups + 1} ints")
    if not hasattr(offsets, "__len__") and hasattr(offsets, "__iter__"):
        offsets = list(offsets)  # a generator
    try:
        host = np.asarray(offsets)
    except (TypeError, ValueError, OverflowError):
        raise TmaflowError(f"{who}: offsets={offsets!r} must be {groups + 1} ints") from None
    if host.shape != (groups + 1,) or host.dtype.kind not in "iu":
        raise TmaflowError(f"{who}: offsets must be {groups + 1} ints (got {host.shape} {host.dtype})")
    if (host < 0).any() or (host > rows).any() or host[0] != 0 or host[-1] != rows or \
            (np.diff(host.astype(np.int64)) < 0).any():
        raise TmaflowError(f"{who}: offsets {host.tolist()} must start at 0, never decrease and "
                           f"end at the {rows} rows of a")
    return host.astype(np.int32)
