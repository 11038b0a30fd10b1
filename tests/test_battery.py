"""The bad-input battery (tests/battery.py): every case raises a TmaflowError with a message
naming the problem; on a GPU, a correct launch still works after each one."""
import io

import numpy as np
import pytest

import tmaflow as tf
from battery import CASES
from kernel_sources import source

IDS = [f"{c.area}: {c.what}" for c in CASES]

# Long-lived host memory with a known pattern: a case that let the device (or a copy) write
# into host memory shows up here, named, instead of as a later, unrelated failure.
_CANARY = np.arange(1 << 18, dtype=np.uint32) * np.uint32(2654435761)
_CANARY_SUM = int(_CANARY.sum(dtype=np.uint64))


def test_battery_is_large():
    # the rule cases; the type-kind cases are the generated table (tests/test_hostile.py)
    assert len(CASES) >= 300


@pytest.mark.parametrize("case", [c for c in CASES if not c.gpu],
                         ids=[i for c, i in zip(CASES, IDS) if not c.gpu])
def test_cpu_case(case, tmp_cache):
    with pytest.raises(case.error, match=case.match) as info:
        case.action()
    assert isinstance(info.value, tf.TmaflowError)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_case_then_a_correct_launch(case, device, rng):
    if case.what.startswith(("misaligned torch", "transposed torch", "numpy() of a strided")):
        pytest.importorskip("torch")
    if case.what.startswith("misaligned cupy"):
        pytest.importorskip("cupy")
    with pytest.raises(case.error, match=case.match) as info:
        case.action()
    assert isinstance(info.value, tf.TmaflowError)
    # The process is still healthy: a correct launch gives the right answer.
    seed = int(rng.integers(0, 2**32))
    out = tf.empty(256, "uint32").fill_bytes(0xFF)
    tf.Kernel(source("probe"), "big_smem", filename="probe.cu").launch(out, 1024, seed, grid=1,
                                                                        block=64, smem=1024)
    i = np.arange(256, dtype=np.uint64)
    want = (((255 - i) * 2654435761) & 0xFFFFFFFF).astype(np.uint32) ^ np.uint32(seed)
    np.testing.assert_array_equal(out.numpy(), want)
    _host_memory_is_intact(case)


def _host_memory_is_intact(case):
    """After the case: host memory it never owned is unchanged, and an archive written now reads
    back as written (the saved-trace cases once failed inside xdist workers on the GPU machine,
    reading null bytes from archives just written)."""
    assert int(_CANARY.sum(dtype=np.uint64)) == _CANARY_SUM, \
        f"after {case.area}: {case.what}: host memory changed under the canary"
    buf = io.BytesIO()
    arrays = {"a": np.arange(5.0), "b": np.array("{}")}
    np.savez_compressed(buf, **arrays)
    with np.load(io.BytesIO(buf.getvalue())) as f:
        back = {k: f[k] for k in f.files}
    assert all(np.array_equal(back[k], v) for k, v in arrays.items()), \
        f"after {case.area}: {case.what}: an in-memory archive reads back as {back}"
