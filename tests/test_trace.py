"""CPU tier: the flight recorder. Trace builds compile (with and without the watchdog) and
release builds contain none of it; rings parse, name their barriers from the layout, and
export a valid Chrome / Perfetto JSON."""
import json

import numpy as np
import pytest

import tmaflow as tf
from tmaflow.debug import trace as tr
from tmaflow.kernels import examples as ex
from tmaflow.kernels.matmul import choose_config, gemm_plan
from tmaflow.kernels.registry import get_kernel
from tmaflow.launch.config import LaunchConfig


def example_kernels(**flags):
    plan = gemm_plan(4096, 4096, 4096, "nt", choose_config(4096, 4096, 4096, 132))
    yield get_kernel("gemm_bf16", plan.layout, defines=plan.defines, file="gemm", **flags)
    _, layout, defines = ex.softmax_plan((64, 1024))
    yield get_kernel("softmax", layout, defines, **flags)
    _, layout, defines = ex.copy_plan("float32", (1024, 1024))
    yield get_kernel("tile_copy", layout, dict(defines, STORES=2), **flags)


@pytest.mark.parametrize("debug,level", [(False, "stage"), (True, "stage"), (False, "all")])
def test_release_builds_hold_no_recorder_and_trace_builds_do(debug, level):
    for off, on in zip(example_kernels(debug=debug), example_kernels(debug=debug, trace=level)):
        assert "tmaflow_trace" not in off.ptx and "%smid" not in off.ptx
        assert off.cubin == tf.Kernel(off.source, off.name, defines=off.defines, layout=off.layout,
                                      filename=off.filename, debug=debug).cubin
        assert ".const .align 8 .b8 tmaflow_trace_state" in on.ptx and "%globaltimer" in on.ptx
        if not debug:  # (debug + trace builds of the gemm spill a few registers: diagnostic only)
            assert on.resources.spill_stores == 0, f"{on.name}: the recorder spills"
        assert on.cubin != off.cubin


def test_trace_flag_is_checked():
    for bad in ("yes", 1, None):
        with pytest.raises(tf.TmaflowError, match=r"trace=.* must be False, True \(= 'stage'\) or 'all'"):
            tf.Kernel('extern "C" __global__ void k() {}', "k", trace=bad)
    assert tf.Kernel('extern "C" __global__ void k() {}', "k", trace=True).trace == "stage"


def rings(events_per_ring: list[list[tuple]], capacity: int = 8) -> np.ndarray:
    """Device-like rings: (t0, dur, kind, stage, bar, value) per event, zero slots after."""
    out = np.zeros((len(events_per_ring), capacity), dtype=tr.EVENT)
    for r, events in enumerate(events_per_ring):
        for i, (t0, dur, kind, stage, bar, value) in enumerate(events):
            out[r, (i + 3) % capacity] = (t0, dur, tr.KINDS.index(kind) + 1, stage, bar, value, 7, 5)
    return out


def layout():
    spec = tf.TensorMapSpec.tiled("float32", (256, 256), (64, 64))
    return tf.SharedLayout([tf.Pipeline("ab", stages=2, tiles=[spec])])


def test_rings_parse_sort_and_name_barriers():
    lay = layout()
    full, empty = lay.offset("ab_full"), lay.offset("ab_empty")
    producer = [(1000, 0, "arrive + expect_tx", -1, full, 16384), (1010, 0, "TMA load", -1, full, 0),
                (1500, 40, "wait", 1, empty + 8, 1), (1600, 0, "TMA load", -1, full + 8, 0)]
    consumer = [(1100, 300, "wait", 0, full, 0), (1420, 0, "arrive", -1, empty, 0),
                (1900, 2_000_000_000, "wait", 1, full + 8, 0x101)]
    t = tr.Trace.from_rings(rings([producer, consumer, []]), "k", LaunchConfig(3, 64), lay)
    assert len(t) == 7 and list(t.events["t0"]) == sorted(t.events["t0"])
    assert set(t.events["block"]) == {0} and set(t.events["warp"]) == {0, 1}  # rings 0, 1: warps of CTA 0
    assert t.roles() == {(0, 0): "producer", (0, 1): "consumer"}
    labels = [t.label(e) for e in t.events]
    assert "wait ab_full[0]" in labels and "wait ab_empty[1]" in labels and "TMA load ab_full[1]" in labels
    assert "TIMED OUT" in t.tail() and "warp 1 (consumer)" in t.tail()
    summary = t.summary()
    assert "7 events" in summary and "TMA load" in summary and "wait" in summary


def test_chrome_json_is_valid_and_complete(tmp_path):
    lay = layout()
    full = lay.offset("ab_full")
    ev = [[(5000 + 100 * i, 50 if i % 2 else 0, "wait" if i % 2 else "TMA load", i % 2, full, 0)
           for i in range(6)], [(5050, 0, "mark", -1, 0, 42), (5060, 20, "named barrier", -1, 0, 1)]]
    t = tr.Trace.from_rings(rings(ev), "kern", LaunchConfig(1, 64), lay)
    path = tmp_path / "t.json"
    doc = t.to_chrome(path)
    assert json.loads(path.read_text()) == doc
    events = doc["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    timed = [e for e in events if e["ph"] != "M"]
    assert len(timed) == len(t) == 8
    assert {m["args"]["name"] for m in meta} >= {"CTA 0", "warp 0 (producer)", "warp 1 (warp)"}
    for e in timed:
        assert e["ph"] in ("X", "i") and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert e["ts"] >= 0 and isinstance(e["name"], str) and e["cat"] in tr.KINDS
        if e["ph"] == "X":
            assert e["dur"] > 0 and e["cat"] in tr.SPANS
    assert any(e["name"] == "mark 42" for e in timed)
    assert doc["otherData"] == {"kernel": "kern", "events": 8, "wrapped_rings": 0}


def test_full_rings_are_reported_and_save_load_round_trips(tmp_path):
    full = [[(100 + i, 0, "arrive", -1, 0, 0) for i in range(8)]]
    t = tr.Trace.from_rings(rings(full), "k", LaunchConfig(1, 32))
    assert t.wrapped == 1 and "1 rings wrapped" in t.summary()
    t.save(tmp_path / "t.npz")
    back = tr.Trace.load(tmp_path / "t.npz")
    assert np.array_equal(back.events, t.events) and back.kernel_name == "k" and back.wrapped == 1


def test_png_timeline(tmp_path):
    pytest.importorskip("matplotlib")
    lay = layout()
    ev = [[(1000 + 100 * i, 60, "wait", i % 2, lay.offset("ab_full"), 0) for i in range(5)],
          [(1000 + 100 * i, 0, "TMA load", -1, lay.offset("ab_full"), 0) for i in range(5)]]
    t = tr.Trace.from_rings(rings(ev), "k", LaunchConfig(1, 64), lay)
    t.to_png(tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- diagnosis ---------------------------------------------------------------------------------

from tmaflow.debug.diagnose import diagnose  # noqa: E402


def planted_layout(cluster=1):
    spec = tf.TensorMapSpec.tiled("float32", (12 * 32, 64), (32, 64))
    return tf.SharedLayout([tf.Pipeline("p", stages=2, tiles=[spec], cluster=(cluster, 1, 1),
                                        multicast=["x"] if cluster > 1 else None)])


def ev(t, kind, bar=0, value=0, stage=-1, dur=0):
    return (t, dur, kind, stage, bar, value)


def run_rules(per_ring, cluster=1, warps=2):
    lay = planted_layout(cluster)
    t = tr.Trace.from_rings(rings(per_ring, capacity=32), "planted", LaunchConfig(len(per_ring) // warps, 32 * warps), lay)
    return [f.name for f in diagnose(t, lay, cluster)], lay


def offsets(lay):
    return lay.offset("p_full"), lay.offset("p_empty"), 32 * 64 * 4


def test_diagnosis_tx_announced_more_and_less():
    lay = planted_layout()
    full, empty, tx = offsets(lay)
    for announced, rule in ((2 * tx, "tx-announced-more"), (tx // 2, "tx-announced-less")):
        producer = [ev(10, "wait", empty, 1, 0), ev(20, "arrive + expect_tx", full, announced),
                    ev(30, "TMA load", full)]
        consumer = [ev(40, "wait", full, 0x100, 0, dur=10**9)]
        names, _ = run_rules([producer, consumer])
        assert names[0] == rule, names


def test_diagnosis_wrong_parity_missing_commit_missing_arrive_and_reuse():
    lay = planted_layout()
    full, empty, tx = offsets(lay)
    # the producer's first wait on a fresh empty barrier with parity 0 never completes
    names, _ = run_rules([[ev(10, "wait", empty, 0x100, 0, dur=10**9)], [ev(20, "wait", full, 0x100, 0, dur=10**9)]])
    assert names[0] == "wrong-parity", names
    # stage 1 was never filled while its consumer waits for it
    producer = [ev(10, "wait", empty, 1, 0), ev(20, "arrive + expect_tx", full, tx), ev(21, "TMA load", full)]
    consumer = [ev(30, "wait", full, 0, 0), ev(40, "arrive", empty, 1), ev(50, "wait", full + 8, 0x100, 1, dur=10**9)]
    names, _ = run_rules([producer, consumer])
    assert names[0] == "missing-commit", names
    # stage 0 consumed once but never released: the producer's refill waits forever
    producer = [ev(10, "wait", empty, 1, 0), ev(20, "arrive + expect_tx", full, tx), ev(21, "TMA load", full),
                ev(60, "wait", empty, 0x100, 0, dur=10**9)]
    consumer = [ev(30, "wait", full, 0, 0)]
    names, _ = run_rules([producer, consumer])
    assert names[0] == "missing-arrive", names
    # with the consumer of stage 1 waiting for a fill the stuck producer never made
    consumer.append(ev(70, "wait", full + 8, 0x100, 1, dur=10**9))
    names, _ = run_rules([producer, consumer])
    assert names == ["missing-arrive"], names  # the missing commit is its consequence
    # a refill without a wait on the empty barrier since the previous fill
    producer = [ev(10, "wait", empty, 1, 0), ev(20, "arrive + expect_tx", full, tx), ev(30, "arrive + expect_tx", full, tx)]
    consumer = [ev(40, "wait", full, 0, 0), ev(50, "arrive", empty, 1), ev(60, "wait", full, 1, 0)]
    names, _ = run_rules([producer, consumer])
    assert names == ["stage-reused"], names


def test_diagnosis_multicast_rules():
    lay = planted_layout(cluster=2)
    full, empty, tx = offsets(lay)
    sync = ev(5, "cluster sync", dur=3)
    rank0 = [sync, ev(10, "wait", empty, 1, 0), ev(20, "arrive + expect_tx", full, tx), ev(21, "TMA load (multicast)", full, 0b01)]
    rank1 = [sync, ev(10, "wait", empty, 1, 0), ev(20, "arrive + expect_tx", full, tx), ev(30, "wait", full, 0x100, 0, dur=10**9)]
    names, _ = run_rules([rank0, [], rank1, []], cluster=2)
    assert names[0] == "multicast-mask", names
    early = [ev(2, "TMA load (multicast)", full, 0b11), sync, ev(20, "arrive + expect_tx", full, tx)]
    names, _ = run_rules([early, [], [sync], []], cluster=2)
    assert names[0] == "multicast-before-init", names
    end = ev(90, "cluster sync", dur=3)
    good = [sync, ev(10, "wait", empty, 1, 0), ev(20, "arrive + expect_tx", full, tx),
            ev(21, "TMA load (multicast)", full, 0b11), end]
    # (its release lands microseconds after CTA 0's last wait on that barrier: not one it waited for)
    peer = [sync, ev(20, "arrive + expect_tx", full, tx), ev(5000, "arrive (remote)", empty, 0 | 1 << 16),
            ev(6000, "cluster sync", dur=3)]
    assert run_rules([good, [], peer, []], cluster=2)[0] == []
    names, _ = run_rules([good, [], peer[:-1], []], cluster=2)  # the peer left without the sync
    assert names == ["missing-cluster-sync"], names
    # A producer tail instead of the final sync: after its last fill the CTA waits on both
    # stages' empty barriers, which its peer's releases complete.
    tail = [sync, ev(10, "wait", empty, 1, 0), ev(20, "arrive + expect_tx", full, tx),
            ev(21, "TMA load (multicast)", full, 0b11), ev(50, "wait", empty, 0, 0), ev(51, "wait", empty + 8, 1, 1)]
    peer_tail = [sync, ev(20, "arrive + expect_tx", full, tx), ev(40, "arrive (remote)", empty, 0 | 1 << 16),
                 ev(50, "wait", empty, 0, 0), ev(51, "wait", empty + 8, 1, 1)]
    assert run_rules([tail, [], peer_tail, []], cluster=2)[0] == []
    names, _ = run_rules([tail[:-1], [], peer_tail, []], cluster=2)  # stage 1 never waited for
    assert names == ["missing-cluster-sync"], names


def test_a_remote_arrival_its_target_waits_for_needs_no_final_sync():
    """A cluster's K splits: each sender drains the owner's release of its last slot before it
    leaves, so the owner's last remote arrival lands in a CTA that is still there; an arrival
    its target had stopped waiting for (or never waits for) is still a finding."""
    lay = planted_layout(cluster=2)
    _, empty, _ = offsets(lay)
    sync = ev(5, "cluster sync", dur=3)
    owner = [sync, ev(40, "arrive (remote)", empty, 1 | 1 << 16)]  # onto CTA 1's barrier
    sender = [sync, ev(30, "wait", empty, 1, 0, dur=15)]            # waiting from 30 to 45
    assert run_rules([owner, [], sender, []], cluster=2)[0] == []
    woke_first = [sync, ev(30, "wait", empty, 1, 0, dur=9)]  # stamped its end before the arrival's stamp
    assert run_rules([owner, [], woke_first, []], cluster=2)[0] == []
    late = [sync, ev(5000, "arrive (remote)", empty, 1 | 1 << 16)]  # microseconds after the wait ended
    for target in ([sync, ev(30, "wait", empty, 1, 0, dur=5)], [sync]):
        names, _ = run_rules([late if len(target) > 1 else owner, [], target, []], cluster=2)
        assert names == ["missing-cluster-sync"], names
    elsewhere = [sync, ev(40, "arrive (remote)", empty + 8, 1 | 1 << 16)]  # another barrier than the one waited on
    names, _ = run_rules([elsewhere, [], sender, []], cluster=2)
    assert names == ["missing-cluster-sync"], names


def test_stage_traces_apply_only_the_rules_they_can_support():
    lay = planted_layout()
    full, empty, tx = offsets(lay)
    producer = [ev(20, "arrive + expect_tx", full, tx), ev(30, "arrive + expect_tx", full, tx)]
    t = tr.Trace.from_rings(rings([producer, []], capacity=32), "planted", LaunchConfig(1, 64), lay)
    assert [f.name for f in diagnose(t, lay)] == ["stage-reused"]
    t.level = "stage"  # non-blocking waits were not recorded: no reuse can be claimed
    assert diagnose(t, lay) == []


def test_ledger_of_a_stuck_barrier():
    from tmaflow.debug.diagnose import ledger, ledger_text

    lay = planted_layout()
    full, empty, tx = offsets(lay)
    producer = [ev(10, "wait", empty, 1, 0), ev(20, "arrive + expect_tx", full, 2 * tx), ev(21, "TMA load", full)]
    consumer = [ev(40, "wait", full, 0x100, 0, dur=10**9)]
    t = tr.Trace.from_rings(rings([producer, consumer], capacity=32), "planted", LaunchConfig(1, 64), lay)
    text = ledger_text(ledger(t, lay, 1), lay, [{"barrier": "p.full", "stage": 0, "block": (0, 0, 0)}], (1, 1, 1))
    assert text.strip().startswith("CTA 0 p_full[0]: planned 8192 B per fill")
    assert f"last bytes: {2 * tx}" in text and "copies issued into it 1 = 8192 B" in text


def test_tail_stops_at_the_warps_own_timeout():
    lay = planted_layout()
    full, empty, tx = offsets(lay)
    producer = [ev(10, "wait", empty, 1, 0), ev(20, "arrive + expect_tx", full, tx),
                ev(30, "wait", empty + 8, 0x100, 1, dur=10**9),  # timed out
                ev(10**9 + 40, "wait", empty, 0x200, 0),         # gave up afterwards
                ev(10**9 + 50, "cluster sync", dur=5)]
    t = tr.Trace.from_rings(rings([producer]), "planted", LaunchConfig(1, 32), lay)
    tail = t.tail()
    assert tail.rstrip().endswith("wait p_empty[1] @0.0us TIMED OUT"), tail
    assert "gave up" not in tail and "cluster sync" not in tail


def test_diagnosis_missing_acquire_of_a_device_patched_map():
    slot = 0x1234_5680
    out = np.zeros((2, 8), dtype=tr.EVENT)
    out[0, 0] = (100, 0, tr.KINDS.index("tensormap publish") + 1, -1, 0, slot, 0, 1)
    out[1, 0] = (200, 0, tr.KINDS.index("TMA load") + 1, -1, 64, 0, slot, 2)  # line: the map
    t = tr.Trace.from_rings(out, "k", LaunchConfig(2, 32))
    found = diagnose(t, None)
    assert [f.name for f in found] == ["missing-acquire"] and "CTA 1" in found[0].message
    out[1, 0]["t0"], out[1, 1] = 300, (250, 0, tr.KINDS.index("tensormap acquire") + 1, -1, 0, slot, 0, 2)
    assert diagnose(tr.Trace.from_rings(out, "k", LaunchConfig(2, 32)), None) == []


def test_an_empty_trace_says_so_and_round_trips(tmp_path):
    from tmaflow.debug.trace import Trace, _SAVED

    t = Trace(np.empty(0, _SAVED), "k", 4)
    assert t.tail() == t.summary() == "k: no events recorded"
    t.save(tmp_path / "t.npz")
    back = Trace.load(tmp_path / "t.npz")
    assert len(back) == 0 and back.warps_per_block == 4 and back.tail(0) == "k: no events recorded"
