"""Argument coercion shared by every public function: one spelling of "an int", "a flag",
"a finite number" and "one of these names", each refusing with the field, the value and the
rule.

Valid spellings are accepted as a user writes them: numpy integer scalars and 0-d integer
arrays where an int belongs, ``np.bool_`` where a flag belongs, numpy floats where a number
belongs, any iterable (generators included) where a sequence of ints belongs. Lookalikes are
refused: ``True`` is not an int, ``128.0`` is not an int, ``1`` is not a flag, NaN is not a
number, and a string is never a sequence.
"""
from __future__ import annotations

import math
import operator
import re

import numpy as np

from .errors import TmaflowError


def is_int(value) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _bounds(lo, hi) -> str:
    if lo is not None and hi is not None:
        return f" in [{lo}, {hi}]"
    if lo is not None:
        return f" >= {lo}"
    if hi is not None:
        return f" <= {hi}"
    return ""


def as_int(field: str, value, lo: int | None = None, hi: int | None = None,
           error: type[TmaflowError] = TmaflowError) -> int:
    """``value`` as an int (Python or numpy integer), checked against ``[lo, hi]``."""
    if not is_int(value):
        raise error(f"{field}={value!r} must be an int{_bounds(lo, hi)} "
                    f"(got {type(value).__name__})")
    out = operator.index(value)
    if (lo is not None and out < lo) or (hi is not None and out > hi):
        raise error(f"{field}={out} must be{_bounds(lo, hi)}")
    return out


def as_optional_int(field: str, value, lo: int | None = None, hi: int | None = None,
                    error: type[TmaflowError] = TmaflowError) -> int | None:
    """``None`` or :func:`as_int`."""
    return None if value is None else as_int(field, value, lo, hi, error)


def as_bool(field: str, value, error: type[TmaflowError] = TmaflowError) -> bool:
    """``value`` as a flag: ``True``/``False`` or numpy's ``np.bool_``, nothing else."""
    if isinstance(value, bool):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise error(f"{field}={value!r} must be True or False (got {type(value).__name__})")


def as_optional_bool(field: str, value, error: type[TmaflowError] = TmaflowError) -> bool | None:
    """``None`` (a choice left to the library) or :func:`as_bool`'s flag."""
    if value is None or isinstance(value, (bool, np.bool_)):
        return None if value is None else bool(value)
    raise error(f"{field}={value!r} must be True, False or None (got {type(value).__name__})")


def as_float(field: str, value, *, lo: float | None = None, hi: float | None = None,
             open_lo: bool = False, error: type[TmaflowError] = TmaflowError) -> float:
    """``value`` as a finite float (ints and numpy scalars too, bools not), in ``[lo, hi]``
    (``(lo, hi]`` with ``open_lo``)."""
    if isinstance(value, (bool, np.bool_, str, bytes)):
        raise error(f"{field}={value!r} must be a finite number (got {type(value).__name__})")
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        raise error(f"{field}={value!r} must be a finite number (got {type(value).__name__})") from None
    if not math.isfinite(out):
        raise error(f"{field}={value!r} must be a finite number")
    if lo is not None and (out <= lo if open_lo else out < lo):
        raise error(f"{field}={out!r} must be {'>' if open_lo else '>='} {lo}")
    if hi is not None and out > hi:
        raise error(f"{field}={out!r} must be <= {hi}")
    return out


def as_ints(field: str, value, rank: int | None = None, lo: int | None = None,
            hi: int | None = None, error: type[TmaflowError] = TmaflowError) -> tuple[int, ...]:
    """A tuple of ints from an int or any flat iterable of ints (lists, tuples, generators,
    1-D numpy arrays, ``torch.Size``); strings, mappings and nested sequences are refused."""
    if type(value) is tuple and (rank is None or len(value) == rank) and all(  # the common case, in one pass
            type(v) is int and (lo is None or v >= lo) and (hi is None or v <= hi) for v in value):
        return value
    if value is None or isinstance(value, (str, bytes, bytearray, dict, set, frozenset)):
        raise error(f"{field}={value!r} must be a sequence of ints")
    if is_int(value) and getattr(value, "ndim", 0) == 0:
        items = [value]
    else:
        if getattr(value, "ndim", 1) != 1:
            raise error(f"{field}={value!r} must be a flat sequence of ints "
                        f"(got {getattr(value, 'ndim')} dimensions)")
        try:
            items = list(value)
        except TypeError:
            raise error(f"{field}={value!r} must be a sequence of ints "
                        f"(got {type(value).__name__})") from None
    out = tuple(as_int(f"{field}[{i}]", v, lo, hi, error) for i, v in enumerate(items))
    if rank is not None and len(out) != rank:
        raise error(f"{field}={out!r} has {len(out)} entries; {rank} are needed")
    return out


def as_choice(field: str, value, choices, error: type[TmaflowError] = TmaflowError) -> str:
    """One of the names ``choices`` (compared exactly), refused with the list otherwise."""
    if not isinstance(value, str) or value not in choices:
        raise error(f"{field}={value!r} must be one of {', '.join(map(repr, choices))}")
    return value


def as_arch(field: str, value, error: type[TmaflowError] = TmaflowError) -> str:
    """A GPU architecture name such as ``'sm_90a'``."""
    if not isinstance(value, str) or not re.fullmatch(r"sm_\d{2,3}[af]?", value):
        raise error(f"{field}={value!r} must look like 'sm_90a'")
    return value


def as_text(field: str, value, error: type[TmaflowError] = TmaflowError) -> str:
    """A str that encodes as UTF-8 (C tools read bytes; a lone surrogate has none)."""
    if not isinstance(value, str):
        raise error(f"{field}={value!r} must be a str (got {type(value).__name__})")
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise error(f"{field}={value!r} is not valid UTF-8 text ({exc.reason} at "
                    f"{exc.start})") from None
    return value
