"""kernels.attention_backward without a GPU: argument checks, the kernels compiling for sm_90a,
the launch plan, and the float64 reference against finite differences."""
import itertools
import warnings

import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.kernels import attention_backward_sm90
from tmaflow.kernels.attention_backward_entry import HEAD_DIMS, backward_smem, slices
from tmaflow.kernels.attention_backward_sm90 import (DQ_BULK_HEAD_DIMS, DQ_ROWS_DEFINES, DQ_TILE_DEFINES,
                                                     DQ_TILE_HEAD_DIMS, KEYS, ROWS, SEQ_PAD, SM90_HEAD_DIMS, STAGES,
                                                     VARLEN_BEFORE, Sm90VarlenPlan, defines_smem, dq_buffer_bytes,
                                                     kernel_smem, main_defines, padded_rows, sm90_smem, step_rows,
                                                     varlen_dq_accum, varlen_key_blocks, varlen_lse_stride,
                                                     varlen_tiles_per_head)
from tmaflow.kernels.registry import get_kernel
from tmaflow.launch import compiler
from tmaflow.runtime.memory import DeviceArray
from tmaflow.tma.layout import HOPPER_SMEM_LIMIT

from attention_reference import attention_backward, attention_forward

_FAKE = itertools.count(1 << 32, 1 << 24)


def arr(shape, dtype="bfloat16", strides=None, offset=0):
    return DeviceArray(next(_FAKE) + offset, shape, dtype, strides)  # one range each: no aliasing


def args(b=1, hq=2, hkv=2, sq=64, skv=64, d=64, dtype="bfloat16"):
    return [arr((b, hq, sq, d), dtype), arr((b, hkv, skv, d), dtype), arr((b, hkv, skv, d), dtype),
            arr((b, hq, sq, d), dtype), arr((b, hq, sq, d), dtype), arr((b, hq, sq), "float32")]


def _with(index, value, **shape):
    a = args(**shape)
    a[index] = value
    return a


@pytest.mark.parametrize("given,kw,match", [
    (args(d=72), {}, r"attention_backward: head_dim=72 is not supported"),
    (args(d=272), {}, r"head_dim=272 is not supported"),
    (args(hq=3, hkv=2), {}, r"3 query heads must be a multiple of the 2"),
    (args(dtype="float32"), {}, r"q must be bfloat16 or float16 \(got float32\)"),
    (_with(3, arr((1, 2, 64, 64), "float16")), {}, r"out must be \(1, 2, 64, 64\) bfloat16, q's shape with v's head_dim \(got \(1, 2, 64, 64\) float16\)"),
    (_with(4, arr((1, 2, 63, 64))), {}, r"dout must be \(1, 2, 64, 64\) bfloat16, q's shape"),
    (_with(4, arr((1, 2, 64, 64), strides=(16384 * 2, 8192 * 2, 128 * 2, 2))), {}, r"dout must be contiguous"),
    (_with(5, arr((1, 2, 64), "bfloat16")), {}, r"lse must be a contiguous \(1, 2, 64\) float32 array"),
    (_with(5, arr((1, 2, 65), "float32")), {}, r"lse must be a contiguous \(1, 2, 64\) float32 array .* got \(1, 2, 65\)"),
    (_with(0, arr((1, 2, 64, 64), offset=8)), {}, r"q at 0x[0-9a-f]+ must be 16-byte aligned"),
    (_with(2, arr((1, 2, 64, 64), offset=4)), {}, r"v at 0x[0-9a-f]+ must be 16-byte aligned"),
    (args(), {"causal": 1}, r"attention_backward: causal=1 must be True or False"),
    (args(), {"deterministic": "yes"}, r"deterministic='yes' must be True or False"),
    (args(), {"scale": 0.0}, r"attention_backward: scale=0.0 must be a positive"),
    (args(), {"dq": arr((1, 2, 64, 64), "float16")}, r"attention_backward: dq must be a \(1, 2, 64, 64\) bfloat16 array"),
    (args(), {"dk": arr((1, 2, 64, 64), strides=(16384 * 2, 8192 * 2, 128 * 2, 2))}, r"dk must be contiguous"),
])
def test_attention_backward_refuses_bad_arguments_by_name(given, kw, match):
    with pytest.raises(tf.TmaflowError, match=match):
        kernels.attention_backward(*given, **kw)


def test_attention_backward_refuses_gradients_that_overlap_inputs_or_each_other():
    q, k, v, out, dout, lse = args()
    with pytest.raises(tf.TmaflowError, match=r"attention_backward: dq: out \(bytes .*\) overlaps dout"):
        kernels.attention_backward(q, k, v, out, dout, lse, dq=DeviceArray(dout.ptr, dout.shape, "bfloat16"))
    dk = arr(k.shape)
    with pytest.raises(tf.TmaflowError, match=r"attention_backward: dv: out \(bytes .*\) overlaps dk"):
        kernels.attention_backward(q, k, v, out, dout, lse, dk=dk, dv=DeviceArray(dk.ptr, k.shape, "bfloat16"))


@pytest.mark.parametrize("d", [16, 64, 80, 128, 192, 256])
@pytest.mark.parametrize("causal,deterministic,fp16", [(False, False, False), (True, True, True)])
def test_attention_backward_kernels_compile_for_sm90a(d, causal, deterministic, fp16):
    defines = {"HEAD_DIM": d, "CAUSAL": int(causal), "DETERMINISTIC": int(deterministic),
               **({"FP16": 1} if fp16 else {})}
    for name in ("attention_bwd_prep", "attention_bwd", "attention_bwd_dq"):
        program = get_kernel(name, None, defines=defines, file="attention_backward").program
        assert program.cubin and program.resources is not None, (name, d)
        assert program.resources.registers <= 255


def test_attention_backward_plan_fits_every_head_dim():
    for d in HEAD_DIMS:
        assert backward_smem(d) <= HOPPER_SMEM_LIMIT, d
        assert slices(d) == (1 if d <= 128 else 2)
    assert HEAD_DIMS[0] == 16 and HEAD_DIMS[-1] == 256 and len(HEAD_DIMS) == 16


@pytest.mark.parametrize("b,hq,hkv,sq,skv,causal", [(1, 2, 1, 5, 7, True), (2, 2, 2, 6, 3, True),
                                                    (1, 4, 2, 4, 4, False), (1, 1, 1, 1, 1, False)])
def test_reference_backward_matches_finite_differences(rng, b, hq, hkv, sq, skv, causal):
    """The float64 reference's gradients against central differences of its forward (more keys
    than queries, fewer, grouped heads; causal top-left)."""
    d, scale = 8, 0.7
    q, k, v = (rng.standard_normal(s) for s in ((b, hq, sq, d), (b, hkv, skv, d), (b, hkv, skv, d)))
    dout = rng.standard_normal((b, hq, sq, d))
    grads = attention_backward(q, k, v, dout, causal, scale)
    for which, (x, grad) in enumerate(zip((q, k, v), grads)):
        numeric = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            plus, minus = [a.copy() for a in (q, k, v)], [a.copy() for a in (q, k, v)]
            plus[which][idx] += 1e-6
            minus[which][idx] -= 1e-6
            numeric[idx] = ((attention_forward(*plus, causal, scale)[0] -
                             attention_forward(*minus, causal, scale)[0]) * dout).sum() / 2e-6
        np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-7, err_msg="qkv"[which])


def test_reference_lse_is_the_log_sum_exp_of_the_scaled_scores(rng):
    q, k, v = (rng.standard_normal((1, 1, 3, 4)) for _ in range(3))
    _, lse = attention_forward(q, k, v, False, 0.5)
    s = 0.5 * q[0, 0] @ k[0, 0].T
    np.testing.assert_allclose(lse[0, 0], np.log(np.exp(s).sum(-1)))


@pytest.mark.parametrize("d", SM90_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic,fp16", [(False, False), (True, False), (False, True), (True, True)])
def test_sm90_backward_compiles_without_spills(d, causal, deterministic, fp16):
    """Every variant of the Hopper kernel (head dims 64 and 128) fits its consumers' registers
    with nothing on the stack, ptxas keeps its wgmma pipeline (no C75xx note: a serialized one
    is correct and 20-40% slower), and its shared memory fits the SM."""
    defines = main_defines(d, causal, deterministic, fp16)
    assert defines["BLOCK_M"] == step_rows(d)
    assert defines["DQ_BULK"] == int(d in DQ_BULK_HEAD_DIMS or d in DQ_TILE_HEAD_DIMS)
    for name in ("attention_bwd_sm90", "attention_bwd_sm90_prep"):
        _assert_clean(get_kernel(name, None, defines=defines, file="attention_backward_sm90").program, defines)
    assert sm90_smem(d) <= HOPPER_SMEM_LIMIT


def _assert_clean(program, defines):
    assert program.resources.spills == 0 and program.resources.stack_frame == 0, (defines, program.resources)
    assert compiler.wgmma_pipeline_notes(program.log) == [], defines


@pytest.mark.parametrize("d,rows,dq_bulk,dq_early", [(64, 64, 0, 1), (64, 64, 1, 1), (64, 128, 0, 0), (128, 64, 0, 1),
                                                   (128, 64, 1, 0)])
@pytest.mark.parametrize("causal,deterministic", [(False, False), (True, True)])
def test_sm90_backward_other_schedules_compile_and_fit_the_reserved_smem(d, rows, dq_bulk, dq_early, causal,
                                                                         deterministic):
    """The variants an A/B selects beside the plan (64-row steps at head dim 64, the other dQ
    path, round 2's dQ after dK) compile clean and fit what every launch reserves."""
    defines = {"HEAD_DIM": d, "CAUSAL": int(causal), "DETERMINISTIC": int(deterministic), "STAGES": STAGES,
               "BLOCK_M": rows, "DQ_BULK": dq_bulk, "DQ_EARLY": dq_early}
    _assert_clean(get_kernel("attention_bwd_sm90", None, defines=defines, file="attention_backward_sm90").program,
                  defines)
    assert kernel_smem(d, rows, bool(dq_bulk)) <= sm90_smem(d) <= HOPPER_SMEM_LIMIT


@pytest.mark.parametrize("stages,dq_bufs,dq_pack,dv_first", [(2, 2, 1, 0), (2, 1, 0, 0), (3, 1, 1, 0), (3, 1, 0, 1),
                                                              (2, 2, 1, 1)])
@pytest.mark.parametrize("causal,deterministic", [(False, False), (False, True), (True, False), (True, True)])
def test_sm90_backward_head_dim_128_variants_compile_and_fit_the_reserved_smem(stages, dq_bufs, dq_pack, dv_first,
                                                                               causal, deterministic):
    """Head dim 128's A/B variants (two dQ buffers in packed rows with two Q / dO stages; dV
    before dP is waited for, with 240 registers a consumer; the levers apart) compile clean
    (not both levers deterministic: its dQ warp spills at 24 registers) and fit what every
    launch reserves; two buffers in padded rows do not fit beside two stages."""
    if dv_first and dq_bufs == 2 and deterministic:
        pytest.skip("the A/B does not run it: the producer spills at 24 registers")
    defines = {**main_defines(128, causal, deterministic, False), "STAGES": stages, "DQ_BUFS": dq_bufs,
               "DQ_PACK": dq_pack, "DV_FIRST": dv_first, "CONSUMER_REGS": 240 if dv_first else 232,
               **({"DQ_WARPS": 1} if dq_bufs == 1 else {})}  # two dQ warps need a buffer each
    program = get_kernel("attention_bwd_sm90", None, defines=defines, file="attention_backward_sm90").program
    if dv_first and dq_bufs == 2:  # "both", an A/B variant: NVRTC 13.5 spills 8 B (13.0, the GPU image's: none)
        assert program.resources.spills <= 16 and program.resources.stack_frame <= 8, (defines, program.resources)
        assert compiler.wgmma_pipeline_notes(program.log) == [], defines
    else:
        _assert_clean(program, defines)
    assert kernel_smem(128, ROWS, True, stages, dq_bufs, bool(dq_pack)) <= sm90_smem(128) <= HOPPER_SMEM_LIMIT
    assert kernel_smem(128, ROWS, True, 2, 2, False) > HOPPER_SMEM_LIMIT


@pytest.mark.parametrize("causal", [False, True])
def test_sm90_backward_rotated_walk_compiles_clean(causal):
    defines = {**main_defines(128, causal, False, False), "ROTATE": 1}
    _assert_clean(get_kernel("attention_bwd_sm90", None, defines=defines, file="attention_backward_sm90").program,
                  defines)


def test_sm90_dv_first_at_232_registers_is_serialized():
    """Why DV_FIRST takes 240 registers a consumer: at 232 ptxas spills and serializes the wgmmas."""
    defines = {**main_defines(128, False, False, False), "DV_FIRST": 1}
    with warnings.catch_warnings():  # the pipeline warning (only where it compiles, not from the cache)
        warnings.simplefilter("ignore", tf.TmaflowWarning)
        program = get_kernel("attention_bwd_sm90", None, defines=defines, file="attention_backward_sm90").program
    assert program.resources.spills > 0 and compiler.wgmma_pipeline_notes(program.log) != []


def test_sm90_wide_steps_without_room_for_the_dq_buffers_are_refused_at_compile_time():
    defines = {"HEAD_DIM": 64, "STAGES": STAGES, "BLOCK_M": 128, "DQ_BULK": 1}
    with pytest.raises(tf.TmaflowError, match="STAGES do not fit shared memory"):
        get_kernel("attention_bwd_sm90", None, defines=defines, file="attention_backward_sm90").program
    assert kernel_smem(64, 128, True) > HOPPER_SMEM_LIMIT


@pytest.mark.parametrize("d", SM90_HEAD_DIMS)
@pytest.mark.parametrize("causal,deterministic,fp16", [(False, False, False), (True, False, True), (False, True, False),
                                                       (True, True, False)])
@pytest.mark.parametrize("before", [False, True])
def test_sm90_varlen_backward_compiles_without_spills(d, causal, deterministic, fp16, before, monkeypatch):
    """The VARLEN build (attention_varlen_backward at head dims 64 and 128) takes the dense
    plan's defines (128-row steps at head dim 64, two dQ buffers at 128, dQ tiles) and keeps the dense
    kernel's registers: nothing on the stack, no serialized wgmma (its sequence bookkeeping
    must not take the consumers' registers); so does the schedule it had before (the A/B's)."""
    main = main_defines(d, causal, deterministic, fp16, varlen=True)
    assert main == {**main_defines(d, causal, deterministic, fp16), "VARLEN": 1}  # the dense plan's, tiles too
    if before:
        main = {**main, **VARLEN_BEFORE[d]}
    assert bool(main.get("DQ_TILE")) == (not before and d in DQ_TILE_HEAD_DIMS)
    prep = {"HEAD_DIM": d, "DETERMINISTIC": int(deterministic), "VARLEN": 1, **({"FP16": 1} if fp16 else {})}
    kernels_ = [("attention_bwd_sm90", main), ("attention_bwd_sm90_varlen_prep", prep)]
    if main.get("DQ_TILE"):
        kernels_.append(("attention_bwd_sm90_varlen_dq_tile", main))
    for name, defs in kernels_:
        program = get_kernel(name, None, defines=defs, file="attention_backward_sm90").program
        assert program.resources is not None, (name, defs, program.log[-3000:])  # which ptxas report is missing
        assert program.resources.spills == 0 and program.resources.stack_frame == 0, (name, defs, program.resources)
        assert compiler.wgmma_pipeline_notes(program.log) == [], (name, defs)
    assert max(sm90_smem(d), defines_smem(d, main)) <= HOPPER_SMEM_LIMIT


@pytest.mark.parametrize("d", SM90_HEAD_DIMS)
@pytest.mark.parametrize("causal,deterministic,fp16", [(False, False, False), (True, False, True), (False, True, False),
                                                       (True, True, False)])
def test_sm90_dq_tiles_compile_clean_and_fit(d, causal, deterministic, fp16):
    """DQ_TILE (the accumulator in tiles, one bulk reduction a step) over the plan's schedule:
    the main, prep and tile conversion kernels compile clean, the launch's shared memory (the
    larger of what every launch reserves and the built defines' own) fits the SM, and a tile
    (the shared buffer's image) is whole 16-byte pieces."""
    defines = {**main_defines(d, causal, deterministic, fp16), **DQ_TILE_DEFINES[d]}
    for name in ("attention_bwd_sm90", "attention_bwd_sm90_prep", "attention_bwd_sm90_dq_tile"):
        _assert_clean(get_kernel(name, None, defines=defines, file="attention_backward_sm90").program, defines)
    assert max(sm90_smem(d), defines_smem(d, defines)) <= HOPPER_SMEM_LIMIT
    rows, pack = int(defines["BLOCK_M"]), bool(defines.get("DQ_PACK", 0))
    assert dq_buffer_bytes(d, rows, pack) % 16 == 0 and dq_buffer_bytes(d, rows, pack) >= rows * d * 4


def test_sm90_dq_tiles_default_to_the_kernels_defaults_in_the_smem_sum():
    assert defines_smem(128, {}) == kernel_smem(128, ROWS, True, 2, 1, False)
    assert defines_smem(64, {"BLOCK_M": 128, "DQ_BULK": 0, "STAGES": 3}) == kernel_smem(64, 128, False, 3)
    assert defines_smem(64, {"BLOCK_M": 128, "DQ_BULK": 1, "STAGES": 3}) > HOPPER_SMEM_LIMIT


def test_sm90_dq_tiles_as_a_plan_default_go_to_both_plans(monkeypatch):
    from tmaflow.kernels import attention_backward_sm90 as sm90
    monkeypatch.setattr(sm90, "DQ_TILE_HEAD_DIMS", (64, 128))
    for d in SM90_HEAD_DIMS:
        for varlen_ in (False, True):
            assert main_defines(d, False, True, False, varlen=varlen_).items() >= DQ_TILE_DEFINES[d].items()
    monkeypatch.setattr(sm90, "DQ_TILE_HEAD_DIMS", ())
    assert "DQ_TILE" not in main_defines(128, False, True, False, varlen=True)


@pytest.mark.parametrize("extra,match", [({"DQ_BULK": 0}, r"DQ_TILE: the bulk dQ path's \(DQ_BULK\)"),
                                         ({"VARLEN": 1, "DQ_HEAD_MAJOR": 1}, "DQ_TILE and DQ_HEAD_MAJOR")])
def test_sm90_dq_tiles_are_refused_without_bulk_reductions_or_with_a_head_major_accumulator(extra, match):
    defines = {**main_defines(128, False, False, False), "DQ_TILE": 1, **extra}
    with pytest.raises(tf.TmaflowError, match=match):
        get_kernel("attention_bwd_sm90", None, defines=defines, file="attention_backward_sm90").program


@pytest.mark.parametrize("lens", [[2048] * 8, [77, 0, 1, 130, 64, 5, 200], [0, 0, 1], [63, 64, 65, 1, 3, 4],
                                  [127, 128, 129, 255, 0, 383, 66, 2], [128] * 5, [1] * 300])
@pytest.mark.parametrize("rows", [ROWS, 2 * ROWS])
@pytest.mark.parametrize("before,after", [(0, 0), (3, 5)])
def test_sm90_varlen_dq_tiles_of_sequences_are_disjoint_and_fit(lens, rows, before, after):
    """DQ_TILE over packed sequences (the kernel's varlen_tile0): sequence b's query blocks of
    ``rows`` at tiles (cu_q[b] + b rows) // rows + i, no tile shared by two sequences, all of
    them below a head's varlen_tiles_per_head of the tokens (tokens outside the sequences too)."""
    cu = before + np.concatenate([[0], np.cumsum(lens)])
    total = int(cu[-1]) + after
    per_head = varlen_tiles_per_head(total, len(lens), rows)
    used = [(int(c) + b * rows) // rows + i for b, (c, n) in enumerate(zip(cu, lens)) for i in range(-(-n // rows))]
    assert len(set(used)) == len(used) == sum(-(-n // rows) for n in lens)
    assert max(used, default=0) < per_head
    # the conversion's token -> (tile, row) inverts the dQ warp's (tile, row) -> token
    seen = {}
    for b, (c, n) in enumerate(zip(cu, lens)):
        for t in range(int(c), int(c) + n):
            seen[((int(c) + b * rows) // rows + (t - int(c)) // rows, (t - int(c)) % rows)] = t
    assert len(seen) == sum(lens)


@pytest.mark.parametrize("d", SM90_HEAD_DIMS)
@pytest.mark.parametrize("deterministic", [False, True])
def test_sm90_varlen_plan_sizes_its_tiles(d, deterministic):
    """The varlen plan's accumulator: heads x varlen_tiles_per_head tiles of the shared dQ
    buffer's bytes under DQ_TILE (the plan's); rows (tokens x heads x D) under DQ_ROWS_DEFINES."""
    defines = main_defines(d, False, deterministic, False, varlen=True)
    step = step_rows(d)
    tiles, floats = varlen_dq_accum(700, 4, 3, d, defines)
    assert tiles == 4 * ((700 + 3 * step) // step + 1)
    assert floats * 4 == tiles * dq_buffer_bytes(d, step, bool(defines.get("DQ_PACK"))) >= tiles * step * d * 4
    assert varlen_dq_accum(700, 4, 3, d, {**defines, **DQ_ROWS_DEFINES[d]}) == (0, 700 * 4 * d)


@pytest.mark.parametrize("d", SM90_HEAD_DIMS)
@pytest.mark.parametrize("causal,deterministic", [(False, False), (True, True)])
@pytest.mark.parametrize("option", [{"DQ_HEAD_MAJOR": 1}, {"PREP_LOADS_FIRST": 0}, {}])
def test_sm90_varlen_ab_options_compile_without_spills(d, causal, deterministic, option):
    """The varlen A/B options (a head-major dQ accumulator with its conversion kernel, over
    dQ rows; the prep's old order; dQ rows, DQ_ROWS_DEFINES) compile for the plan's schedule:
    no stack, no serialized wgmma."""
    option = {**DQ_ROWS_DEFINES[d], **option} if "PREP_LOADS_FIRST" not in option else option
    main = {**main_defines(d, causal, deterministic, False, varlen=True), **option}
    prep = {"HEAD_DIM": d, "DETERMINISTIC": int(deterministic), "VARLEN": 1, **option}
    kernels_ = [("attention_bwd_sm90", main), ("attention_bwd_sm90_varlen_prep", prep)]
    if "DQ_HEAD_MAJOR" in option:
        kernels_.append(("attention_bwd_sm90_varlen_dq", prep))
    for name, defs in kernels_:
        program = get_kernel(name, None, defines=defs, file="attention_backward_sm90").program
        assert program.resources is not None, (name, defs, program.log[-3000:])
        assert program.resources.spills == 0 and program.resources.stack_frame == 0, (name, defs, program.resources)
        assert compiler.wgmma_pipeline_notes(program.log) == [], (name, defs)


def test_sm90_varlen_steps_wider_than_the_padding_are_refused_at_compile_time():
    defines = {**main_defines(64, False, False, False, varlen=True), "BLOCK_M": 2 * SEQ_PAD}
    with pytest.raises(tf.TmaflowError, match="VARLEN: a step of at most kSeqPad rows"):
        get_kernel("attention_bwd_sm90", None, defines=defines, file="attention_backward_sm90").program


@pytest.mark.parametrize("lens", [[2048] * 8, [77, 0, 1, 130, 64, 5, 200], [0, 0, 1], [63, 64, 65, 1, 3, 4],
                                  [127, 128, 129, 255, 0, 383, 2]])
def test_sm90_varlen_workspace_rows(lens):
    """Each sequence's LSE / Delta rows (as attention_backward_sm90.cu's lse_row0 places them)
    start 16-byte aligned and are followed by SEQ_PAD padding rows (the prep's), which overlap
    no other sequence's rows and fit a head's stride; a step of 64 or 128 rows reads only them;
    the grid has a CTA for every key block."""
    cu = np.concatenate([[0], np.cumsum(lens)])
    stride = varlen_lse_stride(int(cu[-1]), len(lens))
    assert stride % 4 == 0
    spans = [((c + 3) // 4 * 4 + b * (SEQ_PAD + 4), n + SEQ_PAD) for b, (c, n) in enumerate(zip(cu, lens))]
    assert all(start % 4 == 0 for start, _ in spans)
    assert all(s0 + n0 <= s1 for (s0, n0), (s1, _) in zip(spans, spans[1:]))
    assert spans[-1][0] + spans[-1][1] <= stride
    assert all(padded_rows(n, rows) <= n + SEQ_PAD for n in lens for rows in (ROWS, 2 * ROWS))
    assert varlen_key_blocks(int(cu[-1]), len(lens)) >= sum(-(-n // KEYS) for n in lens)


def test_sm90_workspace_rows_are_whole_blocks():
    assert [padded_rows(n) for n in (1, 63, 64, 65, 1023)] == [64, 64, 64, 128, 1024]
    assert [padded_rows(n, 128) for n in (1, 128, 129)] == [128, 128, 256]
    assert [step_rows(d) for d in (64, 128)] == [128, 64]
