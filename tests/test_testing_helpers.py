"""``tmaflow.testing`` in a plain script: its helpers need no pytest (the plugin's pytest parts
live in ``tmaflow.pytest_plugin``)."""
import subprocess
import sys
from pathlib import Path

import pytest

import tmaflow.pytest_plugin
import tmaflow.testing

ROOT = Path(__file__).resolve().parents[1]


def test_helpers_import_and_run_without_pytest():
    script = ("import sys; sys.modules['pytest'] = None  # an environment without pytest\n"
              "from tmaflow.testing import assert_close, rel_error\n"
              "assert rel_error([1.0, 2.0], [1.0, 2.0]) == 0.0\n"
              "assert_close([1.0, 2.0], [1.0, 2.0 + 1e-9])\n"
              "try:\n"
              "    assert_close([1.0], [2.0])\n"
              "except AssertionError as exc:\n"
              "    print(exc)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "relative error 5.000e-01 > 1.0e-06"


def test_the_plugin_registers_its_pytest_parts(request, tmp_cache):
    manager = request.config.pluginmanager
    assert manager.is_registered(tmaflow.testing) and manager.is_registered(tmaflow.pytest_plugin)
    assert tmp_cache.name == "cache"  # a fixture of tmaflow.pytest_plugin
    assert any(line.startswith("gpu:") for line in request.config.getini("markers"))


def test_assert_close_names_the_error():
    with pytest.raises(AssertionError, match=r"relative error 1.000e\+00 > 1.0e-06"):
        tmaflow.testing.assert_close([0.0, 0.0], [1.0, 0.0])
