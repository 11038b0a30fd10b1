"""GPU tier: planted pipeline bugs become DeadlockError naming the barrier; correct kernels
right after still run."""
import time

import numpy as np
import pytest

import tmaflow as tf
from tmaflow.kernels import source

pytestmark = pytest.mark.gpu

K_TILES = 8


def _kernel(bug, cluster, debug=True):
    spec = tf.TensorMapSpec.tiled("float32", (K_TILES * 32, 64), (32, 64))
    pipe = tf.Pipeline("p", stages=2, tiles=[spec], consumers=1, cluster=(cluster, 1, 1),
                       multicast=["x"] if cluster > 1 else None)
    layout = tf.SharedLayout([pipe])
    defines = {bug: 1} if bug else {}
    return tf.Kernel(source("planted"), "planted", layout=layout, defines=defines, debug=debug,
                     watchdog_seconds=1.0, filename="planted.cu")


def _run(k, cluster, rng):
    host = rng.standard_normal((K_TILES * 32, 64)).astype(np.float32)
    a = tf.from_numpy(host)
    out = tf.empty(cluster * 2, "float32").fill_bytes(0xFF)
    k.launch(tf.TensorMap.tiled(a, (32, 64)), out, K_TILES, grid=cluster * 2, block=64,
             cluster=(cluster, 1, 1))
    return host, out


@pytest.mark.parametrize("bug,cluster,barrier", [
    ("BUG_MISSING_ARRIVE", 1, "p.empty"),
    ("BUG_DOUBLE_TX", 1, "p.full"),
    ("BUG_PARITY", 1, "p.empty"),
    ("BUG_NO_COMMIT", 1, "p.full"),
    ("BUG_MASK", 2, "p.full"),
    ("BUG_MASK", 4, "p.full"),
])
def test_planted_bug_raises_deadlock(device, rng, bug, cluster, barrier):
    k = _kernel(bug, cluster)
    t0 = time.perf_counter()
    with pytest.raises(tf.DeadlockError, match=r"never completed") as info:
        _run(k, cluster, rng)
    assert time.perf_counter() - t0 < 5.0
    # Every stuck barrier is recorded and named; the planted one among them.
    stuck = {r["barrier"] for r in info.value.records}
    assert barrier in stuck and f"'{barrier}'" in str(info.value)
    assert all(r["line"] > 0 and r["file"] for r in info.value.records)
    # The same process compiles and launches a correct kernel right after.
    good = _kernel(None, cluster)
    host, out = _run(good, cluster, rng)
    np.testing.assert_allclose(out.numpy(), np.full(cluster * 2, host.sum(dtype=np.float64)),
                               rtol=1e-4)


@pytest.mark.parametrize("cluster", [1, 2, 4])
def test_correct_pipeline_no_false_trips(device, rng, cluster):
    k = _kernel(None, cluster)
    for _ in range(100):
        host, out = _run(k, cluster, rng)
        np.testing.assert_allclose(out.numpy(), np.full(cluster * 2, host.sum(dtype=np.float64)),
                                   rtol=1e-4)
