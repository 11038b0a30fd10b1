"""A kernel that stores through a wild address, launched through tmaflow on the C launch path and
on the Python path (TMAFLOW_NATIVE=0): the synchronize after it raises one KernelFaultError naming
the kernel and saying the context is unusable; later calls raise it again up front; after
Device.reset() the same kernel runs correctly. Each run is a subprocess: the fault kills the
context, and the test process must stay healthy."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tmaflow as tf
from kernel_sources import source
from tmaflow import faults

TESTS = Path(__file__).resolve().parent
WILD = 1 << 40  # floats past the array: 4 TiB away, far outside any allocation


def wild_store_kernel():
    # planted.cu includes the layout header of its pipeline kernel: give it that layout
    spec = tf.TensorMapSpec.tiled("float32", (12 * 32, 64), (32, 64))
    layout = tf.SharedLayout([tf.Pipeline("p", stages=2, tiles=[spec], consumers=1)])
    return tf.Kernel(source("planted"), "wild_store", layout=layout, filename="planted.cu")


SCRIPT = """
import json
import numpy as np
import tmaflow as tf
from tmaflow import native
from test_gpu_faults import WILD, wild_store_kernel

report = {"launch_path": native.status()}
k = wild_store_kernel()
dev = tf.current_device()
out = tf.empty(32, "float32").fill_bytes(0xFF)
run = k.launcher(grid=1, block=32)
run(out, 0)    # a good launch: the checked path, which installs the fast path
dev.synchronize()
report["fast_path"] = type(run.func).__name__
report["counter"] = getattr(run.func, "launches", None) is not None
run(out, WILD)  # the fault, through the fast path
try:
    dev.synchronize()
    report["first"] = None
except tf.KernelFaultError as e:
    report["first"], report["kernels"], report["code"] = str(e), list(e.kernels), e.code


def attempt(call):
    try:
        call()
    except tf.KernelFaultError as e:
        return "KernelFaultError: " + str(e)
    except Exception as e:
        return type(e).__name__ + ": " + str(e)


report["numpy"] = attempt(out.numpy)
report["copy_in"] = attempt(lambda: tf.from_numpy(np.ones(16, np.float32)))
report["launch"] = attempt(lambda: run(out, 0))
try:
    dev.reset()
    out = tf.empty(32, "float32").fill_bytes(0xFF)
    k.launch(out, 0, grid=1, block=32)
    report["after_reset"] = out.numpy().tolist()
except tf.KernelFaultError as e:  # the driver keeps some faults (700) until the process exits
    report["after_reset"] = str(e)
print("REPORT " + json.dumps(report))
"""


def run_faulting_script(native: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS.parent), str(TESTS)]),
               TMAFLOW_NATIVE="1" if native else "0")
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=300, env=env, cwd=str(TESTS))
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("REPORT ")]
    assert done.returncode == 0 and lines, f"rc={done.returncode}\n{done.stdout}\n{done.stderr}"
    return json.loads(lines[-1][len("REPORT "):])


def test_the_wild_store_kernel_compiles():
    k = wild_store_kernel()
    assert k.cubin[:4] == b"\x7fELF"
    assert [(p.kind, p.size, p.signed) for p in k.params] == [("pointer", 8, None), ("int", 8, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("native", [True, False], ids=["C-path", "Python-path"])
def test_a_fault_is_reported_once_and_then_up_front(device, native):
    report = run_faulting_script(native)
    first = report["first"]
    assert first is not None, "the wild store did not fault"
    # an illegal address (700) on Hopper; any code the driver documents as sticky is the point
    assert report["code"] in faults.STICKY and first.startswith("cuCtxSynchronize failed with CUDA_ERROR_")
    assert "context of device 0 is unusable" in first and "tf.Device(0).reset()" in first
    assert "compute-sanitizer --tool memcheck" in first
    for call in ("numpy", "copy_in", "launch"):  # later calls: the same fault, not a new error
        later = report[call]
        assert later is not None and later.startswith("KernelFaultError: cu"), (call, later)
        assert "this context faulted earlier in" in later and "first reported by cuCtxSynchronize" in later
        assert first.split(": ", 1)[1] in later, (call, later)  # the same report
    assert "cuLaunchKernelEx failed: this context faulted earlier" in report["launch"]
    after = report["after_reset"]
    if isinstance(after, str):  # the driver kept the fault: reset() says so, naming the kernel
        assert after.startswith("Device(0).reset() could not recover") and "wild_store" in after, after
    else:
        assert after == [1.0] * 32  # reset cleared the fault: the kernel runs again
    if native:
        if report["fast_path"] != "Plan":
            pytest.skip(f"no C launch path on this machine: {report['launch_path']}")
        if not report["counter"]:
            pytest.skip("plan.launches (the native branch's C-path launch counter) is missing: "
                        "C-path launches cannot be named")
    else:
        assert report["fast_path"] == "function", report  # the generated Python path (a plain function)
    assert report["kernels"] == ["wild_store"], first
    assert "grid=(1, 1, 1) block=(32, 1, 1)" in first
    if not native:  # the C path packs each call on its own stack and records no arguments
        assert f"unsigned long long offset={WILD}" in first
    assert "this context faulted earlier in wild_store (" in report["launch"]
    if native:
        assert "[C launch path: 1 launch]" in first
