"""tf.autotune on the GPU: a kernel's variants (kernels.copy's box and stages) and an entry
point's config (kernels.gemm's GemmConfig on two shapes), each choice correct against a
reference and no slower than the default beyond noise (interleaved rounds, same run)."""
import numpy as np
import pytest

import tmaflow as tf
from tmaflow import bench, kernels
from tmaflow.dtypes import bf16_bits, bf16_to_float32
from tmaflow.kernels import GemmConfig
from tmaflow.testing import rel_error

pytestmark = pytest.mark.gpu

NOISE = 0.9  # a tuned choice may time this far below the default in a re-run and still be "no slower"


@pytest.fixture(autouse=True)
def tuning_on(monkeypatch):
    monkeypatch.delenv("TMAFLOW_AUTOTUNE", raising=False)


def test_copy_variants_tuned(tmp_path, rng):
    src = tf.from_numpy(rng.standard_normal((4096, 4096), dtype=np.float32))
    dst = tf.empty((4096, 4096), "float32")
    variants = [{}, {"box": (32, 256), "stages": 6}, {"box": (64, 256), "stages": 3},
                {"box": (32, 256), "stages": 3, "stores": 1}]
    lines = []
    tuned = tf.autotune(lambda v: (lambda s, d: kernels.copy(s, d, **v)), variants, name="copy",
                        memo_root=tmp_path, progress=lines.append, repeats=10)
    dst.fill_bytes(0xFF)
    tuned(src, dst)
    assert np.array_equal(dst.numpy(), src.numpy())
    confirmed = sum("confirmed_speedup" in r for r in tuned.results())  # a faster screen, re-run interleaved
    assert len(lines) == len(variants) + 2 + confirmed and all(r["correct"] for r in tuned.results())
    chosen = tuned.chosen()
    got = bench.rounds({"tuned": lambda: kernels.copy(src, dst, **chosen), "default": lambda: kernels.copy(src, dst)},
                       repeats=15)
    assert got.ratio("tuned", "default").median >= NOISE, (chosen, tuned.table())
    again = tf.autotune(lambda v: (lambda s, d: kernels.copy(s, d, **v)), variants, name="copy", memo_root=tmp_path,
                        progress=lines.append)
    again(src, dst)  # remembered: no tuning lines
    assert again.chosen() == chosen and len(lines) == len(variants) + 2 + confirmed


@pytest.mark.parametrize("m, n, k", [(1000, 3000, 520), (2048, 2048, 2048)])
def test_gemm_config_tuned(tmp_path, rng, m, n, k):
    a_bits, b_bits = bf16_bits(rng.standard_normal((m, k))), bf16_bits(rng.standard_normal((n, k)))
    a, b = tf.from_numpy(a_bits, dtype="bfloat16"), tf.from_numpy(b_bits, dtype="bfloat16")
    c = tf.empty((m, n), "bfloat16")
    configs = [GemmConfig(bn=128, cluster_m=1), GemmConfig(bn=256, cluster_m=2), GemmConfig(bn=128, cluster_m=2),
               GemmConfig(bn=192, cluster_m=1, epi_cols=64)]
    tuned = tf.autotune.entry(kernels.gemm, configs=configs, tolerance=(2e-2, 0.02 * np.sqrt(k)),
                              memo_root=tmp_path, progress=None, repeats=10)
    c.fill_bytes(0xFF)
    tuned(a, b, c)
    ref = bf16_to_float32(a_bits[:128]).astype(np.float64) @ bf16_to_float32(b_bits).astype(np.float64).T
    assert rel_error(bf16_to_float32(c.numpy()[:128]), ref) < 1e-2
    chosen = tuned.chosen()
    got = bench.rounds({"tuned": kernels.gemm.prepare(a, b, c, config=chosen), "default": kernels.gemm.prepare(a, b, c)},
                       repeats=20, flush_l2=True)
    assert got.ratio("tuned", "default").median >= NOISE, tuned.table()


def test_autotune_off_runs_the_default(tmp_path, rng, monkeypatch):
    monkeypatch.setenv("TMAFLOW_AUTOTUNE", "0")
    src = tf.from_numpy(rng.standard_normal((256, 256), dtype=np.float32))
    dst = tf.empty((256, 256), "float32").fill_bytes(0xFF)
    made = []
    tuned = tf.autotune(lambda v: made.append(v) or (lambda s, d: kernels.copy(s, d, **v)), [{}, {"stages": 6}],
                        name="copy-off", memo_root=tmp_path, progress=None)
    tuned(src, dst)
    assert made == [{}] and np.array_equal(dst.numpy(), src.numpy())
