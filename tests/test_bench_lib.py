"""tmaflow.bench on the CPU: results and their spread, per-round ratios, shape parsing, the
shape suites, and the checks that run before any device is touched."""
import numpy as np
import pytest

import tmaflow as tf
from tmaflow import bench
from tmaflow.bench import gemm_shapes


def test_result_summary_matches_numpy(rng):
    samples = rng.uniform(1e-6, 1e-3, 25)
    r = bench.Result(tuple(samples))
    assert r.median == pytest.approx(np.median(samples))
    assert r.spread == pytest.approx((samples.min(), np.percentile(samples, 20), np.percentile(samples, 80), samples.max()))
    assert r.mean == pytest.approx(samples.mean()) and len(r.samples) == 25
    text = repr(r)
    assert text.startswith("Result(median ") and all(f"{name} " in text for name in ("min", "p20", "p80", "max"))
    assert r.summary()["n"] == 25


def test_result_needs_samples():
    with pytest.raises(tf.TmaflowError, match=r"samples=\(\) is empty"):
        bench.Result(())


def test_ratios_are_per_round(rng):
    peer, ours = rng.uniform(1, 2, 9), rng.uniform(1, 2, 9)
    r = bench.ratios(peer, ours)
    assert r.median == pytest.approx(np.median(peer / ours)) and r.unit == "x"
    with pytest.raises(tf.TmaflowError, match="3 numerators and 2 denominators"):
        bench.ratios([1, 2, 3], [1, 2])


def test_rounds_ratio_is_reference_over_name():
    got = bench.Rounds({"ours": [1.0, 2.0, 4.0], "peer": [2.0, 2.0, 2.0]})
    assert got.ratio("ours", "peer").samples == (2.0, 1.0, 0.5)
    assert got["ours"].median == 2.0


def test_versus_row_and_line():
    cold = bench.Rounds({"ours": [1e-3, 1e-3], "peer": [2e-3, 2e-3]})
    warm = bench.Rounds({"ours": [1e-3, 1e-3], "peer": [1e-3, 1e-3]})
    v = bench.Versus(cold, warm, "ours", "peer")
    row = v.row()
    assert row["cold"]["ratio"] == 2.0 and row["warm"]["ratio"] == 1.0 and row["cold"]["peer_ms"] == 2.0
    assert "cold" in v.line(2e9) and "back to back" in v.line() and "ratio 2.000" in v.line()


@pytest.mark.parametrize("text, want", [("4096x4096x4096", (4096, 4096, 4096)), ("1X2x3", (1, 2, 3))])
def test_parse_shape(text, want):
    assert bench.parse_shape(text, 3) == want


@pytest.mark.parametrize("text", ["4096x4096", "0x1x2", "ax1x2", "", "1x2x-3"])
def test_parse_shape_refuses(text):
    with pytest.raises(tf.TmaflowError, match="must be AxBxC: positive integers joined by 'x'"):
        bench.parse_shape(text, 3)


def test_parse_gemm_shape_layouts():
    assert bench.parse_gemm_shape("1x2x3") == (1, 2, 3, "nt")
    assert bench.parse_gemm_shape("1x2x3:nn") == (1, 2, 3, "nn")
    with pytest.raises(tf.TmaflowError, match="layout 'tn' must be one of"):
        bench.parse_gemm_shape("1x2x3:tn")
    assert bench.parse_shapes([], [(1, 2, 3)]) == [(1, 2, 3)]


def test_suites():
    assert len(gemm_shapes.SUITE_30) == 30 == len(set(gemm_shapes.SUITE_30))
    assert (512, 512, 2048, "nt") in gemm_shapes.SUITE_30 and (128, 8192, 8192, "nt") in gemm_shapes.SUITE_30
    assert all(n % 8 or k % 8 for _, n, k, _ in gemm_shapes.UNALIGNED)
    assert gemm_shapes.describe(None) == "auto"
    assert gemm_shapes.describe(gemm_shapes.SWEEP[0]).startswith("bn256 c2")


def test_do_bench_checks_before_the_device():
    with pytest.raises(tf.TmaflowError, match="return_mode='p50' must be one of"):
        bench.do_bench(lambda: None, return_mode="p50")
    with pytest.raises(tf.TmaflowError, match="repeats=0 must be an int >= 1"):
        bench.do_bench(lambda: None, repeats=0)
    with pytest.raises(tf.TmaflowError, match="batch=4 with flush_l2=True; .* batch must be 1"):
        bench.do_bench(lambda: None, flush_l2=True, batch=4)


def test_kernel_times_without_torch_says_so(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "torch.profiler", None)
    assert not bench.cupti.available()
    with pytest.raises(tf.TmaflowError, match="needs torch"):
        bench.kernel_times(lambda: None)


def test_a_records_commit_is_the_carried_commit_file_first(tmp_path):
    from tmaflow.bench import records

    (tmp_path / "COMMIT").write_text("abc1234\n")
    assert records.commit(tmp_path) == "abc1234"
    (tmp_path / "COMMIT").unlink()
    assert records.commit(tmp_path) != "abc1234"  # git's answer for tmp_path, or "unknown"


def test_split_calls_reads_a_marked_session():
    """call_times' session: a marker before each function's calls; a call's time is the sum of
    its kernels, memsets (the L2 flush) and copies left out; events may come in any order."""
    from tmaflow.bench.cupti import MARKER, split_calls

    events = [(0, 1.0, MARKER), (1, 5.0, "gemm_bf16"), (2, 80.0, "Memset (Device)"), (3, 6.0, "gemm_bf16"),
              (4, 1.0, MARKER), (5, 3.0, "nvjet_a"), (6, 1.0, "nvjet_reduce"), (7, 2.0, "nvjet_a"),
              (8, 2.0, "nvjet_reduce"), (9, 1.0, MARKER)]
    got = split_calls(list(reversed(events)), ["ours", "peer"], 2)
    assert got == {"ours": (5.0, 6.0), "peer": (4.0, 4.0)}
    with pytest.raises(tf.TmaflowError, match=r"'ours' launched 2 kernels in 3 calls; each call must launch"):
        split_calls(events, ["ours", "peer"], 3)
    with pytest.raises(tf.TmaflowError, match=r"found 3 marker-separated segments for 4 functions"):
        split_calls(events, ["a", "b", "c", "d"], 2)


def test_gemm_candidates_refuse_what_the_tma_kernel_cannot_run():
    from tmaflow.bench.gemm_candidates import candidates

    with pytest.raises(tf.TmaflowError, match=r"gemm candidates: the TMA kernel cannot run 4097x4099x4104 as "
                                              r"given .* N and K are multiples of 8"):
        candidates(4097, 4099, 4104, "nt", 132)


def test_call_times_without_torch_says_so(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(tf.TmaflowError, match="call_times needs torch"):
        bench.call_times({"f": lambda: None})


@pytest.mark.parametrize("m,n,k,layout", gemm_shapes.SUITE_30 + [(512, 512, 2048, "nn"), (300, 1000, 64, "nt"),
                                         (16, 64, 65536, "nt"), (8, 8, 8, "nt")])
def test_gemm_candidates(m, n, k, layout):
    """The sweep's candidates: the default first, each plannable and distinct once normalised,
    bounded in number; skinny shapes keep every skinny choice, small products try cluster
    K-splits."""
    from tmaflow.bench.gemm_candidates import LARGE_FLOP, SMALL_FLOP, candidates, normalized
    from tmaflow.kernels.matmul import SKINNY_M, SkinnyConfig, choose_config

    got = candidates(m, n, k, layout, 132)
    assert got[0].default and got[0].config == choose_config(m, n, k, 132, layout)
    assert sum(c.default for c in got) == 1
    keys = [normalized(c.config, m, n, k, layout, 132) for c in got]
    assert len(set(keys)) == len(keys)
    skinny = layout == "nt" and m <= SKINNY_M
    flop = 2.0 * m * n * k
    # skinny shapes: every skinny choice (65-128 rows: two more, M halves) and 4 dense ones, plus a
    # dense default and its twin
    halves = 2 if skinny and m > 64 else 0
    assert len(got) <= (18 + halves if skinny else 5 if flop > LARGE_FLOP else 12 if flop < SMALL_FLOP else 10)
    default = got[0].config
    if not skinny and not isinstance(default, SkinnyConfig) and (default.split_k > 1 or default.cluster_k > 1):
        # its unsplit twin is timed too
        assert got[1].config == type(default)(**{**default.__dict__, "split_k": 1, "cluster_k": 1, "split_tail": False})
    if skinny:
        assert sum(isinstance(c.config, SkinnyConfig) for c in got) >= (6 if k >= 8 * 64 else 4)
    if 2.0 * m * n * k < 5e9 and m > SKINNY_M and k >= 4 * 64:
        assert any(getattr(c.config, "cluster_k", 1) > 1 for c in got)
