"""Tail splits (``GemmConfig(split_tail=True)``): the tiles of a last, partly idle wave are
split along K, and a tile's parts meet in fp32 partial slots. Every dtype and scale mode
against float64, shapes whose tile count leaves a partial wave on this GPU (checked, so a case
cannot silently run unsplit), ragged edges, debug builds, repeats and determinism."""
import math

import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.dtypes import bf16_to_float32
from tmaflow.kernels.matmul import dense
from tmaflow.kernels.matmul import BM, GemmConfig, tail_splits
from tmaflow.testing import poison, rel_error

from test_gpu_fp8 import _block_operands, _check_gemm
from test_gpu_fp8 import _operands as _fp8_operands
from test_gpu_gemm import _check, _operands

pytestmark = pytest.mark.gpu


def _shape_with_partial_wave(device, config, n, k, extra_tiles, dtype="bfloat16", block_scales=None):
    """(m, n, k) whose cluster items are whole waves of the clusters this GPU runs at once plus
    a tail of at most ``extra_tiles`` that is split, M ragged by a few rows."""
    cm = config.cluster_m
    plan = dense.gemm_plan(4096, n, k, "nt", config, dtype, block_scales)
    kern = dense.get_kernel("gemm_bf16", plan.layout, defines=plan.defines, file="gemm")
    clusters = dense._resident_clusters(kern, cm, device.ordinal)
    tiles_n = math.ceil(n / config.bn)
    k_blocks = math.ceil(k / (128 if dtype == "float8_e4m3fn" else 64))
    for extra in range(extra_tiles, 0, -1):
        m = math.ceil((clusters + extra) / tiles_n) * cm * BM - 5
        items = math.ceil(math.ceil(m / BM) / cm) * tiles_n
        if tail_splits(items, clusters, k_blocks) > 1:
            return m, n, k
    raise AssertionError(f"no tail split for n={n} k={k} {config} on {clusters} clusters")


BF16_CONFIGS = [GemmConfig(bn=128, cluster_m=1, split_tail=True), GemmConfig(bn=256, cluster_m=2, split_tail=True),
                GemmConfig(bn=192, cluster_m=1, epi_cols=64, split_tail=True),
                GemmConfig(bn=64, cluster_m=2, epi_cols=64, split_tail=True)]


@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize("config", BF16_CONFIGS, ids=lambda c: f"bn{c.bn}-c{c.cluster_m}")
@pytest.mark.parametrize("n,k,extra", [(1000, 2000, 7), (512, 4096, 1), (760, 1480, 20)])
def test_bf16_tail_split_against_float64(device, rng, layout, config, n, k, extra):
    # K ragged (2000, 1480: 32 and 24 k-blocks, the last one partial)
    m, n, k = _shape_with_partial_wave(device, config, n, k, extra)
    A, B, ref = _operands(rng, m, n, k, layout)
    for debug in (True, False):
        out = poison(tf.empty((m, n), "bfloat16"))
        kernels.gemm(A, B, out, layout=layout, config=config, debug=debug)
        _check(out, ref, (m, n, k, config, layout, debug))


def test_tail_split_repeats_bit_for_bit_and_resets_its_counters(device, rng):
    # Two shapes alternate on one stream through the same counters and slots; each result must
    # be right and equal, bit for bit, to its first run (parts are summed in order).
    config = GemmConfig(bn=128, cluster_m=1, split_tail=True)
    cases = []
    for n, k, extra in ((512, 2048, 3), (640, 3000, 20)):
        m, n, k = _shape_with_partial_wave(device, config, n, k, extra)
        cases.append(_operands(rng, m, n, k, "nt"))
    first = {}
    for round_ in range(3):
        for i, (A, B, ref) in enumerate(cases):
            out = poison(tf.empty(ref.shape, "bfloat16"))
            kernels.gemm(A, B, out, config=config)
            _check(out, ref, ("tail split", i, round_))
            bits = out.numpy()
            assert (bits == first.setdefault(i, bits)).all(), (i, round_)


@pytest.mark.parametrize("config", [GemmConfig(bn=192, cluster_m=2, epi_cols=64, split_tail=True),
                                    GemmConfig(bn=128, cluster_m=1, promote=4, split_tail=True),
                                    GemmConfig(bn=256, cluster_m=2, promote=0, split_tail=True)],
                         ids=["bn192-c2", "bn128-promote4", "bn256-nopromote"])
def test_fp8_tail_split_against_float64(device, rng, config):
    # k = 3200: 25 k-blocks of 128, parts not a multiple of the promotion interval
    m, n, k = _shape_with_partial_wave(device, config, 1000, 3200, 9, "float8_e4m3fn")
    A, B, sa, sb, ref = _fp8_operands(rng, m, n, k)
    _check_gemm(A, B, ref, config, scale_a=sa, scale_b=sb)


@pytest.mark.parametrize("cluster_m", [1, 2])
@pytest.mark.parametrize("m_major", [False, True], ids=["row-major", "m-major"])
def test_fp8_block_scales_tail_split_against_float64(device, rng, cluster_m, m_major):
    config = GemmConfig(bn=128, cluster_m=cluster_m, epi_cols=64, promote=1, split_tail=True)
    m, n, k = _shape_with_partial_wave(device, config, 520, 3072, 5, "float8_e4m3fn",
                                       "m_major" if m_major else "row_major")
    A, B, SA, SB, ref = _block_operands(rng, m, n, k, m_major)
    _check_gemm(A, B, ref, config, scale_a=SA, scale_b=SB)


@pytest.mark.parametrize("level", ["stage", "all"])
def test_tail_split_traced_debug_launch_passes_the_diagnosis(device, rng, level):
    config = GemmConfig(bn=128, cluster_m=2, split_tail=True)
    m, n, k = _shape_with_partial_wave(device, config, 384, 2048, 3)
    A, B, ref = _operands(rng, m, n, k, "nt")
    out = poison(tf.empty((m, n), "bfloat16"))
    kernels.gemm(A, B, out, config=config, debug=True, trace=level)
    got = bf16_to_float32(out.numpy())
    assert not np.isnan(got).any() and rel_error(got, ref) < 1e-2


def test_grouped_gemm_refuses_split_tail(device):
    a = tf.empty((256, 128), "bfloat16")
    b = tf.empty((2, 128, 128), "bfloat16")
    with pytest.raises(tf.TmaflowError, match=r"grouped_gemm: split_tail=True is for single products"):
        kernels.grouped_gemm(a, b, [0, 100, 256], config=GemmConfig(bn=128, cluster_m=1, split_tail=True))
