"""WINDOWS, the packed-sequence forward's tiles of 128 packed query rows whatever their sequences
(no GPU: the GPU cases are in test_gpu_attention_varlen.py): every windows build compiles without
spills or serialised wgmma at each head-dim pair; the plan drops the pairs, takes the tile
ahead where the producer's registers allow it; the entry plans windows by max_seqlen_q and
max_seqlen_k and sizes its grid by the token count."""
import pytest

from tmaflow import kernels
from tmaflow.kernels import attention_varlen_entry as varlen_entry
from tmaflow.kernels.attention_entry import attention_kernel, attention_plan, varlen_dynamic
from tmaflow.kernels.registry import extra_defines
from tmaflow.launch import compiler
from tmaflow.tma.layout import HOPPER_SMEM_LIMIT

from test_attention_plan import DIMS
from test_attention_varlen_dynamic import _arr, fake_device  # noqa: F401 (a fixture)


@pytest.mark.parametrize("d,dv", DIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_every_windows_build_compiles_without_spills(d, dv, causal):
    plan = varlen_entry.varlen_plan(d, causal, dv, 1 << 14, 16, windows=True)
    kernel = attention_kernel(plan, "bfloat16")
    assert kernel.defines["WINDOWS"] == 1 and "PAIRED" not in kernel.defines
    assert plan.layout.total_bytes + varlen_entry.sched_bytes(plan.defines) <= HOPPER_SMEM_LIMIT
    assert kernel.resources.spills == 0 and kernel.resources.stack_frame == 0, (d, dv, causal, kernel.resources)
    assert compiler.wgmma_pipeline_notes(kernel.program.log) == []


@pytest.mark.parametrize("d,causal", [(64, True), (144, False)])
def test_windows_builds_with_the_stride_compile_without_spills(d, causal):
    plan = varlen_entry.varlen_plan(d, causal, d, 1 << 14, 16, static=True, windows=True)
    kernel = attention_kernel(plan, "bfloat16")
    assert "DYNAMIC_TILES" not in kernel.defines
    assert kernel.resources.spills == 0 and kernel.resources.stack_frame == 0, (d, causal, kernel.resources)


def test_windows_plan_drops_pairs_and_takes_late_where_the_tile_ahead_spills():
    for d in (64, 128, 144, 256):
        seq = varlen_entry.varlen_plan(d, True, d, 4096, 8)
        win = varlen_entry.varlen_plan(d, True, d, 4096, 8, windows=True)
        assert seq.defines["PAIRED"] == 1 and "WINDOWS" not in seq.defines
        assert {k: v for k, v in win.defines.items() if k not in ("WINDOWS", "DYNAMIC_TILES")} == \
            {k: v for k, v in seq.defines.items() if k not in ("PAIRED", "DYNAMIC_TILES")}
        want = (1 if d in varlen_entry._WINDOWS_TAKE_LATE else 2) if varlen_dynamic() else None
        assert win.defines.get("DYNAMIC_TILES") == want, d
        assert win.layout == seq.layout
    assert "DYNAMIC_TILES" not in varlen_entry.varlen_plan(128, False, 128, 4096, 8, static=True, windows=True).defines


def _prepare(max_q, max_k, tokens=700, heads=4, causal=True):
    q, k, v, out = _arr((tokens, heads, 128)), _arr((tokens, 2, 128)), _arr((tokens, 2, 128)), _arr((tokens, heads, 128))
    cu = _arr((40,), "int32")
    return kernels.attention_varlen.prepare(q, k, v, cu, cu, max_q, max_k, out, causal=causal, stream=0x10)


def test_in_windows_by_lengths_and_tiles():
    """Windows where max_seqlen_q and max_seqlen_k are both at most WINDOWS_UP_TO[causal] and
    the sequences' tiles may leave a third of them empty (128 x 128 tokens fill theirs)."""
    in_windows, up_to = varlen_entry.in_windows, varlen_entry.WINDOWS_UP_TO
    assert in_windows(224, 224, 128, 1 << 14, True) and in_windows(56, 56, 512, 1 << 14, False)
    assert not in_windows(224, 224, 128, 1 << 14, False)  # non-causal: up to 64
    assert not in_windows(up_to[True] + 1, 8, 1000, 1 << 14, True) and not in_windows(8, up_to[True] + 1, 1000, 1 << 14,
                                                                                      True)
    assert not in_windows(128, 128, 128, 1 << 14, True)  # 128 tiles either way
    assert in_windows(128, 128, 192, 1 << 14, True)  # at most 192 tiles of their own against 128
    assert not in_windows(100, 100, 100, 100 * 100, True)  # 100 tiles against 79


def test_entry_plans_windows_by_the_longest_sequences(fake_device):
    """The entry asks in_windows; the grid is then ceil(tokens / 128) windows a head (39
    sequences of 700 tokens would take up to 4 x 44 tiles of their own), and a dynamic launch
    asks for the windows' larger schedule slots."""
    built = fake_device
    up_to = varlen_entry.WINDOWS_UP_TO[True]
    _prepare(up_to, up_to)
    _prepare(up_to + 1, 8)
    _prepare(8, up_to + 1)
    (win, win_config), (seq, _) = [b for b in built if b[0] != "reserve"]  # the last two: one state
    assert win.defines["WINDOWS"] == 1 and "WINDOWS" not in seq.defines
    assert win_config["grid"] == 4 * 6
    plan = varlen_entry.varlen_plan(128, True, 128, 700, 4, windows=True)
    if varlen_dynamic():
        assert win_config["smem"] == plan.layout.total_bytes + varlen_entry.WINDOW_SCHED_BYTES
    else:  # the stride (CUDA 12); causal windows unpaired: a CTA a tile
        assert "smem" not in win_config

