"""CPU tier: the host side of tmaflow.distributed: the no-multicast environment, argument
checks of the collectives, the signal kernels compiled for sm_90a, the watchdog's message for
a stuck signal, and per-rank traces merged into one timeline."""
import json

import numpy as np
import pytest

import tmaflow as tf
from tmaflow.debug import trace as tr
from tmaflow.debug import watchdog
from tmaflow.distributed import merge_traces, no_multicast, ops, protocol
from tmaflow.kernels.registry import source
from tmaflow.launch.config import LaunchConfig

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}


def test_importing_sets_the_no_multicast_environment():
    import os
    for name in MULTICAST_OFF:
        assert os.environ[name].lower() in ("0", "1", "true"), name


def test_no_multicast_fills_in_unset_variables():
    env = {"NCCL_NVLS_ENABLE": "0"}
    no_multicast(env)
    assert env == MULTICAST_OFF


@pytest.mark.parametrize("name,value", [("NCCL_NVLS_ENABLE", "1"), ("NCCL_NVLS_ENABLE", "2"),
                                        ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "0"),
                                        ("NVSHMEM_DISABLE_NVLS", "false"), ("NVSHMEM_DISABLE_NVLS", "")])
def test_no_multicast_refuses_a_value_that_enables_it(name, value):
    env = {**MULTICAST_OFF, name: value}
    with pytest.raises(tf.TmaflowError, match=rf"{name}='{value}' enables NVLink multicast.*set {name}="):
        no_multicast(env)


@pytest.mark.parametrize("value", ["TRUE", " true ", "1"])
def test_no_multicast_accepts_spellings_of_off(value):
    no_multicast({**MULTICAST_OFF, "TORCH_SYMM_MEM_DISABLE_MULTICAST": value})


def test_gather_shapes_ragged_and_even():
    s = ops.gather_shapes((3, 64), "bfloat16", (32, 64), "bfloat16", 10, 4, 1)
    assert s.rows == (3, 3, 3, 1) and (s.m, s.n, s.k) == (10, 32, 64) and s.span(3) == slice(9, 10)
    assert ops.gather_shapes((1, 64), "bfloat16", (32, 64), "bfloat16", 10, 4, 3).rows == (3, 3, 3, 1)
    assert ops.gather_shapes((8, 16), "float8_e4m3fn", (8, 16), "float8_e4m3fn", None, 2, 0,
                             0.5, 2.0).rows == (8, 8)


@pytest.mark.parametrize("args,match", [
    (((3, 64), "bfloat16", (32, 64), "bfloat16", 10, 4, 3),
     r"a_shard has 3 rows but rank 3's shard of m=10 rows over 4 ranks has 1 \(shards: \[3, 3, 3, 1\]"),
    (((3, 64), "bfloat16", (32, 48), "bfloat16", None, 2, 0), r"K of a_shard \(64\) and b \(48\) differ"),
    (((3, 64), "bfloat16", (32, 64), "float8_e4m3fn", None, 2, 0), r"a_shard is bfloat16 but b is float8_e4m3fn"),
    (((3, 64, 1), "bfloat16", (32, 64), "bfloat16", None, 2, 0), r"a_shard: shape \(3, 64, 1\) must be 2-D"),
    (((3, 64), "float32", (32, 64), "float32", None, 2, 0), r"a_shard: dtype float32 must be one of"),
    (((3, 64), "bfloat16", (32, 64), "bfloat16", -1, 2, 0), r"m=-1 must be"),
    (((3, 64), "bfloat16", (32, 64), "bfloat16", None, 9, 0), r"world_size=9 must be in \[1, 8\]"),
])
def test_gather_shapes_refuse(args, match):
    with pytest.raises(tf.TmaflowError, match=match):
        ops.gather_shapes(*args)


@pytest.mark.parametrize("dtype,scales,match", [
    ("bfloat16", (1.0, None), r"scale_a / scale_b dequantise float8_e4m3fn operands"),
    ("float8_e4m3fn", (1.0, None), r"float8_e4m3fn operands need both scale_a and scale_b"),
    ("float8_e4m3fn", (None, None), r"need both scale_a and scale_b"),
])
def test_scales_are_checked(dtype, scales, match):
    with pytest.raises(tf.TmaflowError, match=match):
        ops.gather_shapes((4, 64), dtype, (32, 64), dtype, None, 2, 0, *scales)
    with pytest.raises(tf.TmaflowError, match=match):
        ops.scatter_shapes((8, 64), dtype, (32, 64), dtype, 2, 0, *scales)


def test_tensors_of_a_call_are_on_one_gpu():
    """Refused before anything is planned or signalled (a CPU tensor used to rendezvous a plan
    and fail in a GEMM mid-protocol)."""
    import collections
    import types

    device = collections.namedtuple("device", "type index")
    gpu0, gpu1 = (types.SimpleNamespace(device=device("cuda", i)) for i in (0, 1))
    ops.on_one_gpu("all_gather_gemm", {"a_shard": gpu0, "b": gpu0, "out": None})
    with pytest.raises(tf.TmaflowError, match=r"all_gather_gemm: b is on device\(type='cpu', index=None\); "
                                              r"the collectives take CUDA torch tensors"):
        ops.on_one_gpu("all_gather_gemm", {"a_shard": gpu0, "b": types.SimpleNamespace(device=device("cpu", None))})
    with pytest.raises(tf.TmaflowError, match=r"a is on ('cpu'|None); the collectives take CUDA"):
        ops.on_one_gpu("gemm_reduce_scatter", {"a": np.ones(3), "b_shard": gpu0})  # numpy 2 arrays say 'cpu'
    with pytest.raises(tf.TmaflowError, match=r"b_shard is on None; the collectives take CUDA"):
        ops.on_one_gpu("gemm_reduce_scatter", {"a": gpu0, "b_shard": [[1.0]]})
    with pytest.raises(tf.TmaflowError, match=r"gemm_reduce_scatter: out is on device\(type='cuda', index=1\) "
                                              r"but a is on device\(type='cuda', index=0\); every tensor of a call "
                                              r"must be on one GPU"):
        ops.on_one_gpu("gemm_reduce_scatter", {"a": gpu0, "b_shard": gpu0, "out": gpu1})


def test_scatter_shapes():
    s = ops.scatter_shapes((10, 16), "bfloat16", (24, 16), "bfloat16", 4, 2)
    assert s.rows == (3, 3, 3, 1) and (s.n, s.k) == (24, 16)
    with pytest.raises(tf.TmaflowError, match=r"K of a \(16\) and b_shard \(8\) differ"):
        ops.scatter_shapes((10, 16), "bfloat16", (24, 8), "bfloat16", 4, 2)
    with pytest.raises(tf.TmaflowError, match=r"rank=4 must be in \[0, 3\]"):
        ops.scatter_shapes((10, 16), "bfloat16", (24, 16), "bfloat16", 4, 4)


@pytest.mark.parametrize("debug", [False, True], ids=["release", "debug"])
def test_signal_kernels_compile_for_sm90a(tmp_cache, debug):
    for name in ("signal_put", "signal_wait_reset"):
        k = tf.Kernel(source("signal"), name, filename="signal.cu", debug=debug)
        assert ".target sm_90a" in k.ptx and k.resources.spills == 0
    ptx = k.ptx
    for instruction in ("st.release.sys.global.u32", "ld.acquire.sys.global.u32", "nanosleep.u32",
                        "st.relaxed.sys.global.u32"):
        assert instruction in ptx, instruction
    assert ("%globaltimer" in ptx) == debug  # the watchdog exists only in debug builds


def test_fences_and_add_compile(tmp_cache):
    src = r'''
#include <tmaflow.cuh>
using namespace tmaflow;
extern "C" __global__ void k(uint32_t* s) {
  signal::add(s, 2u);
  fence::acq_rel_sys(); fence::sc_sys(); fence::proxy_async_global();
  s[1] = signal::wait_ge(s, 2u, {0, 1, 3});
}'''
    ptx = tf.Kernel(src, "k").ptx
    for instruction in ("red.release.sys.global.add.u32", "fence.acq_rel.sys", "fence.sc.sys",
                        "fence.proxy.async.global"):
        assert instruction in ptx, instruction


def _record(**fields):
    r = watchdog.Record()
    r.magic, r.rank, r.peer = watchdog.MAGIC, -1, -1
    for name, value in fields.items():
        setattr(r, name, value)
    return watchdog._as_dict(r)


class _Kernel:
    name = "signal_wait_reset"


def test_watchdog_names_rank_peer_and_signal():
    stuck = _record(rank=2, peer=1, signal=1, expected=1, seen=0, waited_us=1_200_000,
                    file=b"signal.cu", line=17, name=b"signal")
    text = watchdog._message(_Kernel, [stuck])
    assert "rank 2: signal 1 from rank 1 (waiting for 1, saw 0; signal.cu:17) never completed " \
           "within 1.20 s" in text
    assert "Rank 1 never put the signal" in text


def test_watchdog_barrier_records_keep_their_message():
    stuck = _record(name=b"p.full", stage=1, parity=0, waited_us=1_000_000)
    text = watchdog._message(_Kernel, [stuck])
    assert "barrier 'p.full' stage 1" in text and "multicast mask" in text and "rank" not in text


def _trace(kernel, t0, blocks=1):
    ev = np.zeros(2 * blocks, dtype=tr._SAVED)
    for i in range(2 * blocks):
        ev[i] = (t0 + 100 * i, 50, tr.KIND["wait"], 0, 0, 0, 3, 1, i // 2, i % 2)
    return tr.Trace(ev, kernel, 2)


def test_merge_traces_one_process_per_rank_on_one_clock(tmp_path):
    saved = tmp_path / "rank1.npz"
    _trace("gemm", 5_000).save(saved)
    doc = merge_traces({0: [_trace("pull", 2_000), _trace("gemm", 3_000, blocks=2)], 1: str(saved)},
                       tmp_path / "merged.json")
    assert json.loads((tmp_path / "merged.json").read_text()) == doc
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}
    first = min(spans, key=lambda e: e["ts"])
    assert first["ts"] == 0 and first["pid"] == 0
    assert any(e["pid"] == 1 and e["ts"] == pytest.approx(3.0) for e in spans)  # 5000 ns - 2000 ns
    # every (launch, CTA, warp) of a rank is its own thread, named after its kernel
    threads = [e for e in doc["traceEvents"] if e["name"] == "thread_name" and e["pid"] == 0]
    assert len(threads) == 2 + 4 and any("gemm #1 CTA 1" in t["args"]["name"] for t in threads)


@pytest.mark.parametrize("bad,match", [({}, r"per_rank must be a non-empty dict"),
                                       ({-1: []}, r"rank -1 must be an int >= 0"),
                                       ({0: [3]}, r"rank 0: 3 must be a tmaflow Trace")])
def test_merge_traces_refuses(bad, match):
    with pytest.raises(tf.TmaflowError, match=match):
        merge_traces(bad)


def test_the_pad_holds_every_world_size():
    from tmaflow.distributed.symmetric import PAD_BYTES
    assert protocol.pad_slots(protocol.MAX_WORLD) <= PAD_BYTES // 4


def test_signal_events_are_labelled_spans(tmp_cache):
    ev = np.zeros(2, dtype=tr._SAVED)
    ev[0] = (1_000, 700, tr.KIND["signal wait"], -1, 3, (1 << 16) | 1, 17, 0, 0, 0)
    ev[1] = (2_000, 0, tr.KIND["signal put"], -1, 0xBEEF00, 1, 0, 0, 0, 0)
    doc = tr.Trace(ev, "signal_wait_reset", 1).to_chrome()
    wait, put = [e for e in doc["traceEvents"] if e["ph"] != "M"]
    assert (wait["name"], wait["ph"], wait["dur"]) == ("signal wait 3 from rank 1", "X", 0.7)
    assert (put["name"], put["ph"]) == ("signal put 1 at ..00beef00", "i")
    k = tf.Kernel(source("signal"), "signal_wait_reset", filename="signal.cu", trace=True)
    assert "tmaflow_trace_state" in k.ptx and k.resources.spills == 0


def test_stream_operations_queue_the_driver_calls_with_their_flags(monkeypatch):
    from tmaflow.distributed import streamops

    calls = []
    monkeypatch.setattr(streamops.driver, "call", lambda name, *args: calls.append((name, *args)))
    streamops.put(7, 0x1000)
    streamops.wait_reset(7, 0x2000)
    streamops.copy(7, 0x3000, 0x4000, 256)
    streamops.copy(7, 0x3000, 0x4000, 0)  # nothing to copy: no call
    assert calls == [("cuStreamWriteValue32", 7, 0x1000, 1, 0),   # default: fenced
                     ("cuStreamWaitValue32", 7, 0x2000, 1, 1),    # EQ
                     ("cuStreamWriteValue32", 7, 0x2000, 0, 0),
                     ("cuMemcpyAsync", 0x3000, 0x4000, 256, 7)]
    calls.clear()
    assert streamops.usable(7, 0x10, 0x20)
    assert calls == [("cuStreamWriteValue32", 7, 0x10, 0, 0), ("cuStreamWriteValue32", 7, 0x20, 0, 0),
                     ("cuStreamWaitValue32", 7, 0x10, 0, 0)]  # GEQ 0: holds already


def test_stream_operations_refused_fall_back_to_the_kernels(monkeypatch, caplog):
    from tmaflow.distributed import streamops
    from tmaflow.errors import CudaError

    def refuse(name, *args):
        raise CudaError(name, 1, "CUDA_ERROR_INVALID_VALUE", "")

    monkeypatch.setattr(streamops.driver, "call", refuse)
    assert not streamops.usable(7, 0x10, 0x20)
    assert "signal kernels" in caplog.text
