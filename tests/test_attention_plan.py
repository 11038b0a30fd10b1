"""kernels.attention's and kernels.attention_varlen's argument checks and plans, and every
forward variant compiled (no GPU)."""
import itertools
import re

import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.kernels.attention_entry import (HEAD_DIMS, VARLEN_KEYS, _VARLEN_UNPAIRED, _VARLEN_WHOLE_Q,
                                            attention_kernel, attention_plan, keys_per_tile, swizzle_span, varlen_dynamic)
from tmaflow.kernels.attention_varlen_entry import varlen_plan
from tmaflow.launch import compiler
from tmaflow.tma.layout import HOPPER_SMEM_LIMIT
from tmaflow.runtime.memory import DeviceArray


_FAKE = itertools.count(1 << 32, 1 << 24)


def arr(shape, dtype="bfloat16", strides=None):
    return DeviceArray(next(_FAKE), shape, dtype, strides)  # one range each: no aliasing


@pytest.mark.parametrize("q,k,v,kw,match", [
    (arr((2, 64, 128)), arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), {}, r"q must be 4-D"),
    (arr((1, 2, 64, 128), "float32"), arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), {}, r"q must be bfloat16 or float16 \(got float32\)"),
    (arr((1, 2, 64, 128), "float16"), arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), {}, r"k is bfloat16 but q is float16; q, k and v must have one dtype"),
    (arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), arr((1, 2, 64, 128), "float16"), {}, r"v is float16 but q is bfloat16"),
    (arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), arr((1, 2, 65, 128)), {}, r"k \(1, 2, 64, 128\) and v \(1, 2, 65, 128\)"),
    (arr((1, 3, 64, 128)), arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), {}, r"3 query heads must be a multiple of the 2"),
    (arr((1, 2, 64, 72)), arr((1, 2, 64, 72)), arr((1, 2, 64, 72)), {},
     r"head_dim=72 is not supported; use a multiple of 16 from 32 to 256"),
    (arr((1, 2, 64, 16)), arr((1, 2, 64, 16)), arr((1, 2, 64, 16)), {}, r"head_dim=16 is not supported"),
    (arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), arr((1, 2, 64, 264)), {}, r"v's head_dim=264 is not supported"),
    (arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), arr((1, 1, 64, 96)), {},
     r"k \(1, 2, 64, 128\) and v \(1, 1, 64, 96\) must have one batch, heads and seq"),
    (arr((1, 2, 64, 128)), arr((1, 2, 0, 128)), arr((1, 2, 0, 128)), {}, r"k and v have no keys"),
    (arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), {"scale": float("inf")}, r"scale=inf must be a positive finite float"),
    (arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), {"scale": -0.1}, r"scale=-0.1 must be a positive"),
    (arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), arr((1, 2, 64, 128)), {"causal": 1}, r"causal=1 must be True or False"),
    (arr((1, 2, 64, 64), strides=(16384 * 2, 8192 * 2, 128, 2)), arr((1, 2, 64, 64)), arr((1, 2, 64, 64)), {},
     r"q must be contiguous"),
])
def test_attention_refuses_bad_arguments_by_name(q, k, v, kw, match):
    with pytest.raises(tf.TmaflowError, match=match):
        kernels.attention(q, k, v, **kw)


@pytest.mark.parametrize("d,causal,keys,q_stages,k_stages,v_stages,split",
                         [(64, False, 128, 1, 4, 4, False), (64, True, 128, 2, 4, 4, False),
                          (128, False, 176, 1, 2, 2, True), (128, True, 128, 1, 3, 3, True),
                          (256, False, 64, 1, 3, 2, True)])
def test_attention_plan_fits_shared_memory_with_several_stages(d, causal, keys, q_stages, k_stages, v_stages, split):
    """Separate K and V pipelines with equal stages (up to four), K taking any bytes left over,
    then a second Q stage if its bytes are left (but at head dim 64 without a causal mask: one
    whole Q buffer measured faster); 176-key tiles at head dim 128 without a causal mask (the
    measured head dims' plans). Causal dense plans pair row blocks (PAIRED). Otherwise one Q
    buffer is split in two stages of 64 rows (Q_SPLIT), one a consumer warpgroup, released by
    its 4 warps."""
    plan = attention_plan(d, causal)
    assert plan.layout.total_bytes <= HOPPER_SMEM_LIMIT and plan.spec_k.box == (1, keys, 64) and plan.keys == keys
    assert [(p.name, p.stages) for p in plan.layout.items[:3]] == [("qp", q_stages * (1 + split)), ("kp", k_stages),
                                                                   ("vp", v_stages)]
    assert plan.spec_q.box == (1, 64 if split else 128, 64) and plan.layout.items[0].consumers == (4 if split else 8)
    assert plan.defines["Q_STAGES"] == q_stages and plan.defines.get("PAIRED", 0) == int(causal)
    assert plan.defines.get("Q_SPLIT", 0) == int(split)
    whole = attention_plan(d, causal, q_split=False)
    assert [p.stages for p in whole.layout.items[:3]] == [q_stages, k_stages, v_stages] and "Q_SPLIT" not in whole.defines


@pytest.mark.parametrize("d,causal,keys,stages", [(128, False, 128, [1, 3, 3]), (256, False, 80, [1, 2, 2]),
                                                  (128, True, 176, [1, 2, 2])])
def test_attention_plan_keys_forced_and_refused(d, causal, keys, stages):
    """``keys`` replaces keys_per_tile's choice (the A/B's BLOCK_N): the stages follow its
    bytes; keys off the 16-key step or too many for shared memory are refused by name."""
    plan = attention_plan(d, causal, keys=keys)
    assert plan.keys == keys and plan.defines["BLOCK_N"] == keys and plan.spec_k.box == (1, keys, 64)
    assert [p.stages for p in plan.layout.items[1:3]] == stages[1:] and plan.layout.total_bytes <= HOPPER_SMEM_LIMIT
    for bad in (72, 0, 272, 256 if d == 256 else 512):
        with pytest.raises(tf.TmaflowError, match=rf"attention: keys={bad} must be a multiple of 16 up to 256 "
                                                  "whose Q tile and two K and V stages fit shared memory"):
            attention_plan(d, causal, keys=bad)


@pytest.mark.parametrize("d,causal,one_q", [(64, False, 1), (64, True, 0), (128, False, 1), (128, True, 1),
                                            (256, False, 1), (256, True, 1)])
def test_dense_plans_prefetch_nothing_into_l2(d, causal, one_q):
    """A second Q buffer loads the next work tile's Q a whole tile ahead where it fits; plans of
    one Q buffer do not prefetch the next tile into L2 (L2_PREFETCH, measured 1-3% slower on an
    H200, H200 round 2) unless asked through the define; varlen plans do neither, nor STORE16."""
    plan = attention_plan(d, causal)
    assert "L2_PREFETCH" not in plan.defines and plan.defines["Q_STAGES"] == 2 - one_q
    assert "L2_PREFETCH" not in attention_plan(d, causal, varlen=True).defines
    sass = attention_kernel(plan, "bfloat16").sass()
    assert "UTMAPF" not in sass
    if one_q:
        asked = plan._replace(defines={**plan.defines, "L2_PREFETCH": 1})
        assert "UTMAPF" in attention_kernel(asked, "bfloat16").sass()
    # STORE16 (dense): O stored 16 B a lane, 8 columns of one row (d / 16 stores a thread),
    # beside the 4-byte stores an out at a 4-byte boundary takes
    assert plan.defines["STORE16"] == 1 and attention_plan(d, causal, varlen=True).defines["STORE16"] == 1
    assert sass.count("STG.E.128") == d // 16 and "STG.E " in sass


def test_attention_plan_q_split_forced_with_varlen_compiles():
    """Varlen plans split a single Q buffer as dense plans do, but at V head dims 208-240 (spills)
    and where two buffers fit (tools/experiments/varlen_ab.py compares);
    forced, each Q buffer is two 64-row stages and the kernel builds without spills."""
    if varlen_dynamic():  # the counter (NVRTC 13); with the stride (CUDA 12) one whole buffer
        assert attention_plan(128, False, varlen=True).defines["Q_SPLIT"] == 1
        assert attention_plan(64, False, varlen=True).defines["Q_STAGES"] == 2  # two whole buffers
    else:
        plan = attention_plan(128, False, varlen=True)
        assert "Q_SPLIT" not in plan.defines and plan.defines["Q_STAGES"] == 1
    assert "Q_SPLIT" not in attention_plan(64, False, varlen=True).defines
    assert not any("Q_SPLIT" in attention_plan(d, False, varlen=True).defines for d in (208, 224, 240))
    assert "Q_SPLIT" not in attention_plan(128, False, varlen=True, q_split=False).defines
    split = attention_plan(128, False, varlen=True, q_split=True)
    assert split.defines["Q_SPLIT"] == 1 and split.layout.items[0].stages == 2
    kernel = attention_kernel(split, "bfloat16")
    assert compiler.wgmma_pipeline_notes(kernel.program.log) == []
    assert kernel.resources.spills == 0 and kernel.resources.stack_frame == 0, kernel.resources
    with pytest.raises(tf.TmaflowError, match=r"attention: q_split=1 must be True or False"):
        attention_plan(128, False, q_split=1)


def test_attention_plan_q_stages_forced_and_refused():
    one = attention_plan(64, True, q_stages=1, q_split=False)
    assert [p.stages for p in one.layout.items[:3]] == [1, 4, 4] and one.defines["Q_STAGES"] == 1
    halves = attention_plan(64, True, q_stages=1)  # one Q buffer: split by default
    assert [p.stages for p in halves.layout.items[:3]] == [2, 4, 4] and halves.defines["Q_SPLIT"] == 1
    with pytest.raises(tf.TmaflowError, match=r"attention: q_stages=3 must be 1 or 2"):
        attention_plan(64, True, q_stages=3)


DIMS = [(d, d) for d in HEAD_DIMS] + [(192, 128), (128, 64), (64, 256), (256, 128)]


@pytest.mark.parametrize("d,dv", DIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_every_head_dim_plans_unpadded_boxes_and_two_stages(d, dv, causal):
    """Boxes one swizzle span wide (64, 32 or 16 columns) tile the head dims exactly, so shared
    memory holds no padding; Q plus two K and two V stages fit; keys a multiple of 16 (the
    P V GEMM's k-step), at most 128 causal and 176 not; dense and varlen plans alike."""
    plan = attention_plan(d, causal, dv)
    for spec, dim in ((plan.spec_q, d), (plan.spec_k, d), (plan.spec_v, dv)):
        span = swizzle_span(dim)
        assert spec.swizzle == f"{span}B" and spec.box[-1] * 2 == span and dim % spec.box[-1] == 0
    stages = {p.name: p.stages for p in plan.layout.items}
    assert stages["qp"] in (1, 2) and stages["kp"] >= stages["vp"] >= 2
    assert plan.layout.total_bytes <= HOPPER_SMEM_LIMIT
    assert plan.keys % 16 == 0 and 16 <= plan.keys <= (128 if causal else 176) and plan.keys == keys_per_tile(d, causal, dv)
    # varlen: at most VARLEN_KEYS keys a tile, a second Q buffer where it costs no K or V stage
    # (head dims up to 80), else one split in two 64-row stages (but at V head dims 208-240)
    one_q = attention_plan(d, causal, dv, q_stages=1, q_split=False)
    assert [p.stages for p in one_q.layout.items[1:3]] == [stages["kp"], stages["vp"]]
    assert "L2_PREFETCH" not in one_q.defines  # measured slower: off
    varlen = attention_plan(d, causal, dv, varlen=True)
    assert varlen.keys == min(plan.keys, VARLEN_KEYS)
    q_stages = varlen.defines["Q_STAGES"]
    single = attention_plan(d, causal, dv, varlen=True, q_stages=1)
    assert q_stages == (2 if max(d, dv) <= 80 and varlen_dynamic() else 1)
    assert [p.stages for p in varlen.layout.items[1:3]] == [p.stages for p in single.layout.items[1:3]]
    split = q_stages == 1 and dv not in _VARLEN_WHOLE_Q and bool(varlen_dynamic())
    assert ("Q_SPLIT" in varlen.defines) == split
    same_keys = attention_plan(d, causal, dv, q_stages=q_stages, q_split=split, keys=varlen.keys)
    dense_defines = {k: v for k, v in same_keys.defines.items() if k not in ("PAIRED", "L2_PREFETCH")}
    paired = {"PAIRED": 1} if causal and dv not in _VARLEN_UNPAIRED else {}  # varlen pairs too, where it fits
    dynamic = {"DYNAMIC_TILES": varlen_dynamic()} if dv not in _VARLEN_UNPAIRED and varlen_dynamic() else {}
    assert varlen.layout.header() == same_keys.layout.header()
    assert varlen.defines == {**dense_defines, "VARLEN": 1, **paired, **dynamic}
    assert varlen.defines["STORE16"] == 1


def test_swizzle_spans_and_the_measured_tiles():
    assert [swizzle_span(d) for d in (32, 48, 64, 80, 96, 128, 160, 192, 240, 256)] == \
        [64, 32, 128, 32, 64, 128, 64, 128, 32, 128]
    assert [keys_per_tile(d, c) for d in (64, 128, 256) for c in (False, True)] == [128, 128, 176, 128, 64, 64]
    assert keys_per_tile(192, False, 128) == 128 and keys_per_tile(192, False) == 112  # MLA's 192 / 128; FA3's 112


def _compiled_widths(kernel) -> set:
    return {int(n) for n in re.findall(r"HGMMA\.64x(\d+)x16", kernel.sass())}


@pytest.mark.parametrize("d,dv,causal,varlen",
                         [(d, dv, causal, True) for d, dv in DIMS for causal in (False, True)] +
                         [(d, dv, causal, False) for d, dv in ((32, 32), (80, 80), (192, 128), (240, 240))
                          for causal in (False, True)])
def test_every_forward_variant_compiles_without_spills(d, dv, causal, varlen):
    """Each head-dim pair, causal or not, varlen (its walk and per-tile bounds take registers the
    dense build's constants do not; causal ones paired but at V head dims 208 and 240; a few
    dense ones too; bf16; tools/attention_variants.py prints the whole table): no local memory,
    no wgmma serialised by ptxas, and the two GEMMs at their widths (S: keys a tile; P V: v's
    head dim)."""
    plan = attention_plan(d, causal, dv, varlen)
    assert ("PAIRED" in plan.defines) == (causal and not (varlen and dv in _VARLEN_UNPAIRED))
    kernel = attention_kernel(plan, "bfloat16")
    assert kernel.resources.spills == 0 and kernel.resources.stack_frame == 0, (d, dv, causal, varlen, kernel.resources)
    assert compiler.wgmma_pipeline_notes(kernel.program.log) == []
    assert _compiled_widths(kernel) == {plan.keys, dv}


def _two_q_buffers_fit(d, dv):
    return min(p.stages for p in attention_plan(d, True, dv, varlen=True, q_stages=2).layout.items[1:3]) >= 2


@pytest.mark.parametrize("d,dv", [(d, dv) for d, dv in DIMS
                                  if dv not in _VARLEN_UNPAIRED and _two_q_buffers_fit(d, dv)])
def test_varlen_causal_with_two_q_buffers_compiles_without_spills(d, dv):
    """Causal varlen plans forced to two Q buffers (tools/experiments/varlen_ab.py's "2q") where
    K and V keep two stages, with the paired walk."""
    plan = attention_plan(d, True, dv, varlen=True, q_stages=2)
    kernel = attention_kernel(plan, "bfloat16")
    assert plan.defines["PAIRED"] == 1 and plan.defines["Q_STAGES"] == 2
    assert kernel.resources.spills == 0 and kernel.resources.stack_frame == 0, (d, dv, kernel.resources)
    assert compiler.wgmma_pipeline_notes(kernel.program.log) == []


def test_varlen_plans_keep_tile_numbers_in_int32():
    """PAIRED's slots reach about 2 x tokens x heads (one-token sequences, two slots a unit):
    from 2^31 on a causal varlen plan keeps a CTA a tile (its numbers stay below tokens x heads,
    which the entry checks)."""
    small = varlen_plan(128, True, 128, (1 << 30) // 64 - 1, 64)
    assert small.defines["PAIRED"] == 1 and small.defines.get("DYNAMIC_TILES", 0) == varlen_dynamic()
    big = varlen_plan(128, True, 128, (1 << 30) // 64, 64)
    assert "PAIRED" not in big.defines and big.layout.header() == attention_plan(128, True, varlen=True).layout.header()
    assert "DYNAMIC_TILES" not in big.defines  # its counter runs a grid past the last tile
    assert not {"PAIRED", "DYNAMIC_TILES"} & set(varlen_plan(128, False, 128, 1 << 30, 64).defines)
    static = varlen_plan(128, True, 128, 4096, 8, static=True)
    assert "DYNAMIC_TILES" not in static.defines and static.defines["PAIRED"] == 1


@pytest.mark.parametrize("d,dv", [(96, 96), (192, 128), (80, 80)])
def test_fp16_variants_compile_without_spills(d, dv):
    for causal, varlen in ((False, True), (True, False), (True, True)):
        kernel = attention_kernel(attention_plan(d, causal, dv, varlen), "float16")
        assert kernel.resources.spills == 0 and kernel.resources.stack_frame == 0, (d, dv, kernel.resources)
        mma = [line for line in kernel.sass().splitlines() if "HGMMA.64x" in line]
        assert mma and not any(".BF16" in line for line in mma)  # fp16 operands: no .BF16 suffix


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [0, 1])
def test_cp_async_attention_compiles_without_spills(d, causal):
    """The pre-Hopper kernel kept from seed 002: mma.sync and ldmatrix, no local memory."""
    from tmaflow.kernels.registry import get_kernel
    k = get_kernel("attention_cp_async", None, defines={"HEAD_DIM": d, "CAUSAL": causal}, file="attention_cp_async")
    sass = k.sass()
    assert k.resources.spills == 0 and k.resources.stack_frame == 0, k.resources
    assert "HMMA" in sass and "LDSM" in sass and "LDGSTS" in sass


def test_cp_async_attention_refuses_head_dim_256():
    with pytest.raises(tf.TmaflowError, match=r"attention_cp_async: head_dim=256 is not supported; use one of \(64, 128\)"):
        kernels.attention_cp_async(arr((1, 2, 64, 256)), arr((1, 2, 64, 256)), arr((1, 2, 64, 256)))


@pytest.mark.parametrize("entry", ["attention", "attention_cp_async"])
def test_attention_refuses_an_out_that_is_not_4_byte_aligned(entry, rng):
    """A lane stores two elements of out as one 4-byte word: an out at an odd element would
    fault on the GPU."""
    q, k, v = (arr((1, 2, 64, 128)) for _ in range(3))
    out = DeviceArray(next(_FAKE) + 2 + 4 * int(rng.integers(0, 4)), q.shape, "bfloat16")
    with pytest.raises(tf.TmaflowError, match=rf"{entry}: out must be contiguous and 4-byte aligned "
                                              rf"\(strides .* at 0x{out.ptr:x}\)"):
        getattr(kernels, entry)(q, k, v, out)


def _cu(*values):
    return np.array(values, np.int32)


_Q, _K = (700, 4, 128), (900, 2, 128)
_CU = arr((4,), "int32")


@pytest.mark.parametrize("q,k,v,cu_q,cu_k,kw,match", [
    (arr((1, 700, 4, 128)), arr(_K), arr(_K), _CU, _CU, {}, r"attention_varlen: q must be 3-D \(tokens, heads, head_dim\)"),
    (arr(_Q, "float32"), arr(_K), arr(_K), _CU, _CU, {}, r"q must be bfloat16 or float16 \(got float32\)"),
    (arr(_Q), arr(_K, "float16"), arr(_K), _CU, _CU, {}, r"k is float16 but q is bfloat16"),
    (arr(_Q), arr(_K), arr((900, 1, 128)), _CU, _CU, {}, r"k \(900, 2, 128\) and v \(900, 1, 128\) must have one token"),
    (arr(_Q), arr((900, 2, 96)), arr(_K), _CU, _CU, {}, r"q's head_dim=128 but k's is 96"),
    (arr((700, 3, 128)), arr(_K), arr(_K), _CU, _CU, {}, r"3 query heads must be a multiple of the 2"),
    (arr((700, 4, 72)), arr((900, 2, 72)), arr((900, 2, 72)), _CU, _CU, {},
     r"q and k's head_dim=72 is not supported; use a multiple of 16 from 32 to 256"),
    (arr(_Q), arr(_K), arr((900, 2, 8)), _CU, _CU, {}, r"v's head_dim=8 is not supported"),
    (arr(_Q), arr((0, 2, 128)), arr((0, 2, 128)), _CU, _CU, {}, r"k and v have no tokens"),
    (arr(_Q, strides=(4 * 256 * 2, 256 * 2, 2)), arr(_K), arr(_K), _CU, _CU, {},
     r"q must be contiguous \(tokens, heads, head_dim\) at a 16-byte boundary"),
    (arr(_Q), arr(_K), arr(_K), arr((4,), "int64"), _CU, {}, r"cu_seqlens_q must be a 1-D int32 array of batch \+ 1"),
    (arr(_Q), arr(_K), arr(_K), _CU, arr((2, 2), "int32"), {}, r"cu_seqlens_k must be a 1-D int32 array"),
    (arr(_Q), arr(_K), arr(_K), _CU, arr((4,), "int32", strides=(8,)), {}, r"cu_seqlens_k must be contiguous"),
    (arr(_Q), arr(_K), arr(_K), [0, 5, 3], [0, 5, 9], {}, r"cu_seqlens_q must never decrease; cu_seqlens_q\[2\]=3 "
     r"is below cu_seqlens_q\[1\]=5"),
    (arr(_Q), arr(_K), arr(_K), _cu(0, 300, 701), _cu(0, 1, 2), {}, r"cu_seqlens_q runs from 0 to 701; it must stay "
     r"within the 700 tokens of its tensor"),
    (arr(_Q), arr(_K), arr(_K), _cu(0, 1), _cu(-1, 2), {}, r"cu_seqlens_k runs from -1 to 2"),
    (arr(_Q), arr(_K), arr(_K), [0, 10, 20], [0, 5, 205], {"max_seqlen_k": 100},
     r"sequence 1 of cu_seqlens_k has 200 tokens, more than max_seqlen_k=100"),
    (arr(_Q), arr(_K), arr(_K), [0.0, 1.5], [0, 1], {}, r"cu_seqlens_q must be batch \+ 1 int32 prefix sums \(got "
     r"\(2,\) float64\)"),
    (arr(_Q), arr(_K), arr(_K), [0, 1, 2], [0, 1], {}, r"cu_seqlens_q has 3 values but cu_seqlens_k has 2"),
    (arr(_Q), arr(_K), arr(_K), _CU, _CU, {"max_seqlen_q": -1}, r"max_seqlen_q=-1 must be"),
    (arr(_Q), arr(_K), arr(_K), _CU, _CU, {"max_seqlen_k": 2.0}, r"max_seqlen_k=2.0 must be an int"),
    (arr(_Q), arr(_K), arr(_K), _CU, _CU, {"causal": "yes"}, r"attention_varlen: causal='yes' must be True or False"),
    (arr(_Q), arr(_K), arr(_K), _CU, _CU, {"scale": 0.0}, r"attention_varlen: scale=0.0 must be a positive"),
    (arr(_Q), arr(_K), arr(_K), _CU, _CU, {"out": arr((700, 4, 64))}, r"out must be a \(700, 4, 128\) bfloat16 array"),
])
def test_attention_varlen_refuses_bad_arguments_by_name(q, k, v, cu_q, cu_k, kw, match):
    kw = {"max_seqlen_q": 512, "max_seqlen_k": 512, **kw}
    with pytest.raises(tf.TmaflowError, match=match):
        kernels.attention_varlen(q, k, v, cu_q, cu_k, kw.pop("max_seqlen_q"), kw.pop("max_seqlen_k"), **kw)


def test_attention_varlen_out_takes_v_head_dim_and_4_byte_alignment(rng):
    q, k, v = arr((100, 4, 192)), arr((100, 2, 192)), arr((100, 2, 128))
    with pytest.raises(tf.TmaflowError, match=r"out must be a \(100, 4, 128\) bfloat16 array"):
        kernels.attention_varlen(q, k, v, [0, 100], [0, 100], 100, 100, arr((100, 4, 192)))
    out = DeviceArray(next(_FAKE) + 2 + 4 * int(rng.integers(0, 4)), (100, 4, 128), "bfloat16")
    with pytest.raises(tf.TmaflowError, match=rf"attention_varlen: out must be contiguous and 4-byte aligned "
                                              rf"\(strides .* at 0x{out.ptr:x}\)"):
        kernels.attention_varlen(q, k, v, [0, 100], [0, 100], 100, 100, out)
