"""The skinny GEMM path (M <= 128, operands swapped; skinny.cu) against a float64 reference:
every rounding of M, both CTA widths, with and without K splits, ragged N and K, poisoned
outputs and a padded output pitch. Each case also runs as a debug build (hangs become
DeadlockErrors naming the barrier)."""
import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.dtypes import bf16_bits, bf16_to_float32
from tmaflow.kernels.matmul import SkinnyConfig
from tmaflow.runtime.memory import DeviceArray
from tmaflow.testing import poison, rel_error

pytestmark = pytest.mark.gpu


def _operands(rng, m, n, k):
    a_bits, b_bits = bf16_bits(rng.standard_normal((m, k))), bf16_bits(rng.standard_normal((n, k)))
    ref = bf16_to_float32(a_bits).astype(np.float64) @ bf16_to_float32(b_bits).astype(np.float64).T
    return tf.from_numpy(a_bits, dtype="bfloat16"), tf.from_numpy(b_bits, dtype="bfloat16"), ref


def _check(got_bits, ref, what):
    got = bf16_to_float32(got_bits)
    assert not np.isnan(got).any(), what
    assert rel_error(got, ref) < 1e-2, (what, rel_error(got, ref))


def _matches_float64(rng, m, n, k, config):
    """Debug and release builds, each into a poisoned output, against a float64 product."""
    A, B, ref = _operands(rng, m, n, k)
    for debug in (True, False):
        out = poison(tf.empty((m, n), "bfloat16"))
        kernels.gemm(A, B, out, config=config, debug=debug)
        _check(out.numpy(), ref, (m, n, k, config, debug))


@pytest.mark.parametrize("m", [1, 7, 16, 33, 64, 100, 128])
@pytest.mark.parametrize("n,k", [(1000, 1000), (4096, 520)])
@pytest.mark.parametrize("config", [SkinnyConfig(), SkinnyConfig(rows=128), SkinnyConfig(split_k=1),
                                    SkinnyConfig(rows=128, split_k=3, stages=3), SkinnyConfig(cluster=2),
                                    SkinnyConfig(rows=128, cluster=2, split_k=2, stages=2)],
                         ids=["auto", "rows128", "nosplit", "rows128-split3-stages3", "cluster2",
                              "rows128-cluster2-split2-stages2"])
def test_skinny_against_float64(device, rng, m, n, k, config):
    _matches_float64(rng, m, n, k, config)


# M in two 64-row halves, a cluster of two CTAs sharing B by multicast: M just past one half,
# odd and full; N ragged (a last tile of 40 or 104 rows, 8 rows left for one CTA's B slice) and
# K ragged; unsplit, split (each half counts its own splits) and 128-row CTAs.
@pytest.mark.parametrize("m", [65, 97, 128])
@pytest.mark.parametrize("n,k", [(1000, 1000), (4104, 520)])
@pytest.mark.parametrize("config", [SkinnyConfig(m_halves=2), SkinnyConfig(m_halves=2, split_k=3),
                                    SkinnyConfig(rows=128, m_halves=2, split_k=2, stages=3)],
                         ids=["halves", "halves-split3", "rows128-halves-split2-stages3"])
def test_skinny_m_halves_against_float64(device, rng, m, n, k, config):
    _matches_float64(rng, m, n, k, config)


# M in chunks of m_rows (a CTA each, pairs sharing B with m_halves): M past the 128 rows of one
# CTA (129 to 517, odd), a last chunk of 1 row or a pair's second chunk empty; split K.
@pytest.mark.parametrize("m", [129, 300, 517])
@pytest.mark.parametrize("config", [SkinnyConfig(m_rows=16), SkinnyConfig(m_rows=64, m_halves=2),
                                    SkinnyConfig(m_rows=32, m_halves=2, split_k=3),
                                    SkinnyConfig(rows=128, m_rows=128, split_k=2), SkinnyConfig(m_rows=48, cluster=2),
                                    SkinnyConfig(m_rows=48, split_k=2), SkinnyConfig(m_rows=32, cluster=2)],
                         ids=["rows16", "rows64-halves", "rows32-halves-split3", "cta128-rows128-split2",
                              "rows48-c2", "rows48-split2", "rows32-c2"])
def test_skinny_m_chunks_against_float64(device, rng, m, config):
    _matches_float64(rng, m, 520, 1000, config)


def test_skinny_m_halves_split_k_is_deterministic_and_resets_its_counters(device, rng):
    A, B, ref = _operands(rng, 120, 2048, 4096)
    outs = []
    for _ in range(3):
        out = poison(tf.empty((120, 2048), "bfloat16"))
        kernels.gemm(A, B, out, config=SkinnyConfig(m_halves=2, split_k=4))
        outs.append(out.numpy())
    _check(outs[0], ref, "halves, split 4")
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


def test_skinny_is_the_default_for_few_rows(device, rng):
    A, B, ref = _operands(rng, 16, 4096, 4096)
    out = poison(tf.empty((16, 4096), "bfloat16"))
    prepared = kernels.gemm.prepare(A, B, out)
    assert prepared.launcher.launcher.kernel.name == "gemm_skinny_bf16"  # split-K wraps the launcher
    prepared()
    _check(out.numpy(), ref, "default")


def test_skinny_padded_output_pitch_leaves_the_padding(device, rng):
    m, n, k = 20, 1000, 704
    A, B, ref = _operands(rng, m, n, k)
    wide = poison(tf.empty((m, n + 24), "bfloat16"))
    before = wide.numpy()
    out = DeviceArray(wide.ptr, (m, n), "bfloat16", strides=((n + 24) * 2, 2), owner=wide)
    kernels.gemm(A, B, out, config=SkinnyConfig(split_k=2))
    after = wide.numpy()
    _check(after[:, :n], ref, "pitched")
    assert np.array_equal(after[:, n:].view(np.uint16), before[:, n:].view(np.uint16))  # nothing past N


def test_skinny_split_k_is_deterministic_and_resets_its_counters(device, rng):
    A, B, ref = _operands(rng, 16, 2048, 4096)
    outs = []
    for _ in range(3):
        out = poison(tf.empty((16, 2048), "bfloat16"))
        kernels.gemm(A, B, out, config=SkinnyConfig(split_k=8))
        outs.append(out.numpy())
    _check(outs[0], ref, "split 8")
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


def test_skinny_torch_in_torch_out(device):
    torch = pytest.importorskip("torch")
    a = torch.randn(8, 3000, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(5000, 3000, device="cuda", dtype=torch.bfloat16)
    c = kernels.gemm(a, b)
    assert isinstance(c, torch.Tensor) and c.shape == (8, 5000)
    ref = a.double() @ b.double().T
    assert (torch.linalg.norm(c.double() - ref) / torch.linalg.norm(ref)).item() < 1e-2
