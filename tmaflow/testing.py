"""Test helpers for kernel authors, usable in a plain script (no pytest needed):
``poison`` outputs before a launch, ``rel_error`` / ``assert_close`` against references,
``hopper_reason``.

Also the pytest plugin's entry point (``pytest11``: ``tmaflow``), whose ``pytest_configure``
registers ``tmaflow.pytest_plugin``: the ``gpu`` marker (skipped, with the reason, on machines
without a Hopper GPU) and the fixtures ``device`` and ``tmp_cache``.
"""
from __future__ import annotations

import numpy as np

from .runtime import driver
from .runtime.device import Device
from .runtime.memory import as_array

POISON_BYTE = 0xFF  # float32 0xFFFFFFFF and bf16 0xFFFF are NaNs: an unwritten output fails


def hopper_reason() -> str | None:
    """None when a Hopper GPU is usable, else why not."""
    if not driver.driver_available():
        return f"no CUDA driver ({driver._init_state.get('reason')})"

    dev = Device(0)
    if not dev.is_hopper:
        return f"device 0 is {dev.name} (cc {dev.compute_capability}), not Hopper (cc 9.0)"
    return None


def poison(array, byte: int = POISON_BYTE):
    """Fill a device array's bytes with ``byte`` (NaN for floats) so unwritten output shows."""
    as_array(array).fill_bytes(byte)
    return array


def rel_error(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64; inf when out has a NaN/inf that ref has not."""
    o = np.asarray(out, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if o.shape != r.shape:
        raise AssertionError(f"shape {o.shape} != reference shape {r.shape}")
    bad = ~np.isfinite(o) & np.isfinite(r)
    if bad.any():
        return float("inf")
    denom = np.linalg.norm(r)
    return float(np.linalg.norm(o - r) / (denom if denom else 1.0))


def assert_close(out, ref, tol: float = 1e-6) -> None:
    """Raise AssertionError unless ``rel_error(out, ref) <= tol``."""
    err = rel_error(out, ref)
    if not err <= tol:
        raise AssertionError(f"relative error {err:.3e} > {tol:.1e}")


def pytest_configure(config) -> None:
    """Register the pytest parts (``tmaflow.pytest_plugin``, which imports pytest)."""
    from . import pytest_plugin  # imports pytest: loaded only when pytest runs

    if not config.pluginmanager.is_registered(pytest_plugin):
        config.pluginmanager.register(pytest_plugin, "tmaflow.pytest_plugin")
