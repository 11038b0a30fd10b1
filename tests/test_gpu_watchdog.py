"""GPU tier: tmaflow pipelines (2-8 stages, warp-specialised and unified, clusters of 1/2/4
with multicast) verified over 100 debug launches each; planted bugs become DeadlockError
naming the barrier, and a correct kernel right after still runs."""
import time

import numpy as np
import pytest

import tmaflow as tf
from kernel_sources import source

pytestmark = pytest.mark.gpu

K_TILES = 12


def _kernel(bug, cluster, stages=2, unified=False, debug=True):
    spec = tf.TensorMapSpec.tiled("float32", (K_TILES * 32, 64), (32, 64))
    pipe = tf.Pipeline("p", stages=stages, tiles=[spec], consumers=64 if unified else 1,
                       cluster=(cluster, 1, 1), multicast=["x"] if cluster > 1 else None)
    defines = {bug: 1} if bug else {}
    if unified:
        defines["UNIFIED"] = 1
    return tf.Kernel(source("planted"), "planted", layout=tf.SharedLayout([pipe]), defines=defines,
                     debug=debug, watchdog_seconds=1.0, filename="planted.cu")


def _run(k, cluster, rng):
    host = rng.standard_normal((K_TILES * 32, 64)).astype(np.float32)
    blocks = cluster * 2
    out = tf.empty((blocks, 64), "float32").fill_bytes(0xFF)
    k.launch(tf.TensorMap.tiled(tf.from_numpy(host), (32, 64)), out, K_TILES, grid=blocks,
             block=64, cluster=(cluster, 1, 1))
    return host, out


def _check(host, out):
    got = out.numpy().astype(np.float64).sum(1)
    np.testing.assert_allclose(got, np.full(got.shape, host.sum(dtype=np.float64)), rtol=1e-4,
                               atol=1e-3)


@pytest.mark.parametrize("unified", [False, True], ids=["warp-specialised", "unified"])
@pytest.mark.parametrize("bug,cluster,barrier", [
    ("BUG_MISSING_ARRIVE", 1, "p.empty"),
    ("BUG_DOUBLE_TX", 1, "p.full"),
    ("BUG_PARITY", 1, "p.empty"),
    ("BUG_NO_COMMIT", 1, "p.full"),
    ("BUG_MASK", 2, "p.full"),
    ("BUG_MASK", 4, "p.full"),
])
def test_planted_bug_raises_deadlock(device, rng, bug, cluster, barrier, unified):
    k = _kernel(bug, cluster, unified=unified)
    t0 = time.perf_counter()
    with pytest.raises(tf.DeadlockError, match=r"never completed") as info:
        _run(k, cluster, rng)
    assert time.perf_counter() - t0 < 5.0
    stuck = {r["barrier"] for r in info.value.records}
    assert barrier in stuck and f"'{barrier}'" in str(info.value), str(info.value)
    # file:line of the wait, or (NVRTC without __builtin_LINE, e.g. 12.6) a note saying why not
    assert all((r["line"] > 0 and r["file"]) or "needs NVRTC" in r["file"] for r in info.value.records)
    host, out = _run(_kernel(None, cluster, unified=unified), cluster, rng)  # same process
    _check(host, out)


@pytest.mark.parametrize("unified", [False, True], ids=["warp-specialised", "unified"])
@pytest.mark.parametrize("stages", [2, 4, 8])
@pytest.mark.parametrize("cluster", [1, 2, 4])
def test_pipelines_100_launches_no_false_trips(device, rng, cluster, stages, unified):
    k = _kernel(None, cluster, stages=stages, unified=unified)
    for _ in range(100):
        host, out = _run(k, cluster, rng)
        _check(host, out)
