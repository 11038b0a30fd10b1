"""The bf16 GEMM (issue 6). The kernel is new and has not run on a GPU yet: each shape is
first run as a debug build, so a pipeline bug becomes a DeadlockError instead of a hang."""
import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.testing import poison, rel_error

pytestmark = pytest.mark.gpu

SHAPES = [(256, 256, 64), (128, 128, 1024), (1000, 760, 520), (300, 4096, 136), (16, 4096, 4096),
          (4096, 16, 4096), (1024, 1024, 1024)]


def _bf16(x):
    """float32 -> bf16 bits (round to nearest even) and the float32 values they hold."""
    u = x.astype(np.float32).view(np.uint32)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_gemm_against_float64(device, rng, m, n, k):
    a_bits, a = _bf16(rng.standard_normal((m, k)))
    b_bits, b = _bf16(rng.standard_normal((n, k)))
    A, B = tf.from_numpy(a_bits, dtype="bfloat16"), tf.from_numpy(b_bits, dtype="bfloat16")
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    for debug in (True, False):
        out = poison(tf.empty((m, n), "bfloat16"))
        kernels.gemm(A, B, out, debug=debug)
        got = (out.numpy().view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        assert not np.isnan(got).any()
        assert rel_error(got, ref) < 1e-2, (m, n, k, debug)
