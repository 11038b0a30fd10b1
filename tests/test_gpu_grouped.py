"""GPU tier: the M-grouped (MoE) GEMM on device-patched tensor maps. Every group, empty and
ragged ones included, against a float64 reference; offsets from the host, tmaflow and torch;
graph replays with group sizes changing on the device, bit-exact against eager calls."""
import dataclasses

import numpy as np
import pytest

import tmaflow as tf
from tmaflow.dtypes import bf16_bits, bf16_to_float32
from tmaflow import kernels
from tmaflow.testing import poison

pytestmark = pytest.mark.gpu


def bf16(rng, shape):
    """Random bfloat16 values in [-1, 1) as (tf array, float64 numpy)."""
    bits = bf16_bits(rng.uniform(-1, 1, shape))
    return tf.from_numpy(bits, "bfloat16"), bf16_to_float32(bits).astype(np.float64)


def reference(a64, b64, offsets, layout="nt"):
    n = b64.shape[1] if layout == "nt" else b64.shape[2]
    out = np.zeros((a64.shape[0], n))
    for g in range(b64.shape[0]):
        lo, hi = offsets[g], offsets[g + 1]
        out[lo:hi] = a64[lo:hi] @ (b64[g].T if layout == "nt" else b64[g])
    return out


@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize("sizes,n,k", [
    ((0, 130, 1, 257), 384, 256),                # an empty group, ragged groups
    ((128, 128, 128, 128), 256, 512),            # tile-aligned
    ((513, 0, 0, 64, 1000, 7, 300, 45), 1024, 320),  # uneven, K not a multiple of 64... (320 = 5 x 64)
    ((33, 97), 200, 136),                        # N and K ragged against the tiles ("nn": K staged to 192)
    ((64,) * 6 + (0, 100), 512, 2048),           # few tiles, long K: split along K by default
])
def test_grouped_gemm_every_group(device, rng, sizes, n, k, layout):
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    t, g = int(offsets[-1]), len(sizes)
    a, a64 = bf16(rng, (t, k))
    b, b64 = bf16(rng, (g, n, k) if layout == "nt" else (g, k, n))
    want = reference(a64, b64, offsets, layout)
    for given in ("host", "device"):
        out = poison(tf.empty((t, n), "bfloat16"))
        offs = offsets if given == "host" else tf.from_numpy(offsets)
        kernels.grouped_gemm(a, b, offs, out, layout=layout)
        got = out.numpy().astype(np.float64)
        assert not np.isnan(got).any(), f"rows left unwritten ({given} offsets)"
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.sqrt(k) / 4)


def test_grouped_gemm_torch_in_torch_out(device, rng):
    torch = pytest.importorskip("torch")
    sizes = (70, 0, 300)
    offsets = torch.tensor([0, *np.cumsum(sizes)], dtype=torch.int32, device="cuda")
    a = torch.randn(370, 192, device="cuda").to(torch.bfloat16)
    b = torch.randn(3, 256, 192, device="cuda").to(torch.bfloat16)
    c = kernels.grouped_gemm(a, b, offsets)
    assert isinstance(c, torch.Tensor) and c.shape == (370, 256)
    want = torch.cat([a[0:70].float() @ b[0].float().T, a[370 - 300:].float() @ b[2].float().T])
    torch.testing.assert_close(c.float(), want, rtol=2e-2, atol=2e-1)


def test_grouped_gemm_graph_replays_with_changing_group_sizes(device, rng):
    """1,000 replays; the group sizes change on the device before every one (same total), and
    each replay is bit-exact against an eager call with those sizes."""
    g, t, n, k = 8, 1024, 256, 256
    a, _ = bf16(rng, (t, k))
    b, _ = bf16(rng, (g, n, k))
    offsets = tf.from_numpy(np.linspace(0, t, g + 1).astype(np.int32))
    out = tf.empty((t, n), "bfloat16")
    kernels.grouped_gemm(a, b, offsets, out)  # warm: compiled, prepared
    with tf.Graph() as graph:
        with graph.capture():
            kernels.grouped_gemm(a, b, offsets, out)
        for replay in range(1000):
            cuts = np.sort(rng.integers(0, t + 1, g - 1))
            host = np.concatenate([[0], cuts, [t]]).astype(np.int32)  # empty groups happen
            offsets.copy_from(host)
            poison(out)
            graph.replay()
            eager = kernels.grouped_gemm(a, b, host)
            assert np.array_equal(out.numpy().view(np.uint16), eager.numpy().view(np.uint16)), \
                f"replay {replay}, offsets {host.tolist()}"


def test_grouped_gemm_checks_its_arguments(device, rng):
    a, _ = bf16(rng, (10, 64))
    b, _ = bf16(rng, (3, 32, 64))
    with pytest.raises(tf.TmaflowError, match=r"offsets \[0, 5, 4, 10\] must start at 0, never decrease"):
        kernels.grouped_gemm(a, b, [0, 5, 4, 10])
    with pytest.raises(tf.TmaflowError, match=r"offsets must be 4 ints"):
        kernels.grouped_gemm(a, b, [0, 10])
    with pytest.raises(tf.TmaflowError, match=r"b must be \(G, N, K\)"):
        kernels.grouped_gemm(a, bf16(rng, (3, 32, 48))[0], [0, 5, 6, 10])


def test_debug_grouped_gemm_proves_its_patched_maps(device, rng):
    """A debug launch checks every C map a CTA patched against the host encode (it would raise
    TensorMapError on a wrong patch) and computes the same result."""
    sizes = (0, 130, 1, 257, 64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    a, a64 = bf16(rng, (int(offsets[-1]), 256))
    b, b64 = bf16(rng, (5, 384, 256))
    release = kernels.grouped_gemm(a, b, offsets).numpy()
    checked = kernels.grouped_gemm(a, b, tf.from_numpy(offsets), debug=True).numpy()
    assert np.array_equal(release.view(np.uint16), checked.view(np.uint16))
    np.testing.assert_allclose(checked.astype(np.float64), reference(a64, b64, offsets), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("split", [2, 3])
def test_grouped_gemm_split_k(device, rng, split):
    """K split among work items whose fp32 partials meet per tile; rows past a group's end are
    never written to the partials the next group's first tile uses."""
    sizes = (70, 0, 130, 5, 300)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    a, a64 = bf16(rng, (int(offsets[-1]), 1000))
    b, b64 = bf16(rng, (5, 264, 1000))
    config = kernels.GemmConfig(bn=128, cluster_m=1, split_k=split)
    out = poison(tf.empty((int(offsets[-1]), 264), "bfloat16"))
    for _ in range(3):  # the per-tile counters are reset by each tile's last split
        kernels.grouped_gemm(a, b, tf.from_numpy(offsets), out, config=config)
        np.testing.assert_allclose(out.numpy().astype(np.float64), reference(a64, b64, offsets),
                                   rtol=2e-2, atol=5e-2)


# --- the decode path (skinny.cu's GROUPED) and the dense path's unpatched full tiles ----------

@pytest.mark.parametrize("sizes,n,k", [
    ((1,) * 8, 4096, 512),                           # a token an expert
    ((0, 1, 0, 16, 3, 0, 64, 9), 384, 256),          # empty groups, 1-token groups, a full 64-row chunk
    ((5, 0, 17, 33), 200, 136),                      # N and K ragged against the tiles
    ((40, 2, 130, 0, 7), 512, 192),                  # groups larger than a chunk: several chunks
    ((0, 0, 0, 12), 256, 64),                        # only the last group has rows
])
@pytest.mark.parametrize("rows", [64, 128])
def test_grouped_decode_path_every_group(device, rng, sizes, n, k, rows):
    """Host offsets size the chunks by the largest group; device offsets by the mean (larger
    groups take several chunks); a hint of 8 rows forces 8-row chunks: all against float64."""
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    t, g = int(offsets[-1]), len(sizes)
    a, a64 = bf16(rng, (t, k))
    b, b64 = bf16(rng, (g, n, k))
    want = reference(a64, b64, offsets)
    config = kernels.SkinnyConfig(rows=rows, split_k=1)
    for given, hint in (("host", None), ("device", None), ("device", 8)):
        out = poison(tf.empty((t, n), "bfloat16"))
        offs = offsets if given == "host" else tf.from_numpy(offsets)
        kernels.grouped_gemm(a, b, offs, out, config=config, max_tokens_per_group=hint)
        got = out.numpy().astype(np.float64)
        assert not np.isnan(got).any(), f"rows left unwritten ({given} offsets, hint {hint})"
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.sqrt(k) / 4,
                                   err_msg=f"{given} offsets, hint {hint}")


@pytest.mark.parametrize("tile_fastest", [False, True])
@pytest.mark.parametrize("rows", [64, 128])
def test_grouped_decode_hot_groups_among_empty_ones(device, rng, rows, tile_fastest):
    """Groups of 1, 63, 64, 65 and 200 rows among empty ones, in both item orders: chunks of 64
    (host offsets and device ones without a hint), of 8 and 32 (hints: the 200-row group in 25
    or 7 chunks, partial chunks' A in 8-row boxes); every row against float64, outputs poisoned."""
    sizes = (0, 1, 0, 0, 63, 0, 64, 0, 65, 0, 0, 200, 0)
    n, k = 320, 192  # 2.5 tiles of 128 rows
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    t, g = int(offsets[-1]), len(sizes)
    a, a64 = bf16(rng, (t, k))
    b, b64 = bf16(rng, (g, n, k))
    want = reference(a64, b64, offsets)
    config = kernels.SkinnyConfig(rows=rows, split_k=1, tile_fastest=tile_fastest)
    for given, hint in (("host", None), ("host", 200), ("device", None), ("device", 8), ("device", 32)):
        out = poison(tf.empty((t, n), "bfloat16"))
        offs = offsets if given == "host" else tf.from_numpy(offsets)
        kernels.grouped_gemm(a, b, offs, out, config=config, max_tokens_per_group=hint)
        got = out.numpy().astype(np.float64)
        assert not np.isnan(got).any(), f"rows left unwritten ({given} offsets, hint {hint})"
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.sqrt(k) / 4,
                                   err_msg=f"{given} offsets, hint {hint}")


def test_grouped_known_hot_group_takes_the_dense_path(device, rng):
    """8 experts, 16 rows a group on average: host offsets (or the hint) showing a 118-row group
    keep the decode path, a 129-row one takes the dense path; right either way, bit-equal to the
    forced configuration."""
    from tmaflow.kernels.matmul.heuristics import grouped_dense_config

    n, k, g = 4096, 256, 8
    sm = tf.current_device().sm_count
    for sizes, dense in (((118, 6, 4, 0, 0, 0, 0, 0), False), ((129, 0, 0, 0, 0, 0, 0, 0), True)):
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
        t = int(offsets[-1])
        a, a64 = bf16(rng, (t, k))
        b, b64 = bf16(rng, (g, n, k))
        forced = grouped_dense_config(t, n, k, g, sm) if dense else kernels.SkinnyConfig(split_k=1)
        want = kernels.grouped_gemm(a, b, offsets, config=forced).numpy()
        for offs, hint in ((offsets, None), (tf.from_numpy(offsets), max(sizes))):
            out = poison(tf.empty((t, n), "bfloat16"))
            kernels.grouped_gemm(a, b, offs, out, max_tokens_per_group=hint)
            assert np.array_equal(out.numpy().view(np.uint16), want.view(np.uint16)), (sizes, hint)
        np.testing.assert_allclose(want.astype(np.float64), reference(a64, b64, offsets), rtol=2e-2,
                                   atol=2e-2 * np.sqrt(k) / 4)


def test_grouped_decode_path_is_the_default_for_few_tokens(device, rng):
    """8 tokens an expert over 8 experts of 4096 x 512 take the decode path by default, and it
    agrees bit for bit with the forced SkinnyConfig, whatever sizes the device offsets hold."""
    from tmaflow.kernels.matmul.heuristics import grouped_config

    g, t, n, k = 8, 64, 4096, 512
    config = grouped_config(t, n, k, g, tf.current_device().sm_count)
    assert isinstance(config, kernels.SkinnyConfig)
    a, a64 = bf16(rng, (t, k))
    b, b64 = bf16(rng, (g, n, k))
    host = np.concatenate([[0], np.sort(rng.integers(0, t + 1, g - 1)), [t]]).astype(np.int32)
    default = kernels.grouped_gemm(a, b, tf.from_numpy(host)).numpy()
    forced = kernels.grouped_gemm(a, b, tf.from_numpy(host), config=kernels.SkinnyConfig(rows=config.rows,
                                                                                          split_k=1)).numpy()
    assert np.array_equal(default.view(np.uint16), forced.view(np.uint16))
    np.testing.assert_allclose(default.astype(np.float64), reference(a64, b64, host), rtol=2e-2, atol=2e-2)


def test_grouped_decode_graph_replays_with_changing_group_sizes(device, rng):
    """200 replays of the decode path; the sizes change on the device before each (empty groups
    and groups past the chunk included), each replay bit-exact against an eager call."""
    g, t, n, k = 8, 64, 512, 256
    a, _ = bf16(rng, (t, k))
    b, _ = bf16(rng, (g, n, k))
    config = kernels.SkinnyConfig(split_k=1)
    offsets = tf.from_numpy(np.linspace(0, t, g + 1).astype(np.int32))
    eager_offsets = tf.from_numpy(np.linspace(0, t, g + 1).astype(np.int32))
    out = tf.empty((t, n), "bfloat16")
    kernels.grouped_gemm(a, b, offsets, out, config=config)  # warm: compiled, prepared
    with tf.Graph() as graph:
        with graph.capture():
            kernels.grouped_gemm(a, b, offsets, out, config=config)
        for replay in range(200):
            host = np.concatenate([[0], np.sort(rng.integers(0, t + 1, g - 1)), [t]]).astype(np.int32)
            offsets.copy_from(host)
            eager_offsets.copy_from(host)
            poison(out)
            graph.replay()
            eager = kernels.grouped_gemm(a, b, eager_offsets, config=config)
            assert np.array_equal(out.numpy().view(np.uint16), eager.numpy().view(np.uint16)), \
                f"replay {replay}, offsets {host.tolist()}"


@pytest.mark.parametrize("sizes", [(0, 256, 128, 1, 383), (128,) * 4, (300, 0, 17, 640)])
def test_grouped_dense_full_tiles_skip_the_patched_map(device, rng, sizes):
    """Tiles wholly inside a group leave through the full C map: the same bits as patching every
    tile's map (the first kernel's way), and right against float64, for clustered and split
    configurations."""
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    t, g, n, k = int(offsets[-1]), len(sizes), 512, 1024
    a, a64 = bf16(rng, (t, k))
    b, b64 = bf16(rng, (g, n, k))
    want = reference(a64, b64, offsets)
    for config in (kernels.GemmConfig(), kernels.GemmConfig(bn=128, cluster_m=1, split_k=2)):
        got = {}
        for patch in (False, True):
            out = poison(tf.empty((t, n), "bfloat16"))
            cfg = dataclasses.replace(config, patch_full_tiles=patch)
            kernels.grouped_gemm(a, b, tf.from_numpy(offsets), out, config=cfg)
            got[patch] = out.numpy()
            assert not np.isnan(got[patch].astype(np.float64)).any(), (config, patch)
        assert np.array_equal(got[False].view(np.uint16), got[True].view(np.uint16)), config
        np.testing.assert_allclose(got[False].astype(np.float64), want, rtol=2e-2, atol=5e-2)
