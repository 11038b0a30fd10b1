import os
from pathlib import Path

import numpy as np
import pytest

# Tests never write into the user's ~/.cache: unless told otherwise, compiled kernels go to a
# cache inside the checkout (ignored by git), which keeps later runs fast.
os.environ.setdefault("TMAFLOW_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".test-cache"))

try:  # imported before any test touches the driver, so interop tests see a clean import
    import torch  # noqa: F401
except Exception:
    pass

import tmaflow.testing


def pytest_configure(config):
    # Installed, the plugin arrives through its entry point; from a source tree, here.
    if not config.pluginmanager.is_registered(tmaflow.testing):
        config.pluginmanager.register(tmaflow.testing, "tmaflow")


@pytest.fixture
def rng():
    # Fresh inputs each run; the seed is printed on failure so a case can be replayed.
    seed = int(np.random.SeedSequence().entropy % (2**32))
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)
