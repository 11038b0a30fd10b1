"""GPU tier: the seeds' kernels as written (libcu++ under NVRTC), each against numpy."""
import numpy as np
import pytest

import tmaflow as tf
from kernel_sources import source
from tmaflow.testing import poison

pytestmark = pytest.mark.gpu


def seed(name, **kw):
    return tf.Kernel(source("seeds"), name, filename="seeds.cu", **kw)


def _copy_compute_ref(x, blocks, threads, batch_sz):
    """out[b*grid + blk*T + i] = 2 * in[b*grid + blk*T + (i+1) % T] + 1."""
    v = x.reshape(batch_sz, blocks, threads)
    return (2 * np.roll(v, -1, axis=2) + 1).ravel()


@pytest.mark.parametrize("name", ["without_memcpy_async", "with_memcpy_async", "with_barrier",
                                  "with_single_stage", "with_staging"])
def test_copy_compute_seeds(device, rng, name):
    blocks, threads, batch_sz = 24, 128, 7
    size = batch_sz * blocks * threads
    host = rng.integers(-1000, 1000, size=size, dtype=np.int32)
    out = poison(tf.empty(size, "int32"))
    smem = threads * 4 * (2 if name == "with_staging" else 1)
    seed(name).launch(out, tf.from_numpy(host), size, batch_sz, grid=blocks, block=threads, smem=smem)
    np.testing.assert_array_equal(out.numpy(), _copy_compute_ref(host, blocks, threads, batch_sz))


def test_with_specialized_staging_unified(device, rng):
    blocks, threads, batch_sz = 16, 256, 9
    per_block = threads // 2
    size = batch_sz * blocks * per_block
    host = rng.integers(-1000, 1000, size=size, dtype=np.int32)
    out = poison(tf.empty(size, "int32"))
    seed("with_specialized_staging_unified<2>").launch(
        out, tf.from_numpy(host), size, batch_sz, grid=blocks, block=threads, smem=2 * per_block * 4)
    np.testing.assert_array_equal(out.numpy(), 2 * host + 1)


def test_split_arrive_wait(device, rng):
    blocks, threads, iters = 4, 96, 5
    host = rng.standard_normal(blocks * threads).astype(np.float32)
    data = tf.from_numpy(host)
    seed("split_arrive_wait").launch(iters, data, grid=blocks, block=threads)
    np.testing.assert_allclose(data.numpy(), host + sum(range(iters)), rtol=1e-6)


def test_producer_consumer_pattern(device, rng):
    n, buffer_len = 64 * 1024, 1024
    host = rng.standard_normal(n).astype(np.float32)
    out = poison(tf.empty(n, "float32"))
    seed("producer_consumer_pattern").launch(n, buffer_len, tf.from_numpy(host), out, grid=1,
                                             block=256, smem=2 * buffer_len * 4)
    np.testing.assert_allclose(out.numpy(), 2 * host + 1, rtol=1e-6)


def test_add_one_kernel_1d_tma(device, rng):
    host = rng.integers(-100, 100, size=4096, dtype=np.int32)
    data = tf.from_numpy(host)
    seed("add_one_kernel").launch(data, 1024, grid=1, block=256)
    want = host.copy()
    want[1024:2048] += 1
    np.testing.assert_array_equal(data.numpy(), want)


@pytest.mark.parametrize("name", ["kernel", "kernel_ptx"])
def test_2d_tensor_map_kernel(device, rng, name):
    h, w = 64, 96
    host = rng.integers(-100, 100, size=(h, w), dtype=np.int32)
    data = tf.from_numpy(host)
    tmap = tf.TensorMap.tiled(data, (8, 32))  # SMEM_HEIGHT x SMEM_WIDTH
    x, y = 32, 16
    seed(name).launch(tmap, x, y, grid=1, block=32)
    want = host.copy()
    want[y, x:x + 32] += np.arange(32, dtype=np.int32)
    np.testing.assert_array_equal(data.numpy(), want)


def test_dsmem_exchange(device):
    out = poison(tf.empty(8, "int32"))
    seed("dsmem_kernel").launch(out, grid=8, block=32)  # __cluster_dims__(2)
    np.testing.assert_array_equal(out.numpy(), np.full(8, 2, np.int32))


def test_multicast_seed_made_correct(device, rng):
    host = rng.standard_normal(1024).astype(np.float32)
    src = tf.from_numpy(host)
    tmap = tf.TensorMap.tiled(src, (256,))  # one box of TILE_SIZE elements
    out = poison(tf.empty((4, 256), "float32"))
    k = seed("tma_multicast_kernel", defines={"TILE_SIZE": 256})
    k.launch(tmap, out, grid=(2, 2), block=128)  # cluster (2, 2, 1) from __cluster_dims__
    np.testing.assert_array_equal(out.numpy(), np.broadcast_to(host[:256], (4, 256)))
    with pytest.raises(tf.LaunchError, match=r"conflicts with __cluster_dims__\(2, 2, 1\)"):
        k.launch(tmap, out, grid=(4, 2), block=128, cluster=(4, 1, 1))
