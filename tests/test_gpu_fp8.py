"""The fp8 (e4m3) GEMM against a float64 product of the dequantised operands: tile shapes,
promotion intervals, split K, ragged edges, skinny M, poisoned outputs, torch tensors."""
import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.dtypes import bf16_to_float32, e4m3_bits, e4m3_to_float32
from tmaflow.kernels.matmul import GemmConfig, SkinnyConfig, block_scale_config, block_scale_default
from tmaflow.kernels.matmul.plan import skinny_row_scales_by_default
from tmaflow.runtime.memory import DeviceArray
from tmaflow.testing import poison, rel_error

pytestmark = pytest.mark.gpu


def _operands(rng, m, n, k):
    a_bits = e4m3_bits(rng.standard_normal((m, k)) * 40)
    b_bits = e4m3_bits(rng.standard_normal((n, k)) * 40)
    sa, sb = float(rng.uniform(0.001, 0.01)), float(rng.uniform(0.001, 0.01))
    ref = sa * sb * (e4m3_to_float32(a_bits).astype(np.float64) @ e4m3_to_float32(b_bits).astype(np.float64).T)
    return (tf.from_numpy(a_bits, dtype="float8_e4m3fn"), tf.from_numpy(b_bits, dtype="float8_e4m3fn"),
            sa, sb, ref)


def _check_gemm(A, B, ref, config, **scales):
    """The debug build, then the release build, into poisoned outputs, against ``ref``."""
    m, n = ref.shape
    for debug in (True, False):
        out = poison(tf.empty((m, n), "bfloat16"))
        kernels.gemm(A, B, out, config=config, debug=debug, **scales)
        got = bf16_to_float32(out.numpy())
        assert not np.isnan(got).any()
        assert rel_error(got, ref) < 1e-2, (m, n, A.shape[1], config, debug, rel_error(got, ref))


@pytest.mark.parametrize("m,n,k", [(256, 256, 256), (1000, 760, 512), (300, 4096, 1040), (16, 4096, 4096),
                                   (129, 264, 2048), (100, 1040, 2056)])  # the last: auto is bn128 ck2
@pytest.mark.parametrize("config", [None, GemmConfig(bn=256, cluster_m=2, promote=0),
                                    GemmConfig(bn=128, cluster_m=1, promote=1),
                                    GemmConfig(bn=128, cluster_m=2, split_k=3),
                                    GemmConfig(bn=192, cluster_m=2, epi_cols=64),
                                    GemmConfig(bn=192, cluster_m=1, epi_cols=64, split_k=2),
                                    GemmConfig(bn=128, cluster_m=1, cluster_k=2),
                                    GemmConfig(bn=128, cluster_m=1, cluster_k=4, promote=0),
                                    GemmConfig(bn=192, cluster_m=1, epi_cols=64, cluster_k=2, promote=1)],
                         ids=["auto", "bn256-nopromote", "promote1", "split3", "bn192", "bn192-split2",
                              "ck2", "ck4-nopromote", "bn192-ck2-promote1"])
def test_fp8_against_float64(device, rng, m, n, k, config):
    A, B, sa, sb, ref = _operands(rng, m, n, k)
    _check_gemm(A, B, ref, config, scale_a=sa, scale_b=sb)


# The skinny path (operands swapped: the activations' M rows are the MMA's N) in fp8: every MMA
# width (M 1 -> 8, 16, 40 -> 64, 64, 128), K split or not, 128-row CTAs in clusters of two sharing
# A; N and K ragged (64.1 row tiles, 16.1 k-blocks), 4 promotions and a partial one.
@pytest.mark.parametrize("m", [1, 16, 40, 64, 128])
@pytest.mark.parametrize("config", [SkinnyConfig(), SkinnyConfig(split_k=3), SkinnyConfig(rows=128, cluster=2)],
                         ids=["auto-split", "split3", "rows128-c2"])
def test_fp8_skinny_against_float64(device, rng, m, config):
    A, B, sa, sb, ref = _operands(rng, m, 4104, 2064)
    _check_gemm(A, B, ref, config, scale_a=sa, scale_b=sb)


# M in two 64-row halves (a cluster of two sharing B's tile by multicast; cuBLAS's M = 128 scheme):
# M past one half, odd, full; N and K ragged; unsplit, split, 128-row CTAs.
@pytest.mark.parametrize("m", [65, 100, 128])
@pytest.mark.parametrize("config", [SkinnyConfig(m_halves=2), SkinnyConfig(m_halves=2, split_k=3),
                                    SkinnyConfig(rows=128, m_halves=2)],
                         ids=["halves", "halves-split3", "rows128-halves"])
def test_fp8_skinny_m_halves_against_float64(device, rng, m, config):
    A, B, sa, sb, ref = _operands(rng, m, 4104, 2064)
    _check_gemm(A, B, ref, config, scale_a=sa, scale_b=sb)


@pytest.mark.parametrize("config", [SkinnyConfig(m_rows=32), SkinnyConfig(m_rows=64, m_halves=2, split_k=2)],
                         ids=["rows32", "rows64-halves-split2"])
def test_fp8_skinny_m_chunks_against_float64(device, rng, config):
    A, B, sa, sb, ref = _operands(rng, 300, 1000, 2064)
    _check_gemm(A, B, ref, config, scale_a=sa, scale_b=sb)


# promote_sets=2: promoted every k-block, two accumulator sets alternating (an odd and an even
# k-block count a split: 17 k-blocks of 2064, 9 and 8 split in two); dense bn128 (unclustered, in
# K-split clusters of two and four, split K) and the skinny path (every MMA width, 64- and 128-row
# CTAs, M halves, M chunks in pairs sharing A). Clusters of four M tiles (fp8 bn128) and 64-column
# fp8 tiles (promoted every 4 k-blocks too) beside them.
@pytest.mark.parametrize("m,n,config", [
    (300, 1040, GemmConfig(bn=128, cluster_m=1, promote=1, promote_sets=2)),
    (128, 4104, GemmConfig(bn=128, cluster_m=1, cluster_k=2, promote=1, promote_sets=2)),
    (100, 4104, GemmConfig(bn=128, cluster_m=1, cluster_k=4, promote=1, promote_sets=2)),
    (300, 1040, GemmConfig(bn=128, cluster_m=2, split_k=2, promote=1, promote_sets=2)),
    (1000, 760, GemmConfig(bn=128, cluster_m=4)),
    (128, 4104, GemmConfig(bn=64, cluster_m=1, epi_cols=64, cluster_k=2, promote=1, promote_sets=2)),
    (300, 1040, GemmConfig(bn=64, cluster_m=2, epi_cols=64)),
    (128, 4104, SkinnyConfig(split_k=1, promote_sets=2)), (40, 4104, SkinnyConfig(promote_sets=2)),
    (1, 4104, SkinnyConfig(split_k=2, promote_sets=2)), (16, 4104, SkinnyConfig(rows=128, cluster=2, promote_sets=2)),
    (128, 4104, SkinnyConfig(m_halves=2, promote_sets=2)), (100, 4104, SkinnyConfig(m_rows=64, cluster=2, promote_sets=2)),
    (128, 4104, SkinnyConfig(m_rows=64, cluster=2))],
    ids=["bn128", "bn128-ck2", "bn128-ck4", "bn128-c2-split2", "bn128-c4-promote4", "bn64-ck2", "bn64-c2-promote4",
         "skinny-128", "skinny-40",
         "skinny-1-split2", "skinny-16-rows128-c2", "skinny-halves", "skinny-mr64-c2", "skinny-mr64-c2-promote4"])
def test_fp8_promote_sets_against_float64(device, rng, m, n, config):
    A, B, sa, sb, ref = _operands(rng, m, n, 2064)
    _check_gemm(A, B, ref, config, scale_a=sa, scale_b=sb)


@pytest.mark.parametrize("config", [None, GemmConfig(bn=128, cluster_m=2, split_k=3), GemmConfig(bn=192, cluster_m=1, epi_cols=64)],
                         ids=["auto", "split3", "bn192"])
def test_fp8_k_tail_against_float64(device, rng, config):
    """K_TAIL (opt-in define): K = 2064, the last k-block's one k-step of 32 that reaches into K."""
    from tmaflow.kernels import registry

    A, B, sa, sb, ref = _operands(rng, 300, 1040, 2064)
    with registry.extra_defines({"K_TAIL": 1}):
        _check_gemm(A, B, ref, config, scale_a=sa, scale_b=sb)


@pytest.mark.parametrize("m", [512, 16], ids=["dense", "skinny"])
def test_fp8_torch_in_bf16_torch_out(device, m):
    torch = pytest.importorskip("torch")
    a = (torch.randn(m, 1024, device="cuda") * 30).to(torch.float8_e4m3fn)
    b = (torch.randn(768, 1024, device="cuda") * 30).to(torch.float8_e4m3fn)
    c = kernels.gemm(a, b, scale_a=0.5, scale_b=0.25)
    assert isinstance(c, torch.Tensor) and c.dtype == torch.bfloat16 and c.shape == (m, 768)
    ref = 0.125 * (a.double() @ b.double().T)
    assert (torch.linalg.norm(c.double() - ref) / torch.linalg.norm(ref)).item() < 1e-2


def _block_operands(rng, m, n, k, m_major=False, b_apart=False):
    """fp8 operands, block scales and the float64 product of the dequantised operands. With
    ``m_major`` scale_a is stored k-block by k-block, its pitch padded past M to 4 rows more
    than a multiple of 4 (a pitch longer than M must be honoured). ``b_apart``: neighbouring
    128-row blocks of B take scales 8x apart (a row given its neighbour's shows)."""
    a_bits = e4m3_bits(rng.standard_normal((m, k)) * 40)
    b_bits = e4m3_bits(rng.standard_normal((n, k)) * 40)
    kb = -(-k // 128)
    sa = rng.uniform(0.001, 0.01, (m, kb)).astype(np.float32)
    sb = rng.uniform(0.001, 0.01, (-(-n // 128), kb)).astype(np.float32)
    if b_apart:
        sb = (rng.uniform(0.001, 0.002, sb.shape) * np.where(np.arange(len(sb)) % 2, 8, 1)[:, None]).astype(np.float32)
    cols = np.arange(k) // 128
    a = e4m3_to_float32(a_bits).astype(np.float64) * sa[:, cols]
    b = e4m3_to_float32(b_bits).astype(np.float64) * sb[np.arange(n)[:, None] // 128, cols[None, :]]
    if m_major:
        pitch = -(-m // 4) * 4 + 4
        padded = np.full((kb, pitch), np.nan, np.float32)  # the padding must never be read
        padded[:, :m] = sa.T
        buf = tf.from_numpy(padded)
        SA = DeviceArray(buf.ptr, (m, kb), "float32", (4, 4 * pitch), owner=buf)
    else:
        SA = tf.from_numpy(sa)
    return (tf.from_numpy(a_bits, dtype="float8_e4m3fn"), tf.from_numpy(b_bits, dtype="float8_e4m3fn"),
            SA, tf.from_numpy(sb), a @ b.T)


# Row-major scale_a is gathered by a producer warp; M-major scale_a comes with A through the TMA.
# K split inside clusters of two and four: at K = 1040 (9 k-blocks) the fourth rank has none.
@pytest.mark.parametrize("m,n,k", [(300, 264, 1040), (1024, 1024, 2048), (16, 512, 4096)])
@pytest.mark.parametrize("config", [None, GemmConfig(bn=128, cluster_m=1, promote=1, split_k=3),
                                    GemmConfig(bn=128, cluster_m=2, epi_cols=64, promote=1),
                                    GemmConfig(bn=128, cluster_m=2, promote=1, split_k=2),
                                    GemmConfig(bn=128, cluster_m=1, epi_cols=64, promote=1, cluster_k=2),
                                    GemmConfig(bn=128, cluster_m=1, epi_cols=64, promote=1, cluster_k=4)],
                         ids=["auto", "split3", "c2", "c2-split2", "ck2", "ck4"])
@pytest.mark.parametrize("m_major", [False, True], ids=["row-major", "m-major"])
def test_fp8_block_scales_against_float64(device, rng, m, n, k, config, m_major):
    A, B, SA, SB, ref = _block_operands(rng, m, n, k, m_major)
    _check_gemm(A, B, ref, config, scale_a=SA, scale_b=SB)


# Block scales on the skinny path (scale_a M-major, the default up to M = 128 unless few tiles
# split K inside clusters: block_scale_default): A's scales scale
# the columns of C^T, B's give each 64-row warpgroup one scale a k-block; MMA widths 8-128, two
# accumulator sets or (128-row CTAs at M > 64) one, K split or not, odd and even k-block counts,
# clusters of two; per-column errors against float64.
@pytest.mark.parametrize("m", [3, 16, 40, 128])
@pytest.mark.parametrize("config", [None, SkinnyConfig(split_k=3), SkinnyConfig(rows=128, cluster=2)],
                         ids=["auto", "split3", "rows128-c2"])
@pytest.mark.parametrize("k", [1040, 1024], ids=["9kb", "8kb"])
def test_fp8_block_scales_on_the_skinny_path(device, rng, m, config, k):
    n = 904
    A, B, SA, SB, ref = _block_operands(rng, m, n, k, m_major=True, b_apart=True)
    _check_gemm(A, B, ref, config, scale_a=SA, scale_b=SB)
    out = poison(tf.empty((m, n), "bfloat16"))
    run = kernels.gemm.prepare(A, B, out, config=config, scale_a=SA, scale_b=SB)
    kernel = getattr(run.launcher, "launcher", run.launcher).kernel  # split-K wraps the launcher
    assert kernel.name == _default_kernel(m, n, k, config, "m_major", SA)
    run()
    got = bf16_to_float32(out.numpy()).astype(np.float64)
    per_column = np.linalg.norm(got - ref, axis=0) / np.linalg.norm(ref, axis=0)
    assert per_column.max() < 2e-2, (np.argmax(per_column), per_column.max())


# Row-major scale_a on the skinny path (the default up to M = 64 when its pitch and base are
# 16-byte multiples, ceil(K/128) a multiple of 4 packed; a SkinnyConfig to M = 128) in the
# per-stage box (SkinnyConfig(scale_ring=False); the ring below is the default): a stage's box
# holds 4 k-blocks' scales of its MP rows, the stage uses column kb % 4. K splits start a split
# at any k-block; K = 1008 ends in a partial k-block. Per-column errors where a column has
# several rows (one row's entries near zero have no relative error to speak of).
@pytest.mark.parametrize("m", [1, 3, 16, 40, 64, 128])
@pytest.mark.parametrize("config", [SkinnyConfig(scale_ring=False), SkinnyConfig(split_k=3, scale_ring=False),
                                    SkinnyConfig(rows=128, cluster=2, scale_ring=False)],
                         ids=["rows64", "split3", "rows128-c2"])
@pytest.mark.parametrize("k", [1024, 1008, 2560], ids=["8kb", "8kb-tail", "20kb"])
def test_fp8_row_major_block_scales_on_the_skinny_path(device, rng, m, config, k):
    n = 904
    A, B, SA, SB, ref = _block_operands(rng, m, n, k, b_apart=True)
    assert SA.strides == (4 * SA.shape[1], 4)  # packed row-major
    kernel = _row_scaled_gemm_column_by_column(A, B, SA, SB, ref, config)
    assert kernel.name == "gemm_skinny_bf16" and "SCALE_RING" not in kernel.defines


# B's block scales of a split's first 128 k-blocks are loaded before the k-loop and handed out
# by shuffles; later k-blocks load their own (skinny.cu's SCALES_B_AHEAD): K of 132 k-blocks in
# one split and in two, neighbouring B blocks' scales 8x apart, both layouts of scale_a.
@pytest.mark.parametrize("config", [SkinnyConfig(), SkinnyConfig(split_k=2)], ids=["whole", "split2"])
@pytest.mark.parametrize("m_major", [False, True], ids=["row-major", "m-major"])
def test_fp8_block_scales_past_the_skinny_kernels_scales_ahead(device, rng, config, m_major):
    A, B, SA, SB, ref = _block_operands(rng, 5, 384, 132 * 128, m_major, b_apart=True)
    kernel = _row_scaled_gemm_column_by_column(A, B, SA, SB, ref, config)
    assert kernel.name == "gemm_skinny_bf16"


def _row_scaled_gemm_column_by_column(A, B, SA, SB, ref, config):
    """_check_gemm, then one prepared launch into a poisoned out checked whole and column by
    column against ``ref`` (several rows: a column of near-zero entries has no relative error
    to speak of); the kernel it ran (split-K wraps the launcher)."""
    m, n = ref.shape
    _check_gemm(A, B, ref, config, scale_a=SA, scale_b=SB)
    out = poison(tf.empty((m, n), "bfloat16"))
    run = kernels.gemm.prepare(A, B, out, config=config, scale_a=SA, scale_b=SB)
    run()
    got = bf16_to_float32(out.numpy()).astype(np.float64)
    assert rel_error(got, ref) < 1e-2
    if m > 1:
        per_column = np.linalg.norm(got - ref, axis=0) / np.linalg.norm(ref, axis=0)
        assert per_column.max() < 2e-2, (np.argmax(per_column), per_column.max())
    return getattr(run.launcher, "launcher", run.launcher).kernel


# The same shapes with the scale ring, the default (SkinnyConfig(scale_ring=None or True): a box
# of 4 k-blocks' scales loaded once into a ring of its own, waited for at a group's first
# k-block, released after its last; a split starting mid-group (split3 of 8 k-blocks: 3 and 6)
# begins with a part of one). config=None: the automatic route (the skinny kernel's ring to
# M = 64, and at M = 128 under 128 k-blocks; the dense kernel's gather elsewhere). _check_gemm launches the debug build first (its
# waits name sc.full / sc.empty).
@pytest.mark.parametrize("m", [1, 3, 16, 40, 64, 128])
@pytest.mark.parametrize("config", [None, SkinnyConfig(), SkinnyConfig(split_k=3),
                                    SkinnyConfig(rows=128, cluster=2, scale_ring=True)],
                         ids=["auto", "rows64", "split3", "rows128-c2"])
@pytest.mark.parametrize("k", [1024, 1008, 2560], ids=["8kb", "8kb-tail", "20kb"])
def test_fp8_row_major_block_scales_in_the_scale_ring(device, rng, m, config, k):
    n = 904
    A, B, SA, SB, ref = _block_operands(rng, m, n, k, b_apart=True)
    kernel = _row_scaled_gemm_column_by_column(A, B, SA, SB, ref, config)
    assert kernel.name == _default_kernel(m, n, k, config, "row_major", SA)
    if kernel.name == "gemm_skinny_bf16":
        assert kernel.defines["SCALE_RING"] == 1
    elif config is None and skinny_row_scales_by_default(m, k):  # not the gather: few tiles, K in clusters
        assert kernel.defines["CLUSTER_K"] > 1


def _default_kernel(m, n, k, config, mode, SA) -> str:
    """The kernel a block-scaled call runs: the skinny one for a SkinnyConfig, or by default
    where ``block_scale_default`` routes it there; else the dense one."""
    if config is None:
        config = block_scale_default(m, n, k, "nt", mode, SA, tf.current_device().sm_count)
    return "gemm_skinny_bf16" if isinstance(config, SkinnyConfig) else "gemm_bf16"


# 132 SMs: clusters of two, four, four (K = 1040: 9 k-blocks, the fourth rank has none), two
@pytest.mark.parametrize("m,n,k", [(128, 4096, 4096), (96, 3072, 4096), (200, 1000, 1040), (256, 2048, 2048)])
@pytest.mark.parametrize("m_major", [False, True], ids=["row-major", "m-major"])
def test_fp8_block_scales_split_k_inside_clusters_by_default(device, rng, m, n, k, m_major):
    """Few tiles past 64 rows: the default splits each tile's K in a cluster of two or four
    (block_scale_cluster_k), poisoned output against float64, the debug build first."""
    A, B, SA, SB, ref = _block_operands(rng, m, n, k, m_major)
    out = poison(tf.empty((m, n), "bfloat16"))
    run = kernels.gemm.prepare(A, B, out, scale_a=SA, scale_b=SB)
    kernel = getattr(run.launcher, "launcher", run.launcher).kernel
    ck = block_scale_config(m, n, k, tf.current_device().sm_count).cluster_k
    assert ck > 1 and kernel.name == "gemm_bf16" and kernel.defines["CLUSTER_K"] == ck
    assert kernel.defines["BLOCK_SCALES"] == 1
    _check_gemm(A, B, ref, None, scale_a=SA, scale_b=SB)


def test_fp8_scale_ring_takes_row_major_scales_only(device, rng):
    """M-major scale_a with scale_ring=True is refused before any launch, naming the rule."""
    A, B, SA, SB, _ = _block_operands(rng, 16, 512, 1024, m_major=True)
    with pytest.raises(tf.TmaflowError, match=r"SkinnyConfig\(scale_ring=True\) holds a row-major scale_a's "
                                              r"boxes .*\(got block scales 'm_major'\)"):
        kernels.gemm(A, B, scale_a=SA, scale_b=SB, config=SkinnyConfig(scale_ring=True))


def _kernel_name(A, B, SA, SB, m, n):
    run = kernels.gemm.prepare(A, B, poison(tf.empty((m, n), "bfloat16")), scale_a=SA, scale_b=SB)
    return getattr(run.launcher, "launcher", run.launcher).kernel.name


def test_fp8_row_major_block_scales_the_tma_cannot_read_are_gathered(device, rng):
    """A row-major scale_a whose pitch (9 k-blocks: 36 bytes) or base (4 bytes past a 16-byte
    boundary) no TMA map takes goes to the dense kernel, whose warp gathers it; a SkinnyConfig
    asked for it says why."""
    A, B, SA, SB, ref = _block_operands(rng, 16, 512, 1040)  # 9 k-blocks
    _check_gemm(A, B, ref, None, scale_a=SA, scale_b=SB)
    assert _kernel_name(A, B, SA, SB, 16, 512) == "gemm_bf16"
    with pytest.raises(tf.TmaflowError, match=r"row-major scale_a reaches the skinny kernel through a TMA map: "
                                              r"its base and row pitch must be multiples of 16 bytes .*pitch 36 bytes: "
                                              r"ceil\(K/128\) = 9 k-blocks"):
        kernels.gemm(A, B, scale_a=SA, scale_b=SB, config=SkinnyConfig())
    A, B, SA, SB, ref = _block_operands(rng, 16, 512, 1024)
    sa = SA.numpy()
    buf = tf.from_numpy(np.concatenate([np.full(1, np.nan, np.float32), sa.ravel()]))
    shifted = DeviceArray(buf.ptr + 4, sa.shape, "float32", (4 * sa.shape[1], 4), owner=buf)
    assert _kernel_name(A, B, SA, SB, 16, 512) == "gemm_skinny_bf16"  # the aligned one first: its own state
    assert _kernel_name(A, B, shifted, SB, 16, 512) == "gemm_bf16"
    _check_gemm(A, B, ref, None, scale_a=shifted, scale_b=SB)
    with pytest.raises(tf.TmaflowError, match=r"row-major scale_a reaches the skinny kernel through a TMA map"):
        kernels.gemm(A, B, scale_a=shifted, scale_b=SB, config=SkinnyConfig())


@pytest.mark.parametrize("k", [128, 256, 384, 640])
def test_fp8_block_scales_short_and_odd_k(device, rng, k):
    """1-5 k-blocks: both endings of the two accumulator sets (an odd and an even count of
    k-blocks per item), for both layouts of scale_a."""
    for m_major in (False, True):
        A, B, SA, SB, ref = _block_operands(rng, 200, 384, k, m_major)
        _check_gemm(A, B, ref, None, scale_a=SA, scale_b=SB)


def test_fp8_block_scales_one_row(device, rng):
    """M = 1: scale_a M-major with a padded pitch takes the TMA (a 128-row box over 1 row);
    torch's M-major view of one row is a packed row and is gathered."""
    torch = pytest.importorskip("torch")
    A, B, SA, SB, ref = _block_operands(rng, 1, 384, 1024, m_major=True)
    _check_gemm(A, B, ref, None, scale_a=SA, scale_b=SB)
    a = (torch.randn(1, 1024, device="cuda") * 30).to(torch.float8_e4m3fn)
    b = (torch.randn(384, 1024, device="cuda") * 30).to(torch.float8_e4m3fn)
    sa = (torch.rand(8, 1, device="cuda") * 0.01 + 0.001).t()  # (1, 8), strides (1, 1)
    sb = torch.rand(3, 8, device="cuda") * 0.01 + 0.001
    cols = torch.arange(1024, device="cuda") // 128
    ref = (a.double() * sa[:, cols].double()) @ (b.double() * sb[torch.arange(384, device="cuda")[:, None] // 128,
                                                                  cols[None, :]].double()).T
    c = kernels.gemm(a, b, scale_a=sa, scale_b=sb)
    assert (torch.linalg.norm(c.double() - ref) / torch.linalg.norm(ref)).item() < 1e-2


@pytest.mark.parametrize("level", ["stage", "all"])
@pytest.mark.parametrize("m_major", [False, True], ids=["gathered", "tma"])
def test_fp8_block_scales_traced_debug_launch_passes_the_diagnosis(device, rng, level, m_major):
    """The scale-gathering warp waits on the empty barriers and arrives on the full ones through
    cp.async; the two accumulator sets release stages in turn: a traced debug launch must not
    read either as a broken plan (a finding raises)."""
    A, B, SA, SB, ref = _block_operands(rng, 300, 264, 1040, m_major)
    out = poison(tf.empty((300, 264), "bfloat16"))
    kernels.gemm(A, B, out, scale_a=SA, scale_b=SB, debug=True, trace=level)
    got = bf16_to_float32(out.numpy())
    assert not np.isnan(got).any() and rel_error(got, ref) < 1e-2
