"""DYNAMIC_TILES, the packed-sequence forward's tile counter (the plans' default; no GPU: its GPU
cases are in test_gpu_attention_varlen.py): every build compiles without spills or serialised
wgmma and leaves room for its schedule slots in shared memory; static builds never read the
counter argument (their SASS is that of the source without it); the entry passes the stream's
counter (or null) as the kernel's last argument and sizes its grid and shared memory; one
counter a stream and thread (the split-K workspace's) for eager calls, a pair of its own for
each captured one (tile_counters), the stride when none is reserved."""
import itertools
import struct
import types

import pytest

from tmaflow import kernels
from tmaflow.kernels import attention_varlen_entry as varlen_entry
from tmaflow.kernels import tile_counters
from tmaflow.kernels import entry as entry_mod
from tmaflow.kernels.attention_entry import HEAD_DIMS, attention_kernel, attention_plan, varlen_dynamic
from tmaflow.kernels.matmul import splitk
from tmaflow.kernels.registry import extra_defines, source
from tmaflow.launch import compiler
from tmaflow.launch.kernel import Kernel
from tmaflow.runtime.memory import DeviceArray
from tmaflow.tma import tensormap
from tmaflow.tma.layout import HOPPER_SMEM_LIMIT

DYNAMIC = {"DYNAMIC_TILES": 1}
# (head dim, causal, dtype, forced defines): the plans' builds, the fp16 one, and the schedules
# tools/experiments/varlen_ab.py and the GPU tests force (two 64-row Q stages, two Q buffers, a
# causal build without pairs)
BUILDS = ([(d, c, "bfloat16", {}) for d in (64, 128, 256) for c in (False, True)] +
          [(128, True, "float16", {}), (128, False, "bfloat16", {"Q_SPLIT": 1, "Q_STAGES": 1}),
           (64, True, "bfloat16", {"Q_STAGES": 2}), (128, True, "bfloat16", {"PAIRED": 0})])


def _plan(d, causal, forced):
    return attention_plan(d, causal, varlen=True, q_stages=forced.get("Q_STAGES"),
                          q_split=bool(forced["Q_SPLIT"]) if "Q_SPLIT" in forced else None)


def _dynamic(d, causal, dtype, forced, mode=1):
    plan = _plan(d, causal, forced)
    with extra_defines({"DYNAMIC_TILES": mode, **forced}):
        return plan, attention_kernel(plan, dtype)


@pytest.mark.parametrize("mode", [1, 2])  # the take before a tile's last V tile, or as its loads begin
@pytest.mark.parametrize("d,causal,dtype,forced", BUILDS)
def test_dynamic_builds_compile_without_spills(d, causal, dtype, forced, mode):
    if mode == 2 and compiler.nvrtc_version()[0] < 13:
        pytest.skip("CUDA 12's ptxas spills the tile ahead in the producer warp (varlen_dynamic: the stride there)")
    plan, kernel = _dynamic(d, causal, dtype, forced, mode)
    assert kernel.defines["DYNAMIC_TILES"] == mode
    assert kernel.resources.spills == 0 and kernel.resources.stack_frame == 0, (d, causal, dtype, kernel.resources)
    assert compiler.wgmma_pipeline_notes(kernel.program.log) == []
    sass = kernel.sass()
    assert "ATOMG.E.ADD" in sass  # the takes and the count of CTAs done
    mma = [line for line in sass.splitlines() if "HGMMA.64x" in line]
    assert mma and all((".BF16" in line) == (dtype == "bfloat16") for line in mma)
    assert len(kernel.params) == len(attention_kernel(plan, dtype).params)  # one signature both ways


def test_every_varlen_plan_has_room_for_the_schedule_slots():
    """A dynamic launch asks for SCHED_BYTES past the layout (attention.cu's kSchedBytes, whose
    static_assert bounds the slots of four Q and four V stages): every varlen plan, forced
    variants included, stays within the per-block limit."""
    src = source("attention")
    assert (f"constexpr int kSchedBytes = WINDOWS ? {varlen_entry.WINDOW_SCHED_BYTES} : "
            f"{varlen_entry.SCHED_BYTES};") in src
    assert 7 * 4 * 4 + 4 * 4 <= varlen_entry.SCHED_BYTES  # Sched: 4 Tiles of 7 ints, 4 flags
    assert 8 * 4 * 4 + 4 * 4 + 8 * 4 <= varlen_entry.WINDOW_SCHED_BYTES  # Tiles of 8, and the tile ahead
    for d, dv, causal, q_stages, q_split in itertools.product(HEAD_DIMS, HEAD_DIMS, (False, True), (None, 2),
                                                             (None, True)):
        try:
            plan = attention_plan(d, causal, dv, varlen=True, q_stages=q_stages, q_split=q_split)
        except Exception:  # a forced variant that does not fit is refused by the plan itself
            continue
        assert plan.layout.total_bytes % 16 == 0
        assert plan.layout.total_bytes + varlen_entry.WINDOW_SCHED_BYTES <= HOPPER_SMEM_LIMIT, (d, dv, causal,
                                                                                                q_stages)


@pytest.mark.parametrize("d,causal", [(128, False), (256, True)])
def test_static_builds_never_read_the_counter(d, causal):
    """The static schedule's SASS is that of the source without the trailing tile_counter
    parameter: the argument costs the default builds nothing (checked against the commit before
    it, for every default varlen build at head dims 64 / 128 / 256 and 96 / 192 / 240, when it
    was written)."""
    plan = varlen_entry.varlen_plan(d, causal, d, 4096, 8, static=True)
    kernel = attention_kernel(plan, "bfloat16")
    assert "DYNAMIC_TILES" not in kernel.defines
    param = "              , unsigned* tile_counter  // DYNAMIC_TILES: two zeroed counters; else unused (null)\n"
    src = source("attention")
    assert src.count(param) == 1
    without = Kernel(src.replace(param, ""), "attention_fwd", defines=dict(plan.defines), layout=plan.layout,
                     filename="attention.cu")
    assert len(without.params) == len(kernel.params) - 1
    sass = kernel.sass()
    assert "ATOMG" not in sass and sass == without.sass()


# --- the entry, with the device faked --------------------------------------------------------------

_addresses = itertools.count(1)


def _arr(shape, dtype="bfloat16"):
    return DeviceArray(next(_addresses) << 30, shape, dtype)  # 1 GiB apart: no aliasing


@pytest.fixture
def fake_device(monkeypatch):
    """No GPU: maps encode to zeros, the device has 132 SMs, a launcher records its kernel and
    configuration, and a workspace's counters sit at an address of its stream."""
    monkeypatch.setattr(tensormap, "encode", lambda spec: bytes(128))
    monkeypatch.setattr(varlen_entry, "current_device", lambda: types.SimpleNamespace(ordinal=0, sm_count=132))
    built = []

    def launcher(self, **config):
        built.append((self, config))
        return lambda *args: None

    monkeypatch.setattr(Kernel, "launcher", launcher)

    def views(self, counters, floats):
        assert counters >= 2
        return (DeviceArray(0x7700_0000_0000 + (self.stream << 20), (4096,), "uint32"),
                DeviceArray(0x7800_0000_0000 + (self.stream << 20), (1 << 20,), "float32"))

    monkeypatch.setattr(splitk._Workspace, "views", views)
    monkeypatch.setattr(varlen_entry, "_foreign_capture", lambda stream: False)
    monkeypatch.setattr(tile_counters, "reserve", lambda device: built.append(("reserve", device.ordinal)))
    entry_mod.STATES.clear()
    splitk._workspaces.__dict__.clear()
    yield built
    entry_mod.STATES.clear()
    splitk._workspaces.__dict__.clear()


def _prepare(causal, stream, d=128, dv=None, tokens=700):
    dv = dv or d
    q, k, v, out = _arr((tokens, 4, d)), _arr((tokens, 2, d)), _arr((tokens, 2, dv)), _arr((tokens, 4, dv))
    cu = _arr((4,), "int32")
    return kernels.attention_varlen.prepare(q, k, v, cu, cu, 512, 512, out, causal=causal, stream=stream)


def _counter_argument(kernel, args) -> int:
    raw = kernel.check_args(*args)  # packs every argument as a launch would
    last = kernel.params[-1]
    assert last.size == 8 and len(args) == len(kernel.params)
    return struct.unpack_from("<Q", raw, last.offset)[0]


@pytest.mark.parametrize("causal", [False, True])
def test_entry_passes_the_stream_counter_as_the_last_argument(fake_device, causal):
    built = fake_device
    with extra_defines(DYNAMIC):
        a = _prepare(causal, 0x10)
        b = _prepare(causal, 0x20)
        again = _prepare(causal, 0x10)
    (kernel, config), (_, config_b) = [b for b in built if b[0] != "reserve"]  # one state a stream
    assert kernel.defines["DYNAMIC_TILES"] == 1 and config["stream"] == 0x10 and config_b["stream"] == 0x20
    plan = attention_plan(128, causal, varlen=True)
    tiles = 4 * ((700 + 3 * 127) // 128)
    assert config["grid"] == min(tiles, 132) and config["smem"] == plan.layout.total_bytes + varlen_entry.SCHED_BYTES
    got = [_counter_argument(kernel, p.args) for p in (a, b, again)]
    assert got == [0x7700_0000_0000 + (0x10 << 20), 0x7700_0000_0000 + (0x20 << 20), got[0]]
    assert {key[1] for key in splitk._workspaces.__dict__} == {0x10, 0x20}  # one workspace a stream


@pytest.mark.parametrize("causal", [False, True])
def test_static_entry_passes_null_and_no_workspace(fake_device, causal):
    built = fake_device
    with extra_defines({"DYNAMIC_TILES": 0}):
        p = _prepare(causal, 0x10)
    (kernel, config), = built
    assert kernel.defines["DYNAMIC_TILES"] == 0 and "smem" not in config and config["grid"] <= 132
    assert _counter_argument(kernel, p.args) == 0 and not splitk._workspaces.__dict__


@pytest.mark.parametrize("causal", [False, True])
def test_default_entry_is_dynamic_and_reserves_pairs_for_captures(fake_device, causal):
    """NVRTC 13: the counter, the stream's for an eager call, pairs reserved for captures.
    CUDA 12 (varlen_dynamic() == 0): the stride, a null counter, nothing reserved."""
    built = fake_device
    p = _prepare(causal, 0x10)
    if not varlen_dynamic():
        (kernel, config), = built
        assert "DYNAMIC_TILES" not in kernel.defines and _counter_argument(kernel, p.args) == 0
        return
    (what, ordinal), (kernel, config) = built
    assert (what, ordinal) == ("reserve", 0) and kernel.defines["DYNAMIC_TILES"] == varlen_dynamic() == 2
    assert _counter_argument(kernel, p.args) == 0x7700_0000_0000 + (0x10 << 20)  # eager: the stream's


def test_captured_calls_take_pairs_of_their_own_or_the_stride(fake_device, monkeypatch):
    """Under a capture each call takes a pair from tile_counters (never its stream's, which
    eager calls share); with none reserved, the static stride and a null counter."""
    if not varlen_dynamic():
        pytest.skip("CUDA 12 plans the stride (varlen_dynamic); the counter's captures run on the NVRTC 13 stack")
    built = fake_device
    _prepare(False, 0x10)  # eager: the state
    monkeypatch.setattr(varlen_entry, "_foreign_capture", lambda stream: True)
    pairs = iter([0x5500_0000, 0x5500_0008, None])
    monkeypatch.setattr(tile_counters, "take", lambda device: next(pairs))
    captured = [_prepare(False, 0x10) for _ in range(3)]
    kernels_built = [b for b in built if b[0] != "reserve"]
    (dynamic, _), (static, static_config) = kernels_built  # the stride built once, for the third
    got = [_counter_argument(k, p.args) for k, p in zip((dynamic, dynamic, static), captured)]
    assert got == [0x5500_0000, 0x5500_0008, 0]
    assert "DYNAMIC_TILES" not in static.defines and "smem" not in static_config
    assert captured[2].launcher is not captured[0].launcher


def test_dynamic_causal_without_pairs_keeps_one_cta_an_sm(fake_device):
    """V head dim 240 plans no pairs (a CTA a tile, as many CTAs as tiles); with the counter the
    grid is one CTA an SM all the same."""
    built = fake_device
    _prepare(True, 0x10, d=240, tokens=9000)
    with extra_defines(DYNAMIC):
        _prepare(True, 0x10, d=240, tokens=9000)
    (static, static_config), (dynamic, dynamic_config) = [b for b in built if b[0] != "reserve"]
    assert "DYNAMIC_TILES" not in static.defines  # the plan's at V head dim 240: ptxas spills with the slots
    assert "PAIRED" not in static.defines and "PAIRED" not in dynamic.defines
    tiles = 4 * ((9000 + 3 * 127) // 128)
    assert static_config["grid"] == tiles and dynamic_config["grid"] == 132
