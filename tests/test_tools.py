"""tools/ as a library's clients: no sys.path edits, no monkeypatched tmaflow attributes, no
private names, every tool's command line in its docstring, and the generated pages current."""
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = sorted((ROOT / "tools").rglob("*.py"))
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def _code(path):
    return [line.split("#")[0] for line in path.read_text().splitlines()]


def test_tools_exist_in_their_groups():
    groups = {p.parent.name for p in TOOLS}
    assert {"peers", "experiments", "docs"} <= groups
    assert (ROOT / "tools" / "experiments" / "README.md").exists()


@pytest.mark.parametrize("path", TOOLS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_path_edits_monkeypatches_or_private_names(path):
    for n, line in enumerate(_code(path), 1):
        where = f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        assert "sys.path.insert" not in line and "sys.path.append" not in line, where
        assert not re.match(r"\s*(tf|tmaflow|kernels|matmul|registry|bench|ex)(\.\w+)+\s*=[^=]", line), where
        assert not re.search(r"setattr\((tf|tmaflow|kernels|matmul|registry|bench|ex)\b", line), where
        assert not re.search(r"(?<!torch)\.\_[A-Za-z]\w*", line), where  # torch._scaled_mm is the peer's API
        assert not re.search(r"from tmaflow[\w.]* import .*\b_\w", line), where


@pytest.mark.parametrize("path", [p for p in TOOLS if p.name != "sass_yield.py"], ids=lambda p: p.name)
def test_docstring_gives_the_command_line(path):
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert str(path.relative_to(ROOT)) in doc, f"{path.name}: its docstring must give its command line"


@pytest.mark.parametrize("name", ["bench_gemm", "bench_grouped", "bench_attention", "stream_gemm", "ncu_pair",
                                  "bench_autotune", "bench_distributed"])
def test_peer_tools_help_without_a_gpu_or_torch(name):
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "peers" / f"{name}.py"), "--help"],
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr


def test_bench_gemm_offers_the_suites():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "peers" / "bench_gemm.py"), "--help"],
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert "30" in r.stdout and "unaligned" in r.stdout


def test_benchmarks_page_is_current():
    """BENCHMARKS.md is generated from bench/results/*.json; a new record must regenerate it."""
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "docs" / "benchmarks_page.py"), "--check"],
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_benchmarks_page_has_every_area():
    text = (ROOT / "BENCHMARKS.md").read_text()
    for heading in ("Launch", "Bandwidth", "GEMM bf16", "GEMM fp8 and block-scaled", "GEMM skinny", "GEMM grouped",
                    "GEMM unaligned", "Attention", "Tracing cost", "Sanitizers"):
        assert f"\n## {heading}" in text, heading
    assert "Device " in text and "commit `" in text and "command `" in text

