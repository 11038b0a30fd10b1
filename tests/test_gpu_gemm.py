"""The bf16 GEMM against a float64 reference: every layout and tile configuration, ragged
and skinny shapes, poisoned outputs. Each case runs as a debug build first, so a pipeline
bug becomes a DeadlockError naming the barrier instead of a hang."""
import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.dtypes import bf16_bits, bf16_to_float32
from tmaflow.kernels.matmul import GemmConfig
from tmaflow.testing import poison, rel_error

pytestmark = pytest.mark.gpu

SHAPES = [(256, 256, 64), (128, 128, 1024), (1000, 760, 520), (300, 4096, 136), (16, 4096, 4096),
          (4096, 16, 4096), (1024, 1024, 1024), (8, 8, 8), (129, 264, 72),  # TMA: rows are 16 B multiples
          # the heuristics' own choices (nt): one M tile in dense tiles, K split in pairs (bn64 /
          # bn112); an odd width filling its waves (bn176); pairs over a short K (bn192, c2)
          (100, 4096, 1024), (128, 7168, 1024), (4096, 2112, 136), (1000, 3000, 520),
          # K in clusters of four over 64-column tiles: small long-K products, one M tile of
          # narrow N (session 27's rules)
          (129, 264, 4096), (96, 768, 4096), (128, 512, 8192)]
CONFIGS = [GemmConfig(bn=256, cluster_m=2), GemmConfig(bn=128, cluster_m=2),
           GemmConfig(bn=256, cluster_m=1), GemmConfig(bn=128, cluster_m=1, epi_cols=64),
           GemmConfig(bn=256, cluster_m=2, epi_cols=256, stages=3),
           GemmConfig(bn=128, cluster_m=1, split_k=3), GemmConfig(bn=256, cluster_m=2, split_k=2),
           GemmConfig(bn=192, cluster_m=1, epi_cols=64), GemmConfig(bn=192, cluster_m=2, epi_cols=64, split_k=2),
           GemmConfig(bn=64, cluster_m=1, epi_cols=64), GemmConfig(bn=64, cluster_m=2, epi_cols=64, split_k=2),
           GemmConfig(bn=64, cluster_m=1, epi_cols=64, cluster_k=4), GemmConfig(bn=128, cluster_m=1, cluster_k=2),
           GemmConfig(bn=256, cluster_m=1, cluster_k=4), GemmConfig(bn=192, cluster_m=1, epi_cols=64, cluster_k=2)]


def _config_id(c):
    return (f"bn{c.bn}-c{c.cluster_m}-e{c.epi_cols}-s{c.stages}-k{c.split_k}" + (f"-ck{c.cluster_k}" if c.cluster_k > 1 else "")
            + ("-tail" if c.split_tail else ""))


def _bf16(x):
    """bf16 bits of x and the float32 values they hold."""
    bits = bf16_bits(x)
    return bits, bf16_to_float32(bits)


def _operands(rng, m, n, k, layout):
    a_bits, a = _bf16(rng.standard_normal((m, k)))
    b_bits, b = _bf16(rng.standard_normal((n, k) if layout == "nt" else (k, n)))
    ref = a.astype(np.float64) @ (b.T if layout == "nt" else b).astype(np.float64)
    return tf.from_numpy(a_bits, dtype="bfloat16"), tf.from_numpy(b_bits, dtype="bfloat16"), ref


def _check(out, ref, what):
    got = bf16_to_float32(out.numpy())
    assert not np.isnan(got).any(), what
    err = rel_error(got, ref)
    assert err < 1e-2, (what, err)


@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_gemm_against_float64(device, rng, m, n, k, layout):
    A, B, ref = _operands(rng, m, n, k, layout)
    for debug in (True, False):
        out = poison(tf.empty((m, n), "bfloat16"))
        kernels.gemm(A, B, out, layout=layout, debug=debug)
        _check(out, ref, (m, n, k, layout, debug))


@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize("config", CONFIGS, ids=_config_id)
def test_gemm_every_config(device, rng, config, layout):
    # 5 M tiles: an odd count, so with clusters of two the last CTA's tile is all out of bounds.
    # 2 full waves of work items at most: the persistent loop and the stage ring both wrap.
    m, n, k = 600, 1000, 1000
    A, B, ref = _operands(rng, m, n, k, layout)
    for debug in (True, False):
        out = poison(tf.empty((m, n), "bfloat16"))
        kernels.gemm(A, B, out, layout=layout, config=config, debug=debug)
        _check(out, ref, (config, layout, debug))


def test_gemm_split_k_counters_reset_between_calls(device, rng):
    # Each tile's last split resets its counter; alternating shapes on one stream reuse the
    # same counters and partial buffer, and every result must still be right.
    cases = [_operands(rng, 16, 512, 4096, "nt") + (8,), _operands(rng, 300, 264, 1024, "nt") + (3,)]
    for _ in range(2):
        for A, B, ref, split in cases:
            out = poison(tf.empty(ref.shape, "bfloat16"))
            kernels.gemm(A, B, out, config=GemmConfig(bn=128, cluster_m=1, split_k=split))
            _check(out, ref, ("split-k", ref.shape, split))


def test_gemm_split_k_is_deterministic(device, rng):
    A, B, _ = _operands(rng, 64, 1024, 8192, "nt")
    outs = []
    for _ in range(3):
        out = poison(tf.empty((64, 1024), "bfloat16"))
        kernels.gemm(A, B, out, config=GemmConfig(bn=128, cluster_m=1, split_k=16))
        outs.append(out.numpy())
    assert all((o == outs[0]).all() for o in outs[1:])


# Cluster K-splits: K shorter than the cluster (ranks with no k-block send zeros), ragged M, N
# and K, one tile per cluster, and many (the reduction barriers' phases wrap every item).
CLUSTER_K_SHAPES = [(129, 264, 72), (8, 8, 8), (1000, 760, 520), (16, 4096, 4096), (4096, 2048, 256)]


@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize("config", [c for c in CONFIGS if c.cluster_k > 1], ids=_config_id)
def test_gemm_cluster_k_against_float64(device, rng, config, layout):
    for m, n, k in CLUSTER_K_SHAPES:
        A, B, ref = _operands(rng, m, n, k, layout)
        for debug in (True, False) if (m, n, k) in ((129, 264, 72), (4096, 2048, 256)) else (False,):
            out = poison(tf.empty((m, n), "bfloat16"))
            kernels.gemm(A, B, out, layout=layout, config=config, debug=debug)
            _check(out, ref, (m, n, k, config, layout, debug))


@pytest.mark.parametrize("config", [GemmConfig(bn=64, cluster_m=1, epi_cols=64, cluster_k=4),
                                    GemmConfig(bn=128, cluster_m=1, cluster_k=2)], ids=["bn64-ck4", "bn128-ck2"])
def test_gemm_cluster_k_traced_debug_launch_passes_the_diagnosis(device, rng, config):
    """An owner's last remote arrivals hand its slots back to senders that wait for them before
    they leave (ClusterReduce.drain): a traced debug launch must not read that as a missing
    cluster sync (a finding raises). Several tiles a cluster, K ragged."""
    A, B, ref = _operands(rng, 1000, 760, 520, "nt")
    out = poison(tf.empty((1000, 760), "bfloat16"))
    kernels.gemm(A, B, out, config=config, debug=True, trace="all")
    _check(out, ref, ("traced cluster-k", config))


def test_gemm_cluster_k_is_deterministic_and_repeats(device, rng):
    # Each tile's rows are summed by their owner in a fixed order: repeats are bit-identical,
    # also with two shapes alternating through the same kernel.
    config = GemmConfig(bn=64, cluster_m=1, epi_cols=64, cluster_k=4)
    cases = [_operands(rng, 512, 512, 2048, "nt"), _operands(rng, 300, 1000, 1000, "nt")]
    first = []
    for rep in range(3):
        for i, (A, B, ref) in enumerate(cases):
            out = poison(tf.empty(ref.shape, "bfloat16"))
            kernels.gemm(A, B, out, config=config)
            got = out.numpy()
            if rep == 0:
                _check(out, ref, ("cluster-k repeat", ref.shape))
                first.append(got)
            assert (got == first[i]).all(), ("cluster-k not deterministic", ref.shape, rep)


# Widths that are no multiple of 64 ("nt" bf16): each with another schedule, so every width and
# every schedule runs; N = 1000 leaves a last tile whose last columns are partly (or wholly)
# past N, where the narrow boxes' stores must clip.
ODD_WIDTH_CONFIGS = [GemmConfig(bn=80, cluster_m=2, epi_cols=64), GemmConfig(bn=96, cluster_m=1, epi_cols=64, split_k=2),
                     GemmConfig(bn=112, cluster_m=1, epi_cols=64, cluster_k=4),
                     GemmConfig(bn=144, cluster_m=2, epi_cols=64, split_tail=True),
                     GemmConfig(bn=160, cluster_m=2, epi_cols=128), GemmConfig(bn=176, cluster_m=1, epi_cols=64, cluster_k=2),
                     GemmConfig(bn=208, cluster_m=2, epi_cols=64), GemmConfig(bn=224, cluster_m=1, epi_cols=64, split_k=3),
                     GemmConfig(bn=240, cluster_m=1, epi_cols=64)]


@pytest.mark.parametrize("config", ODD_WIDTH_CONFIGS, ids=_config_id)
def test_gemm_odd_widths_against_float64(device, rng, config):
    _check_nt_shapes(rng, config, [(600, 1000, 1000), (129, 264, 72), (1000, 3000, 520)])


def _check_nt_shapes(rng, config, shapes):
    """``config``'s "nt" products of ``shapes`` against float64, poisoned outputs; the 600 x 1000
    x 1000 one in the debug build too."""
    for m, n, k in shapes:
        A, B, ref = _operands(rng, m, n, k, "nt")
        for debug in (True, False) if (m, n, k) == (600, 1000, 1000) else (False,):
            out = poison(tf.empty((m, n), "bfloat16"))
            kernels.gemm(A, B, out, config=config, debug=debug)
            _check(out, ref, (m, n, k, config, debug))


def test_gemm_many_tiles_per_cta(device, rng):
    # More work items than resident clusters: each CTA loops over several tiles.
    m, n, k = 4096, 4096, 256
    A, B, ref = _operands(rng, m, n, k, "nt")
    out = poison(tf.empty((m, n), "bfloat16"))
    kernels.gemm(A, B, out, config=GemmConfig(bn=128))
    _check(out, ref, "many tiles")


def test_gemm_torch_interop_and_allocated_out(device):
    torch = pytest.importorskip("torch")
    a = torch.randn(520, 384, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(264, 384, device="cuda", dtype=torch.bfloat16)
    out = kernels.gemm(a, b)
    tf.current_device().synchronize()
    c = torch.from_dlpack(out) if not isinstance(out, torch.Tensor) else out
    ref = (a.double() @ b.double().T)
    assert (torch.linalg.norm(c.double() - ref) / torch.linalg.norm(ref)).item() < 1e-2
    c2 = torch.empty(520, 264, device="cuda", dtype=torch.bfloat16)
    kernels.gemm(a, b.T.contiguous(), c2, layout="nn")
    torch.cuda.synchronize()
    assert (torch.linalg.norm(c2.double() - ref) / torch.linalg.norm(ref)).item() < 1e-2


def test_gemm_zero_k_gives_zeros(device):
    A, B = tf.empty((64, 0), "bfloat16"), tf.empty((32, 0), "bfloat16")
    out = poison(tf.empty((64, 32), "bfloat16"))
    kernels.gemm(A, B, out)
    assert not out.numpy().view(np.uint16).any()


def test_gemm_strided_rows(device, rng):
    # A row-sliced view with a padded leading dimension: TMA takes the row pitch as given.
    a_bits, a = _bf16(rng.standard_normal((256, 200)))
    b_bits, b = _bf16(rng.standard_normal((96, 136)))
    A = tf.from_numpy(a_bits, dtype="bfloat16")
    from tmaflow.runtime.memory import DeviceArray
    A_view = DeviceArray(A.ptr, (256, 136), "bfloat16", strides=(400, 2), owner=A)
    out = poison(tf.empty((256, 96), "bfloat16"))
    kernels.gemm(A_view, tf.from_numpy(b_bits, dtype="bfloat16"), out)
    _check(out, a[:, :136].astype(np.float64) @ b.T.astype(np.float64), "strided")


# Clusters of four M tiles sharing B in four slices ("nt"): 1000 rows (two clusters of four, the
# last tile ragged), 600 rows (the second cluster's last three tiles wholly past M), and many
# items a cluster (the stage ring and the persistent loop wrap); B's slices of 16 to 64 rows.
@pytest.mark.parametrize("config", [GemmConfig(bn=192, cluster_m=4, epi_cols=64), GemmConfig(bn=64, cluster_m=4, epi_cols=64),
                                    GemmConfig(bn=256, cluster_m=4), GemmConfig(bn=160, cluster_m=4, epi_cols=64)],
                         ids=_config_id)
def test_gemm_cluster_m4_against_float64(device, rng, config):
    _check_nt_shapes(rng, config, [(1000, 3000, 520), (600, 1000, 1000), (2048, 2048, 256)])


# K_TAIL (opt-in define): K's last, partial k-block issues only the k-steps that reach into K.
# K = 520, 72, 1000: 1, 1 and 3 of 4 k-steps; split K (the last split owns it) and cluster
# K-splits (the last rank does); both layouts.
# K_TAIL 2: the same k-steps, that k-block after the k-loop in straight-line code per count.
@pytest.mark.parametrize("tail", [1, 2])
@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize("config", [None, GemmConfig(bn=128, cluster_m=1, split_k=3),
                                    GemmConfig(bn=64, cluster_m=1, epi_cols=64, cluster_k=4)],
                         ids=["auto", "bn128-split3", "bn64-ck4"])
def test_gemm_k_tail_against_float64(device, rng, config, layout, tail):
    from tmaflow.kernels import registry

    for m, n, k in [(1000, 3000, 520), (129, 264, 72), (300, 1000, 1000)]:
        A, B, ref = _operands(rng, m, n, k, layout)
        for debug in (True, False) if (m, n, k) == (129, 264, 72) else (False,):
            out = poison(tf.empty((m, n), "bfloat16"))
            with registry.extra_defines({"K_TAIL": tail}):
                kernels.gemm(A, B, out, layout=layout, config=config, debug=debug)
            _check(out, ref, (m, n, k, config, layout, debug, tail))


# Session 19's opt-in epilogue and exit (EPI_STMATRIX: C's swizzled boxes written by stmatrix, two
# 8-column blocks an instruction; EXIT_WAIT_READ: a CTA leaves once its last stores have read
# shared memory): 64-column boxes whole and in halves (bn192), a last narrow box (bn80: 16
# columns, bn176: 48), 32-row boxes (cluster K in fours), split K's reload, both layouts.
@pytest.mark.parametrize("config", [None, GemmConfig(bn=80, cluster_m=2, epi_cols=64),
                                    GemmConfig(bn=176, cluster_m=1, epi_cols=64, cluster_k=2),
                                    GemmConfig(bn=64, cluster_m=1, epi_cols=64, cluster_k=4),
                                    GemmConfig(bn=128, cluster_m=1, split_k=3)],
                         ids=["auto", "bn80-c2", "bn176-ck2", "bn64-ck4", "bn128-split3"])
def test_gemm_stmatrix_epilogue_against_float64(device, rng, config):
    from tmaflow.kernels import registry

    for m, n, k, layout in [(1000, 3000, 520, "nt"), (129, 264, 72, "nt"), (600, 1000, 1000, "nn")]:
        if layout == "nn" and config is not None and config.bn % 64:
            continue  # odd widths are "nt" only
        A, B, ref = _operands(rng, m, n, k, layout)
        out = poison(tf.empty((m, n), "bfloat16"))
        with registry.extra_defines({"EPI_STMATRIX": 1, "EXIT_WAIT_READ": 1}):
            kernels.gemm(A, B, out, layout=layout, config=config)
        _check(out, ref, (m, n, k, config, layout))
