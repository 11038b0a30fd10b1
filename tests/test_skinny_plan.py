"""The skinny GEMM's plan and configuration checks (no GPU)."""
import math

import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.kernels.matmul import (BK, SKINNY_M, GemmConfig, SkinnyConfig, choose_config,
                                    skinny_plan, skinny_splits)
from tmaflow.layout import HOPPER_SMEM_LIMIT


@pytest.mark.parametrize("m,mp", [(1, 8), (8, 8), (9, 16), (16, 16), (17, 32), (64, 64), (65, 128), (128, 128)])
def test_m_rounds_up_to_a_wgmma_width(m, mp):
    plan = skinny_plan(m, 4096, 4096, SkinnyConfig(), 132)
    assert plan.defines["MP"] == mp and plan.spec_x.box == (mp, BK)
    assert plan.layout.total_bytes <= HOPPER_SMEM_LIMIT


@pytest.mark.parametrize("n,k", [(4096, 4096), (7168, 16384), (8192, 8192), (1000, 300), (64, 64)])
def test_splits_fill_one_wave_and_keep_four_k_blocks(n, k):
    for rows in (64, 128):
        split = skinny_splits(n, k, rows, 132)
        tiles, k_blocks = math.ceil(n / rows), math.ceil(k / BK)
        assert 1 <= split and (split == 1 or tiles * split <= 132)
        assert split == 1 or math.ceil(k_blocks / split) >= 4
        assert math.ceil(k_blocks / math.ceil(k_blocks / split)) == split  # no empty split


def test_choose_config_takes_the_skinny_path_for_few_rows_of_nt():
    assert isinstance(choose_config(SKINNY_M, 4096, 4096, 132), SkinnyConfig)
    assert isinstance(choose_config(SKINNY_M + 1, 4096, 4096, 132), GemmConfig)
    assert isinstance(choose_config(16, 4096, 4096, 132, "nn"), GemmConfig)


@pytest.mark.parametrize("kwargs,match", [({"rows": 96}, r"rows=96 must be 64 or 128"),
                                          ({"split_k": 0}, r"split_k=0 must be None or in \[1, 64\]"),
                                          ({"split_k": True}, r"split_k=True"),
                                          ({"stages": 1}, r"stages=1 must be in \[2, 16\]"),
                                          ({"cluster": 4}, r"cluster=4 must be 1 or 2"),
                                          ({"l2_promotion": "512B"}, r"l2_promotion='512B'")])
def test_bad_skinny_configs_are_named(kwargs, match):
    with pytest.raises(tf.TmaflowError, match=match):
        SkinnyConfig(**kwargs)


def test_skinny_config_is_refused_for_nn_and_more_rows():
    with pytest.raises(tf.TmaflowError, match=r"a SkinnyConfig takes layout='nt' \(got 'nn'\)"):
        kernels.gemm(tf.memory.DeviceArray(0, (16, 64), "bfloat16"), tf.memory.DeviceArray(0, (64, 64), "bfloat16"),
                     layout="nn", config=SkinnyConfig())
    with pytest.raises(tf.TmaflowError, match=r"takes M <= 128 \(got M=129\)"):
        skinny_plan(129, 64, 64, SkinnyConfig(), 132)


def test_every_skinny_variant_compiles_without_spills():
    from tmaflow.kernels.registry import get_kernel

    for m in (1, 16, 32, 64, 128):
        for rows, cluster in ((64, 1), (128, 1), (64, 2), (128, 2)):
            plan = skinny_plan(m, 4096, 4096, SkinnyConfig(rows=rows, cluster=cluster), 132)
            k = get_kernel("gemm_skinny_bf16", plan.layout, defines=plan.defines, file="skinny")
            assert k.resources.spill_stores == 0 and k.resources.spill_loads == 0, (m, rows)
