"""tf.autotune on the CPU: variants, keys, the memo on disk, TMAFLOW_AUTOTUNE=0, the
correctness filter and progress, with numpy "kernels" and injected timings."""
import json

import numpy as np
import pytest

import tmaflow as tf
from tmaflow.tune import Memo, build_key, memo_path, source_hash


def scaled(factor_of):
    """A factory of variants writing out = x * factor_of(variant); records what it made."""
    made = []

    def factory(variant):
        made.append(variant)

        def run(x, out):
            out[:] = x * factor_of(variant)
            return out
        return run
    factory.made = made
    return factory


def tuner(tmp_path, factory, variants, times, **options):
    """A Tuner with timings given per variant in order of timing (only correct ones are timed)."""
    queue = list(times)
    options.setdefault("progress", None)
    options.setdefault("confirm", lambda best, default, **_: 2.0)  # interleaved: clearly faster
    return tf.autotune(factory, variants, device="cpu-test", memo_root=tmp_path, name="t",
                       timer=lambda fn, **_: (fn(), queue.pop(0))[1], **options)


@pytest.fixture(autouse=True)
def tuning_on(monkeypatch):
    monkeypatch.delenv("TMAFLOW_AUTOTUNE", raising=False)


def test_every_variant_is_made_once_and_the_fastest_correct_is_chosen(tmp_path, rng):
    factory = scaled(lambda v: 2.0)
    t = tuner(tmp_path, factory, ["a", "b", "c"], [3e-6, 1e-6, 2e-6])
    x, out = rng.standard_normal(8), np.full(8, np.nan)
    t(x, out)
    assert sorted(factory.made) == ["a", "b", "c"]
    assert np.array_equal(out, 2 * x)
    rows = t.results()
    assert [r["index"] for r in rows] == [0, 1, 2] and all(r["correct"] for r in rows)
    assert "*   1" in t.table()
    t(x, out)  # the same key: no second tuning, nothing made again
    assert len(factory.made) == 3


def test_a_wrong_variant_is_never_chosen_however_fast(tmp_path, rng):
    factory = scaled(lambda v: 3.0 if v == "wrong" else 2.0)
    t = tuner(tmp_path, factory, ["default", "wrong", "slow"], [5e-6, 9e-6])  # "wrong" is not timed
    x, out = rng.standard_normal(16), np.zeros(16)
    t(x, out)
    rows = {r["variant"]: r for r in t.results()}
    assert not rows["'wrong'"]["correct"] and "differs from the default" in rows["'wrong'"]["note"]
    assert rows["'wrong'"]["median_s"] is None
    assert np.array_equal(out, 2 * x)  # the default (5 us) beat "slow" (9 us)


def test_a_variant_that_writes_nothing_is_caught_by_poisoned_outputs(tmp_path, rng):
    def factory(variant):
        def run(x, out):
            if variant == "default":
                out[:] = x
            return out
        return run
    t = tuner(tmp_path, factory, ["default", "lazy"], [2e-6])
    x, out = rng.standard_normal(8), np.zeros(8)
    t(x, out)
    assert not t.results()[1]["correct"]


def test_tolerance_accepts_a_close_variant_and_bit_exact_refuses_it(tmp_path, rng):
    factory = scaled(lambda v: 2.0 + (1e-9 if v == "close" else 0.0))
    x = rng.standard_normal(8) + 3
    exact = tuner(tmp_path / "exact", factory, ["default", "close"], [2e-6])
    exact(x, np.zeros(8))
    assert not exact.results()[1]["correct"]
    loose = tuner(tmp_path / "loose", factory, ["default", "close"], [2e-6, 1e-6], tolerance=(1e-6, 0))
    loose(x, np.zeros(8))
    assert loose.results()[1]["correct"] and "*   1" in loose.table()
    with pytest.raises(tf.TmaflowError, match=r"tolerance='x' must be None \(bit-exact\) or \(rtol, atol\)"):
        tf.autotune(factory, ["a"], tolerance="x")


def test_a_variant_whose_factory_refuses_is_left_out(tmp_path, rng):
    def factory(variant):
        if variant == "bad":
            raise tf.CompileError("no such tile")
        return scaled(lambda v: 2.0)(variant)
    t = tuner(tmp_path, factory, ["default", "bad"], [1e-6])
    t(rng.standard_normal(4), np.zeros(4))
    assert "CompileError: no such tile" in t.results()[1]["note"]


def test_key_holds_shapes_dtypes_strides_scalars_and_device():
    a, b = np.zeros((4, 8), np.float32), np.zeros((4, 8), np.float64)
    assert build_key((a,), {}, device="d") != build_key((b,), {}, device="d")
    assert build_key((a,), {}, device="d") != build_key((a.T,), {}, device="d")
    assert build_key((a,), {}, device="d") != build_key((a,), {}, device="e")
    assert build_key((a, 3), {"k": 1}, device="d") != build_key((a, 4), {"k": 1}, device="d")
    assert "(4, 8)" in build_key((a,), {}, device="d") and "float32" in build_key((a,), {}, device="d")
    by_rows = build_key((a,), {}, key=lambda x: [x.shape[0]], device="d")
    assert by_rows == build_key((np.ones((4, 2)),), {}, key=lambda x: [x.shape[0]], device="d")


def test_a_new_shape_is_tuned_again(tmp_path, rng):
    factory = scaled(lambda v: 2.0)
    t = tuner(tmp_path, factory, ["a", "b"], [1e-6, 2e-6, 2e-6, 1e-6])
    t(rng.standard_normal(4), np.zeros(4))
    t(rng.standard_normal(8), np.zeros(8))
    assert len(t._chosen) == 2 and sorted(t._chosen.values()) == [0, 1]


def test_the_choice_is_remembered_on_disk_and_read_back(tmp_path, rng):
    x = rng.standard_normal(4)
    first = tuner(tmp_path, scaled(lambda v: 2.0), ["a", "b"], [2e-6, 1e-6])
    first(x, np.zeros(4))
    data = json.loads(memo_path("t", tmp_path).read_text())
    (entry,) = data["entries"].values()
    assert entry["choice"] == 1 and entry["variant"] == "'b'"
    lines = []
    factory = scaled(lambda v: 2.0)
    again = tuner(tmp_path, factory, ["a", "b"], [], progress=lines.append)
    again(x, np.zeros(4))
    assert factory.made == ["b"] and lines == []  # only the remembered variant made; no tuning
    assert again.results()[1]["median_s"] == pytest.approx(1e-6)


def test_a_memo_tuned_from_other_variants_is_not_reused(tmp_path, rng):
    x = rng.standard_normal(4)
    tuner(tmp_path, scaled(lambda v: 2.0), ["a", "b"], [2e-6, 1e-6])(x, np.zeros(4))
    factory = scaled(lambda v: 2.0)
    tuner(tmp_path, factory, ["a", "b", "c"], [1e-6, 2e-6, 3e-6])(x, np.zeros(4))
    assert sorted(factory.made) == ["a", "b", "c"]


@pytest.mark.parametrize("content", ["{not json", "[]", '{"format": 99, "entries": {}}', '{"format": 1, "entries": []}'])
def test_a_corrupt_memo_is_ignored_and_rewritten(tmp_path, rng, content):
    path = memo_path("t", tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    t = tuner(tmp_path, scaled(lambda v: 2.0), ["a", "b"], [2e-6, 1e-6])
    t(rng.standard_normal(4), np.zeros(4))
    assert json.loads(path.read_text())["format"] == 1
    assert not list(path.parent.glob("*.tmp"))  # the write went through a renamed temporary


def test_memo_entry_of_another_source_or_a_bad_choice_is_no_entry(tmp_path):
    memo = Memo(tmp_path / "m.json")
    memo.put("k", "src", {"choice": 1})
    assert memo.get("k", "src")["choice"] == 1
    assert memo.get("k", "other") is None and memo.get("other", "src") is None
    memo.put("k", "src", {"choice": "1"})
    assert memo.get("k", "src") is None
    assert source_hash("a", [1]) != source_hash("a", [2])


def test_tuning_off_runs_the_default_and_tunes_nothing(tmp_path, rng, monkeypatch):
    monkeypatch.setenv("TMAFLOW_AUTOTUNE", "0")
    factory = scaled(lambda v: 2.0 if v == "default" else 5.0)
    lines = []
    t = tuner(tmp_path, factory, ["default", "other"], [], progress=lines.append)
    x, out = rng.standard_normal(4), np.zeros(4)
    t(x, out)
    assert factory.made == ["default"] and lines == [] and np.array_equal(out, 2 * x)
    assert not memo_path("t", tmp_path).exists()
    monkeypatch.setenv("TMAFLOW_AUTOTUNE", "maybe")
    with pytest.raises(tf.TmaflowError, match=r"TMAFLOW_AUTOTUNE='maybe' must be 0 .* or 1"):
        t(x, out)


def test_progress_names_every_variant_and_the_choice(tmp_path, rng):
    lines = []
    t = tuner(tmp_path, scaled(lambda v: 3.0 if v == "wrong" else 2.0), ["a", "wrong", "c"], [2e-6, 1e-6],
              progress=lines.append)
    t(rng.standard_normal(4), np.zeros(4))
    assert lines[0].startswith("t: tuning 3 variants for cpu-test|")
    assert lines[1] == "t: [1/3] 'a': 2.0 us" and lines[3] == "t: [3/3] 'c': 1.0 us"
    assert lines[2].startswith("t: [2/3] 'wrong': refused (output 0 differs")
    assert lines[4] == "t: 'c' against the default, interleaved: 2.000x"
    assert lines[5].startswith("t: chose 'c' in ")


def test_progress_goes_to_stderr_by_default(tmp_path, rng, capsys):
    queue = [1e-6]
    t = tf.autotune(scaled(lambda v: 2.0), ["a"], device="cpu-test", memo_root=tmp_path, name="t",
                    timer=lambda fn, **_: (fn(), queue.pop(0))[1])
    t(rng.standard_normal(4), np.zeros(4))
    assert "tmaflow autotune: t: [1/1] 'a': 1.0 us" in capsys.readouterr().err


def test_entry_tunes_the_config_against_the_entry_points_own_choice(tmp_path, rng):
    calls = []

    def entry_point(x, out=None, *, config=None):
        """A stand-in entry point."""
        calls.append(config)
        out = np.empty_like(x) if out is None else out
        out[:] = x * (3 if config == "broken" else 2)
        return out
    queue = [3e-6, 1e-6]
    t = tf.autotune.entry(entry_point, configs=["broken", "fast"], device="cpu-test", memo_root=tmp_path,
                          progress=None, timer=lambda fn, **_: (fn(), queue.pop(0))[1],
                          confirm=lambda best, default, **_: 1.5)
    x = rng.standard_normal(4)
    assert np.array_equal(t(x), 2 * x)
    assert t.__doc__ == "A stand-in entry point."
    assert [r["variant"] for r in t.results()] == ["None", "'broken'", "'fast'"]
    assert calls[-1] == "fast" and not t.results()[1]["correct"]


def test_no_variants_is_refused():
    with pytest.raises(tf.TmaflowError, match=r"variants=\[\] is empty"):
        tf.autotune(lambda v: v, [])
    with pytest.raises(tf.TmaflowError, match="factory=3 must be callable"):
        tf.autotune(3, ["a"])


def test_bf16_device_arrays_are_compared_as_values():
    from tmaflow.tune.check import to_host

    class FakeBf16:  # what a tmaflow bf16 array gives: 16-bit patterns
        dtype = tf.as_dtype("bfloat16")

        def numpy(self):
            return np.array([0x3F80, 0xC000], np.uint16)  # 1.0, -2.0
    assert to_host(FakeBf16()).tolist() == [1.0, -2.0]


@pytest.mark.parametrize("speedup, kept", [(1.01, "a"), (1.02, "a"), (1.05, "c")])
def test_the_default_stays_unless_interleaved_rounds_confirm_a_gain(tmp_path, rng, speedup, kept):
    """Screened one after another, 'c' looks twice as fast; it replaces the default only if the
    interleaved comparison finds it faster by more than min_gain (2%)."""
    seen = []

    def confirm(best, default, **options):
        seen.append(options)
        return speedup
    t = tuner(tmp_path, scaled(lambda v: 2.0), ["a", "c"], [2e-6, 1e-6], confirm=confirm)
    t(rng.standard_normal(4), np.zeros(4))
    assert t.chosen() == kept and len(seen) == 1
    assert t.results()[1]["confirmed_speedup"] == speedup
