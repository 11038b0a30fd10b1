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
                                  "bench_autotune", "bench_distributed", "gemm_sweep", "decode_timeline"])
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


def _sweep_row(shape, default, best, cold_gain, warm_gain):
    def side(cfg, ratio, gain):
        return {"config": {"type": "GemmConfig", **cfg}, "describe": str(cfg), "cold_ratio": ratio,
                "warm_ratio": ratio, "cold_vs_default": gain, "warm_vs_default": gain}
    return {"shape": shape, "tiles_m": 4, "k_blocks": 32, "default": side(default, 0.8, 1.0),
            "best": {**side(best, 1.1, 1.0), "cold_vs_default": cold_gain, "warm_vs_default": warm_gain},
            "confirmed": {"default+pdl": {"warm_ratio": 0.9}}}


def test_gemm_sweep_summary_and_precompile(tmp_path):
    """gemm_sweep.py without a GPU: --summary prints a saved run's table and the shapes whose
    best beats the default by 2% in both timings, with the fields that changed; --precompile
    compiles a shape's kernels into the cache, and a second run finds them all there."""
    import json

    base = dict(bn=64, cluster_m=1, split_k=2, cluster_k=1)
    rows = [_sweep_row("512x512x2048", base, dict(base, split_k=1, cluster_k=4), 1.3, 1.2),
            _sweep_row("1024x1024x1024", base, dict(base, bn=128), 1.05, 1.01),
            {"shape": "4096x4096x4096", "skipped": "budget spent (231 s)"}]
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"rows": rows}))
    tool = str(ROOT / "tools" / "peers" / "gemm_sweep.py")
    r = subprocess.run([sys.executable, tool, "--summary", str(path)], capture_output=True, text=True, env=ENV,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "512x512x2048 tiles_m   4 k_blocks   32: split_k 2->1, cluster_k 1->4" in r.stdout
    assert "1024x1024x1024 tiles_m" not in r.stdout and "budget spent" in r.stdout
    env = dict(ENV, TMAFLOW_CACHE_DIR=str(tmp_path / "cache"))
    runs = [subprocess.run([sys.executable, tool, "--precompile", "--shape", "256x256x256", "--jobs", "2"],
                           capture_output=True, text=True, env=env, timeout=300) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr + runs[1].stderr
    first = re.search(r"precompiled (\d+) kernels \((\d+) compiled, 0 from disk\)", runs[0].stdout)
    assert first and first.group(1) == first.group(2) and int(first.group(1)) >= 5, runs[0].stdout
    assert f"({first.group(1)} from disk)" not in runs[1].stdout  # the counts are 0 compiled, N from disk
    assert f"(0 compiled, {first.group(1)} from disk)" in runs[1].stdout, runs[1].stdout
