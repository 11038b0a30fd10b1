"""The ``TMAFLOW_*`` environment variables, each parsed in one place with an error that names
the variable, its value and what it may be."""
from __future__ import annotations

import math
import os
from pathlib import Path

from .errors import TmaflowError

_TRUE = ("1", "true", "on", "yes")
_FALSE = ("", "0", "false", "off", "no")


def flag(name: str, default: bool) -> bool:
    """A boolean variable: 1/true/on/yes or 0/false/off/no (any case), unset = ``default``."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise TmaflowError(f"{name}={raw!r} must be one of 1/true/on/yes or 0/false/off/no")


def seconds(name: str, default: float) -> float:
    """A positive, finite number of seconds."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise TmaflowError(f"{name}={raw!r} must be a positive number of seconds (e.g. 1.5)")
    return value


def directory(name: str) -> Path | None:
    """A directory named by a variable, ``~`` expanded; None when unset or empty."""
    raw = os.environ.get(name)
    if not raw:
        return None
    return Path(os.path.expanduser(raw))
