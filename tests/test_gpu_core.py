"""GPU tier: launch configurations, clusters, DSMEM, big smem, every argument kind."""
import numpy as np
import pytest

import tmaflow as tf
from kernel_sources import source

pytestmark = pytest.mark.gpu


def probe(name):
    return tf.Kernel(source("probe"), name, filename="probe.cu")


def bench_kernel(name):
    return tf.Kernel(source("bench"), name, filename="bench.cu")


@pytest.mark.parametrize("cluster", [(1, 1, 1), (2, 1, 1), (4, 1, 1), (8, 1, 1), (16, 1, 1),
                                     (2, 2, 1), (1, 4, 1), (2, 2, 2)])
def test_cluster_shape_seen_from_inside(device, cluster):
    k = bench_kernel("cluster_probe")
    grid = (cluster[0] * 4, cluster[1] * 2, cluster[2])
    nblocks = grid[0] * grid[1] * grid[2]
    out = tf.empty(nblocks * 10, "uint32").fill_bytes(0xFF)
    k.launch(out, grid=grid, block=64, cluster=cluster)
    got = out.numpy().reshape(nblocks, 10)
    size = cluster[0] * cluster[1] * cluster[2]
    for b in range(nblocks):
        bx, by, bz = b % grid[0], (b // grid[0]) % grid[1], b // (grid[0] * grid[1])
        cx, cy, cz = bx % cluster[0], by % cluster[1], bz % cluster[2]
        rank = cx + cluster[0] * (cy + cluster[1] * cz)
        assert tuple(got[b, :8]) == (rank, size, *cluster, cx, cy, cz), b
        nxt = (rank + 1) % size
        assert got[b, 8] == got[b, 9] == 1000 + nxt  # DSMEM: the neighbour's word, both ways


def test_200kb_dynamic_smem(device, rng):
    k = probe("big_smem")
    nbytes = 200 * 1024
    seed = int(rng.integers(0, 2**32))
    out = tf.empty(nbytes // 4, "uint32").fill_bytes(0xFF)
    k.launch(out, nbytes, seed, grid=1, block=256, smem=nbytes)
    i = np.arange(nbytes // 4, dtype=np.uint64)
    words = ((i * 2654435761) & 0xFFFFFFFF).astype(np.uint32) ^ np.uint32(seed)
    np.testing.assert_array_equal(out.numpy(), words[::-1])


def test_max_active_clusters(device):
    k = probe("big_smem")
    # One 200 KB block per SM: with no cluster, one per SM; pairs cannot exceed half the SMs.
    single = k.bind(grid=1, block=256, smem=200 * 1024).max_active_clusters()
    pairs = k.bind(grid=2, block=256, cluster=(2, 1, 1), smem=200 * 1024).max_active_clusters()
    assert single == device.sm_count
    assert 0 < pairs <= device.sm_count // 2
    small = k.bind(grid=1, block=64, smem=1024).max_active_clusters()
    assert small > device.sm_count  # several small blocks fit per SM


def test_smem_over_limit_raises_before_launch(device):
    k = probe("big_smem")
    out = tf.empty(16, "uint32")
    with pytest.raises(tf.LaunchError, match=r"exceeds the \d+ B per-block limit"):
        k.launch(out, 16, 0, grid=1, block=32, smem=device.max_smem_per_block + 16)


def test_every_argument_kind(device, rng):
    torch = pytest.importorskip("torch")
    cupy = pytest.importorskip("cupy")
    k = probe("echo_args")
    base = tf.from_numpy(rng.standard_normal((64, 64)).astype(np.float32))
    tmap = tf.TensorMap.tiled(base, (16, 16))
    t = torch.full((4,), 3.5, device="cuda")
    c = cupy.full((4,), -2.25, dtype=cupy.float32)
    out = tf.empty(24, "uint64").fill_bytes(0xFF)
    torch.cuda.synchronize()
    k.launch(tmap, np.int8(-5), np.uint16(65000), -123456, 2**40 + 7, 1.5, np.float64(-0.125),
             t, c, out, grid=1, block=32)
    got = out.numpy()
    assert got[:16].tobytes() == bytes(tmap)
    assert got[16] == np.uint64(2**64 - 5) and got[17] == 65000
    assert got[18] == np.uint64(2**64 - 123456) and got[19] == 2**40 + 7
    assert np.uint32(got[20]).view(np.float32) == 1.5
    assert np.uint64(got[21]).view(np.float64) == -0.125
    assert np.uint32(got[22]).view(np.float32) == 3.5
    assert np.uint32(got[23]).view(np.float32) == -2.25


def test_wrong_arguments_raise_before_launch(device):
    k = probe("echo_args")
    base = tf.zeros((64, 64), "float32")
    tmap = tf.TensorMap.tiled(base, (16, 16))
    out = tf.empty(24, "uint64")
    good = [tmap, np.int8(1), np.uint16(1), 1, 1, 1.0, 1.0, base, base, out]
    with pytest.raises(tf.LaunchError, match=r"takes 10 arguments .* but 9 were given"):
        k.launch(*good[:-1], grid=1, block=32)
    bad = list(good)
    bad[1] = np.int32(1)
    with pytest.raises(tf.LaunchError, match=r"argument 1 \([^)]*\): numpy.int32 \(4 B\) is 4 bytes but the kernel parameter is 1 bytes"):
        k.launch(*bad, grid=1, block=32)
    bad = list(good)
    bad[0] = base
    with pytest.raises(tf.LaunchError, match=r"argument 0 \([^)]*\): a device array passes an 8-byte pointer but the kernel parameter is 128 bytes"):
        k.launch(*bad, grid=1, block=32)
    bad = list(good)
    bad[7] = tmap
    with pytest.raises(tf.LaunchError, match=r"argument 7 \([^)]*\): a TensorMap is 128 bytes but the kernel parameter is 8"):
        k.launch(*bad, grid=1, block=32)
    bad = list(good)
    bad[3] = 2**40
    with pytest.raises(tf.LaunchError, match=r"argument 3 \([^)]*\): int 1099511627776 does not fit the 4-byte parameter"):
        k.launch(*bad, grid=1, block=32)
    bad = list(good)
    bad[7] = np.zeros(4, np.float32)
    with pytest.raises(tf.LaunchError, match=r"argument 7 \([^)]*\): a host numpy array"):
        k.launch(*bad, grid=1, block=32)
    k.launch(*good, grid=1, block=32)  # and a correct launch still works
    tf.current_device().synchronize()


def test_bad_clusters_raise_before_launch(device):
    k = bench_kernel("cluster_probe")
    out = tf.empty(64 * 10, "uint32")
    with pytest.raises(tf.LaunchError, match=r"cluster=\(4, 1, 1\) does not divide grid=\(6, 1, 1\)"):
        k.launch(out, grid=6, block=32, cluster=4)
    with pytest.raises(tf.LaunchError, match=r"at most 8 \(portable\) or 16"):
        k.launch(out, grid=32, block=32, cluster=32)
    big = probe("big_smem")  # 16 CTAs of 1024 threads and 200 KB each: one GPC, non-portable
    big.launch(out, 16, 0, grid=16, block=1024, cluster=16, smem=200 * 1024)
    k.launch(out, grid=8, block=32, cluster=8)
    tf.current_device().synchronize()


def test_streams_of_every_kind(device, rng):
    torch = pytest.importorskip("torch")
    k = probe("big_smem")
    for stream in (None, tf.Stream(), torch.cuda.Stream(), 0):
        out = tf.empty(256, "uint32").fill_bytes(0xFF)
        k.launch(out, 1024, 7, grid=1, block=64, smem=1024, stream=stream)
        tf.current_device().synchronize()
        assert out.numpy()[0] == (255 * 2654435761 & 0xFFFFFFFF) ^ 7


def test_bound_launcher_matches_launch(device):
    k = probe("big_smem")
    out = tf.empty(256, "uint32").fill_bytes(0xFF)
    run = k.bind(grid=1, block=64, smem=1024)
    for seed in (1, 2, 3):
        run(out, 1024, seed)
        assert out.numpy()[0] == (255 * 2654435761 & 0xFFFFFFFF) ^ seed


def test_dlpack_roundtrip_with_torch(device, rng):
    torch = pytest.importorskip("torch")
    host = rng.standard_normal((8, 16)).astype(np.float32)
    a = tf.from_numpy(host)
    t = torch.from_dlpack(a)
    assert t.device.type == "cuda" and tuple(t.shape) == (8, 16)
    np.testing.assert_array_equal(t.cpu().numpy(), host)
    b = tf.as_array(torch.arange(6, device="cuda", dtype=torch.bfloat16).reshape(2, 3))
    assert b.dtype.name == "bfloat16" and b.shape == (2, 3)
