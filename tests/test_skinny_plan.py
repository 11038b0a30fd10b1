"""The skinny GEMM's plan and configuration checks (no GPU)."""
import math
from dataclasses import replace

import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.kernels.matmul import (BK, FP8_BK, SKINNY_FP8_PROMOTE, SKINNY_M, GemmConfig, SkinnyConfig,
                                    choose_config, skinny_plan, skinny_splits)
from tmaflow.kernels.matmul.plan import (skinny_row_scales_by_default, skinny_scale_ring_slots,
                                         skinny_takes_row_major_scales)
from tmaflow.runtime.memory import DeviceArray
from tmaflow.tma.layout import HOPPER_SMEM_LIMIT


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


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_skinny_tiles_that_outnumber_the_sms_share_them(dtype):
    """224 tiles of 64 rows on 132 SMs: 5 stages, so two or more CTAs an SM hold every tile in
    one wave (16 stages left a second wave of 92); 64 rows of M take 128-row tiles instead."""
    few = choose_config(16, 14336, 7168, 132, "nt", dtype)
    assert few == SkinnyConfig(stages=5)
    plan = skinny_plan(16, 14336, 7168, few, 132, dtype)
    assert plan.config.stages == 5 and plan.config.split_k == 1
    assert 2 * (plan.layout.total_bytes + 1024) <= 228 * 1024  # two CTAs an SM (1 KB reserved each)
    sets = 2 if dtype == "float8_e4m3fn" else 1  # fp8 of at most 16 rows: promoted on two sets
    assert choose_config(16, 8448, 7168, 132, "nt", dtype) == SkinnyConfig(promote_sets=sets)  # 132 tiles: one each
    assert choose_config(64, 14336, 4096, 132, "nt", dtype) == SkinnyConfig(rows=128)


def test_fp8_decode_rows_promote_on_two_sets_up_to_sixteen_rows():
    """Per-tensor fp8 products of 1-16 rows promote every k-block on two accumulator sets
    (faster cold and back to back on the H200); 17-64 rows and bf16 keep one set."""
    for m in (1, 5, 16):
        config = choose_config(m, 4096, 4096, 132, "nt", "float8_e4m3fn")
        assert config == SkinnyConfig(promote_sets=2)
        assert skinny_plan(m, 4096, 4096, config, 132, "float8_e4m3fn").defines["PROMOTE_SETS"] == 2
    for m, dtype in ((17, "float8_e4m3fn"), (64, "float8_e4m3fn"), (16, "bfloat16")):
        assert choose_config(m, 4096, 4096, 132, "nt", dtype) == SkinnyConfig()


def test_choose_config_takes_the_skinny_path_for_few_rows_of_nt():
    for dtype in ("bfloat16", "float8_e4m3fn"):
        assert isinstance(choose_config(SKINNY_M, 2048, 1024, 132, "nt", dtype), SkinnyConfig)
        assert isinstance(choose_config(SKINNY_M + 1, 4096, 4096, 132, "nt", dtype), GemmConfig)
    assert isinstance(choose_config(64, 4096, 4096, 132, "nt", "float8_e4m3fn"), SkinnyConfig)
    # fp8 with one full M tile and K of 16 k-blocks or more: K split in pairs, 64-column tiles
    # where their pairs fit one wave (N up to 4224 on 132 SMs), else 128
    assert choose_config(100, 4096, 2048, 132, "nt", "float8_e4m3fn") == \
        GemmConfig(bn=64, cluster_m=1, epi_cols=64, cluster_k=2)
    assert choose_config(100, 4224, 2048, 132, "nt", "float8_e4m3fn").bn == 64
    assert choose_config(100, 4288, 2048, 132, "nt", "float8_e4m3fn") == GemmConfig(bn=128, cluster_m=1, cluster_k=2)
    assert isinstance(choose_config(100, 4096, 1920, 132, "nt", "float8_e4m3fn"), SkinnyConfig)
    assert isinstance(choose_config(16, 4096, 4096, 132, "nn"), GemmConfig)


@pytest.mark.parametrize("m,mp", [(1, 8), (16, 16), (40, 64), (128, 128)])
def test_fp8_skinny_plan_reads_128_element_k_blocks_and_promotes(m, mp):
    """fp8 k-blocks are 128 elements (128-byte rows, as bf16's 64): the same boxes in bytes."""
    plan = skinny_plan(m, 4096, 4096, SkinnyConfig(), 132, "float8_e4m3fn")
    bf16 = skinny_plan(m, 4096, 4096, SkinnyConfig(), 132)
    assert plan.spec_x.box == (mp, FP8_BK) and plan.spec_w.box == (64, FP8_BK)
    assert plan.spec_x.smem_bytes == bf16.spec_x.smem_bytes and plan.config.stages == bf16.config.stages
    assert plan.defines == {**bf16.defines, "FP8": 1, "PROMOTE": SKINNY_FP8_PROMOTE}
    assert "FP8" not in bf16.defines


@pytest.mark.parametrize("m,mp", [(1, 8), (16, 16), (40, 64), (128, 128)])
def test_block_scaled_skinny_plan_loads_a_k_blocks_scales_with_its_stage(m, mp):
    """M-major scale_a: one TMA box of the k-block's MP scales a stage; promoted every k-block."""
    plan = skinny_plan(m, 4096, 16384, SkinnyConfig(), 132, "float8_e4m3fn", "m_major")
    assert plan.spec_s.box == (1, mp) and plan.spec_s.smem_bytes == 4 * mp
    assert plan.defines["BLOCK_SCALES"] == 1 and plan.defines["PROMOTE"] == 1
    assert plan.defines["BLOCK_SCALE_SETS"] == 2  # one promoted while the other's wgmmas run
    wide = skinny_plan(m, 4096, 16384, SkinnyConfig(rows=128), 132, "float8_e4m3fn", "m_major")
    assert wide.defines["BLOCK_SCALE_SETS"] == (1 if mp == 128 else 2)  # 3 x 64 registers of 168 do not fit
    stage = plan.spec_x.smem_bytes + plan.spec_w.smem_bytes
    assert plan.config.stages == min(16, (HOPPER_SMEM_LIMIT - 256) // (stage + plan.spec_s.smem_bytes))
    for scales, dtype in (("row_major", "bfloat16"), ("m_major", "bfloat16"), ("k_major", "float8_e4m3fn")):
        with pytest.raises(tf.TmaflowError, match=r"skinny path takes block scales with fp8 operands, scale_a "
                                                  r"M-major or row-major \(got '.+' scales, .+ operands\)"):
            skinny_plan(m, 4096, 4096, SkinnyConfig(), 132, dtype, scales)


@pytest.mark.parametrize("base,shape,strides,readable", [
    (0x1000, (16, 8), (32, 4), True),     # packed, 8 k-blocks: pitch 32 bytes
    (0x1000, (16, 9), (36, 4), False),    # 9 k-blocks: pitch 36
    (0x1004, (16, 8), (32, 4), False),    # base 4 bytes past 16
    (0x1000, (1, 8), (32, 4), True),
    (0x1000, (1, 8), (4, 4), False),      # one row, pitch 4: gathered (the rule, not the TMA's)
])
def test_skinny_reads_row_major_scales_of_16_byte_base_and_pitch(base, shape, strides, readable):
    scale_a = DeviceArray(base, shape, "float32", strides)
    assert skinny_takes_row_major_scales(scale_a) is readable


@pytest.mark.parametrize("m,mp", [(1, 8), (16, 16), (100, 128)])
def test_row_major_block_scales_load_four_k_blocks_a_stage(m, mp):
    """Row-major scale_a (M, KB) in the per-stage box (scale_ring=False): a box of MP rows x 4
    k-blocks (16 bytes a row, the TMA's least), the stage's k-block one column of it; otherwise
    as M-major."""
    plan = skinny_plan(m, 4096, 16384, SkinnyConfig(scale_ring=False), 132, "float8_e4m3fn", "row_major")
    assert plan.spec_s.box == (mp, 4) and plan.spec_s.smem_bytes == 16 * mp
    assert plan.spec_s.shape == (m, 128) and plan.spec_s.strides[0] == 512
    assert plan.defines["SCALES_ROW_MAJOR"] == 1 and plan.defines["BLOCK_SCALES"] == 1
    m_major = skinny_plan(m, 4096, 16384, SkinnyConfig(), 132, "float8_e4m3fn", "m_major")
    assert "SCALES_ROW_MAJOR" not in m_major.defines
    assert {key: v for key, v in plan.defines.items() if key != "SCALES_ROW_MAJOR"} == m_major.defines


def _pipes(plan) -> dict:
    return {item.name: item for item in plan.layout.items if isinstance(item, tf.Pipeline)}


def _same(a, b) -> bool:
    """Two plans alike: their specs, defines, configs and layouts (a SharedLayout compares by
    identity; its header says all the kernel sees of it)."""
    return (a.spec_x, a.spec_w, a.spec_s, a.defines, a.config, a.grid_z, a.layout.header()) == \
        (b.spec_x, b.spec_w, b.spec_s, b.defines, b.config, b.grid_z, b.layout.header())


@pytest.mark.parametrize("m,mp", [(1, 8), (16, 16), (64, 64), (128, 128)])
@pytest.mark.parametrize("config", [SkinnyConfig(), SkinnyConfig(split_k=3), SkinnyConfig(rows=128, cluster=2)],
                         ids=["rows64", "split3", "rows128-c2"])
def test_row_major_scale_ring_loads_a_box_a_group_of_four_k_blocks(m, mp, config):
    """scale_ring=True: the stages carry A and B only; the MP x 4 scale boxes have a ring of their
    own (sc, tile s) of ceil(stages / 4) + 1 slots, released by every consumer warp to its own CTA
    (no multicast in clusters of two), its bytes counted before the stages are chosen."""
    box = skinny_plan(m, 4096, 16384, replace(config, scale_ring=False), 132, "float8_e4m3fn", "row_major")
    plan = skinny_plan(m, 4096, 16384, replace(config, scale_ring=True), 132, "float8_e4m3fn", "row_major")
    wx, sc = _pipes(plan)["wx"], _pipes(plan)["sc"]
    assert wx.tile_names == ("w", "x") and _pipes(box)["wx"].tile_names == ("w", "x", "s")
    assert wx.tx_bytes == _pipes(box)["wx"].tx_bytes - 16 * mp
    assert sc.tile_names == ("s",) and sc.tiles == (plan.spec_s,) and plan.spec_s == box.spec_s
    assert plan.spec_s.box == (mp, 4) and sc.tx_bytes == 16 * mp
    stages = plan.config.stages
    assert sc.stages == skinny_scale_ring_slots(stages) == math.ceil(stages / 4) + 1
    boxes = config.rows // 64
    assert sc.consumers == 4 * boxes and sc.empty_arrivals == 4 * boxes and not sc.uses_cluster
    assert wx.multicast == ((None, "x") if config.cluster > 1 else None)  # A shared, as without scales
    assert plan.defines == {**box.defines, "SCALE_RING": 1}
    # the most stages (<= 16) that fit beside the ring and its barriers; never fewer than the box's
    stage = plan.spec_x.smem_bytes + boxes * plan.spec_w.smem_bytes
    room = HOPPER_SMEM_LIMIT - 256
    assert stages * stage + sc.stages * (16 * mp + 16) <= room
    assert stages == 16 or (stages + 1) * stage + skinny_scale_ring_slots(stages + 1) * (16 * mp + 16) > room
    assert stages >= box.config.stages and plan.layout.total_bytes <= HOPPER_SMEM_LIMIT
    assert plan.layout.offset("sc_s") + sc.stages * 16 * mp <= plan.layout.offset("wx_full")
    assert skinny_plan(m, 4096, 16384, replace(config, scale_ring=True, stages=4), 132, "float8_e4m3fn",
                       "row_major").layout.items[1].stages == 2


@pytest.mark.parametrize("stages", range(2, 17))
def test_scale_ring_slots_let_the_producer_run_a_ring_ahead(stages):
    """With k-block r the oldest the consumers hold, the producer takes the scale slot of k-block
    r + stages before waiting for r's stage: the groups of 4 k-blocks r .. r + stages, from any
    split's first k-block, must have slots, and one fewer would not always do."""
    slots = skinny_scale_ring_slots(stages)
    spans = [len({kb // 4 for kb in range(r, r + stages + 1)}) for kb0 in range(4) for r in range(kb0, kb0 + 8)]
    assert max(spans) == slots


def _ring_model(kb0, kb1, stages, slots, two_sets):
    """skinny.cu's order as a model: the producer takes a group's scale slot, then each k-block's
    stage; the consumers issue k-block j + 1 before they retire j (two sets) or not, and release
    a stage at its retire, a slot at its group's last. The producer moves whenever it can.
    Returns "deadlock", or the times the producer waited on the ring with the main stage free."""
    group = {kb: (kb - kb0 + kb0 % 4) // 4 for kb in range(kb0, kb1)}
    last = {group[kb]: kb for kb in range(kb0, kb1)}
    producer = [op for kb in range(kb0, kb1)
                for op in ([("slot", group[kb])] if kb == kb0 or kb % 4 == 0 else []) + [("stage", kb)]]
    consumer = [("issue", kb0)] + [op for kb in range(kb0 + 1, kb1) for op in (("issue", kb), ("retire", kb - 1))] \
        + [("retire", kb1 - 1)] if two_sets else [op for kb in range(kb0, kb1) for op in (("issue", kb), ("retire", kb))]
    loaded, freed_slots, freed_stages, stalls = set(), set(), set(), 0
    while producer or consumer:
        if producer:
            what, i = producer[0]
            stage_free = lambda kb: kb - stages < kb0 or kb - stages in freed_stages  # noqa: E731
            if what == "slot" and (i < slots or i - slots in freed_slots) or what == "stage" and stage_free(i):
                loaded.add(producer.pop(0))
                continue
            stalls += what == "slot" and stage_free(producer[1][1])
        if not consumer or consumer[0][0] == "issue" and ("stage", consumer[0][1]) not in loaded:
            return "deadlock"
        what, kb = consumer.pop(0)
        if what == "retire":
            freed_stages.add(kb)
            if last[group[kb]] == kb:
                freed_slots.add(group[kb])
    return stalls


@pytest.mark.parametrize("stages", [2, 4, 5, 8, 13, 16])
def test_scale_ring_never_holds_the_producer_back(stages):
    """Every split start (kb0 % 4) and length: with skinny_scale_ring_slots the producer never
    waits on a slot while its stage is free; one slot deadlocks the two-set loop (it waits for
    the next k-block's stage before it retires the group's last)."""
    for kb0 in range(4):
        for n in range(1, 24):
            for two_sets in (True, False):
                assert _ring_model(kb0, kb0 + n, stages, skinny_scale_ring_slots(stages), two_sets) == 0
    assert _ring_model(0, 20, stages, 1, True) == "deadlock"
    assert _ring_model(0, 20, stages, 1, False) != "deadlock"


@pytest.mark.parametrize("scales", [None, "m_major"])
def test_scale_ring_is_for_row_major_scales(scales):
    with pytest.raises(tf.TmaflowError, match=r"SkinnyConfig\(scale_ring=True\) holds a row-major scale_a's "
                                              r"boxes of 4 k-blocks in a ring of their own \(got block scales "
                                              r".+\); use scale_ring=False or None"):
        skinny_plan(16, 4096, 4096, SkinnyConfig(scale_ring=True), 132, "float8_e4m3fn", scales)


@pytest.mark.parametrize("m,mp", [(1, 8), (16, 16), (64, 64), (128, 128)])
@pytest.mark.parametrize("config", [SkinnyConfig(), SkinnyConfig(split_k=3), SkinnyConfig(rows=128, cluster=2)],
                         ids=["rows64", "split3", "rows128-c2"])
def test_default_config_takes_the_scale_ring_for_row_major_scales(m, mp, config):
    """scale_ring=None (the default) with row-major scale_a: the ring (H200, 30 rounds: 1-13%
    less time than the per-stage box but at 64x4096x4096 cold), the same plan as
    scale_ring=True, the choice kept in the plan's config; the stages carry A and B only."""
    assert config.scale_ring is None
    plan = skinny_plan(m, 4096, 16384, config, 132, "float8_e4m3fn", "row_major")
    assert plan.defines["SCALE_RING"] == 1 and plan.defines["SCALES_ROW_MAJOR"] == 1
    assert plan.config.scale_ring is True
    pipes = _pipes(plan)
    assert set(pipes) == {"wx", "sc"} and pipes["wx"].tile_names == ("w", "x") and pipes["sc"].tile_names == ("s",)
    assert pipes["sc"].tx_bytes == 16 * mp and plan.spec_s.box == (mp, 4)
    assert _same(plan, skinny_plan(m, 4096, 16384, replace(config, scale_ring=True), 132, "float8_e4m3fn",
                                   "row_major"))
    # planning again from the plan's config takes the same plan
    assert _same(skinny_plan(m, 4096, 16384, plan.config, 132, "float8_e4m3fn", "row_major"), plan)


@pytest.mark.parametrize("m,mp", [(1, 8), (16, 16), (64, 64), (128, 128)])
@pytest.mark.parametrize("config", [SkinnyConfig(), SkinnyConfig(split_k=3), SkinnyConfig(rows=128, cluster=2)],
                         ids=["rows64", "split3", "rows128-c2"])
def test_scale_ring_false_keeps_the_per_stage_scale_box(m, mp, config):
    """scale_ring=False forces the per-stage box (users and tools/experiments/block_scales_ab.py
    pick either): the MP x 4 box rides in every stage of wx, no ring, no SCALE_RING."""
    plan = skinny_plan(m, 4096, 16384, replace(config, scale_ring=False), 132, "float8_e4m3fn", "row_major")
    assert "SCALE_RING" not in plan.defines and plan.defines["SCALES_ROW_MAJOR"] == 1
    assert plan.config.scale_ring is False
    pipes = _pipes(plan)
    assert set(pipes) == {"wx"} and pipes["wx"].tile_names == ("w", "x", "s") and plan.spec_s.box == (mp, 4)
    ring = skinny_plan(m, 4096, 16384, config, 132, "float8_e4m3fn", "row_major")
    assert pipes["wx"].tx_bytes == _pipes(ring)["wx"].tx_bytes + 16 * mp
    assert plan.config.stages <= ring.config.stages


@pytest.mark.parametrize("dtype,scales", [("bfloat16", None), ("float8_e4m3fn", None), ("float8_e4m3fn", "m_major")])
@pytest.mark.parametrize("config", [SkinnyConfig(), SkinnyConfig(rows=128, cluster=2), SkinnyConfig(split_k=2)],
                         ids=["rows64", "rows128-c2", "split2"])
def test_default_config_plans_no_ring_without_row_major_scales(dtype, scales, config):
    """scale_ring=None with bf16, fp8 per-tensor or M-major block scales: no ring and no refusal
    (only an explicit True is refused there); the plan's config says False, and planning with
    scale_ring=False gives the same plan."""
    for m in (1, 16, 64, 128):
        plan = skinny_plan(m, 4096, 4096, config, 132, dtype, scales)
        assert "SCALE_RING" not in plan.defines and set(_pipes(plan)) == {"wx"}
        assert plan.config.scale_ring is False
        assert _same(plan, skinny_plan(m, 4096, 4096, replace(config, scale_ring=False), 132, dtype, scales))
    halves = skinny_plan(100, 4096, 4096, SkinnyConfig(m_halves=2), 132, dtype)
    chunks = skinny_plan(300, 4096, 4096, SkinnyConfig(m_rows=64), 132, dtype)
    assert halves.config.scale_ring is False and chunks.config.scale_ring is False


@pytest.mark.parametrize("value", ["yes", "", 1, 0, 1.0, np.int64(1), [True]])
def test_scale_ring_takes_true_false_or_none(value):
    with pytest.raises(tf.TmaflowError, match=r"SkinnyConfig: scale_ring=.* must be True, False or None \(got "):
        SkinnyConfig(scale_ring=value)
    assert SkinnyConfig(scale_ring=np.bool_(True)).scale_ring is True
    assert type(SkinnyConfig(scale_ring=np.bool_(False)).scale_ring) is bool


def test_scale_ring_debug_build_compiles_without_spills():
    """The debug build (its waits name sc.full / sc.empty on a hang) of the ring, M = 16 and 128."""
    from tmaflow.kernels.registry import get_kernel

    for m, config in ((16, SkinnyConfig(scale_ring=True)), (128, SkinnyConfig(rows=128, cluster=2, scale_ring=True))):
        plan = skinny_plan(m, 4096, 4096, config, 132, "float8_e4m3fn", "row_major")
        kernel = get_kernel("gemm_skinny_bf16", plan.layout, defines=plan.defines, file="skinny", debug=True)
        assert '"sc.full"' in plan.layout.header() and kernel.resources.spills == 0, (m, kernel.resources)


@pytest.mark.parametrize("n,k,split", [(4096, 4096, 1), (4096, 8192, 2), (4096, 16384, 2), (7168, 16384, 1),
                                       (1024, 16384, 4)])
def test_fp8_skinny_splits_keep_32_k_blocks(n, k, split):
    """fp8 splits K only into splits of at least 32 k-blocks of 128 (16 measured slower on H200)."""
    plan = skinny_plan(16, n, k, SkinnyConfig(), 132, "float8_e4m3fn")
    assert plan.config.split_k == split
    assert split == 1 or math.ceil(k / FP8_BK / split) >= 32
    assert skinny_plan(16, n, k, SkinnyConfig(split_k=3), 132, "float8_e4m3fn").config.split_k == 3


@pytest.mark.parametrize("kwargs,match", [({"rows": 96}, r"rows=96 must be 64 or 128"),
                                          ({"split_k": 0}, r"SkinnyConfig: split_k=0 must be in \[1, 64\]"),
                                          ({"split_k": True}, r"split_k=True"),
                                          ({"stages": 1}, r"stages=1 must be in \[2, 16\]"),
                                          ({"cluster": 4}, r"cluster=4 must be 1 or 2"),
                                          ({"l2_promotion": "512B"}, r"l2_promotion='512B'"),
                                          ({"tile_fastest": 1}, r"tile_fastest=1"),
                                          ({"m_halves": 4}, r"SkinnyConfig: m_halves=4 must be 1 or 2"),
                                          ({"m_rows": 24}, r"SkinnyConfig: m_rows=24 must be 8, 16, 32, 48, 64 or 128"),
                                          ({"promote_sets": 0}, r"SkinnyConfig: promote_sets=0 must be 1 or 2"),
                                          ({"m_halves": 2, "cluster": 2},
                                           r"m_halves=2 pairs the CTAs of a cluster along M; it takes cluster=1 "
                                           r"\(got cluster=2\)")])
def test_bad_skinny_configs_are_named(kwargs, match):
    with pytest.raises(tf.TmaflowError, match=match):
        SkinnyConfig(**kwargs)


def test_skinny_config_is_refused_for_nn_and_more_rows():
    with pytest.raises(tf.TmaflowError, match=r"a SkinnyConfig takes layout='nt' \(got 'nn'\)"):
        kernels.gemm(tf.runtime.memory.DeviceArray(0, (16, 64), "bfloat16"), tf.runtime.memory.DeviceArray(0, (64, 64), "bfloat16"),
                     layout="nn", config=SkinnyConfig())
    with pytest.raises(tf.TmaflowError, match=r"SkinnyConfig tile_fastest=True orders grouped_gemm's decode items"):
        kernels.gemm(tf.runtime.memory.DeviceArray(0, (16, 64), "bfloat16"), tf.runtime.memory.DeviceArray(0, (64, 64), "bfloat16"),
                     config=SkinnyConfig(tile_fastest=True))
    with pytest.raises(tf.TmaflowError, match=r"takes M <= 128 \(got M=129\)"):
        skinny_plan(129, 64, 64, SkinnyConfig(), 132)


@pytest.mark.parametrize("dtype,scales", [("bfloat16", None), ("float8_e4m3fn", None), ("float8_e4m3fn", "m_major")])
def test_every_skinny_variant_compiles_without_spills(dtype, scales):
    from tmaflow.kernels.registry import get_kernel

    for m in (1, 16, 32, 64, 128):
        for rows, cluster in ((64, 1), (128, 1), (64, 2), (128, 2)):
            plan = skinny_plan(m, 4096, 4096, SkinnyConfig(rows=rows, cluster=cluster), 132, dtype, scales)
            k = get_kernel("gemm_skinny_bf16", plan.layout, defines=plan.defines, file="skinny")
            assert k.resources.spill_stores == 0 and k.resources.spill_loads == 0, (m, rows)


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize("rows", [64, 128])
def test_m_halves_plan_shares_b_slices_and_loads_its_own_half_of_a(dtype, rows):
    """m_halves=2: MP 64, a cluster of two, B in 32-row slices multicast to both (each CTA receives
    every slice: its stage carries the whole tile), A one 64-row box."""
    from tmaflow.kernels.registry import get_kernel
    from tmaflow.launch.sass import disassemble

    plan = skinny_plan(100, 4096, 4096, SkinnyConfig(rows=rows, m_halves=2), 132, dtype)
    one = skinny_plan(100, 4096, 4096, SkinnyConfig(rows=rows), 132, dtype)
    bk = FP8_BK if dtype == "float8_e4m3fn" else BK
    assert plan.defines["MP"] == 64 and plan.defines["M_HALVES"] == 2 and plan.defines["CLUSTER"] == 2
    assert plan.spec_x.box == (64, bk) and plan.spec_w.box == (32, bk)
    pipe = plan.layout.items[0]
    assert pipe.cluster == (2, 1, 1) and pipe.multicast == ("x", None) and pipe.boxes[0] == 2 * rows // 64
    assert pipe.tx_bytes == plan.spec_x.smem_bytes + rows * 128  # the whole tile of B lands in each CTA
    assert pipe.empty_arrivals == 2 * pipe.consumers  # its own consumers and the partner's
    assert "M_HALVES" not in one.defines and one.defines["MP"] == 128
    k = get_kernel("gemm_skinny_bf16", plan.layout, defines=plan.defines, file="skinny")
    sass = disassemble(k.cubin)
    assert "UTMALDG.2D.MULTICAST" in sass
    assert k.resources.spill_stores == 0 and k.resources.spill_loads == 0 and k.resources.stack_frame == 0


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_every_m_halves_width_compiles_without_spills(dtype):
    from tmaflow.kernels.registry import get_kernel

    for mp in (8, 16, 32, 64, 128):
        for rows in (64, 128):
            plan = skinny_plan(512, 4096, 4096, SkinnyConfig(rows=rows, m_rows=mp, m_halves=2), 132, dtype)
            assert plan.defines["MP"] == mp and plan.defines["M_HALVES"] == 2
            k = get_kernel("gemm_skinny_bf16", plan.layout, defines=plan.defines, file="skinny")
            assert k.resources.spill_stores == 0 and k.resources.spill_loads == 0, (mp, rows)


@pytest.mark.parametrize("m,config,dtype,scales", [
    (128, SkinnyConfig(split_k=1, promote_sets=2), "float8_e4m3fn", None), (64, SkinnyConfig(rows=128, promote_sets=2), "float8_e4m3fn", None),
    (128, SkinnyConfig(m_halves=2, promote_sets=2), "float8_e4m3fn", None),
    (128, SkinnyConfig(m_rows=64, cluster=2, promote_sets=2), "float8_e4m3fn", None),
    (128, SkinnyConfig(rows=128, promote_sets=2), "float8_e4m3fn", None), (16, SkinnyConfig(promote_sets=2), "bfloat16", None),
    (64, SkinnyConfig(promote_sets=2), "float8_e4m3fn", "m_major")])
def test_promote_sets_plan_promotes_every_k_block_and_compiles_clean(m, config, dtype, scales):
    """promote_sets=2: fp8 per-tensor promoted every k-block on two accumulator sets (the block
    scales' loop); three sets of MP / 2 accumulators must fit (128-row CTAs: at most 64 rows of M)
    with ptxas's wgmma pipeline intact. bf16, block scales and 128-row CTAs of 128 rows refuse."""
    from tmaflow.kernels.registry import get_kernel
    from tmaflow.launch import compiler

    if dtype == "bfloat16" or scales or (config.rows == 128 and m > 64):
        with pytest.raises(tf.TmaflowError, match=r"SkinnyConfig\(promote_sets=2\) promotes every k-block on two "
                                                  r"accumulator sets: fp8 with per-tensor scales, and with rows=128"):
            skinny_plan(m, 4096, 4096, config, 132, dtype, scales)
        return
    plan = skinny_plan(m, 4096, 4096, config, 132, dtype)
    assert plan.defines["PROMOTE_SETS"] == 2 and plan.defines["PROMOTE"] == 1
    kern = get_kernel("gemm_skinny_bf16", plan.layout, defines=plan.defines, file="skinny")
    r = kern.program.resources
    assert r.spills == 0 and r.stack_frame == 0, r
    assert compiler.wgmma_pipeline_notes(kern.program.log) == []


@pytest.mark.parametrize("m,config,scales,match", [
    (64, SkinnyConfig(m_halves=2), None,
     r"m_halves=2\) pairs two chunks of 64 rows of M; it takes M over 64 rows \(got M=64\)"),
    (16, SkinnyConfig(m_rows=16, m_halves=2), None, r"pairs two chunks of 16 rows of M; it takes M over 16"),
    (129, SkinnyConfig(m_halves=2), None, r"takes M <= 128 \(got M=129\); use a GemmConfig, or a SkinnyConfig "
                                          r"with m_rows"),
    (100, SkinnyConfig(m_halves=2), "m_major",
     r"SkinnyConfig\(m_rows=None, m_halves=2\) takes per-tensor scales \(got block scales\)"),
    (100, SkinnyConfig(m_rows=32), "m_major", r"SkinnyConfig\(m_rows=32, m_halves=1\) takes per-tensor"),
    (300, SkinnyConfig(m_rows=48), None, r"SkinnyConfig\(m_rows=48\) is for bfloat16 products without M halves "
                                         r"\(got float8_e4m3fn, m_halves=1\)")])
def test_m_chunk_refusals(m, config, scales, match):
    with pytest.raises(tf.TmaflowError, match=match):
        skinny_plan(m, 4096, 4096, config, 132, "float8_e4m3fn", scales)


def test_48_row_chunks_run_bf16_in_m64n48_mmas():
    """m_rows=48 (cuBLAS's 64 x 48 tiles at 512^3): bf16 only, 11 chunks of 512 rows, clean compiles."""
    from tmaflow.kernels.registry import get_kernel
    from tmaflow.launch import compiler

    with pytest.raises(tf.TmaflowError, match=r"m_rows=48\) is for bfloat16 products without M halves \(got "
                                              r"bfloat16, m_halves=2\)"):
        skinny_plan(512, 512, 512, SkinnyConfig(m_rows=48, m_halves=2), 132)
    for config in (SkinnyConfig(m_rows=48), SkinnyConfig(m_rows=48, cluster=2), SkinnyConfig(m_rows=48, split_k=2)):
        plan = skinny_plan(512, 512, 2048, config, 132)
        assert plan.defines["MP"] == 48 and plan.grid_z == 11 and plan.spec_x.box == (48, BK)
        kern = get_kernel("gemm_skinny_bf16", plan.layout, defines=plan.defines, file="skinny")
        assert kern.program.resources.spills == 0 and compiler.wgmma_pipeline_notes(kern.program.log) == []


@pytest.mark.parametrize("m,config,mp,grid_z", [
    (256, SkinnyConfig(m_rows=16), 16, 16), (256, SkinnyConfig(m_rows=32, m_halves=2), 32, 4),
    (1000, SkinnyConfig(m_rows=64, m_halves=2), 64, 8), (100, SkinnyConfig(m_rows=8), 8, 13),
    (100, SkinnyConfig(m_halves=2), 64, 1), (128, SkinnyConfig(), 128, 1)])
def test_m_chunks_take_any_m_in_chunks_of_m_rows(m, config, mp, grid_z):
    """m_rows: a CTA (a pair with m_halves) per chunk along grid z; the splits count those CTAs."""
    plan = skinny_plan(m, 512, 4096, config, 132)
    assert plan.defines["MP"] == mp and plan.grid_z == grid_z and plan.spec_x.box == (mp, BK)
    ctas = math.ceil(512 / 64) * config.m_halves * grid_z
    assert plan.config.split_k == 1 or ctas * plan.config.split_k <= 132


# --- fp8 (no GPU) ---------------------------------------------------------------------------

def test_e4m3_round_trip_and_rounding():
    import numpy as np

    from tmaflow.dtypes import e4m3_bits, e4m3_to_float32

    b = np.arange(256, dtype=np.uint8)
    v = e4m3_to_float32(b)
    finite = ~np.isnan(v)
    assert np.array_equal(e4m3_bits(v[finite]), b[finite]) and np.isnan(v).sum() == 2
    assert e4m3_to_float32(e4m3_bits([1.0625, 1.1875, 500.0, -1e9, 2.0 ** -10])).tolist() == \
        [1.0, 1.25, 448.0, -448.0, 0.0]  # ties to even, saturation, underflow to zero


def test_fp8_plan_uses_128_byte_k_blocks_and_promotes():
    from tmaflow.kernels.matmul import FP8_BK, gemm_plan

    plan = gemm_plan(4096, 4096, 4096, "nt", GemmConfig(bn=128), "float8_e4m3fn")
    assert plan.spec_a.box == (128, FP8_BK) and plan.spec_a.dtype.itemsize == 1
    assert plan.defines["FP8"] == 1 and plan.defines["PROMOTE"] == 4
    assert plan.spec_a.smem_bytes == gemm_plan(4096, 4096, 4096, "nt", GemmConfig(bn=128)).spec_a.smem_bytes


@pytest.mark.parametrize("layout,config,match", [
    ("nn", GemmConfig(bn=128), r"fp8 operands take layout 'nt' \(got 'nn'\)"),
    ("nt", GemmConfig(bn=256), r"fp8 with promote=4 needs bn=64, 128 or 192 \(got bn=256\)"),
    ("nt", GemmConfig(bn=80, epi_cols=64), r"bn=80 \(no multiple of 64\) is for bfloat16 'nt' products \(got "
                                           r"float8_e4m3fn")])
def test_fp8_plan_refusals(layout, config, match):
    from tmaflow.kernels.matmul import gemm_plan

    with pytest.raises(tf.TmaflowError, match=match):
        gemm_plan(256, 256, 256, layout, config, "float8_e4m3fn")


def test_fp8_scales_are_checked_before_any_launch():
    from tmaflow.runtime.memory import DeviceArray

    a8, b8 = DeviceArray(0, (64, 64), "float8_e4m3fn"), DeviceArray(0, (64, 64), "float8_e4m3fn")
    with pytest.raises(tf.TmaflowError, match=r"scale_a=nan must be a finite float"):
        kernels.gemm(a8, b8, scale_a=float("nan"))
    with pytest.raises(tf.TmaflowError, match=r"scale_b='2' must be a finite float"):
        kernels.gemm(a8, b8, scale_b="2")
    bf = DeviceArray(0, (64, 64), "bfloat16")
    with pytest.raises(tf.TmaflowError, match=r"scale_a / scale_b dequantise fp8 operands; a and b are bfloat16"):
        kernels.gemm(bf, bf, scale_a=2.0)
    with pytest.raises(tf.TmaflowError, match=r"a is float8_e4m3fn but b is bfloat16"):
        kernels.gemm(a8, bf)
    with pytest.raises(tf.TmaflowError, match=r"promote=-1 must be in \[0, 64\]"):
        GemmConfig(promote=-1)


def test_fp8_block_scales_are_checked_by_shape_type_and_config():
    from tmaflow.runtime.memory import DeviceArray

    a8, b8 = DeviceArray(0, (300, 1040), "float8_e4m3fn"), DeviceArray(0, (264, 1040), "float8_e4m3fn")
    sa, sb = DeviceArray(0, (300, 9), "float32"), DeviceArray(0, (3, 9), "float32")
    with pytest.raises(tf.TmaflowError, match=r"scale_b must be \(3, 9\) \(128 x 128 blocks of b\), got None"):
        kernels.gemm(a8, b8, scale_a=sa)
    with pytest.raises(tf.TmaflowError, match=r"scale_a must be \(300, 9\) \(1 x 128 blocks of a\), got \(300, 8\)"):
        kernels.gemm(a8, b8, scale_a=DeviceArray(0, (300, 8), "float32"), scale_b=sb)
    with pytest.raises(tf.TmaflowError, match=r"scale_b must be .* got \(3, 9\) float16"):
        kernels.gemm(a8, b8, scale_a=sa, scale_b=DeviceArray(0, (3, 9), "float16"))
    with pytest.raises(tf.TmaflowError, match=r"config must be a GemmConfig with bn=128 and promote=1"):
        kernels.gemm(a8, b8, scale_a=sa, scale_b=sb, config=GemmConfig(bn=128, promote=4))
    with pytest.raises(tf.TmaflowError, match=r"bn=128 and promote=1, or a SkinnyConfig \(got GemmConfig\(bn=192"):
        kernels.gemm(a8, b8, scale_a=sa, scale_b=sb, config=GemmConfig(bn=192, epi_cols=64, promote=1))


def test_fp8_config_takes_192_column_tiles_for_large_products():
    """Each promotion covers 1.5x the math with 128 x 192 tiles; 128 x 128 ones only where
    their whole waves take less time."""
    from tmaflow.kernels.matmul import fp8_config

    # 20 waves and 56 items: no split of those pays
    assert fp8_config(8192, 8192, 8192, 132) == GemmConfig(bn=192, cluster_m=2, epi_cols=64)
    # 608 cluster items: 9 waves and 14 items, split in 4 parts along K (one round of parts)
    assert fp8_config(4096, 7168, 16384, 132) == GemmConfig(bn=192, cluster_m=2, epi_cols=64, split_tail=True)
    assert fp8_config(2048, 2048, 2048, 132) == GemmConfig(bn=128, cluster_m=2)  # 2 waves either way
    # 352 tiles of 192 columns in 3 waves against 544 of 128 columns in 5
    assert fp8_config(4096, 2112, 7168, 132) == GemmConfig(bn=192, cluster_m=1, epi_cols=64)
    assert fp8_config(64, 7168, 16384, 132).bn == 128  # one wave either way: the narrower tiles
    assert choose_config(8192, 8192, 8192, 132, "nt", "float8_e4m3fn").bn == 192


def test_block_scale_plan_gives_each_stage_its_scales():
    """Block scales: 128 x 128 tiles promoted every k-block, in clusters of two along M when
    there are two M tiles, with 64-column epilogue rounds. Each stage carries A's 128 row scales: M-major ones as a TMA box beside
    A's (counted in the stage's bytes), row-major ones gathered by 32 lanes that arrive on the
    stage's full barrier beside the TMA thread."""
    from tmaflow.kernels.matmul import SCALE_STRIDE, block_scale_config, gemm_plan

    cfg = block_scale_config(4096, 7168, 16384, 132)
    assert cfg == GemmConfig(bn=128, cluster_m=2, epi_cols=64, promote=1)
    assert block_scale_config(128, 7168, 16384, 132).cluster_m == 1  # one M tile: nobody to share B with
    assert block_scale_config(64, 512, 8192, 132).split_k == 4  # 4 tiles at 64 rows: K split to fill the GPU
    assert block_scale_config(256, 512, 8192, 132).cluster_k == 4  # 8 tiles: K split inside clusters
    plain = gemm_plan(4096, 7168, 16384, "nt", cfg, "float8_e4m3fn")
    assert "BLOCK_SCALES" not in plain.defines and plain.spec_s is None
    stage = plain.layout.items[0].tx_bytes
    plan = gemm_plan(4096, 7168, 16384, "nt", cfg, "float8_e4m3fn", block_scales="m_major")
    assert plan.defines["BLOCK_SCALES"] == 1 and plan.defines["SCALES_TMA"] == 1
    assert plan.spec_s.box == (1, 128) and plan.spec_s.smem_bytes == 512 and plan.config.stages == 6
    pipe = plan.layout.items[0]
    assert pipe.full_arrivals == 1 and pipe.tx_bytes == stage + 512
    assert not any(p.name == "scales" for p in plan.layout.placements)
    plan = gemm_plan(4096, 7168, 16384, "nt", cfg, "float8_e4m3fn", block_scales="row_major")
    assert plan.defines["SCALES_TMA"] == 0 and plan.spec_s is None and plan.config.stages == 6
    pipe = plan.layout.items[0]
    # 33 producers (TMA thread, gathering warp); every consumer lane releases on its own CTA (8 x
    # 32), one per warp on the other (8)
    assert pipe.full_arrivals == 33 and pipe.empty_arrivals == 264 and pipe.tx_bytes == stage
    scales = next(p for p in plan.layout.placements if p.name == "scales")
    assert scales.nbytes == 6 * SCALE_STRIDE * 4 and scales.offset % 16 == 0
    with pytest.raises(tf.TmaflowError, match=r"block scales .* fp8 operands with bn=128 and promote=1 \(got bfloat16"):
        gemm_plan(4096, 7168, 16384, "nt", GemmConfig(bn=128, promote=1), "bfloat16", block_scales="m_major")
    with pytest.raises(tf.TmaflowError, match=r"\(got float8_e4m3fn, bn=128, promote=4\)"):
        gemm_plan(4096, 7168, 16384, "nt", GemmConfig(bn=128), "float8_e4m3fn", block_scales="row_major")
    with pytest.raises(tf.TmaflowError, match=r"block_scales=True must be None or one of \('row_major', 'm_major'\)"):
        gemm_plan(4096, 7168, 16384, "nt", cfg, "float8_e4m3fn", block_scales=True)


@pytest.mark.parametrize("m,k,strides,mode", [
    (300, 2048, None, "row_major"),
    (300, 1040, None, "row_major"),
    (300, 1040, (4, 1200), "m_major"),      # k-block by k-block, 300 rows
    (301, 2048, (4, 1216), "m_major"),      # 301 rows padded to 304
    (1, 128, (4, 16), "m_major"),
    (1, 2048, (4, 4), "row_major"),         # one row stored "k-block by k-block" is one packed row
    (200, 128, (4, 4), "row_major"),        # one k-block: the column's stride is moot
])
def test_block_scale_layout_picks_how_the_scales_travel(m, k, strides, mode):
    from tmaflow.kernels.matmul.operands import _scales
    from tmaflow.runtime.memory import DeviceArray

    kb = -(-k // 128)
    a8, b8 = DeviceArray(0, (m, k), "float8_e4m3fn"), DeviceArray(0, (256, k), "float8_e4m3fn")
    sa = DeviceArray(0, (m, kb), "float32", strides)
    sb = DeviceArray(0, (2, kb), "float32")
    scale, blocks, got = _scales(a8, b8, sa, sb)
    assert (scale, got) == (1.0, mode) and blocks[0] is sa and blocks[1] is sb


@pytest.mark.parametrize("sa_strides,sb_strides", [
    ((4, 1204), None),    # k-block by k-block with a pitch of 1204 B: not a 16-byte multiple
    ((8, 2408), None),    # every other float
    (None, (4, 8)),       # scale_b's rows overlapping
])
def test_block_scales_the_kernels_cannot_read_are_staged(sa_strides, sb_strides):
    """Layouts of block scales the kernels cannot read as given are accepted and staged
    (edge.py copies them into M-major / row-major scratch); shape and type are still checked."""
    from tmaflow.kernels.edge import STAGED
    from tmaflow.kernels.matmul.operands import _scales
    from tmaflow.runtime.memory import DeviceArray

    a8, b8 = DeviceArray(0, (301, 2048), "float8_e4m3fn"), DeviceArray(0, (256, 2048), "float8_e4m3fn")
    sa = DeviceArray(0, (301, 16), "float32", sa_strides)
    sb = DeviceArray(0, (2, 16), "float32", sb_strides)
    assert _scales(a8, b8, sa, sb)[2] == STAGED
    with pytest.raises(tf.TmaflowError, match=r"scale_a must be \(301, 16\) \(1 x 128 blocks of a\), got \(301, 8\)"):
        _scales(a8, b8, DeviceArray(0, (301, 8), "float32", (4, 1204)), sb)


@pytest.mark.parametrize("m,n,k,want", [
    (128, 4096, 7168, (64, 2)),    # 64 tiles, K split in pairs: 128 CTAs
    (128, 7168, 7168, (112, 2)),   # 64 tiles of 112 columns in pairs
    (128, 8192, 8192, (64, 1)),    # 128 tiles; 64 of 128 in pairs tie: no split wins
    (65, 4096, 4096, (64, 2)),
])
def test_one_m_tile_of_bf16_takes_dense_tiles_that_fill_the_sms(m, n, k, want):
    cfg = choose_config(m, n, k, 132)
    assert isinstance(cfg, GemmConfig) and (cfg.bn, cfg.cluster_k) == want and cfg.split_k == 1


@pytest.mark.parametrize("m,n,k", [(96, 768, 4096), (128, 512, 8192), (128, 256, 16384), (128, 1024, 8192)])
def test_one_m_tile_of_narrow_n_and_long_k_splits_k_in_clusters_of_four(m, n, k):
    """Where the skinny path would split K eight ways or more (16 tiles of 64 columns or fewer)
    over 64+ k-blocks: 64-column tiles, K in clusters of four."""
    assert choose_config(m, n, k, 132) == GemmConfig(bn=64, cluster_m=1, epi_cols=64, cluster_k=4)


@pytest.mark.parametrize("m,n,k", [(64, 4096, 4096), (128, 2048, 4096), (128, 4096, 512), (128, 3072, 4096),
                                   (128, 512, 2048), (64, 512, 8192)])
def test_one_m_tile_keeps_the_skinny_path_when_dense_tiles_leave_sms_idle(m, n, k):
    """64 rows or fewer, short K, or too few columns to fill 80% of the SMs (and too many for
    clusters of four over 64+ k-blocks): the skinny path."""
    assert isinstance(choose_config(m, n, k, 132), SkinnyConfig)


def test_skinny_rows_double_when_64_row_tiles_outnumber_the_sms():
    assert choose_config(64, 14336, 4096, 132) == SkinnyConfig(rows=128)
    assert choose_config(16, 14336, 4096, 132) == SkinnyConfig(rows=64, stages=5)  # MP 16: a light tile
    assert choose_config(64, 4096, 4096, 132, "nt", "float8_e4m3fn") == SkinnyConfig(rows=64)


def test_row_major_block_scales_take_the_skinny_path_to_m_64_and_at_m_128_under_128_k_blocks():
    """The default route of row-major scale_a (session 21's records on both GPUs: the skinny
    kernel's ring ahead of the dense gather at M = 128 but at 128 k-blocks and more)."""
    assert all(skinny_row_scales_by_default(m, 16384) for m in (1, 16, 64))
    assert skinny_row_scales_by_default(128, 4096) and skinny_row_scales_by_default(128, 8192)
    assert skinny_row_scales_by_default(128, 127 * 128) and not skinny_row_scales_by_default(128, 127 * 128 + 1)
    assert not skinny_row_scales_by_default(128, 16384) and not skinny_row_scales_by_default(129, 4096)
