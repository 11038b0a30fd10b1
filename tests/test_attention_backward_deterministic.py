"""The deterministic attention backward's rotated walk (attention_backward_sm90.cu's DET_ROTATE)
without a GPU: its builds compile clean, its chain order (rotated_chain_rank, the kernel's
chain_rank) is a total order of arrival whose waits form no cycle in a lockstep model (while
every CTA of a group is resident), the model's finish against the chain from key block 0, and
the persistent plan's slots."""
import numpy as np
import pytest

from tmaflow.errors import CompileError
from tmaflow.kernels.attention_backward_sm90 import (DET_DIAGNOSTICS, DET_ROTATE_DEFINES, DQ_ROWS_DEFINES,
                                                     ROTATE_ONE_BUFFER, ROTATE_ONE_DQ_WARP, SM90_HEAD_DIMS,
                                                     TWO_DQ_WARPS, defines_smem, main_defines,
                                                     persistent_slots, rotated_chain_rank, sm90_smem)
from tmaflow.kernels.registry import get_kernel
from tmaflow.launch import compiler
from tmaflow.tma.layout import HOPPER_SMEM_LIMIT


def _program(defines):
    return get_kernel("attention_bwd_sm90", None, defines=defines, file="attention_backward_sm90").program


@pytest.mark.parametrize("d", SM90_HEAD_DIMS)
@pytest.mark.parametrize("fp16", [False, True])
def test_rotated_walk_compiles_clean(d, fp16):
    """The plan's schedule with DET_ROTATE (head dim 128: two dQ buffers), and the ones GPU
    tests and the A/B override (head dim 64's 64-row steps, OVERLAP, and dQ rows; head dim 128's
    one buffer, in tiles and in rows: two buffers of rows spill in the dQ warp, no plan's): no
    stack, no serialized wgmma, what the plan reserves fits."""
    plan = {**main_defines(d, False, True, fp16), **DET_ROTATE_DEFINES[d]}
    overrides = [{}] + {64: [DQ_ROWS_DEFINES[64]] + ([{"BLOCK_M": 64}] if not fp16 else []),
                         128: [ROTATE_ONE_BUFFER, {**ROTATE_ONE_BUFFER, **DQ_ROWS_DEFINES[128]}]}[d]
    for extra in overrides:
        defines = {**plan, **extra}
        program = _program(defines)
        assert program.resources.spills == 0 and program.resources.stack_frame == 0, (defines, program.resources)
        assert compiler.wgmma_pipeline_notes(program.log) == [], defines
        assert max(defines_smem(d, defines), sm90_smem(d)) <= HOPPER_SMEM_LIMIT  # what the plan reserves


@pytest.mark.parametrize("fp16", [False, True])
def test_two_dq_warps_and_the_diagnostics_compile_clean(fp16):
    """Head dim 128: the A/B's builds (one dQ warp in the rotated walk, two in the chain from key
    block 0 and the causal chain with two buffers, the DET_DIAG diagnostics) have no stack and no
    serialized wgmma, and fit what the plan reserves."""
    full, causal = main_defines(128, False, True, fp16), main_defines(128, True, True, fp16)
    rotate = {**full, **DET_ROTATE_DEFINES[128]}
    assert rotate["DQ_WARPS"] == 2 and rotate["DQ_BUFS"] == 2  # the plan's: two warps, a buffer each
    builds = [{**rotate, **ROTATE_ONE_DQ_WARP}, {**full, **TWO_DQ_WARPS}, {**causal, **TWO_DQ_WARPS}]
    builds += [{**rotate, **diag} for diag in DET_DIAGNOSTICS.values()]
    for defines in builds:
        program = _program(defines)
        assert program.resources.spills == 0 and program.resources.stack_frame == 0, (defines, program.resources)
        assert compiler.wgmma_pipeline_notes(program.log) == [], defines
        assert max(defines_smem(128, defines), sm90_smem(128)) <= HOPPER_SMEM_LIMIT


def test_two_dq_warps_need_a_buffer_each():
    """DQ_WARPS=2 over one dQ buffer (the warps would wait on one barrier's phases out of turn)
    is refused at compile time, naming the rule."""
    defines = {**main_defines(128, False, True, False), **DET_ROTATE_DEFINES[128], **ROTATE_ONE_BUFFER, "DQ_WARPS": 2}
    with pytest.raises(CompileError, match=r"DQ_WARPS: 1, or 2 with DQ_BULK and DQ_BUFS 2"):
        _program(defines)


@pytest.mark.parametrize("d", SM90_HEAD_DIMS)
@pytest.mark.parametrize("varlen", [False, True])
def test_no_plan_builds_a_diagnostic(d, varlen):
    """DET_DIAG (sums in no fixed order) is the A/B's only: no plan's defines carry it."""
    for causal in (False, True):
        for deterministic in (False, True):
            for fp16 in (False, True):
                defines = main_defines(d, causal, deterministic, fp16, varlen)
                assert "DET_DIAG" not in defines and "DET_DIAG" not in DET_ROTATE_DEFINES[d]


@pytest.mark.parametrize("d", SM90_HEAD_DIMS)
@pytest.mark.parametrize("causal,deterministic", [(True, True), (False, False)])
def test_rotated_walk_leaves_the_other_modes_alone(d, causal, deterministic):
    """DET_ROTATE applies to the deterministic full attention only: elsewhere the CUBIN is the
    plan's own, byte for byte."""
    defines = main_defines(d, causal, deterministic, False)
    assert _program({**defines, "DET_ROTATE": 1}).cubin == _program(defines).cubin


def _finish(key_blocks: int, per_head: int, start, rank, latency: float) -> float:
    """A lockstep model of one group's chained walk: key block j's step s (query block
    (start(j) + s) % per_head) ends a unit after its step s - 1, and not before `latency` after
    the key block ranked just before it at that query block ended its step there. Steps are
    visited in (step, rank) order, which must put every wait after what it waits for (else
    the waits have a cycle: a deadlock). Returns when the last step ends."""
    where = {}  # (j, query block) -> step
    for j in range(key_blocks):
        for s in range(per_head):
            where[j, (start(j) + s) % per_head] = s
    by_rank = {(i, rank(i, j)): j for j in range(key_blocks) for i in range(per_head)}
    order = sorted(where, key=lambda ji: (where[ji], rank(ji[1], ji[0])))
    end: dict = {}
    for j, i in order:
        s, r = where[j, i], rank(i, j)
        t = (end[j, (start(j) + s - 1) % per_head] if s else 0.0) + 1.0
        if r:
            before = (by_rank[i, r - 1], i)
            assert before in end, f"key block {j} waits at query block {i} on a later step: a cycle"
            t = max(t, end[before] + latency)
        end[j, i] = t
    return max(end.values())


@pytest.mark.parametrize("key_blocks,per_head", [(32, 32), (32, 64), (128, 128), (128, 256), (5, 13), (7, 2),
                                                 (1, 5), (3, 1)])
def test_rotated_chain_is_the_order_of_arrival(key_blocks, per_head):
    """Every query block's ranks are 0 .. key_blocks - 1 once each (its counter ends at
    key_blocks), in the order the rotated walks reach it (ties where there are fewer query
    blocks than key blocks), so no wait is on a later step."""
    start = [j * per_head // key_blocks for j in range(key_blocks)]
    for i in range(per_head):
        ranks = [rotated_chain_rank(i, j, key_blocks, per_head) for j in range(key_blocks)]
        assert sorted(ranks) == list(range(key_blocks)), (i, ranks)
        steps = [(i - start[j]) % per_head for j in sorted(range(key_blocks), key=ranks.__getitem__)]
        assert steps == sorted(steps), (i, steps)
    _finish(key_blocks, per_head, start.__getitem__, lambda i, j: rotated_chain_rank(i, j, key_blocks, per_head), 0.5)


@pytest.mark.parametrize("key_blocks,per_head", [(32, 32), (32, 64), (128, 128), (128, 256)])
@pytest.mark.parametrize("latency", [0.3, 0.9])
def test_rotated_chain_finishes_with_the_walk(key_blocks, per_head, latency):
    """In the lockstep model the rotated chain ends with the walk itself (each key block's
    predecessor is per_head / key_blocks >= 1 steps ahead), where the chain from key block 0
    (every walk from query block 0, key block j after j - 1) ends (key_blocks - 1) latencies
    later: the measured 0.78-0.80 of the default at 4k."""
    rotated = _finish(key_blocks, per_head, lambda j: j * per_head // key_blocks,
                      lambda i, j: rotated_chain_rank(i, j, key_blocks, per_head), latency)
    chain = _finish(key_blocks, per_head, lambda j: 0, lambda i, j: j, latency)
    assert rotated == per_head
    assert chain == pytest.approx(per_head + (key_blocks - 1) * latency)


def test_persistent_slots():
    """Whole groups a wave, each its key blocks at once; none where one group does not fit."""
    assert persistent_slots(32, 64, 132) == 4      # 4k tokens: 128 of 132 SMs, 16 waves
    assert persistent_slots(128, 16, 132) == 1     # 16k
    assert persistent_slots(133, 16, 132) == 0     # 17k: the chain from key block 0
    assert persistent_slots(4, 2, 132) == 2        # fewer groups than fit
    assert persistent_slots(0, 4, 132) == persistent_slots(4, 0, 132) == 0
    rng = np.random.default_rng()
    for key_blocks, groups, resident in rng.integers(1, 300, (200, 3)):
        slots = persistent_slots(int(key_blocks), int(groups), int(resident))
        assert slots * key_blocks <= resident and slots <= groups
        assert (slots == 0) == (key_blocks > resident)


def test_head_dim_64_keeps_the_chain_past_64_key_blocks():
    """Measured (H200): at head dim 64 the chain beat the rotation at 128 key blocks a group
    (0.897 / 0.872 of the default) and lost at 32 (0.717 / 0.910): the plan takes the chain past
    64 without asking the GPU how many CTAs it holds."""
    from tmaflow.kernels import attention_backward_sm90 as sm90

    defines = sm90.main_defines(64, causal=False, deterministic=True, fp16=False)
    kernel, grid, slots = sm90._main_kernel(defines, True, sm90.ROTATE_KEY_BLOCKS_64 + 1, 8, 2, 0)
    assert (grid, slots) == ((sm90.ROTATE_KEY_BLOCKS_64 + 1, 8, 2), 0)
    assert not int(kernel.defines.get("DET_ROTATE", 0))


def test_the_plan_rotates_where_a_group_fits_and_head_dim_64_keeps_the_chain_past_64_key_blocks(monkeypatch):
    """_main_kernel's choice (the GPU's resident CTAs stood in by 132): the rotated walk
    (DET_ROTATE, whole groups a wave) where a (batch, kv head)'s key blocks fit, except at head
    dim 64 past ROTATE_KEY_BLOCKS_64; else the chain from key block 0, a CTA a (key block, kv
    head, batch); an override's DET_ROTATE=1 where a group does not fit is refused."""
    import types

    import tmaflow as tf
    from tmaflow.kernels import attention_backward_sm90 as bwd

    override: dict = {}

    class Kernel:
        def __init__(self, defines):
            self.defines = {**defines, **override}

        def launcher(self, **config):
            return types.SimpleNamespace(max_active_clusters=lambda: 132)

    monkeypatch.setattr(bwd, "get_kernel", lambda name, layout, file, defines: Kernel(defines))
    limit = bwd.ROTATE_KEY_BLOCKS_64
    for d, key_blocks, rotated in ((64, limit, True), (64, limit + 1, False), (128, limit + 1, True),
                                   (128, 132, True), (128, 133, False)):
        main, grid, slots = bwd._main_kernel(main_defines(d, False, True, False), True, key_blocks, 3, 2, 0)
        assert bool(main.defines.get("DET_ROTATE", 0)) == rotated, (d, key_blocks)
        assert slots == (min(132 // key_blocks, 6) if rotated else 0)
        assert grid == ((slots * key_blocks, 1, 1) if rotated else (key_blocks, 3, 2))
    main, grid, slots = bwd._main_kernel(main_defines(64, False, False, False), False, 8, 3, 2, 0)
    assert (grid, slots) == ((8, 3, 2), 0) and "DET_ROTATE" not in main.defines  # not deterministic
    override["DET_ROTATE"] = 1  # an override asks for the rotation
    main, grid, slots = bwd._main_kernel(main_defines(64, False, True, False), True, limit + 1, 3, 2, 0)
    assert slots == 2 and grid == (2 * (limit + 1), 1, 1)
    with pytest.raises(tf.TmaflowError, match=r"attention_backward: DET_ROTATE=1 \(an override\) needs a \(batch, "
                                              r"kv head\)'s 133 key blocks resident at once; the GPU holds 132 CTAs"):
        bwd._main_kernel(main_defines(128, False, True, False), True, 133, 3, 2, 0)
