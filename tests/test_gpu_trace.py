"""GPU tier: the flight recorder on real kernels. Traced softmax and gemm give the same results
as release builds, every warp role shows up, waits name their layout barriers (the device's
dynamic-smem base matches the layout's), the Chrome JSON is valid, and a traced debug build's
DeadlockError tells what every warp did last."""
import json
import os
import re

import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.debug import trace as tr
from kernel_sources import source
from tmaflow.testing import poison

pytestmark = pytest.mark.gpu


def report(name):
    """Where a test leaves a file for the GPU run's report (TMAFLOW_REPORT_DIR), if anywhere."""
    d = os.environ.get("TMAFLOW_REPORT_DIR")
    return os.path.join(d, name) if d else None


def check_chrome(t, path=None):
    doc = json.loads(json.dumps(t.to_chrome(path)))
    timed = [e for e in doc["traceEvents"] if e["ph"] != "M"]
    assert len(timed) == len(t) > 0
    assert all(e["ph"] in ("X", "i") and e["ts"] >= 0 for e in timed)
    return timed


@pytest.mark.parametrize("level", ["stage", "all"])
def test_traced_softmax(device, rng, level):
    host = rng.standard_normal((512, 2048)).astype(np.float32)
    x = tf.from_numpy(host)
    want = kernels.softmax(x).numpy()
    y = poison(tf.empty(host.shape, "float32"))
    kernels.softmax(x, y, trace=level)
    assert np.array_equal(y.numpy(), want)
    t = tr.last()
    assert t is not None and t.kernel_name == "softmax" and t.wrapped == 0
    kinds = {t.kind(int(k)) for k in np.unique(t.events["kind"])}
    assert "arrive + expect_tx" in kinds
    detail = {"TMA load", "named barrier", "TMA store", "store wait"}
    assert detail <= kinds if level == "all" else not detail & kinds
    waits = t.events[t.events["kind"] == tr.KINDS.index("wait") + 1]
    names = {t.label(e) for e in waits}
    assert level == "stage" or names, "every wait is recorded at level 'all'"
    assert all(n.startswith("wait rows_full[") for n in names), names
    # each wait's stage (from the call site) is the index of the barrier it waited on
    assert all(t.label(e) == f"wait rows_full[{e['stage']}]" for e in waits)
    assert "producer" in set(t.roles().values())
    check_chrome(t)


@pytest.mark.parametrize("shape,level", [((1024, 1024, 1024), "stage"), ((1024, 1024, 1024), "all"),
                                         ((384, 640, 512), "all")])
def test_traced_gemm(device, rng, shape, level):
    m, n, k = shape
    a = tf.from_numpy(rng.integers(0, 2**16, (m, k), dtype=np.uint16) & 0x3FFF, "bfloat16")
    b = tf.from_numpy(rng.integers(0, 2**16, (n, k), dtype=np.uint16) & 0x3FFF, "bfloat16")
    want = kernels.gemm(a, b).numpy()
    c = poison(tf.empty((m, n), "bfloat16"))
    kernels.gemm(a, b, c, trace=level)
    assert np.array_equal(c.numpy(), want)
    t = tr.last()
    kinds = {t.kind(int(x)) for x in np.unique(t.events["kind"])}
    assert "arrive + expect_tx" in kinds
    detail = {"wgmma commit", "wgmma wait", "TMA store"}
    assert detail <= kinds and kinds & {"TMA load", "TMA load (multicast)"} if level == "all" \
        else not detail & kinds
    # Every level sees the consumers wait for their first stage (loaded from memory): a blocked
    # try_wait sleeps and then succeeds at its first try, which stage traces once dropped.
    roles = set(t.roles().values())
    assert "producer" in roles and "consumer" in roles
    labels = {t.label(e) for e in t.events[t.events["kind"] == tr.KINDS.index("wait") + 1]}
    assert any(label.startswith("wait ab_full[") for label in labels)
    if level == "all":
        assert any(label.startswith("wait ab_empty[") for label in labels)
    check_chrome(t)
    if shape == (1024, 1024, 1024) and report("trace_gemm.npz"):
        t.save(report(f"trace_gemm_{level}.npz"))


def test_traced_deadlock_says_what_every_warp_did_last(device, rng):
    spec = tf.TensorMapSpec.tiled("float32", (12 * 32, 64), (32, 64))
    pipe = tf.Pipeline("p", stages=2, tiles=[spec])
    k = tf.Kernel(source("planted"), "planted", layout=tf.SharedLayout([pipe]),
                  defines={"BUG_MISSING_ARRIVE": 1}, debug=True, trace=True, watchdog_seconds=1.0,
                  filename="planted.cu")
    host = rng.standard_normal((12 * 32, 64)).astype(np.float32)
    out = tf.empty((2, 64), "float32")
    with pytest.raises(tf.DeadlockError, match=r"(?s)never completed.*Last events of every warp"
                                               r".*warp 0 \(producer\).*TIMED OUT") as info:
        k.launch(tf.TensorMap.tiled(tf.from_numpy(host), (32, 64)), out, 12, grid=2, block=64)
    assert info.value.trace is not None and len(info.value.trace)
    timed_out = info.value.trace.events[(info.value.trace.events["value"] & tr.TIMED_OUT) != 0]
    assert len(timed_out) and {info.value.trace.label(e) for e in timed_out} <= \
        {f"wait p_empty[{s}]" for s in range(2)} | {f"wait p_full[{s}]" for s in range(2)}
    fixed = tf.Kernel(source("planted"), "planted", layout=tf.SharedLayout([pipe]), debug=True,
                      trace=True, filename="planted.cu")
    fixed.launch(tf.TensorMap.tiled(tf.from_numpy(host), (32, 64)), out, 12, grid=2, block=64)
    np.testing.assert_allclose(out.numpy().astype(np.float64).sum(1),
                               np.full(2, host.sum(dtype=np.float64)), rtol=1e-4, atol=1e-3)
    assert fixed.last_trace is not None and fixed.last_trace.wrapped == 0


def test_trace_builds_are_not_captured(device, rng):
    x = tf.from_numpy(rng.standard_normal((64, 512)).astype(np.float32))
    y = tf.empty((64, 512), "float32")
    kernels.softmax(x, y, trace=True)
    with tf.Graph() as g:
        with pytest.raises(tf.LaunchError, match=r"trace build.*cannot be captured"):
            with g.capture():
                kernels.softmax(x, y, trace=True)


# --- planted faults, each named by the flight recorder -------------------------------------------

K_TILES = 12
FAULTS = [  # (define, cluster, unified, the rule that must come first)
    ("BUG_DOUBLE_TX", 1, False, "tx-announced-more"),
    ("BUG_SHORT_TX", 1, False, "tx-announced-less"),
    ("BUG_MISSING_ARRIVE", 1, False, "missing-arrive"),
    ("BUG_MISSING_ARRIVE", 1, True, "missing-arrive"),
    ("BUG_PARITY", 1, False, "wrong-parity"),
    ("BUG_NO_COMMIT", 1, False, "missing-commit"),
    ("BUG_MASK", 2, False, "multicast-mask"),
    ("BUG_EARLY_MULTICAST", 2, False, "multicast-before-init"),
    ("BUG_REUSE", 1, False, "stage-reused"),
    ("BUG_NO_FINAL_SYNC", 2, False, "missing-cluster-sync"),
]


def planted(bug, cluster, unified, trace="all"):
    spec = tf.TensorMapSpec.tiled("float32", (K_TILES * 32, 64), (32, 64))
    pipe = tf.Pipeline("p", stages=2, tiles=[spec], consumers=64 if unified else 1,
                       cluster=(cluster, 1, 1), multicast=["x"] if cluster > 1 else None)
    defines = {bug: 1} if bug else {}
    if unified:
        defines["UNIFIED"] = 1
    return tf.Kernel(source("planted"), "planted", layout=tf.SharedLayout([pipe]), defines=defines,
                     debug=True, trace=trace, watchdog_seconds=1.0, filename="planted.cu")


def run_planted(k, cluster, host):
    blocks = 2 * cluster
    out = tf.empty((blocks, 64), "float32").fill_bytes(0xFF)
    k.launch(tf.TensorMap.tiled(tf.from_numpy(host), (32, 64)), out, K_TILES, grid=blocks, block=64,
             cluster=(cluster, 1, 1))
    return out


@pytest.mark.parametrize("bug,cluster,unified,rule", FAULTS,
                         ids=[f"{b}-c{c}{'-unified' if u else ''}" for b, c, u, _ in FAULTS])
def test_planted_fault_is_diagnosed_by_name(device, rng, bug, cluster, unified, rule):
    import time

    host = rng.standard_normal((K_TILES * 32, 64)).astype(np.float32)
    k = planted(bug, cluster, unified)
    assert k.cubin  # compiled before the clock starts
    t0 = time.perf_counter()
    with pytest.raises((tf.DeadlockError, tf.PipelineError, tf.CudaError)) as info:
        run_planted(k, cluster, host)
    assert time.perf_counter() - t0 < 2.0
    findings = getattr(info.value, "findings", [])
    assert findings and findings[0].name == rule, f"{[f.name for f in findings]}\n{info.value}"
    assert f"[{rule}]" in str(info.value)
    if isinstance(info.value, tf.DeadlockError):
        assert "Ledger of the stuck barriers" in str(info.value)
    if bug == "BUG_DOUBLE_TX":  # the ledger shows what was announced against the plan
        assert re.search(r"p_full\[\d\]: planned 8192 B per fill.*last bytes: 16384", str(info.value))
    if bug == "BUG_MISSING_ARRIVE" and not unified:  # only the stage that was not released
        assert all(f.barrier == "p_empty[1]" for f in findings), findings
    # and a correct kernel runs right after, on a context that may have been reset
    out = run_planted(planted(None, cluster, unified), cluster, host)
    np.testing.assert_allclose(out.numpy().astype(np.float64).sum(1),
                               np.full(2 * cluster, host.sum(dtype=np.float64)), rtol=1e-4, atol=1e-3)


def test_correct_planted_kernels_pass_the_diagnosis(device, rng):
    host = rng.standard_normal((K_TILES * 32, 64)).astype(np.float32)
    for cluster, unified in ((1, False), (1, True), (2, False), (2, True), (4, False)):
        for level in ("stage", "all"):
            out = run_planted(planted(None, cluster, unified, level), cluster, host)
            np.testing.assert_allclose(out.numpy().astype(np.float64).sum(1),
                                       np.full(2 * cluster, host.sum(dtype=np.float64)), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("shape", [(1024, 1024, 1024), (16, 4096, 4096)], ids=["cluster", "split-k"])
def test_traced_debug_gemm_and_softmax_pass_the_diagnosis(device, rng, shape):
    m, n, k = shape
    a = tf.from_numpy(rng.integers(0, 2**16, (m, k), dtype=np.uint16) & 0x3FFF, "bfloat16")
    b = tf.from_numpy(rng.integers(0, 2**16, (n, k), dtype=np.uint16) & 0x3FFF, "bfloat16")
    want = kernels.gemm(a, b).numpy()
    for level in ("stage", "all"):
        c = poison(tf.empty((m, n), "bfloat16"))
        kernels.gemm(a, b, c, debug=True, trace=level)  # a false finding would raise
        assert np.array_equal(c.numpy(), want)
    x = tf.from_numpy(rng.standard_normal((256, 1024)).astype(np.float32))
    y = kernels.softmax(x, debug=True, trace="all")
    assert np.array_equal(y.numpy(), kernels.softmax(x).numpy())
