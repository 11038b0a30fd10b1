"""The packaging metadata: an SPDX license with its file, an sdist that carries the tests and
the docs, and a README whose commands install what the tests use (checked by reading them;
``python -m build --sdist`` itself needs the network for its build requirement)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_license_is_an_spdx_string_with_its_file():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "MIT"
    assert project["project"]["license-files"] == ["LICENSE"] and (ROOT / "LICENSE").is_file()
    # SPDX strings in project.license need setuptools >= 77 (PEP 639)
    requires = project["build-system"]["requires"]
    assert any(re.fullmatch(r"setuptools>=(\d+)", r) and int(r.split(">=")[1]) >= 77 for r in requires)
    assert project["project"]["entry-points"]["pytest11"] == {"tmaflow": "tmaflow.testing"}


def test_the_sdist_carries_tests_docs_and_the_tools_tests_run():
    rules = (ROOT / "MANIFEST.in").read_text().splitlines()
    for folder in ("tests", "docs", "tools"):
        assert f"graft {folder}" in rules


def test_readme_installs_from_a_checkout_with_the_extras_the_tests_use():
    text = (ROOT / "README.md").read_text()
    assert "From a checkout of this repository (`git clone <repository URL> tmaflow && cd tmaflow`)" in text
    install = re.search(r'python -m pip install -e "\.\[([a-z0-9,]+)\]"\s*(?:#.*)?\npython -m pytest -q',
                        text)
    assert install and set(install.group(1).split(",")) >= {"test", "tools", "plot"}
