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
    # the GPU run's report folder: tests and the failure log below write files into it
    if os.environ.get("TMAFLOW_REPORT_DIR"):
        os.makedirs(os.environ["TMAFLOW_REPORT_DIR"], exist_ok=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (the README's test command): the CPU tier, mostly NVRTC and ptxas at work,
    spreads over every CPU (2 CPUs, --dist worksteal: 5 minutes a stack where one process took
    12; --dist load left a worker idle for the last long compiles, 6 minutes). With a
    Hopper GPU here the tests run in one process instead: the planted-fault files reset the
    context, which fails every later test of a worker that had run torch's (session 15);
    tools/gpu_check.sh spreads the GPU tier its own way and runs those files apart."""
    return 0 if tmaflow.testing.hopper_reason() is None else None


_ONE_BYTE = bytes(range(256))


@pytest.fixture(autouse=True)
def _shared_bytes_intact():
    """CPython shares one object per one-byte ``bytes``; C code writing into a ``bytes`` buffer
    it was given can change it for the whole process (NVRTC once wrote an empty log's NUL into
    ``b" "``). Fail the test after which any of them changed, by name."""
    yield
    bad = [c for c in range(256) if bytes(_ONE_BYTE[c:c + 1])[0] != c]
    assert not bad, f"the shared one-byte bytes objects for {bad[:8]} changed during this test"


@pytest.fixture
def rng():
    # Fresh inputs each run; the seed is printed on failure so a case can be replayed.
    seed = int(np.random.SeedSequence().entropy % (2**32))
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)


def pytest_runtest_logreport(report):
    """Each failure's text as it happens, into $TMAFLOW_REPORT_DIR/failures.txt (the GPU
    script's report folder): a run stopped at its time limit still says why its tests failed."""
    folder = os.environ.get("TMAFLOW_REPORT_DIR")
    if getattr(report, "node", None) is not None:  # the xdist controller, echoing a worker's report
        return
    if folder and report.failed:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(os.path.join(folder, f"failures-{worker}.txt"), "a") as f:
            f.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
