"""The GEMM's host side without a GPU: operand checks, plans, shared-memory budgets."""
import itertools
import math

import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.kernels.matmul import GemmConfig, SkinnyConfig, choose_config, dense_config, gemm_plan
from tmaflow.runtime.memory import DeviceArray

FAKE = itertools.count(1 << 32, 1 << 24)  # never dereferenced: every check below fails before a launch


def arr(shape, dtype="bfloat16", strides=None):
    return DeviceArray(next(FAKE), shape, dtype, strides=strides)  # one range each: no aliasing


@pytest.mark.parametrize("a,b,out,kw,msg", [
    (arr((64, 32)), arr((48, 32)), arr((64, 48)), dict(layout="tn"), r"layout='tn' must be one of \('nt', 'nn'\)"),
    (arr((64, 32), "float16"), arr((48, 32)), arr((64, 48)), {}, r"a must be bfloat16 or float8_e4m3fn \(got float16\)"),
    (arr((64, 32)), arr((48, 32, 1)), arr((64, 48)), {}, r"b must be 2-D \(got shape \(48, 32, 1\)\)"),
    (arr((64, 32)), arr((48, 40)), arr((64, 48)), {}, r"b must be \(N, K\) for layout 'nt'"),
    (arr((64, 32)), arr((48, 32)), arr((64, 48)), dict(layout="nn"), r"b must be \(K, N\) for layout 'nn'"),
    (arr((64, 32)), arr((48, 32)), arr((64, 40)), {}, r"out must be a \(64, 48\) bfloat16 array \(got \(64, 40\)"),
    (arr((64, 32)), arr((48, 32)), arr((64, 48), "float32"), {}, r"out must be a \(64, 48\) bfloat16 array"),
])
def test_gemm_rejects_bad_operands(a, b, out, kw, msg):
    with pytest.raises(tf.TmaflowError, match=msg):
        kernels.gemm(a, b, out, **kw)


@pytest.mark.parametrize("kw,msg", [
    (dict(bn=120), r"bn=120 must be a multiple of 16 from 64 to 256"),
    (dict(bn=48), r"bn=48 must be a multiple of 16 from 64 to 256"),
    (dict(bn=272), r"bn=272 must be a multiple of 16 from 64 to 256"),
    (dict(bn=96), r"epi_cols=128 must be a multiple of 64 dividing bn=96's 64 columns in whole 64-column boxes"),
    (dict(bn=224), r"epi_cols=128 must be a multiple of 64 dividing bn=224's 192 columns in whole 64-column boxes"),
    (dict(bn=192), r"epi_cols=128 must be a multiple of 64 dividing bn=192"),
    (dict(cluster_m=3), r"cluster_m=3 must be 1, 2 or 4"),
    (dict(cluster_m=4, group_m=6), r"group_m=6 must be a multiple of cluster_m=4"),
    (dict(promote_sets=3), r"GemmConfig: promote_sets=3 must be 1 or 2"),
    (dict(epi_cols=96), r"epi_cols=96 must be a multiple of 64 dividing bn=256"),
    (dict(group_m=3), r"group_m=3 must be a multiple of cluster_m=2"),
    (dict(stages=1), r"stages=1 must be in \[2, 16\]"),
    (dict(split_k=0), r"split_k=0 must be in \[1, 64\]"),
    (dict(split_tail=1), r"split_tail=1 must be True or False"),
    (dict(split_tail=True, split_k=2), r"split_tail=True splits only the last wave's tiles; it takes split_k=1 \(got split_k=2\)"),
    (dict(cluster_m=1, cluster_k=3), r"cluster_k=3 must be 1, 2 or 4"),
    (dict(cluster_k=2), r"cluster_k=2 splits each tile's K among the CTAs of a cluster; it takes cluster_m=1 \(got cluster_m=2\)"),
    (dict(cluster_m=1, cluster_k=4, split_k=2), r"cluster_k=4 .* it takes split_k=1 \(got split_k=2\)"),
    (dict(cluster_m=1, cluster_k=2, split_tail=True), r"cluster_k=2 .* it takes split_tail=False \(got split_tail=True\)"),
])
def test_gemm_config_rules(kw, msg):
    with pytest.raises(tf.TmaflowError, match=msg):
        GemmConfig(**kw)


def test_gemm_stage_overflow_names_the_layout():
    with pytest.raises(tf.LayoutError, match=r"over the 232448 B per-block limit"):
        gemm_plan(4096, 4096, 4096, "nt", GemmConfig(stages=5))


@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize("bn,cm", [(256, 2), (128, 2), (256, 1), (128, 1), (192, 1), (192, 2), (64, 1), (64, 2)])
def test_gemm_plan_bytes(layout, bn, cm):
    plan = gemm_plan(1000, 3000, 520, layout, GemmConfig(bn=bn, cluster_m=cm, epi_cols=128 if bn in (128, 256) else 64))
    pipe = plan.layout.items[0]
    assert pipe.tx_bytes == (128 + bn) * 64 * 2           # one A and one whole B tile per stage
    b_boxes = pipe.boxes[1]
    assert b_boxes * plan.spec_b.tx_bytes == bn * 64 * 2
    if layout == "nt":
        assert plan.spec_b.box == (bn // cm, 64) and b_boxes == cm   # B rows split over the cluster
    else:
        assert plan.spec_b.box == (64, 64) and b_boxes == bn // 64
    assert pipe.empty_arrivals == 8 * cm                  # 8 consumer warps in every CTA it feeds
    assert plan.layout.total_bytes <= 227 * 1024
    hdr = plan.layout.header()
    assert f"constexpr int b_boxes = {b_boxes};" in hdr
    assert plan.defines["B_N_MAJOR"] == (layout == "nn") and plan.defines["BN"] == bn


@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize("ck", [2, 4])
@pytest.mark.parametrize("bn", [64, 128, 192, 256])
def test_gemm_plan_cluster_k(layout, ck, bn):
    """Cluster K-splits: each CTA owns 128 / ck rows of the tile, takes the other ck - 1 ranks'
    fp32 partials of them in its `red` slots (bytes the red_full barrier expects), is released
    by every owning warp of the others (red_freed) and stores only its rows (C boxes of that
    many rows, at most 64)."""
    epi = 128 if bn in (128, 256) else 64
    plan = gemm_plan(1000, 3000, 520, layout, GemmConfig(bn=bn, cluster_m=1, cluster_k=ck, epi_cols=epi))
    own = 128 // ck
    slots = (ck - 1) * own * bn * 4
    items = {getattr(item, "name", None): item for item in plan.layout.items}
    assert items["red"].nbytes == slots
    assert (items["red_full"].arrivals, items["red_full"].tx_bytes) == (1, slots)
    assert items["red_freed"].arrivals == (ck - 1) * own // 16
    assert items["c"].nbytes == own * epi * 2
    assert plan.spec_c.box == (min(64, own), 64)
    assert plan.defines["CLUSTER_K"] == ck and plan.defines["CLUSTER_M"] == 1 and plan.defines["SPLIT_K"] == 0
    assert plan.layout.cluster is None  # no multicast: the A/B pipeline is each CTA's own
    assert 2 <= plan.config.stages and plan.layout.total_bytes <= 227 * 1024
    assert "red_full()" in plan.layout.header() and "red_freed()" in plan.layout.header()
    assert "CLUSTER_K" not in gemm_plan(1000, 3000, 520, layout, GemmConfig(bn=bn, cluster_m=1, epi_cols=epi)).defines


@pytest.mark.parametrize("bn", [80, 96, 112, 144, 160, 176, 208, 224, 240])
@pytest.mark.parametrize("cm", [1, 2])
def test_gemm_plan_odd_widths(bn, cm):
    """A width that is no multiple of 64: B's boxes (a row slice each in a cluster) keep whole
    1024-byte swizzle atoms, C's whole 64-column boxes leave in EPI_COLS rounds and the last
    bn % 64 columns through a map of boxes that narrow (EPI_REM_MAP)."""
    plan = gemm_plan(1000, 3000, 520, "nt", GemmConfig(bn=bn, cluster_m=cm, epi_cols=64))
    pipe = plan.layout.items[0]
    assert pipe.tx_bytes == (128 + bn) * 64 * 2
    assert plan.spec_b.box == (bn // cm, 64) and (bn // cm * 128) % 1024 == 0
    assert plan.spec_c.box == (64, 64) and plan.spec_c_rem.box == (64, bn % 64)
    assert plan.spec_c_rem.swizzle == "128B"
    assert plan.defines["BN"] == bn and plan.defines["EPI_REM_MAP"] == 1
    assert plan.layout.total_bytes <= 227 * 1024 and plan.config.stages >= 2
    ck = gemm_plan(512, 512, 2048, "nt", GemmConfig(bn=bn, cluster_m=1, cluster_k=4, epi_cols=64))
    assert ck.spec_c_rem.box == (32, bn % 64)  # with cluster K-splits a CTA stores its rows only
    assert "EPI_REM_MAP" not in gemm_plan(1000, 3000, 520, "nt", GemmConfig(bn=bn - bn % 64 or 64, cluster_m=cm,
                                                                           epi_cols=64)).defines


def test_odd_widths_refuse_what_they_do_not_run():
    with pytest.raises(tf.TmaflowError, match=r"gemm: bn=160 \(no multiple of 64\) is for bfloat16 'nt' "
                                              r"products \(got bfloat16, layout 'nn'\)"):
        gemm_plan(512, 512, 512, "nn", GemmConfig(bn=160, epi_cols=64))
    with pytest.raises(tf.TmaflowError, match=r"bn=176 \(no multiple of 64\) is for bfloat16 'nt' products "
                                              r"\(got float8_e4m3fn"):
        gemm_plan(512, 512, 512, "nt", GemmConfig(bn=176, epi_cols=64), "float8_e4m3fn")
    with pytest.raises(tf.TmaflowError, match=r"grouped_gemm: bn=96 \(no multiple of 64\) is for single products"):
        kernels.grouped_gemm(arr((10, 64)), arr((3, 32, 64)), [0, 5, 6, 10], config=GemmConfig(bn=96, epi_cols=64))


def test_promote_sets_and_four_m_tiles_refuse_what_they_do_not_run():
    fp8 = "float8_e4m3fn"
    for config, dtype, scales in [(GemmConfig(bn=128, promote=1, promote_sets=2), "bfloat16", None),
                                  (GemmConfig(bn=128, promote=4, promote_sets=2), fp8, None),
                                  (GemmConfig(bn=192, promote=1, epi_cols=64, promote_sets=2), fp8, None),
                                  (GemmConfig(bn=128, promote=1, promote_sets=2), fp8, "m_major")]:
        with pytest.raises(tf.TmaflowError, match=r"gemm: promote_sets=2 promotes every k-block on two accumulator "
                                                  r"sets: fp8 with per-tensor scales, bn=64 or 128 and promote=1"):
            gemm_plan(512, 512, 2048, "nt", config, dtype, scales)
    for layout, bn in (("nn", 128), ("nt", 208)):
        with pytest.raises(tf.TmaflowError, match=rf"gemm: cluster_m=4 shares B in four 8-row-aligned slices .* "
                                                  rf"\(got layout '{layout}', bn={bn}\)"):
            gemm_plan(1000, 3000, 520, layout, GemmConfig(bn=bn, cluster_m=4, epi_cols=64))
    with pytest.raises(tf.TmaflowError, match=r"grouped_gemm: cluster_m=4 is for single products \(gemm\)"):
        kernels.grouped_gemm(arr((10, 64)), arr((3, 32, 64)), [0, 5, 6, 10], config=GemmConfig(cluster_m=4))


@pytest.mark.parametrize("m,n,k,config,dtype", [
    (128, 4096, 4096, GemmConfig(bn=128, cluster_m=1, cluster_k=2, promote=1, promote_sets=2), "float8_e4m3fn"),
    (128, 4096, 4096, GemmConfig(bn=128, cluster_m=1, cluster_k=4, promote=1, promote_sets=2), "float8_e4m3fn"),
    (1024, 4096, 4096, GemmConfig(bn=128, cluster_m=2, split_k=2, promote=1, promote_sets=2), "float8_e4m3fn"),
    (128, 4096, 4096, GemmConfig(bn=64, cluster_m=1, epi_cols=64, cluster_k=2, promote=1, promote_sets=2), "float8_e4m3fn"),
    (128, 4096, 4096, GemmConfig(bn=64, cluster_m=1, epi_cols=64, cluster_k=2), "float8_e4m3fn"),
    (1000, 3000, 520, GemmConfig(bn=192, cluster_m=4, epi_cols=64), "bfloat16"),
    (1000, 3000, 520, GemmConfig(bn=64, cluster_m=4, epi_cols=64), "bfloat16"),
    (1024, 1024, 1024, GemmConfig(bn=128, cluster_m=4), "float8_e4m3fn")])
def test_promote_sets_and_four_m_tiles_compile_clean(m, n, k, config, dtype):
    """Two promotion sets keep three sets of 64 accumulators in the consumers' registers with
    ptxas's wgmma pipeline intact (no C75xx note); four M tiles multicast B in four slices, and
    their consumers release to all four CTAs."""
    from tmaflow.kernels.registry import get_kernel
    from tmaflow.launch import compiler

    plan = gemm_plan(m, n, k, "nt", config, dtype)
    assert plan.defines.get("PROMOTE_SETS", 1) == config.promote_sets and plan.defines["CLUSTER_M"] == config.cluster_m
    pipe = plan.layout.items[0]
    assert pipe.empty_arrivals == 8 * config.cluster_m and pipe.cluster == (config.cluster_m, 1, 1)
    assert plan.spec_b.box[0] == config.bn // config.cluster_m
    kern = get_kernel("gemm_bf16", plan.layout, defines=plan.defines, file="gemm")
    r = kern.program.resources
    assert r.spills == 0 and r.stack_frame == 0, r
    assert compiler.wgmma_pipeline_notes(kern.program.log) == []


@pytest.mark.parametrize("layout,dtype", [("nt", "bfloat16"), ("nn", "bfloat16"), ("nt", "float8_e4m3fn")])
def test_k_tail_keeps_the_wgmma_pipeline(layout, dtype):
    """K_TAIL (opt-in): the last k-block's k-steps past K are skipped. K_TAIL=1 tests the step
    count inside the k-loop: NVRTC 13.5's ptxas keeps its wgmma pipeline (no C75xx note), NVRTC
    12's and 13.0's (the GPU image's) serialize it (C7519). K_TAIL=2 issues that k-block after
    the loop in straight-line code per count: no note from either."""
    from tmaflow.kernels.registry import get_kernel
    from tmaflow.launch import compiler
    from tmaflow.launch.sass import disassemble

    plan = gemm_plan(1000, 3000, 520 if dtype == "bfloat16" else 2064, layout, GemmConfig(bn=128, cluster_m=2), dtype)
    plain = get_kernel("gemm_bf16", plan.layout, defines=plan.defines, file="gemm")
    tail = get_kernel("gemm_bf16", plan.layout, defines={**plan.defines, "K_TAIL": 1}, file="gemm")
    after = get_kernel("gemm_bf16", plan.layout, defines={**plan.defines, "K_TAIL": 2}, file="gemm")
    assert tail.program.resources.spills == 0 and after.program.resources.spills == 0
    notes = compiler.wgmma_pipeline_notes(tail.program.log)
    if compiler.nvrtc_version() >= (13, 5):
        assert notes == []
    else:
        assert all("C7519" in n for n in notes), notes
    assert compiler.wgmma_pipeline_notes(after.program.log) == []
    assert compiler.wgmma_pipeline_notes(plain.program.log) == []
    mmas = {kernel: disassemble(kernel.cubin).count("GMMA") for kernel in (plain, tail, after)}  # HGMMA, QGMMA
    assert mmas[tail] > mmas[plain] and mmas[after] == mmas[plain] + 1 + 2 + 3, mmas


@pytest.mark.parametrize("ck", [2, 4])
@pytest.mark.parametrize("mode", ["row_major", "m_major"])
def test_block_scales_split_k_inside_clusters_compile_clean(mode, ck):
    """Block scales with K split inside clusters: two accumulator sets and the promoted sum in
    the consumers' registers beside the cluster reduction, no spills, the wgmma pipeline intact;
    the reduction's slots fit beside five stages."""
    from tmaflow.kernels.registry import get_kernel
    from tmaflow.launch import compiler

    plan = gemm_plan(128, 4096, 4096, "nt", GemmConfig(bn=128, cluster_m=1, epi_cols=64, promote=1, cluster_k=ck),
                     "float8_e4m3fn", mode)
    assert plan.defines["CLUSTER_K"] == ck and plan.defines["BLOCK_SCALES"] == 1 and plan.config.stages >= 5
    kern = get_kernel("gemm_bf16", plan.layout, defines=plan.defines, file="gemm")
    r = kern.program.resources
    assert r.spills == 0 and r.stack_frame == 0, r
    assert compiler.wgmma_pipeline_notes(kern.program.log) == []


@pytest.mark.parametrize("m,n,k,ck", [(128, 4096, 4096, 2), (128, 3072, 4096, 4), (96, 1024, 1024, 4),
                                      (256, 4096, 16384, 2), (65, 8192, 8192, 2), (128, 8448, 4096, 2)])
def test_block_scales_split_k_inside_clusters_where_tiles_fill_half_the_sms(m, n, k, ck):
    from tmaflow.kernels.matmul.heuristics import block_scale_config

    assert block_scale_config(m, n, k, 132) == GemmConfig(bn=128, cluster_m=1, epi_cols=64, promote=1, cluster_k=ck)


@pytest.mark.parametrize("m,n,k", [(64, 4096, 4096), (128, 4096, 896), (128, 8576, 4096), (384, 4096, 4096),
                                   (4096, 7168, 16384)])
def test_block_scales_keep_their_tiles_past_half_the_sms_or_at_64_rows(m, n, k):
    """At most 64 rows (the skinny path's), under 8 k-blocks, or more than 66 tiles: no cluster."""
    from tmaflow.kernels.matmul import block_scale_default
    from tmaflow.kernels.matmul.heuristics import block_scale_config

    assert block_scale_config(m, n, k, 132).cluster_k == 1
    route = block_scale_default(m, n, k, "nt", "m_major", None, 132)
    assert isinstance(route, SkinnyConfig) == (m <= 128)


def test_cluster_k_refuses_what_it_does_not_run():
    fp8 = gemm_plan(128, 4096, 4096, "nt", GemmConfig(bn=128, cluster_m=1, cluster_k=4), "float8_e4m3fn")
    assert fp8.defines["CLUSTER_K"] == 4 and fp8.defines["FP8"] == 1
    with pytest.raises(tf.TmaflowError, match=r"grouped_gemm: cluster_k=4 is for single products"):
        kernels.grouped_gemm(arr((10, 64)), arr((3, 32, 64)), [0, 5, 6, 10],
                             config=GemmConfig(cluster_m=1, cluster_k=4))


@pytest.mark.parametrize("fields", [dict(), dict(split_k=3), dict(split_tail=True), dict(epi_cols=64)])
@pytest.mark.parametrize("cm", [1, 2])
@pytest.mark.parametrize("mode", [None, "row_major", "m_major"])
def test_gemm_plan_arrival_counts(mode, cm, fields):
    """Gathered (row-major) block scales are read by every consumer lane, and each lane releases
    its own reads on its CTA's empty barrier: 8 warps x 32 lanes there, plus one per warp of the
    other CTA of the cluster. Everything else releases one per warp and CTA of the mask."""
    dtype = "float8_e4m3fn" if mode else "bfloat16"
    config = GemmConfig(bn=128, cluster_m=cm, promote=1 if mode else 4, **fields)
    plan = gemm_plan(4096, 7168, 16384, "nt", config, dtype, mode)
    pipe = plan.layout.items[0]
    peers = cm - 1  # B is multicast along the cluster, A and the scales are each CTA's own
    assert bin(pipe.release_mask(0)).count("1") == 1 + peers
    if mode == "row_major":
        assert (pipe.empty_arrivals, pipe.consumer_lanes, pipe.full_arrivals) == (8 * 32 + 8 * peers, 32, 33)
        assert (pipe.empty_arrivals, cm) in ((256, 1), (264, 2))
    else:
        assert (pipe.empty_arrivals, pipe.consumer_lanes, pipe.full_arrivals) == (8 * cm, 1, 1)
    hdr = plan.layout.header()
    assert f"constexpr uint32_t empty_arrivals = {pipe.empty_arrivals};" in hdr
    assert f"constexpr uint32_t consumer_lanes = {pipe.consumer_lanes};" in hdr


@pytest.mark.parametrize("shape,split_k,cluster_k", [
    ((129, 264, 4096), 1, 4),    # 10 tiles of 64 columns: 4 global splits before, a cluster of four now
    ((256, 256, 4096), 1, 4),
    ((192, 384, 7168), 1, 4),
    ((512, 512, 2048), 1, 2),    # _filling_splits gives 2: a cluster of two, as before
    ((640, 512, 4096), 3, 1),    # 40 tiles: four CTAs a tile would not fit 132 SMs (three global splits)
])
def test_small_long_k_products_split_k_inside_clusters(shape, split_k, cluster_k):
    config = choose_config(*shape, 132)
    assert (config.bn, config.split_k, config.cluster_k) == (64, split_k, cluster_k), config


def test_choose_config():
    assert choose_config(8192, 8192, 8192, 132) == GemmConfig(bn=256, cluster_m=2)
    assert choose_config(2048, 2048, 2048, 132) == GemmConfig(bn=256, cluster_m=1, epi_cols=64)  # one wave: unclustered
    # whole waves: 384 tiles of 192 columns take 3 waves of 132, nearly full; 288 of 256 columns
    # also 3, the last a fifth full; 576 of 128 columns 5
    assert choose_config(3072, 3072, 3072, 132) == GemmConfig(bn=192, cluster_m=1, epi_cols=64)
    # 128 tiles of 192 columns: one wave; 9 k-blocks: pairs share B by multicast
    assert choose_config(1000, 3000, 520, 132) == GemmConfig(bn=192, cluster_m=2, epi_cols=64)
    assert choose_config(768, 768, 768, 132).cluster_m == 1  # 64-column pairs measured slower
    # 352 tiles of 192 columns in 3 waves, 384 of 176 in 3: the narrower is 8% cheaper
    assert choose_config(4096, 2112, 7168, 132) == GemmConfig(bn=176, cluster_m=1, epi_cols=64)
    assert choose_config(4096, 2048, 7168, 132).bn == 256  # whole waves already: no odd width
    assert choose_config(4096, 2112, 7168, 132, "nn").bn == 192  # odd widths: "nt" only
    # 5 waves of 128 columns beat 4 of 192; several waves of them pair up where B is wide
    assert choose_config(2304, 4608, 1024, 132) == GemmConfig(bn=128, cluster_m=2)
    assert choose_config(6144, 1024, 1024, 132) == GemmConfig(bn=128, cluster_m=1)  # 8 N tiles: unpaired
    assert choose_config(1024, 2048, 512, 132).cluster_m == 2  # one wave, short K (as 1000x3000x520)
    assert choose_config(1024, 2048, 2048, 132).cluster_m == 1  # one wave, 32 k-blocks
    assert choose_config(4096, 7168, 16384, 132) == GemmConfig(bn=256, cluster_m=2)
    # 64 tiles of 128 columns or 128 of 64 columns: one wave either way, the narrow ones half the math
    assert choose_config(1024, 1024, 1024, 132) == GemmConfig(bn=64, cluster_m=1, epi_cols=64)  # 16 k-blocks: no split
    assert choose_config(768, 768, 768, 132).bn == 64
    # 32 tiles under half the SMs: a cluster of two splits each tile's K in shared memory
    small = choose_config(512, 512, 2048, 132)
    assert (small.bn, small.cluster_k, small.split_k, small.cluster_m) == (64, 2, 1, 1)
    assert dense_config(512, 512, 512, 132, "nt").cluster_k == 2                  # 8 k-blocks
    assert dense_config(256, 256, 256, 132, "nt").cluster_k == 1                  # 4 k-blocks: none
    assert isinstance(choose_config(512, 512, 512, 132), SkinnyConfig)            # (m_chunk_config first)
    narrow = dense_config(16, 4096, 4096, 132)
    assert narrow.cluster_m == 1 and narrow.bn == 128                              # one M tile: no partner
    assert narrow.split_k == 4                                                     # 32 tiles x 4 splits fill 128 SMs
    assert dense_config(16, 4096, 256, 132).split_k == 1                           # K too short to split
    assert choose_config(16, 4096, 4096, 132) == SkinnyConfig()                    # "nt": operands swapped
    assert choose_config(16, 4096, 4096, 132, "nn") == narrow


@pytest.mark.parametrize("k_blocks,asked,used", [(64, 4, 4), (10, 4, 4), (9, 4, 3), (5, 16, 5), (1, 8, 1)])
def test_split_k_never_plans_an_empty_split(k_blocks, asked, used):
    plan = gemm_plan(256, 256, 64 * k_blocks, "nt", GemmConfig(split_k=asked))
    assert plan.config.split_k == used and plan.defines["SPLIT_K"] == int(used > 1)
    per = -(-k_blocks // used)
    assert (used - 1) * per < k_blocks  # the last split starts inside K


# --- grouped (MoE) GEMM: its host side -------------------------------------------------------

@pytest.mark.parametrize("a,b,offsets,kw,msg", [
    (arr((10, 64)), arr((3, 32, 64)), [0, 5, 4, 10], {}, r"offsets \[0, 5, 4, 10\] must start at 0, never decrease"),
    (arr((10, 64)), arr((3, 32, 64)), [1, 5, 6, 10], {}, r"must start at 0"),
    (arr((10, 64)), arr((3, 32, 64)), [0, 5, 6, 9], {}, r"end at the 10 rows of a"),
    (arr((10, 64)), arr((3, 32, 64)), [0, 10], {}, r"offsets must be 4 ints \(got \(2,\)"),
    (arr((10, 64)), arr((3, 32, 64)), [0.0, 1.5, 2.0, 10.0], {}, r"offsets must be 4 ints"),
    (arr((10, 64)), arr((3, 32, 48)), [0, 5, 6, 10], {}, r"b must be \(G, N, K\)"),
    (arr((10, 64)), arr((3, 48, 32)), [0, 5, 6, 10], dict(layout="nn"), r"b must be \(G, K, N\)"),
    (arr((10, 64)), arr((32, 64)), [0, 10], {}, r"a must be \(T, K\) and b \(G, N, K\)"),
    (arr((10, 64), "float16"), arr((3, 32, 64)), [0, 5, 6, 10], {}, r"both bfloat16"),
    (arr((10, 64)), arr((3, 32, 64)), [0, 5, 6, 10], dict(layout="tn"), r"layout='tn' must be one of"),
    (arr((10, 64)), arr((3, 32, 64)), arr((4,), "float32"), {}, r"offsets must be 4 int32 values"),
])
def test_grouped_gemm_rejects_bad_arguments(a, b, offsets, kw, msg):
    with pytest.raises(tf.TmaflowError, match=msg):
        kernels.grouped_gemm(a, b, offsets, **kw)


def test_grouped_gemm_rejects_strided_device_offsets(rng):
    """The kernel reads offsets[g] as packed int32 values: a strided view would give it other
    groups' boundaries (a silent wrong product)."""
    step = 4 * int(rng.integers(2, 9))
    offsets = arr((4,), "int32", strides=(step,))
    with pytest.raises(tf.TmaflowError, match=rf"grouped_gemm: device offsets must be contiguous "
                                              rf"\(got strides \({step},\) B\)"):
        kernels.grouped_gemm(arr((10, 64)), arr((3, 32, 64)), offsets)


@pytest.mark.parametrize("t,n,k,g,want", [
    (4096 * 8, 4096, 7168, 8, (256, 2, 1)),    # big groups: wide tiles, pairs share B
    (512, 7168, 2048, 8, (256, 1, 1)),         # 64-row groups: no pairs (half of each would idle)
    (512, 4096, 7168, 8, (128, 1, 1)),         # too few wide tiles to fill 132 SMs
    (484, 512, 2048, 8, (128, 1, 2)),          # few tiles, long K: split along K (16 k-blocks a split)
    (2048, 7168, 2048, 32, (256, 1, 1)),
])
def test_grouped_tile_choice(t, n, k, g, want):
    from tmaflow.kernels.matmul.heuristics import grouped_dense_config

    c = grouped_dense_config(t, n, k, g, 132)
    assert (c.bn, c.cluster_m, c.split_k) == want


def tail_split_work(items: int, clusters: int, k_blocks: int) -> list:
    """The work of each cluster with a split tail, as gemm.cu walks it: lists of (item, kb0,
    kb1), every ``clusters``-th item of the whole waves, then every ``clusters``-th part of the
    tail (all tail tiles' first parts, then their second parts, ...)."""
    from tmaflow.kernels.matmul import tail_splits

    split = tail_splits(items, clusters, k_blocks)
    tail = items % clusters if split > 1 else 0
    whole, per = items - tail, math.ceil(k_blocks / split)
    work = whole + tail * split
    out = []
    for c in range(clusters):
        pieces = []
        for w in range(c, work, clusters):
            if w < whole:
                pieces.append((w, 0, k_blocks))
            else:
                i, part = (w - whole) % tail, (w - whole) // tail
                pieces.append((whole + i, part * per, min(k_blocks, (part + 1) * per)))
        out.append(pieces)
    return out


@pytest.mark.parametrize("items,k_blocks,clusters", [
    (1792 // 2, 128, 66), (150, 16, 132), (133, 8, 132), (263, 7, 132), (9, 12, 4), (200, 64, 66),
    (132 * 3, 32, 132), (100, 9, 132), (5, 40, 4), (7, 3, 4), (144, 48, 66)])
def test_tail_split_covers_every_k_block_once(items, k_blocks, clusters):
    """gemm.cu's walk with a split tail, modelled: every k-block of every item is computed
    exactly once, only tail items are split (into the same parts as split-K's), and the parts
    are dealt part by part: the CTAs of one round work on as few k-ranges as the tail allows."""
    from tmaflow.kernels.matmul import tail_splits

    split = tail_splits(items, clusters, k_blocks)
    tail = items % clusters if split > 1 else 0
    work = tail_split_work(items, clusters, k_blocks)
    assert len(work) == clusters
    done = set()
    parts = {}
    for pieces in work:
        for item, kb0, kb1 in pieces:
            assert 0 <= kb0 < kb1 <= k_blocks
            for kb in range(kb0, kb1):
                assert (item, kb) not in done
                done.add((item, kb))
            if (kb0, kb1) != (0, k_blocks):
                assert item >= items - tail
                parts.setdefault(item, []).append(kb0)
    assert len(done) == items * k_blocks
    assert all(len(p) == split for p in parts.values()) and len(parts) == tail
    for r in range(max(len(p) for p in work)):  # round r: the r-th piece of every cluster
        tail_ranges = {(kb0, kb1) for p in work if len(p) > r for _, kb0, kb1 in [p[r]]
                       if (kb0, kb1) != (0, k_blocks)}
        assert len(tail_ranges) <= -(-clusters // max(tail, 1)) + 1


def test_tail_splits_only_where_they_pay():
    from tmaflow.kernels.matmul import tail_splits

    assert tail_splits(264, 132, 64) == 1       # whole waves
    assert tail_splits(100, 132, 64) == 1       # less than one wave: split-K's case
    assert tail_splits(132 + 120, 132, 64) == 1  # a nearly full tail: no split makes it cheaper
    assert tail_splits(132 + 58, 132, 64) == 2   # 58 tail tiles in halves: one round
    assert tail_splits(896, 66, 128) == 3        # 4096x7168 block-scaled tiles in clusters of two: 38 tail items
    assert tail_splits(608, 66, 128) == 4        # in 192-column tiles: 14 tail items, one round of parts
    assert tail_splits(896, 66, 8) == 1         # 2 k-blocks a part would be too short
    plan = gemm_plan(4096, 7168, 16384, "nt", GemmConfig(bn=128, promote=1, epi_cols=64, split_tail=True),
                     "float8_e4m3fn", "m_major")
    assert plan.defines["SPLIT_TAIL"] == 1 and plan.defines["SPLIT_K"] == 0


# --- grouped decode path (skinny.cu's GROUPED): route, chunks, checks ---------------------------

@pytest.mark.parametrize("t,n,g,layout,max_rows,chunks,want", [
    (8, 4096, 8, "nt", None, None, SkinnyConfig(rows=128, split_k=1)),   # a token an expert: 512 items of 64
    (64, 4096, 8, "nt", None, None, SkinnyConfig(rows=128, split_k=1)),  # 8 a group, sizes unknown
    (8, 1024, 8, "nt", None, None, SkinnyConfig(rows=64, split_k=1)),    # 128 items of 64 at most: one round
    (8, 4096, 8, "nt", 1, None, SkinnyConfig(rows=128, split_k=1)),      # a hint: which groups have rows unknown
    (8, 4096, 8, "nt", 6, 2, SkinnyConfig(rows=64, split_k=1)),          # host offsets: 2 x 64 items of 64
    (8, 4096, 8, "nt", 3, 3, SkinnyConfig(rows=128, split_k=1)),         # 3 x 64: two rounds
    (72, 4096, 8, "nt", None, None, None),                               # 9 a group, unknown: maybe skewed
    (512, 7168, 8, "nt", None, None, None),                              # 64 a group, unknown: dense
    (512, 7168, 8, "nt", 64, 8, SkinnyConfig(rows=128, split_k=1)),      # 64 a group, none larger
    (8192, 4096, 128, "nt", 64, None, SkinnyConfig(rows=128, split_k=1)),  # 64 a group, 4096 wide tiles
    (2048, 4096, 128, "nt", 16, 128, SkinnyConfig(rows=128, split_k=1)),   # 16 a group: 8192 items of 64
    (520, 7168, 8, "nt", 65, None, None),                                # mean 65 rows: the dense kernel
    (512, 7168, 8, "nn", 64, None, None),                                # "nn": the dense kernel
    (4, 256, 2, "nt", 2, None, None),                                    # 2 x 4 tiles would leave SMs idle
])
def test_grouped_route(t, n, g, layout, max_rows, chunks, want):
    from tmaflow.kernels.matmul.heuristics import grouped_config, grouped_dense_config

    got = grouped_config(t, n, 2048, g, 132, layout, max_rows, chunks)
    assert got == (want or grouped_dense_config(t, n, 2048, g, 132))


@pytest.mark.parametrize("t,n,g,chunks,wide", [
    (32, 2048, 32, None, True),      # 32 groups x 32 tiles of 64 rows could need 8 rounds of 132 SMs
    (8, 2048, 8, None, True),        # 8 x 32 = 256 items of 64 at most
    (8, 1024, 8, None, False),       # 8 x 16 = 128: one round
    (4, 4096, 8, None, True),        # 4 tokens: at most 4 groups with rows, 4 x 64 = 256
    (2, 4096, 8, None, False),       # 2 x 64 = 128
    (32, 2048, 32, 5, True),         # host offsets: 5 chunks x 32 tiles = 160 items
    (32, 2048, 32, 4, False),        # 4 x 32 = 128: one round
    (8, 4096, 8, 2, False),          # 2 x 64 = 128
    (8192, 4096, 128, 128, True),    # 64 a group, 4096 wide tiles (four items an SM at 128 rows)
])
def test_grouped_decode_wide_tiles_where_64_row_items_take_two_rounds(t, n, g, chunks, wide):
    from tmaflow.kernels.matmul.heuristics import grouped_wide_tiles

    assert grouped_wide_tiles(t, n, g, 132, chunks) is wide


@pytest.mark.parametrize("max_rows,decode", [(None, False), (1, True), (64, True), (128, True), (129, False),
                                             (1000, False)])
def test_grouped_route_sends_a_known_hot_group_to_the_dense_path(max_rows, decode):
    """16 rows a group on average; host offsets or the hint showing a group of more than 128 rows
    take the dense path, whose 128-row tiles read the hot expert's weights half as often; so do
    unknown sizes (a hot expert may hide behind the mean)."""
    from tmaflow.kernels.matmul.heuristics import grouped_config, grouped_dense_config

    got = grouped_config(128, 7168, 2048, 8, 132, "nt", max_rows)
    assert got == (SkinnyConfig(rows=128, split_k=1) if decode else grouped_dense_config(128, 7168, 2048, 8, 132))


@pytest.mark.parametrize("max_rows,want", [
    (None, 64), (1, 8), (8, 8), (9, 16), (16, 16), (17, 32), (40, 64), (64, 64), (65, 64), (1000, 64), (0, 8),
])
def test_grouped_chunk_rows(max_rows, want):
    """The largest group's rows when known, rounded up to a wgmma width, at most 64; 64 when unknown
    (device offsets may hide a hot expert)."""
    from tmaflow.kernels.matmul.heuristics import grouped_chunk_rows

    assert grouped_chunk_rows(max_rows) == want


@pytest.mark.parametrize("kw,msg", [
    (dict(config=SkinnyConfig(split_k=2)), r"SkinnyConfig split_k=2 is for single products \(gemm\); the "
                                           r"grouped decode path takes split_k=1"),
    (dict(config=SkinnyConfig(cluster=2)), r"SkinnyConfig cluster=2 is for single products"),
    (dict(config=SkinnyConfig(m_halves=2)), r"SkinnyConfig m_halves=2 is for single products \(gemm\); the "
                                            r"grouped decode path takes m_halves=1"),
    (dict(config=SkinnyConfig(m_rows=16)), r"SkinnyConfig m_rows=16 is for single products"),
    (dict(config=SkinnyConfig(), layout="nn"), r"a SkinnyConfig takes layout='nt' \(got 'nn'\)"),
    (dict(config="skinny"), r"config='skinny' must be None, a kernels.GemmConfig or a kernels.SkinnyConfig"),
    (dict(max_tokens_per_group=0), r"max_tokens_per_group=0 must be"),
    (dict(max_tokens_per_group=2.5), r"max_tokens_per_group=2.5 must be an int"),
    (dict(max_tokens_per_group=4), r"max_tokens_per_group=4 but group 0 has 5 rows \(offsets \[0, 5, 6, 10\]\)"),
])
def test_grouped_decode_arguments_are_checked(kw, msg):
    b = arr((3, 64, 32)) if kw.get("layout") == "nn" else arr((3, 32, 64))
    with pytest.raises(tf.TmaflowError, match=msg):
        kernels.grouped_gemm(arr((10, 64)), b, [0, 5, 6, 10], **kw)


def test_every_grouped_variant_compiles_without_spills():
    """The decode kernel for every chunk width and tile height, in both item orders; the dense one with and without
    patching every tile's C map."""
    from tmaflow.kernels.matmul import skinny_plan
    from tmaflow.kernels.registry import get_kernel

    for mp in (8, 16, 32, 64, 128):
        for rows in (64, 128):
            for order in ({}, {"TILE_FASTEST": 1}):
                plan = skinny_plan(mp, 8 * 4096, 7168, SkinnyConfig(rows=rows, split_k=1), 132)
                k = get_kernel("gemm_skinny_bf16", plan.layout, defines=dict(plan.defines, GROUPED=1, **order),
                               file="skinny")
                assert k.resources.spill_stores == 0 and k.resources.spill_loads == 0, (mp, rows, order)
    for config in (GemmConfig(), GemmConfig(bn=128, cluster_m=1, split_k=2)):
        for patch in ({}, {"PATCH_ALL": 1}):
            plan = gemm_plan(4096, 4096, 4096, "nt", config)
            k = get_kernel("gemm_bf16", plan.layout, defines=dict(plan.defines, GROUPED=1, **patch), file="gemm")
            assert k.resources.spill_stores == 0 and k.resources.spill_loads == 0, (config, patch)


@pytest.mark.parametrize("shape,rows", [((256, 256, 256), 16), ((512, 512, 512), 32), ((129, 512, 512), 16),
                                        ((200, 304, 128), 16), ((384, 384, 384), 32)])
def test_small_bf16_products_run_in_m_chunks_that_plan(shape, rows):
    """129-512 rows with N and K up to 512: the skinny kernel over about 16 chunks of M, a
    CTA a chunk and 64 columns, and the plan takes it."""
    from tmaflow.kernels.matmul import skinny_plan

    config = choose_config(*shape, 132, "nt", "bfloat16")
    assert config == SkinnyConfig(m_rows=rows)
    skinny_plan(*shape, config, 132, "bfloat16")


@pytest.mark.parametrize("shape,layout,dtype,sms", [((512, 512, 2048), "nt", "bfloat16", 132),
                                                    ((513, 64, 64), "nt", "bfloat16", 132),
                                                    ((256, 256, 256), "nn", "bfloat16", 132),
                                                    ((256, 256, 256), "nt", "float8_e4m3fn", 132),
                                                    ((512, 4096, 512), "nt", "bfloat16", 132),
                                                    ((512, 512, 512), "nt", "bfloat16", 100)])
def test_m_chunks_stay_off_longer_k_wider_n_other_layouts_and_fp8(shape, layout, dtype, sms):
    from tmaflow.kernels.matmul import heuristics

    assert heuristics.m_chunk_config(*shape, sms, layout, dtype) is None


@pytest.mark.parametrize("shape, config", [
    ((2304, 4608, 1024), GemmConfig(bn=128, cluster_m=1)),
    ((512, 512, 512), GemmConfig(bn=64, cluster_m=1, epi_cols=64, cluster_k=2)),
    ((1000, 3000, 520), GemmConfig(bn=192, cluster_m=2, epi_cols=64)),
    ((256, 256, 256), SkinnyConfig(m_rows=16)),
    ((128, 4096, 4096), SkinnyConfig(m_halves=2))])
def test_uniform_desc_keeps_the_k_loop_descriptors_in_uniform_registers(shape, config):
    """gemm.cu's and skinny.cu's UNIFORM_DESC: fewer R2UR (a vector register moved to a uniform
    one for a wgmma descriptor; none in the dense kernel) and fewer instructions in the bf16
    k-loop, no more registers, no spills."""
    from tmaflow.kernels.matmul import skinny_plan
    from tmaflow.kernels.registry import get_kernel
    from tmaflow.launch.sass import disassemble

    skinny = isinstance(config, SkinnyConfig)
    plan = skinny_plan(*shape, config, 132) if skinny else gemm_plan(*shape, "nt", config)
    name, file = ("gemm_skinny_bf16", "skinny") if skinny else ("gemm_bf16", "gemm")
    got, regs = {}, {}
    for uniform in (0, 1):
        kernel = get_kernel(name, plan.layout, defines=dict(plan.defines, UNIFORM_DESC=uniform), file=file)
        r = kernel.resources
        assert r.spill_stores == 0 and r.spill_loads == 0, (uniform, r)
        got[uniform], regs[uniform] = _k_loop(disassemble(kernel.cubin)), r.registers
    moves = [sum("R2UR" in op for op in got[uniform]) for uniform in (0, 1)]
    # the plain loop moves its descriptors; the skinny loops keep a few (M halves: 1 under NVRTC
    # 13.5, 4 under 12.x)
    assert moves[0] >= 8 and moves[1] <= (4 if skinny else 0) and moves[1] < moves[0], moves
    assert len(got[1]) < len(got[0]) and sum("HGMMA" in op for op in got[1]) == 4
    assert regs[1] <= regs[0]


def _k_loop(sass: str) -> list:
    """The instructions of the shortest backward-branching loop that issues wgmmas."""
    import re

    code = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,6})\*/\s*([^;]*);", sass)]
    loops = []
    for at, op in code:
        jump = re.search(r"BRA (0x[0-9a-f]+)", op)
        if jump and int(jump.group(1), 16) < at:
            body = [o for a, o in code if int(jump.group(1), 16) <= a <= at]
            if any("HGMMA" in o for o in body):
                loops.append(body)
    assert loops, "no k-loop found in the SASS"
    return min(loops, key=len)


@pytest.mark.parametrize("shape", [(1000, 3000, 520), (512, 512, 2048)])
def test_prologue_cuts_and_stmatrix_drop_instructions(shape):
    """gemm.cu's UDIV_TILE and CLUSTER_ARRIVE_RELAXED (defaults since session 19) and
    ACC_OVERWRITE (opt-in: measured 1% slower on an H100) take instructions out: no MEMBAR.ALL.GPU
    before the cluster barrier, no accumulator zeroing where the first wgmma overwrites (not
    with cluster K-splits), fewer SASS instructions, the wgmma pipeline intact. EPI_STMATRIX
    (opt-in) writes C's boxes with a quarter the stores."""
    from tmaflow.kernels.registry import get_kernel
    from tmaflow.launch import compiler
    from tmaflow.launch.sass import disassemble, sass_instructions

    config = choose_config(*shape, 132, "nt", "bfloat16")
    plan = gemm_plan(*shape, "nt", config)
    before = {"ACC_OVERWRITE": 0, "UDIV_TILE": 0, "CLUSTER_ARRIVE_RELAXED": 0}
    sass = {}
    for name, extra in (("before", before), ("now", {"ACC_OVERWRITE": 1}),
                        ("stmatrix", {"ACC_OVERWRITE": 1, "EPI_STMATRIX": 1})):
        kernel = get_kernel("gemm_bf16", plan.layout, defines={**plan.defines, **extra}, file="gemm")
        r = kernel.resources
        assert r.spill_stores == 0 and r.spill_loads == 0, (name, r)
        assert compiler.wgmma_pipeline_notes(kernel.program.log) == [], name
        sass[name] = [text for _, text in sass_instructions(disassemble(kernel.cubin))]
    count = {name: {op: sum(text.split()[0] == op for text in ins) for op in ("MEMBAR.ALL.GPU", "CS2R", "STS", "STSM.16.M88.4")}
             for name, ins in sass.items()}
    assert count["before"]["MEMBAR.ALL.GPU"] == 1 and count["now"]["MEMBAR.ALL.GPU"] == 0, count
    if config.cluster_k == 1:
        assert count["now"]["CS2R"] <= count["before"]["CS2R"] - config.bn // 4, count  # kAcc / 2 zeroings
    assert len(sass["now"]) < len(sass["before"]) and len(sass["stmatrix"]) < len(sass["now"])
    assert count["stmatrix"]["STS"] == 0 and count["stmatrix"]["STSM.16.M88.4"] * 4 == count["now"]["STS"], count


def test_unsigned_tile_divisions_are_the_default_under_nvrtc_13_only():
    """gemm.cu's UDIV_TILE default follows the compiler: on under NVRTC 13 (measured on the GPU,
    whose image has 13.0), off under 12.x (its ptxas put 12 R2UR moves into the fp8 row-major
    block-scale loop with it): the default build is byte-identical to the explicit one."""
    from tmaflow.kernels.registry import get_kernel
    from tmaflow.launch import compiler

    plan = gemm_plan(1000, 3000, 520, "nt", choose_config(1000, 3000, 520, 132, "nt", "bfloat16"))
    default = get_kernel("gemm_bf16", plan.layout, defines=dict(plan.defines), file="gemm").cubin
    expected = 1 if compiler.nvrtc_version() >= (13, 0) else 0
    cubins = {value: get_kernel("gemm_bf16", plan.layout, defines={**plan.defines, "UDIV_TILE": value},
                                file="gemm").cubin for value in (0, 1)}
    assert cubins[0] != cubins[1]
    assert default == cubins[expected]
