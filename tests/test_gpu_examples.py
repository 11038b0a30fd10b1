"""GPU tier: every example kernel against numpy on fresh random data, outputs poisoned."""
import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.testing import assert_close, poison

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("flatten,evict_first,stores", [(True, False, 1), (False, True, 2)])
@pytest.mark.parametrize("dtype,shape", [("float32", (1000, 1000)), ("float32", (333, 264)),
                                         ("bfloat16", (517, 1032)), ("float16", (64, 4096))])
def test_tile_copy(device, rng, dtype, shape, flatten, evict_first, stores):
    bits = rng.integers(0, 2**16, size=shape, dtype=np.uint16)
    host = bits if dtype != "float32" else rng.standard_normal(shape).astype(np.float32)
    src = tf.from_numpy(host, dtype=dtype)
    dst = poison(tf.empty(shape, dtype))
    kernels.copy(src, dst, flatten=flatten, evict_first=evict_first, stores=stores, stages=4)
    np.testing.assert_array_equal(dst.numpy().view(np.uint8), host.view(np.uint8))


def test_tile_copy_torch(device, rng):
    torch = pytest.importorskip("torch")
    a = torch.randn(300, 512, device="cuda")
    b = torch.full_like(a, float("nan"))
    torch.cuda.synchronize()
    kernels.copy(a, b)
    tf.current_device().synchronize()
    assert torch.equal(a, b)


@pytest.mark.parametrize("shape", [(512, 256), (300, 200), (4096, 1024)])
def test_transpose(device, rng, shape):
    host = rng.standard_normal(shape).astype(np.float32)
    out = poison(tf.empty(shape[::-1], "float32"))
    kernels.transpose(tf.from_numpy(host), out)
    np.testing.assert_array_equal(out.numpy(), host.T)


@pytest.mark.parametrize("shape", [(64, 4096), (37, 1000), (1024, 256)])
def test_softmax(device, rng, shape):
    host = (rng.standard_normal(shape) * 4).astype(np.float32)
    out = poison(tf.empty(shape, "float32"))
    kernels.softmax(tf.from_numpy(host), out)
    ref = np.exp(host - host.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    assert_close(out.numpy(), ref, 1e-5)


def test_reduce_add(device, rng):
    parts = rng.standard_normal((5, 100, 200)).astype(np.float32)
    base = rng.standard_normal((100, 200)).astype(np.float32)
    out = tf.from_numpy(base)
    kernels.reduce_add(tf.from_numpy(parts), out)
    assert_close(out.numpy(), base + parts.sum(0, dtype=np.float64), 1e-6)


@pytest.mark.parametrize("cluster,group_size,wrows,sparse", [
    (1, None, 32, 1), (2, None, 32, 1), (4, None, 64, 1), (1, 4, 32, 8), (2, 2, 32, 4), (4, 4, 64, 8)])
def test_broadcast_multicast(device, rng, cluster, group_size, wrows, sparse):
    from tmaflow.kernels.examples import broadcast_reference

    x = rng.standard_normal((8 * 32, 256)).astype(np.float32)
    w = rng.standard_normal((24 * wrows, 256)).astype(np.float32)
    out = poison(tf.empty(x.shape, "float32"))
    iters = 30 if group_size else None
    kernels.broadcast_scale(tf.from_numpy(x), tf.from_numpy(w), out, cluster=cluster,
                            wrows=wrows, stages=3 if wrows == 64 else 4, group_size=group_size,
                            iters=iters, sparse=sparse)
    ref = broadcast_reference(x, w, group_size=group_size, iters=iters, wrows=wrows, sparse=sparse)
    assert_close(out.numpy(), ref, 1e-5)  # every CTA must have received every tile it needs


@pytest.mark.parametrize("method", ["ldgsts", "tma"])
def test_axpb(device, rng, method):
    host = rng.standard_normal(4096 * 300).astype(np.float32)
    out = poison(tf.empty(host.shape, "float32"))
    kernels.axpb(tf.from_numpy(host), 1.5, -0.25, out, method=method)
    assert_close(out.numpy(), 1.5 * host.astype(np.float64) - 0.25, 1e-6)


def test_entry_points_take_cupy_arrays(device, rng):
    cupy = pytest.importorskip("cupy")
    host = rng.standard_normal((300, 512)).astype(np.float32)
    a = cupy.asarray(host)
    b = cupy.full_like(a, cupy.nan)
    kernels.copy(a, b)
    t = kernels.transpose(a)
    s = cupy.empty_like(a)
    kernels.softmax(a, s)
    tf.current_device().synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(b), host)
    assert isinstance(t, cupy.ndarray)  # cupy in, cupy out
    np.testing.assert_array_equal(cupy.asnumpy(t), host.T)
    ref = np.exp(host - host.max(1, keepdims=True))
    assert_close(cupy.asnumpy(s), ref / ref.sum(1, keepdims=True), 1e-5)
