"""The command line, and behaviour on a machine without a CUDA driver."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tmaflow as tf


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tmaflow", *args], capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})), timeout=600)


def test_demo_without_gpu_says_so(tmp_cache):
    out = run("demo", "--no-gpu", env={"TMAFLOW_CACHE_DIR": str(tmp_cache)})
    assert out.returncode == 0, out.stderr
    assert "NO KERNEL RAN" in out.stdout and "compiled tile_copy" in out.stdout
    assert "compiled broadcast_scale" in out.stdout


def test_swizzle_view():
    out = run("swizzle", "--dtype", "bf16", "--box", "8x64", "--swizzle", "128B")
    assert out.returncode == 0, out.stderr
    rows = [ln for ln in out.stdout.splitlines() if ln.strip().startswith("row")]
    assert rows[1].split()[2:4] == ["1:1", "1:0"]  # row 1: chunk 0 lands in chunk 1


def test_cache_info_and_clear(tmp_cache):
    tf.Kernel("__global__ void k(int* p) { p[0] = 9; }", "k").cubin
    env = {"TMAFLOW_CACHE_DIR": str(tmp_cache)}
    info = run("cache", "info", env=env)
    assert "entries    1" in info.stdout
    cleared = run("cache", "clear", env=env)
    assert "removed 1 entries" in cleared.stdout and not list(tmp_cache.glob("*/*.tfbin"))


no_driver = pytest.mark.skipif(tf.driver_available(), reason="this machine has a CUDA driver")


@no_driver
def test_no_driver_is_reported_not_raised():
    assert tf.driver_available() is False
    with pytest.raises(tf.DriverNotFoundError, match=r"no usable CUDA driver: .* compilation"):
        tf.Device(0)
    with pytest.raises(tf.DriverNotFoundError):
        tf.empty((4,), "float32")
    with pytest.raises(tf.DriverNotFoundError):
        tf.TensorMap.tiled(tf.DeviceArray(0x1000, (16, 16), "float32"), (4, 4))


def test_host_array_where_device_needed():
    with pytest.raises(tf.TmaflowError, match=r"got a host numpy array of shape \(4,\); .* tf.from_numpy"):
        tf.as_array(np.zeros(4))
    with pytest.raises(tf.TmaflowError, match=r"list is not a device array"):
        tf.as_array([1, 2])


def test_swizzle_png(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "swizzle.png"
    out = run("swizzle", "--dtype", "float32", "--box", "16x32", "--png", str(png))
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_swizzle_png_without_matplotlib_fails_saying_so(tmp_path):
    blocked = tmp_path / "site" / "matplotlib"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    root = Path(__file__).resolve().parents[1]
    out = run("swizzle", "--png", str(tmp_path / "s.png"),
              env={"PYTHONPATH": os.pathsep.join([str(blocked.parent), str(root)])})
    assert out.returncode == 1 and not (tmp_path / "s.png").exists()
    assert out.stderr == "tmaflow: swizzle --png needs matplotlib (pip install 'tmaflow[plot]')\n"
    assert out.stdout == ""  # refused before any work


def test_drawing_leaves_the_global_backend_and_pyplot_alone(tmp_path):
    pytest.importorskip("matplotlib")
    script = f"""
import sys, matplotlib
matplotlib.use("pdf")  # a user's choice, e.g. a notebook's inline backend
from tmaflow import cli
from test_trace import layout, rings
import tmaflow.debug.trace as tr
from tmaflow.launch.config import LaunchConfig
assert cli.main(["swizzle", "--box", "8x64", "--png", {str(tmp_path / "s.png")!r}]) == 0
lay = layout()
t = tr.Trace.from_rings(rings([[(1000, 60, "wait", 0, lay.offset("ab_full"), 0)]]), "k", LaunchConfig(1, 32), lay)
t.to_png({str(tmp_path / "t.png")!r})
print(matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules)
"""
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=root,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(root / "tests")])))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "pdf False"
    for png in ("s.png", "t.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trace_png_without_matplotlib_is_a_tmaflow_error(monkeypatch, tmp_path):
    from test_trace import layout, rings
    from tmaflow.debug import trace as tr

    lay = layout()
    t = tr.Trace.from_rings(rings([[(1000, 60, "wait", 0, lay.offset("ab_full"), 0)]]), "k",
                            tf.LaunchConfig(1, 32), lay)
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(tf.TmaflowError, match=r"Trace.to_png needs matplotlib \(pip install 'tmaflow\[plot\]'\)"):
        t.to_png(tmp_path / "t.png")


def test_cli_reports_tmaflow_errors_without_traceback():
    out = run("swizzle", "--dtype", "float32", "--box", "8x64", "--swizzle", "128B")
    assert out.returncode == 1
    assert out.stderr.startswith("tmaflow: box[1]=64 x 4 B = 256 B exceeds the 128B swizzle span")
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("argv", [["swizzle", "--box", "8xq"], ["swizzle", "--dtype", "nope"],
                                  ["swizzle", "--box", "0x8"], ["swizzle", "--swizzle", "7B"],
                                  ["cache", "nope"], ["nope"], [], ["bench", "--only", "nope"],
                                  ["bench", "--repeats", "many"], ["demo", "--bogus"]])
def test_cli_garbage_is_one_line_and_non_zero(argv):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "tmaflow", *argv], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0, (argv, r.stdout)
    assert "Traceback" not in r.stderr and r.stderr.strip(), (argv, r.stderr)
    assert len(r.stderr.strip().splitlines()) <= 3, r.stderr  # argparse: usage + error


def test_cli_into_a_closed_pipe_is_quiet():
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-m", "tmaflow", "swizzle", "--box", "256x64",
                          "--dtype", "uint8", "--swizzle", "none"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()  # the reader leaves before the first line (as `| head -0` would)
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag):
    r = run(flag)
    assert r.returncode == 0 and r.stdout.strip() == f"tmaflow {tf.__version__}"


def test_cache_info_while_another_process_clears(tmp_path, monkeypatch):
    import threading

    from tmaflow.launch import cache

    monkeypatch.setenv("TMAFLOW_CACHE_DIR", str(tmp_path))
    for i in range(200):
        d = tmp_path / f"{i % 16:02x}"
        d.mkdir(exist_ok=True)
        (d / f"{i}.tfbin").write_bytes(b"x" * 100)
    errors = []

    def clear():
        try:
            cache.clear()
        except Exception as exc:  # noqa: BLE001 - any escape is the failure
            errors.append(exc)

    t = threading.Thread(target=clear)
    t.start()
    for _ in range(20):
        got = cache.info()
        assert 0 <= got["entries"] <= 200 and got["bytes"] == 100 * got["entries"]
    t.join()
    assert not errors and cache.info()["entries"] == 0


def test_bad_input_page_is_current():
    """docs/bad-input-battery.md is generated from tests/battery.py (it once fell 41 cases
    behind); a new case must regenerate it."""
    import subprocess
    import sys
    from pathlib import Path

    import os

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(root / "tests")]))
    r = subprocess.run([sys.executable, str(root / "tools" / "docs" / "battery_table.py"), "--check"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr


def test_device_library_page_is_current():
    """docs/device-library.md is generated from the headers; a header edit must regenerate it."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "tools" / "device_reference.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


@pytest.mark.parametrize("err,status,capturing", [(0, "NONE", False), (0, "ACTIVE", True), (0, "INVALIDATED", True),
                                                  (1, "NONE", True)])
@pytest.mark.parametrize("path", ["ctypes", "cuda.bindings"])
def test_stream_capturing_counts_an_error_as_capturing(monkeypatch, err, status, capturing, path):
    """driver.stream_capturing, the one capture question (collectives' replay shortcut, split-K's
    and grouped C-map slots' captured scratch, the sanitizer's zeroing): a stream the driver
    cannot answer for is not taken for an eager one; libcuda through ctypes where it loads,
    else cuda.bindings."""
    import types

    from tmaflow.runtime import driver

    names = ("NONE", "ACTIVE", "INVALIDATED")
    asked = []
    if path == "ctypes":
        def fn(stream, status_ref):  # CUresult cuStreamIsCapturing(CUstream, CUstreamCaptureStatus*)
            asked.append(stream)
            status_ref._obj.value = names.index(status)
            return err
        monkeypatch.setattr(driver, "_is_capturing", [fn])
    else:
        states = types.SimpleNamespace(**{f"CU_STREAM_CAPTURE_STATUS_{s}": s for s in names})
        fake = types.SimpleNamespace(CUstreamCaptureStatus=states,
                                     cuStreamIsCapturing=lambda s: asked.append(s) or (err, status))
        monkeypatch.setattr(driver, "cu", lambda: fake)
        monkeypatch.setattr(driver, "_is_capturing", [None])
    assert driver.stream_capturing(0x77) is capturing and asked == [0x77]
