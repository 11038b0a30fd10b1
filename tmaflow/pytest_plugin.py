"""The pytest parts of tmaflow's plugin, registered by ``tmaflow.testing.pytest_configure``:
the ``gpu`` marker (its tests skipped, with the reason, without a Hopper GPU) and the fixtures
``device`` (the current tf.Device) and ``tmp_cache`` (a private compile cache)."""
from __future__ import annotations

import pytest

from .launch import cache
from .runtime.device import current_device
from .testing import hopper_reason


def pytest_configure(config) -> None:
    """Declare the ``gpu`` marker."""
    config.addinivalue_line("markers", "gpu: needs a Hopper GPU (skipped with a reason otherwise)")


def pytest_collection_modifyitems(config, items) -> None:
    """Skip every ``gpu`` test, with the reason, where no Hopper GPU is usable."""
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
    """The current tf.Device; skips the test, with the reason, without a Hopper GPU."""
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
