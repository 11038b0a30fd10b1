"""The key a tuned choice is remembered under: the shapes, dtypes and strides of the call's
array arguments, its other arguments' values, and the device's name."""
from __future__ import annotations

import hashlib

from ..runtime.device import current_device


def describe(value) -> str:
    """One argument as it matters to a kernel's speed: an array's shape, dtype and strides, a
    scalar's value, a config's repr."""
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        strides = value.stride() if callable(getattr(value, "stride", None)) else getattr(value, "strides", None)
        return f"{type(value).__name__}{tuple(shape)}:{str(value.dtype).replace('torch.', '')}:{tuple(strides or ())}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(describe(v) for v in value) + "]"
    return repr(value)


def build_key(args: tuple, kwargs: dict, key=None, device: str | None = None) -> str:
    """The key of a call: ``key(*args, **kwargs)``'s value when given, else every argument
    described; with the device's name."""
    if key is not None:
        parts = key(*args, **kwargs)
        body = describe(tuple(parts) if isinstance(parts, list) else parts)
    else:
        body = ",".join([describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in sorted(kwargs.items())])
    return f"{device if device is not None else current_device().name}|{body}"


def source_hash(*parts) -> str:
    """A short hash over what was tuned (the variants, a kernel's source): a memo entry tuned
    from anything else is not reused."""
    return hashlib.sha256("\x00".join(str(p) for p in parts).encode()).hexdigest()[:16]
