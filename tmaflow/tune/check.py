"""Whether a variant computed what the default variant did: outputs copied to the host and
compared bit for bit, or within a tolerance the caller gives."""
from __future__ import annotations

import numpy as np

from ..errors import TmaflowError


def to_host(value) -> np.ndarray:
    """A numpy copy of a tmaflow array, a torch tensor (bf16 of either widened to float32:
    exact) or an array-like (a copy: the next variant may overwrite the original)."""
    if hasattr(value, "detach"):  # torch
        value = value.detach()
        if value.dtype.is_floating_point and value.element_size() < 4:
            value = value.float()
        value = value.cpu().numpy()
    elif hasattr(value, "numpy"):
        bf16 = getattr(getattr(value, "dtype", None), "name", None) == "bfloat16"
        value = value.numpy()
        if bf16:  # 16-bit patterns (or ml_dtypes values) widened to float32, exactly
            return (np.asarray(value).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.array(value, copy=True)


def poison(value) -> None:
    """Overwrite an output before a variant runs, so one that writes nothing cannot pass."""
    if hasattr(value, "fill_bytes"):  # tmaflow array
        value.fill_bytes(0xFF)
    elif hasattr(value, "fill_"):  # torch
        value.fill_(float("nan") if value.dtype.is_floating_point else -1)
    elif isinstance(value, np.ndarray) and value.flags.writeable:
        value.fill(np.nan if value.dtype.kind in "fc" else -1)


def as_outputs(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def mismatch(got, want, tolerance) -> str | None:
    """Why ``got`` differs from ``want`` (lists of host arrays), or None when it does not.
    ``tolerance``: None for bit-exact, else ``(rtol, atol)``."""
    if len(got) != len(want):
        return f"{len(got)} outputs, the default gave {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {i}: {g.dtype}{g.shape}, the default gave {w.dtype}{w.shape}"
        if tolerance is None:
            same = np.array_equal(g.view(np.uint8), w.view(np.uint8)) if g.dtype.kind != "O" else np.array_equal(g, w)
        else:
            rtol, atol = tolerance
            same = bool(np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True))
        if not same:
            return f"output {i} differs from the default's ({'bit-exact' if tolerance is None else f'rtol={tolerance[0]}, atol={tolerance[1]}'})"
    return None


def as_tolerance(tolerance):
    """None (bit-exact) or a (rtol, atol) pair of non-negative floats."""
    if tolerance is None:
        return None
    try:
        rtol, atol = (float(t) for t in tolerance)
    except (TypeError, ValueError):
        raise TmaflowError(f"autotune: tolerance={tolerance!r} must be None (bit-exact) or (rtol, atol)") from None
    if not (rtol >= 0 and atol >= 0):
        raise TmaflowError(f"autotune: tolerance={tolerance!r}: rtol and atol must be >= 0")
    return rtol, atol
