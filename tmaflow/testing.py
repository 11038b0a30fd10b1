"""Test helpers for kernel authors, also a pytest plugin (entry point ``tmaflow``).

- marker ``gpu``: skipped, with the reason, on machines without a Hopper GPU;
- fixtures ``device`` (the current tf.Device) and ``tmp_cache`` (a private compile cache);
- ``poison`` outputs before a launch, ``rel_error`` / ``assert_close`` against references.
"""
from __future__ import annotations

import numpy as np
import pytest

from .launch import cache
from .runtime import driver
from .runtime.device import Device, current_device
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
    err = rel_error(out, ref)
    if not err <= tol:
        raise AssertionError(f"relative error {err:.3e} > {tol:.1e}")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a Hopper GPU (skipped with a reason otherwise)")


def pytest_collection_modifyitems(config, items):
    gpu_items = [i for i in items if i.get_closest_marker("gpu")]
    if not gpu_items:
        return
    reason = hopper_reason()
    if reason:
        skip = pytest.mark.skip(reason=f"gpu test: {reason}")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture
def device():
    reason = hopper_reason()
    if reason:
        pytest.skip(reason)
    return current_device()


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """A private, empty compile cache directory (in-process cache cleared too)."""
    monkeypatch.setenv("TMAFLOW_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TMAFLOW_CACHE", "1")
    cache.clear_memory()
    yield tmp_path / "cache"
    cache.clear_memory()
