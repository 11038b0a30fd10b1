"""GPU tier: the launch path users take. Use after free on every path, torch/cupy arguments
on the generated path, the torch current stream, pool memory, entry points returning the
caller's kind, the template encoder, and the parameter table against the driver's."""
import gc
import threading
import time
import weakref

import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from kernel_sources import source
from tmaflow.kernels import examples
from tmaflow.kernels.entry import Prepared
from tmaflow.testing import poison

pytestmark = pytest.mark.gpu


def probe(name):
    return tf.Kernel(source("probe"), name, filename="probe.cu")


def bench_kernel(name):
    return tf.Kernel(source("bench"), name, filename="bench.cu")


def big_smem_expect(value, seed):
    return (value * 2654435761 & 0xFFFFFFFF) ^ seed


# --- use after free, every path ------------------------------------------------------------

@pytest.mark.parametrize("path", ["bound", "launch", "bound-first", "launch-first"])
def test_freed_array_is_refused(device, path):
    k = probe("big_smem")
    out = tf.empty(256, "uint32").fill_bytes(0xFF)
    run = k.bind(grid=1, block=64, smem=1024) if path.startswith("bound") else \
        (lambda *a: k.launch(*a, grid=1, block=64, smem=1024))
    if not path.endswith("first"):
        run(out, 1024, 1)
        run(out, 1024, 2)  # the generated path is in place
        assert out.numpy()[0] == big_smem_expect(255, 2)
    out.free()
    with pytest.raises(tf.LaunchError, match=r"argument 0 \(uint32_t\* out\): DeviceArray.*FREED.*"
                                             r"was freed before the launch"):
        run(out, 1024, 3)
    fresh = tf.empty(256, "uint32").fill_bytes(0xFF)
    run(fresh, 1024, 4)  # and the launcher still works
    assert fresh.numpy()[0] == big_smem_expect(255, 4)


@pytest.mark.parametrize("path", ["bound", "launch"])
def test_tensormap_of_freed_array_is_refused(device, path):
    k = bench_kernel("empty_kernel")
    a = tf.zeros((256, 256), "float32")
    ta, tb = tf.TensorMap.tiled(a, (32, 32)), tf.TensorMap.tiled(tf.zeros((64, 64)), (64, 64))
    run = k.bind(grid=1, block=32) if path == "bound" else (lambda *x: k.launch(*x, grid=1, block=32))
    run(ta, tb, 1, 2.0, 3)
    run(ta, tb, 1, 2.0, 3)
    a.free()
    with pytest.raises(tf.LaunchError, match=r"argument 0 \(.*CUtensorMap.*\): TensorMap.*its array was freed"):
        run(ta, tb, 1, 2.0, 3)
    with pytest.raises(tf.TensorMapError, match=r"was freed; a tensor map needs live memory"):
        tf.TensorMap.tiled(a, (32, 32))
    tf.current_device().synchronize()


def test_entry_points_refuse_freed_arrays(device):
    x = tf.zeros((64, 256))
    kernels.softmax(x)
    x.free()
    with pytest.raises(tf.TmaflowError, match=r"was freed"):
        kernels.softmax(x)


def test_float_for_a_pointer_is_refused_on_the_gpu_too(device):
    k = probe("big_smem")
    with pytest.raises(tf.LaunchError, match=r"argument 0 \(uint32_t\* out\): float 1.5 given for a pointer"):
        k.launch(1.5, 1024, 1, grid=1, block=64, smem=1024)


def test_launch_config_object(device):
    k = probe("big_smem")
    out = tf.empty(256, "uint32").fill_bytes(0xFF)
    run = k.bind(tf.LaunchConfig(grid=[1], block=[64], smem=1024))
    run(out, 1024, 9)
    assert out.numpy()[0] == big_smem_expect(255, 9)



def test_a_layouts_planned_cluster_and_size_bind_every_launch_path(device):
    spec = tf.TensorMapSpec.tiled("float32", (64, 64), (8, 64))
    layout = tf.SharedLayout([tf.Pipeline("w", stages=2, tiles=[spec], cluster=(2, 1, 1), multicast=["x"])])
    k = tf.Kernel('#include "tmaflow_layout.cuh"\nextern "C" __global__ void k() {}', "k", layout=layout)
    planned = r"but its layout's Pipeline 'w' was planned for cluster=\(2, 1, 1\)"
    with pytest.raises(tf.LaunchError, match=r"launched with cluster=\(1, 1, 1\), " + planned):
        k.launch(grid=2, block=32)
    with pytest.raises(tf.LaunchError, match=r"launched with cluster=\(4, 1, 1\), " + planned):
        k.launcher(grid=4, block=32, cluster=4)
    with pytest.raises(tf.LaunchError, match=rf"smem={layout.total_bytes - 8} B is below the "
                       rf"{layout.total_bytes} B its layout places"):
        k.bind(grid=2, block=32, cluster=2, smem=layout.total_bytes - 8)
    k.launch(grid=2, block=32, cluster=2)
    device.synchronize()


# --- torch and cupy on the generated path, and the framework's stream ---------------------------

def test_torch_and_cupy_arguments_take_the_generated_path(device):
    torch = pytest.importorskip("torch")
    cupy = pytest.importorskip("cupy")
    k = probe("echo_args")
    base = tf.zeros((64, 64), "float32")
    tmap = tf.TensorMap.tiled(base, (16, 16))
    run = k.bind(grid=1, block=32, stream=0)
    for i in range(3):
        t = torch.full((4,), 1.5 + i, device="cuda")
        c = cupy.full((4,), -2.0 - i, dtype=cupy.float32)
        out = torch.zeros(24, dtype=torch.int64, device="cuda")
        torch.cuda.synchronize()
        run(tmap, np.int8(-5), np.uint16(7), i, 2**40, 1.5, -0.5, t, c, out)
        tf.current_device().synchronize()
        got = out.cpu().numpy().view(np.uint64)
        assert np.uint32(got[22]).view(np.float32) == 1.5 + i
        assert np.uint32(got[23]).view(np.float32) == -2.0 - i
        assert got[18] == i
    assert run.func is not tf.Launcher._checked_call  # a generated function
    cpu = torch.zeros(4)
    with pytest.raises(tf.TmaflowError, match=r"on cpu; kernels need a CUDA tensor"):
        run(tmap, np.int8(-5), np.uint16(7), 0, 2**40, 1.5, -0.5, cpu, c, out)


def test_torch_current_stream_orders_launches_with_a_side_stream(device):
    torch = pytest.importorskip("torch")
    x = torch.zeros(1 << 20, device="cuda").reshape(1024, 1024)
    y = torch.full_like(x, float("nan"))
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s on the side stream, then the value to copy
        x.fill_(7.0)
        kernels.copy(x, y)  # stream=None: torch's current stream, so after the fill
        z = kernels.softmax(x)
    side.synchronize()
    assert torch.all(y == 7.0).item()
    assert isinstance(z, torch.Tensor) and torch.allclose(z, torch.full_like(z, 1 / 1024))


def test_cupy_current_stream_is_followed(device):
    cupy = pytest.importorskip("cupy")
    x = cupy.zeros((256, 256), dtype=cupy.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        x.fill(3.0)
        y = kernels.copy(x)
    s.synchronize()
    # Checked on the host: cupy's own reductions compile with the NVRTC loaded, which need not
    # be the one cupy was built for (gpu_check.sh's CUDA 12 run preloads NVRTC 12).
    assert isinstance(y, cupy.ndarray) and (cupy.asnumpy(y) == 3.0).all()


def test_a_cupy_stream_outlives_what_tmaflow_keeps_for_it(device):
    """A stream destroyed with work queued can hand its handle to the next stream created; the
    copy's state (its launcher, bound to the handle) keeps the stream object, so it cannot."""
    cupy = pytest.importorskip("cupy")
    x = cupy.full((256, 256), 3.0, dtype=cupy.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    handle, gone = s.ptr, weakref.ref(s)
    with s:
        y = kernels.copy(x)
    del s
    gc.collect()
    assert gone() is not None
    t = cupy.cuda.Stream(non_blocking=True)
    assert t.ptr != handle
    with t:
        z = kernels.copy(y)
    t.synchronize()
    assert (cupy.asnumpy(z) == 3.0).all()


# --- memory -----------------------------------------------------------------------------------

def test_free_does_not_wait_for_the_gpu(device):
    torch = pytest.importorskip("torch")
    a = tf.empty((1 << 20,), "float32")
    torch.cuda._sleep(400_000_000)  # legacy default stream busy for ~0.2 s
    t0 = time.perf_counter()
    a.free()
    b = tf.empty((1 << 20,), "float32")
    took = time.perf_counter() - t0
    tf.current_device().synchronize()
    assert took < 0.02, f"free + empty took {took * 1e3:.1f} ms: they waited for the GPU"
    assert b.alive and not a.alive


def test_pool_reuses_memory_and_trims(device, rng):
    host = rng.standard_normal(4096).astype(np.float32)
    for _ in range(20):
        a = tf.from_numpy(host)
        np.testing.assert_array_equal(a.numpy(), host)
        a.free()
    tf.current_device().trim_memory()
    assert tf.from_numpy(host).numpy().sum() == pytest.approx(host.sum(), rel=1e-5)


def test_block_cache_reuses_in_stream_order_and_trims(device):
    pool = tf.current_device().memory_pool()
    tf.current_device().trim_memory()
    assert pool.cached_bytes == 0
    a = tf.empty((1000,), "float32")  # 4000 B: a 4096 B block
    ptr = a.ptr
    a.free()
    assert pool.cached_bytes == 4096
    b = tf.empty((1010,), "float32")  # rounds to the same size: the same block, no driver call
    assert b.ptr == ptr and pool.cached_bytes == 0
    s = tf.Stream()
    c = tf.empty((1000,), "float32", stream=s)  # another stream: another block
    assert c.ptr != ptr
    c.free()
    s.close()  # its cached blocks go back to the pool
    assert pool.cached_bytes == 0
    budget, pool.budget = pool.budget, 8192
    try:
        arrays = [tf.empty((2048,), "float32") for _ in range(4)]  # 8 KB each
        del arrays
        assert pool.cached_bytes <= 8192
    finally:
        pool.budget = budget
    b.free()
    tf.current_device().trim_memory()
    assert pool.cached_bytes == 0


def test_per_thread_default_stream_blocks_stay_with_their_thread(device):
    """Handle 2 is each thread's own stream: a block freed on it goes back to that thread alone."""
    pool = tf.current_device().memory_pool()
    tf.current_device().trim_memory()
    a = tf.empty((1000,), "float32", stream=2)
    ptr = a.ptr
    a.free()
    seen = []

    def other_thread():
        tf.set_device(device.ordinal)
        b = tf.empty((1000,), "float32", stream=2)
        seen.append(b.ptr)
        b.free()

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert seen and seen[0] != ptr
    c = tf.empty((1000,), "float32", stream=2)
    assert c.ptr == ptr
    c.free()
    tf.current_device().trim_memory()  # every cached block back to the driver (the other thread's
    assert pool.cached_bytes == 0      # on the legacy stream: tests/test_streams.py checks which)


# --- entry points -------------------------------------------------------------------------------

def test_entry_points_return_the_callers_kind(device, rng):
    torch = pytest.importorskip("torch")
    host = rng.standard_normal((96, 512)).astype(np.float32)
    t = torch.from_numpy(host).cuda()
    for fn in (kernels.softmax, kernels.copy):
        out = fn(t)
        assert isinstance(out, torch.Tensor) and out.device == t.device and out.shape == t.shape
    a = tf.from_numpy(host)
    assert isinstance(kernels.softmax(a), tf.DeviceArray)
    bt = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
    c = kernels.gemm(bt, bt)
    assert isinstance(c, torch.Tensor) and c.dtype == torch.bfloat16 and c.shape == (256, 256)
    torch.testing.assert_close(c.float(), (bt.float() @ bt.float().T), rtol=2e-2, atol=2e-1)


def test_entry_point_cache_with_new_buffers_every_call(device, rng):
    ref = lambda h: np.exp(h - h.max(1, keepdims=True)) / np.exp(h - h.max(1, keepdims=True)).sum(1, keepdims=True)  # noqa: E731
    for _ in range(4):
        host = rng.standard_normal((70, 1000)).astype(np.float32)
        x = tf.from_numpy(host)
        out = poison(tf.empty((70, 1000)))
        got = kernels.softmax(x, out)
        assert got is out
        np.testing.assert_allclose(out.numpy(), ref(host.astype(np.float64)), rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(kernels.softmax(x).numpy(), ref(host.astype(np.float64)), rtol=1e-4, atol=1e-7)
        x.free()


def test_prepared_call_repeats(device, rng):
    host = rng.standard_normal((128, 256)).astype(np.float32)
    x, y = tf.from_numpy(host), poison(tf.empty((128, 256)))
    run = kernels.copy.prepare(x, y)
    assert isinstance(run, Prepared) and run.out is y
    assert run() is y
    np.testing.assert_array_equal(y.numpy(), host)


def test_entry_points_take_debug(device, rng):
    host = rng.standard_normal((33, 300)).astype(np.float32)
    out = kernels.softmax(tf.from_numpy(host), debug=True).numpy()
    np.testing.assert_allclose(out.sum(1), 1.0, rtol=1e-5)


def test_gemm_writes_into_a_padded_view(device, rng):
    torch = pytest.importorskip("torch")
    a = torch.randn(200, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(136, 256, device="cuda", dtype=torch.bfloat16)
    wide = torch.full((200, 160), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = wide[:, :136]
    kernels.gemm(a, b, out)
    torch.cuda.synchronize()
    ref = a.double() @ b.double().T
    assert (torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref)).item() < 1e-2
    assert torch.isnan(wide[:, 136:]).all().item()  # the padding is untouched


# --- softmax: long rows (the plan kept two stages or refuses) -----------------------------------

@pytest.mark.parametrize("shape", [(512, 8192), (64, 25600), (5, 12340)])
def test_softmax_long_rows(device, rng, shape):
    host = rng.standard_normal(shape).astype(np.float32)
    out = poison(tf.empty(shape))
    kernels.softmax(tf.from_numpy(host), out, debug=True)  # a hang would be a DeadlockError
    h = host.astype(np.float64)
    ref = np.exp(h - h.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-9)


def test_softmax_rows_too_long_for_two_stages_take_the_edge_kernel(device, rng):
    host = rng.standard_normal((3, 30000)).astype(np.float32)
    out = poison(tf.empty(host.shape))
    kernels.softmax(tf.from_numpy(host), out)
    h = host.astype(np.float64)
    ref = np.exp(h - h.max(1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), ref / ref.sum(1, keepdims=True), rtol=1e-4, atol=1e-9)


# --- the encoders and the parameter table ------------------------------------------------------

def test_template_encoder_matches_the_driver_bindings(device, rng):
    from tmaflow.tma.tensormap import MapTemplate, encode
    from tmaflow.tma.spec import TensorMapSpec

    base = tf.empty((1 << 22,), "uint8")
    cases = [("float32", (300, 200), (32, 32), "none"), ("bfloat16", (64, 4096), (64, 64), "128B"),
             ("uint8", (7, 9, 640), (2, 3, 64), "64B"), ("float16", (5, 6, 7, 8, 16), (1, 2, 3, 4, 16), "32B"),
             ("float64", (1000,), (16,), "none"), ("int32", (17, 36), (8, 4), "none")]
    for dtype, shape, box, swz in cases:
        spec = TensorMapSpec.tiled(dtype, shape, box, swizzle=swz, l2_promotion="128B", oob_fill="zero")
        tmpl = MapTemplate(spec)
        for _ in range(3):
            addr = base.ptr + 16 * int(rng.integers(0, 1000))
            arr = tf.DeviceArray(addr, shape, dtype)
            assert bytes(tmpl.bind(arr)) == encode(spec.with_address(addr))


def test_ptx_table_matches_the_driver(device):
    names = [("probe", "echo_args"), ("probe", "big_smem"), ("bench", "empty_kernel"),
             ("bench", "cluster_probe")]
    kerns = [tf.Kernel(source(f), n, filename=f"{f}.cu") for f, n in names]
    plan = examples.softmax_plan((64, 1024))
    kerns.append(examples.get_kernel("softmax", plan[1], plan[2]))
    for k in kerns:
        mod = k.module()
        assert [(p.offset, p.size) for p in mod.params] == [(p.offset, p.size) for p in k.params], k.name
        assert all(p.kind != "any" for p in mod.params), k.name


def test_kernel_close_unloads_and_reloads(device):
    k = probe("big_smem")
    out = tf.empty(256, "uint32")
    k.launch(out, 1024, 1, grid=1, block=64, smem=1024)
    k.close()
    out.fill_bytes(0xFF)
    k.launch(out, 1024, 5, grid=1, block=64, smem=1024)
    got = out.numpy()
    assert got[0] == big_smem_expect(255, 5) and got[255] == big_smem_expect(0, 5)


RESET_SCRIPT = """
import numpy as np, tmaflow as tf
from tmaflow import kernels
host = np.random.default_rng().standard_normal((64, 512)).astype(np.float32)
ref = np.exp(host - host.max(1, keepdims=True)); ref /= ref.sum(1, keepdims=True)
np.testing.assert_allclose(kernels.softmax(tf.from_numpy(host)).numpy(), ref, rtol=1e-5, atol=1e-8)
old = tf.from_numpy(host)
tf.current_device().reset()
try:
    kernels.softmax(old)  # its memory went with the context
    raise SystemExit("a launch of an array freed by the reset was accepted")
except tf.TmaflowError as e:
    assert "was freed" in str(e), e
np.testing.assert_allclose(kernels.softmax(tf.from_numpy(host)).numpy(), ref, rtol=1e-5, atol=1e-8)
print("reset ok")
"""


def test_entry_points_after_a_context_reset(device):
    """A reset takes every loaded function with it: the entry points' prepared launches must
    be rebuilt, not replayed with dead handles. In its own process: a reset also kills the
    CUDA state of any torch that shares the primary context (see the next test)."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", RESET_SCRIPT], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == 0 and "reset ok" in done.stdout, done.stdout + done.stderr


def test_reset_warns_when_torch_shares_the_context(device, monkeypatch):
    torch = pytest.importorskip("torch")
    torch.zeros(1, device="cuda")
    monkeypatch.setattr(tf.runtime.driver, "call", _no_reset(tf.runtime.driver.call))
    with pytest.warns(tf.TmaflowWarning, match=r"reset\(\): torch.*initialised CUDA.*invalid"):
        tf.current_device().reset()


def _no_reset(call):
    # The warning is the subject here; the real reset would break torch for the rest of the run.
    def without_reset(name, *args, **kw):
        if name == "cuDevicePrimaryCtxReset":
            return None
        return call(name, *args, **kw)
    return without_reset
