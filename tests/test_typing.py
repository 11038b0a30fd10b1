"""mypy finds nothing in tmaflow/ under the project's settings ([tool.mypy] in pyproject.toml)."""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="mypy is not installed (it comes with the test extra: pip install -e .[test])")
def test_mypy_finds_no_errors_in_every_module():
    # The cache sits next to the compile cache of the tests (.test-cache, ignored by git): a
    # cold run takes a few seconds, a warm one under one.
    run = subprocess.run([sys.executable, "-m", "mypy", "tmaflow",
                          "--cache-dir", str(ROOT / ".test-cache" / "mypy")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    checked = re.search(r"Success: no issues found in (\d+) source files", run.stdout)
    assert checked, run.stdout + run.stderr
    modules = sum(1 for _ in (ROOT / "tmaflow").rglob("*.py"))
    assert int(checked.group(1)) == modules, f"mypy checked {checked.group(1)} of {modules} modules"
