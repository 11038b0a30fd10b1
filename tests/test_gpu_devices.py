"""GPU tier, two GPUs in one process: entry points follow their arrays' device as torch's own
ops do (a model split over GPUs in one thread), whatever the thread's device, and leave the
thread's device and torch's current device as they were. Skipped with fewer than two GPUs."""
import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.runtime.device import current_ordinal

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


@pytest.fixture
def two(device):
    if tf.runtime.driver.call("cuDeviceGetCount") < 2 or torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    tf.set_device(0)
    torch.cuda.set_device(0)
    yield
    tf.set_device(0)
    torch.cuda.set_device(0)


def left_as_they_were():
    assert current_ordinal() == 0 and torch.cuda.current_device() == 0
    assert tf.current_device().ordinal == 0


def bf16(shape, device="cuda:1", seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(shape, generator=g).to(device=device, dtype=torch.bfloat16)


@pytest.mark.parametrize("m, n, k", [(256, 512, 1024), (16, 1024, 4096), (1000, 3000, 520), (129, 257, 4095)])
def test_gemm_of_tensors_on_the_other_gpu(two, m, n, k):
    a, b = bf16((m, k), seed=m), bf16((n, k), seed=n)
    for _ in range(3):  # the state, the workspace and the stream of device 1 again
        c = kernels.gemm(a, b)
        assert c.device == a.device
        left_as_they_were()
    ref = a.float() @ b.float().T
    torch.testing.assert_close(c.float(), ref, rtol=2e-2, atol=2e-1)


def test_stream_none_is_torchs_current_stream_of_the_tensors_device(two):
    a, b = bf16((512, 2048)), bf16((768, 2048), seed=1)
    side = torch.cuda.Stream(device=1)
    with torch.cuda.device(1), torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # the fill below lands late: ordered only on side
        b2 = b * 2
    torch.cuda.set_device(0)
    with torch.cuda.stream(side):  # side is device 1's: torch makes device 1 current for the block
        c = kernels.gemm(a, b2)
        assert torch.cuda.current_device() == 1 and current_ordinal() == 0
    left_as_they_were()
    side.synchronize()
    torch.testing.assert_close(c.float(), a.float() @ (2 * b.float()).T, rtol=2e-2, atol=4e-1)


def test_attention_softmax_and_copy_on_the_other_gpu(two):
    q, k, v = (bf16((2, 8, 384, 128), seed=s) for s in range(3))
    o = kernels.attention(q, k, v, causal=True)
    left_as_they_were()
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    torch.testing.assert_close(o.float(), ref, rtol=2e-2, atol=2e-2)
    x = torch.randn(300, 512, device="cuda:1")
    torch.testing.assert_close(kernels.softmax(x), torch.softmax(x, -1), rtol=1e-5, atol=1e-6)
    y = torch.full_like(x, float("nan"))
    kernels.copy(x, y)
    left_as_they_were()
    assert torch.equal(y, x)


def test_a_prepared_launch_runs_on_its_device_from_any_thread_device(two):
    a, b = bf16((256, 1024)), bf16((512, 1024), seed=2)
    run = kernels.gemm.prepare(a, b)
    c = run()
    c.fill_(float("nan"))
    run()
    left_as_they_were()
    torch.testing.assert_close(c.float(), a.float() @ b.float().T, rtol=2e-2, atol=2e-1)
    tf.set_device(1)  # prepared on device 0's thread for device 1: still right from device 1
    try:
        c.fill_(float("nan"))
        run()
        torch.testing.assert_close(c.float(), a.float() @ b.float().T, rtol=2e-2, atol=2e-1)
    finally:
        tf.set_device(0)


def test_tmaflow_arrays_of_the_other_gpu(two, rng):
    host = rng.standard_normal((96, 512)).astype(np.float32)
    with tf.runtime.device.using(1):
        x = tf.from_numpy(host)
    out = kernels.softmax(x)
    left_as_they_were()
    assert out.device.ordinal == 1
    ref = np.exp(host - host.max(1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), ref / ref.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
    left_as_they_were()  # numpy() made device 1's context current for its copy only


def test_arrays_on_two_gpus_in_one_call_are_refused(two):
    a, b = bf16((256, 512), device="cuda:0"), bf16((256, 512))
    with pytest.raises(tf.TmaflowError, match=r"gemm: b lives on device 1 but a on device 0"):
        kernels.gemm(a, b)
    with pytest.raises(tf.TmaflowError, match=r"gemm: b lives on device 0 but a on device 1"):
        kernels.gemm(b, a)
    left_as_they_were()


def test_a_launcher_called_from_another_devices_context_says_so(two):
    with tf.runtime.device.using(1):
        k = tf.Kernel('extern "C" __global__ void put(float* out, float v) { out[threadIdx.x] = v; }', "put")
        out = tf.zeros((32,), "float32")
        run = k.launcher(grid=1, block=32)
        run(out, 7.0)
    left_as_they_were()
    with pytest.raises(tf.LaunchError, match=r"put .*this launcher is device 1's but device 0's context is "
                                             r"current on this thread; call tf.set_device\(1\)"):
        run(out, 9.0)
    with tf.runtime.device.using(1):
        run(out, 9.0)
    assert (out.numpy() == 9.0).all()
    left_as_they_were()


def test_another_devices_methods_leave_the_current_context(two):
    tf.Device(1).synchronize()
    left_as_they_were()
    z = tf.zeros((16,), "float32", device=1)
    left_as_they_were()
    assert z.device.ordinal == 1 and (z.numpy() == 0).all()
    z.fill_bytes(0xFF)
    left_as_they_were()


def test_a_later_torch_device_switch_is_survived(two, rng):
    """The thread took device 0; then torch (another library) makes device 1 current. Calls on
    device 0's arrays, allocating or not, tensors or tmaflow arrays, prepared or not, still run
    there: a launch that found device 1's context current runs again under a guard (torch stays
    on device 1); building a new state or allocating a tmaflow array makes the thread's device
    current again, as the README says."""
    host = rng.standard_normal((96, 512)).astype(np.float32)
    x = torch.from_numpy(host).cuda(0)
    y = torch.empty_like(x)
    a = tf.from_numpy(host)
    kernels.softmax(x, y), kernels.softmax(x)  # their states are built here
    run = kernels.softmax.prepare(x, y)
    ref = torch.softmax(x, -1)
    torch.cuda.set_device(1)
    try:
        y.fill_(float("nan"))
        kernels.softmax(x, y)
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
        y.fill_(float("nan"))
        run()
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(kernels.softmax(x), ref, rtol=1e-5, atol=1e-6)
        assert torch.cuda.current_device() == 1  # these calls built no state
        b = kernels.softmax(a)  # allocates a tmaflow array: device 0 current again
        assert current_ordinal() == 0
        np.testing.assert_allclose(b.numpy(), ref.cpu().numpy(), rtol=1e-5, atol=1e-6)
        big = torch.randn(64, 4096, device="cuda:0", dtype=torch.bfloat16)  # a split-K skinny GEMM
        w = torch.randn(1024, 4096, device="cuda:0", dtype=torch.bfloat16)
        want = big.float() @ w.float().T
        kernels.gemm(big, w)  # its workspace exists
        torch.cuda.set_device(1)
        got = kernels.gemm(big, w)
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=3e-1)
    finally:
        torch.cuda.set_device(0)
