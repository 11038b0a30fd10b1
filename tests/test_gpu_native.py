"""GPU tier: the C launch path (tmaflow/launch/_launch.c) against the hardware. Every argument kind
packed per call and echoed back by a kernel, the plan's launch counter, kept launchers
refused after Kernel.close() and Device.reset() on the C and the Python path, arrays of
another device refused on both paths (two GPUs)."""
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import tmaflow as tf
from kernel_sources import source
from tmaflow.launch import native
from tmaflow.testing import poison

pytestmark = pytest.mark.gpu

PATHS = ["C", "Python"]


def probe(name):
    return tf.Kernel(source("probe"), name, filename="probe.cu")


def take_path(path, monkeypatch):
    """Launchers built from here on take the C plan (skipped where it is not built) or the
    generated Python function."""
    if path == "C" and native.module() is None:
        pytest.skip(native.status())
    if path == "Python":
        monkeypatch.setattr(native, "plan", lambda *args, **kwargs: None)


def fast_path_of(run):
    return "C" if type(run.func).__name__ == "Plan" else "Python"


def test_the_c_path_packs_every_kind_per_call(device, rng):
    if native.module() is None:
        pytest.skip(native.status())
    k = probe("echo_args")
    base = tf.zeros((64, 64), "float32")
    tmap = tf.TensorMap.tiled(base, (16, 16))
    p0, p1 = tf.from_numpy(np.array([1.5], np.float32)), tf.from_numpy(np.array([-2.5], np.float32))
    out = tf.empty(24, "uint64")
    run = k.launcher(grid=1, block=32)
    for i in range(12):
        i8, u16 = int(rng.integers(-128, 128)), int(rng.integers(0, 2**16))
        i32, i64 = int(rng.integers(-2**31, 2**31)), int(rng.integers(-2**63, 2**63))
        f32, f64 = float(np.float32(rng.standard_normal())), float(rng.standard_normal() * 1e200)
        poison(out)
        run(tmap, i8, u16, i32, i64, f32, f64, p0, p1, out)
        got = out.numpy()
        assert got[:16].tobytes() == bytes(tmap)
        assert got[16:20].view(np.int64).tolist() == [i8, u16, i32, i64]
        assert struct.unpack("<f", struct.pack("<I", int(got[20])))[0] == f32
        assert got[21:22].view(np.float64)[0] == f64
        assert got[22:24].astype(np.uint32).view(np.float32).tolist() == [1.5, -2.5]
    assert fast_path_of(run) == "C" and run.func.launches == 11  # the first call: checked


@pytest.mark.parametrize("path", PATHS)
def test_a_kept_launcher_is_refused_after_kernel_close(device, path, monkeypatch):
    take_path(path, monkeypatch)
    k = probe("big_smem")
    out = tf.empty(256, "uint32")
    run = k.launcher(grid=1, block=64, smem=1024)
    run(out, 1024, 1)
    run(out, 1024, 2)
    assert fast_path_of(run) == path
    k.close()
    poison(out, 0xFF)
    with pytest.raises(tf.LaunchError, match=r"kernel 'big_smem' was closed; build a new launcher"):
        run(out, 1024, 3)
    assert (out.numpy() == 0xFFFFFFFF).all()  # nothing launched
    k.launch(out, 1024, 4, grid=1, block=64, smem=1024)  # the kernel itself loads again
    assert out.numpy()[255] == 4  # words[0] = 0 * 2654435761 ^ seed


RESET_SCRIPT = """
import sys
import numpy as np, tmaflow as tf
from kernel_sources import source
from tmaflow.launch import native
if sys.argv[1] == "Python":
    native.plan = lambda *args, **kwargs: None
k = tf.Kernel(source("probe"), "big_smem", filename="probe.cu")
run = k.launcher(grid=1, block=64, smem=1024)
out = tf.empty(256, "uint32")
run(out, 1024, 1)
run(out, 1024, 2)
print("path", "C" if type(run.func).__name__ == "Plan" else "Python")
tf.current_device().reset()
out = tf.empty(256, "uint32").fill_bytes(0xFF)
try:
    run(out, 1024, 3)
    raise SystemExit("a launcher kept across a reset launched its dead function")
except tf.LaunchError as e:
    assert "kernel 'big_smem': the context was reset; build a new launcher" in str(e), e
assert (out.numpy() == 0xFFFFFFFF).all()
k.launcher(grid=1, block=64, smem=1024)(out, 1024, 5)
assert out.numpy()[255] == 5
print("reset ok")
"""


@pytest.mark.parametrize("path", PATHS)
def test_a_kept_launcher_is_refused_after_a_context_reset(device, path):
    """In its own process: a reset kills the CUDA state of anything sharing the context."""
    if path == "C" and native.module() is None:
        pytest.skip(native.status())
    tests = os.path.dirname(__file__)
    done = subprocess.run([sys.executable, "-c", RESET_SCRIPT, path], capture_output=True, text=True,
                          timeout=300, cwd=tests,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([tests, *sys.path])))
    assert done.returncode == 0 and f"path {path}" in done.stdout and "reset ok" in done.stdout, \
        done.stdout + done.stderr


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("which", ["array", "map"])
def test_an_array_of_another_device_is_refused_on_the_fast_path(device, path, which, monkeypatch):
    if tf.runtime.driver.call("cuDeviceGetCount") < 2:
        pytest.skip("needs two GPUs")
    take_path(path, monkeypatch)
    k = probe("echo_args")
    here = tf.zeros((64, 64), "float32")
    out = tf.empty(24, "uint64")
    run = k.launcher(grid=1, block=32)
    args = [tf.TensorMap.tiled(here, (16, 16)), 1, 2, 3, 4, 1.0, 2.0, here, here, out]
    run(*args)
    run(*args)
    assert fast_path_of(run) == path
    tf.set_device(1)
    try:
        there = tf.zeros((64, 64), "float32")
        tf.Device(1).synchronize()
    finally:
        tf.set_device(0)
    if which == "map":
        args[0], where = tf.TensorMap.tiled(there, (16, 16)), 0
    else:
        args[7], where = there, 7
    with pytest.raises(tf.LaunchError, match=rf"argument {where}.*the array lives on device 1 but the "
                                             r"launch is on device 0"):
        run(*args)
