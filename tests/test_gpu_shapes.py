"""GPU tier: every shape and stride torch takes, against torch. Random sweeps (each dim 1..4099,
a third drawn from awkward sizes, a third multiples of 8 that keep the TMA path) of gemm bf16
("nt" and "nn"), fp8 gemm (per-tensor and block scales), grouped_gemm, copy, softmax and
transpose, with operands as contiguous tensors, transposed views, views one element past an
aligned base and every-other-element views, and outputs given as views of wider buffers (whose
other columns must stay untouched); the shapes the issue found refused; empty dims; the edge
path under .prepare(), explicit streams and CUDA graphs."""
import math

import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.testing import poison, rel_error

pytestmark = pytest.mark.gpu

AWKWARD = (1, 3, 7, 13, 127, 129, 255, 257, 1000, 4095, 4097, 4099)
LAYOUTS = ("contiguous", "transposed", "offset", "strided")
GEMM_MACS = 1 << 30  # M * N * K of one swept product at most (a few ms of torch reference each)


@pytest.fixture
def torch(device):
    return pytest.importorskip("torch")


def _dim(rng) -> int:
    pick = rng.random()
    if pick < 1 / 3:
        return int(rng.choice(AWKWARD))
    n = int(rng.integers(1, 4100))
    return n if pick < 2 / 3 else max(8, n // 8 * 8)


def _dims(rng, count: int, most: int) -> list:
    """``count`` dims of 1..4099, halved (largest first) until their product is at most ``most``."""
    dims = [_dim(rng) for _ in range(count)]
    while math.prod(dims) > most:
        i = int(np.argmax(dims))
        dims[i] = max(1, dims[i] // 2)
    return dims


def _values(torch, shape, dtype, scale=1.0):
    if dtype in (torch.int8, torch.int32):
        return torch.randint(-100, 100, tuple(shape), device="cuda", dtype=dtype)
    return (torch.randn(tuple(shape), device="cuda") * scale).to(dtype)


def _matrix(torch, rng, shape, dtype, how=None, scale=1.0):
    """A (rows, cols) tensor laid out as ``how`` (random by default): "contiguous",
    "transposed" (a view of the transposed array), "offset" (a slice one element past the
    base: misaligned rows) or "strided" (every other column)."""
    rows, cols = shape
    how = how or LAYOUTS[int(rng.integers(len(LAYOUTS)))]
    if how == "transposed":
        return _values(torch, (cols, rows), dtype, scale).t(), how
    if how == "offset":
        return _values(torch, (rows, cols + 1), dtype, scale)[:, 1:], how
    if how == "strided":
        return _values(torch, (rows, 2 * cols), dtype, scale)[:, ::2], how
    return _values(torch, (rows, cols), dtype, scale), how


def _out(torch, rng, shape, dtype):
    """None (the entry point allocates), a poisoned contiguous tensor, or a poisoned view of a
    buffer wider than the output (the issue's 4099-column view of a 4104-wide buffer)."""
    pick = int(rng.integers(3))
    if pick == 0:
        return None, None
    pad = 0 if pick == 1 else int(rng.integers(1, 9))
    buf = torch.full((shape[0], shape[1] + pad), float("nan"), device="cuda", dtype=dtype)
    return buf[:, :shape[1]], buf


def _check_product(torch, c, ref, what, buf=None):
    got = c.float()
    assert not got.isnan().any(), f"unwritten elements: {what}"
    err = ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert err < 1e-2, (what, err)
    if buf is not None:
        assert buf[:, c.shape[1]:].isnan().all(), f"wrote past the out view's columns: {what}"


# --- gemm ---------------------------------------------------------------------------------------

def _gemm_case(torch, rng, m, n, k, layout, a_how=None, b_how=None, out=None):
    a, a_how = _matrix(torch, rng, (m, k), torch.bfloat16, a_how)
    b, b_how = _matrix(torch, rng, (n, k) if layout == "nt" else (k, n), torch.bfloat16, b_how)
    ref = a.float() @ (b.float().T if layout == "nt" else b.float())
    if out is None:
        out, buf = _out(torch, rng, (m, n), torch.bfloat16)
    else:
        out, buf = out
    c = kernels.gemm(a, b, out, layout=layout)
    assert c.shape == (m, n) and c.dtype == torch.bfloat16 and (out is None or c is out)
    _check_product(torch, c, ref, (m, n, k, layout, a_how, b_how, buf is not None and buf.shape), buf)


def test_gemm_bf16_random_shapes(torch, rng):
    for case in range(60):
        m, n, k = _dims(rng, 3, GEMM_MACS)
        _gemm_case(torch, rng, m, n, k, ("nt", "nn")[case % 2])


NAMED = [(4097, 4099, 4104), (7, 13, 64), (4096, 4096, 4100), (129, 257, 4095), (3, 5, 7), (2048, 2048, 1),
         (1024, 1024, 1023), (2048, 2047, 2049)]


@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize("m,n,k", NAMED)
def test_gemm_bf16_named_shapes(torch, rng, m, n, k, layout):
    _gemm_case(torch, rng, m, n, k, layout, "contiguous", "contiguous", out=(None, None))


def test_gemm_into_a_4099_column_view_of_a_4104_wide_buffer(torch, rng):
    buf = torch.full((4097, 4104), float("nan"), device="cuda", dtype=torch.bfloat16)
    _gemm_case(torch, rng, 4097, 4099, 4104, "nt", "contiguous", "contiguous", out=(buf[:, :4099], buf))


def test_gemm_empty_dims(torch, rng):
    a, b = _values(torch, (5, 0), torch.bfloat16), _values(torch, (7, 0), torch.bfloat16)
    buf = torch.full((5, 9), float("nan"), device="cuda", dtype=torch.bfloat16)
    c = kernels.gemm(a, b, buf[:, 1:8])  # K = 0: zeros, at the view's strides
    assert torch.equal(c, torch.zeros(5, 7, device="cuda", dtype=torch.bfloat16))
    assert buf[:, 0].isnan().all() and buf[:, 8].isnan().all()
    assert kernels.gemm(a, b).abs().sum().item() == 0
    assert kernels.gemm(_values(torch, (0, 16), torch.bfloat16), _values(torch, (7, 16), torch.bfloat16)).shape == (0, 7)
    assert kernels.gemm(_values(torch, (5, 16), torch.bfloat16), _values(torch, (16, 0), torch.bfloat16),
                        layout="nn").shape == (5, 0)


def test_gemm_edge_path_returns_the_callers_kind(device, rng):
    from tmaflow.dtypes import bf16_bits, bf16_to_float32

    a_bits, b_bits = bf16_bits(rng.standard_normal((33, 13))), bf16_bits(rng.standard_normal((21, 13)))
    c = kernels.gemm(tf.from_numpy(a_bits, dtype="bfloat16"), tf.from_numpy(b_bits, dtype="bfloat16"))
    assert isinstance(c, tf.DeviceArray) and c.shape == (33, 21)
    ref = bf16_to_float32(a_bits).astype(np.float64) @ bf16_to_float32(b_bits).astype(np.float64).T
    assert rel_error(bf16_to_float32(c.numpy()), ref) < 1e-2


# --- fp8 --------------------------------------------------------------------------------------

def test_fp8_per_tensor_random_shapes(torch, rng):
    for case in range(30):
        m, n, k = _dims(rng, 3, GEMM_MACS)
        a, a_how = _matrix(torch, rng, (m, k), torch.float8_e4m3fn, scale=4.0)
        b, b_how = _matrix(torch, rng, (n, k), torch.float8_e4m3fn, scale=4.0)
        sa, sb = float(rng.uniform(0.01, 0.1)), float(rng.uniform(0.01, 0.1))
        out, buf = _out(torch, rng, (m, n), torch.bfloat16)
        c = kernels.gemm(a, b, out, scale_a=sa, scale_b=sb)
        ref = sa * sb * (a.float() @ b.float().T)
        _check_product(torch, c, ref, ("fp8", m, n, k, a_how, b_how), buf)


def _scale_layout(torch, rng, rows, cols, m_major_ok):
    """Random positive scales (rows, cols) laid out row-major, M-major with a 16-byte pitch
    (``m_major_ok``), M-major with the pitch of exactly ``rows`` (16-byte only when rows % 4
    is 0), or every other column."""
    how = ("row_major", "m_major", "m_major_tight", "strided")[int(rng.integers(4))]
    if how == "m_major" and not m_major_ok:
        how = "row_major"
    values = torch.rand(rows, cols, device="cuda") + 0.5
    if how == "row_major":
        return values, how
    if how == "strided":
        buf = torch.empty(rows, 2 * cols, device="cuda")
        buf[:, ::2] = values
        return buf[:, ::2], how
    pitch = -(-rows // 4) * 4 if how == "m_major" else rows
    buf = torch.empty(cols, pitch, device="cuda")
    buf[:, :rows] = values.T
    return buf.t()[:rows], how


def test_fp8_block_scales_random_shapes(torch, rng):
    for case in range(20):
        m, n, k = _dims(rng, 3, GEMM_MACS // 2)
        a, a_how = _matrix(torch, rng, (m, k), torch.float8_e4m3fn, scale=4.0)
        b, b_how = _matrix(torch, rng, (n, k), torch.float8_e4m3fn, scale=4.0)
        kb = -(-k // 128)
        sa, sa_how = _scale_layout(torch, rng, m, kb, True)
        sb, sb_how = _scale_layout(torch, rng, -(-n // 128), kb, False)
        out, buf = _out(torch, rng, (m, n), torch.bfloat16)
        c = kernels.gemm(a, b, out, scale_a=sa, scale_b=sb)
        a_deq = a.float() * sa.repeat_interleave(128, 1)[:, :k]
        b_deq = b.float() * sb.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
        _check_product(torch, c, a_deq @ b_deq.T, ("fp8 blocks", m, n, k, a_how, b_how, sa_how, sb_how), buf)


# --- grouped --------------------------------------------------------------------------------------

def test_grouped_gemm_random_shapes(torch, rng):
    for case in range(25):
        layout = ("nt", "nn")[case % 2]
        g = int(rng.integers(1, 9))
        t, n, k = _dims(rng, 3, GEMM_MACS // 2)
        sizes = rng.multinomial(t, np.ones(g) / g)
        offsets = torch.tensor([0, *np.cumsum(sizes)], dtype=torch.int32, device="cuda")
        a, a_how = _matrix(torch, rng, (t, k), torch.bfloat16)
        inner = (n, k) if layout == "nt" else (k, n)
        b_how = ("contiguous", "sliced", "strided")[int(rng.integers(3))]
        if b_how == "sliced":  # each expert's rows cut from wider ones
            b = _values(torch, (g, inner[0], inner[1] + 5), torch.bfloat16)[..., 2:inner[1] + 2]
        elif b_how == "strided":
            b = _values(torch, (g, inner[0], 2 * inner[1]), torch.bfloat16)[..., ::2]
        else:
            b = _values(torch, (g, *inner), torch.bfloat16)
        out, buf = _out(torch, rng, (t, n), torch.bfloat16)
        c = kernels.grouped_gemm(a, b, offsets if case % 3 else offsets.tolist(), out, layout=layout)
        ref = torch.cat([a[lo:hi].float() @ (b[i].float().T if layout == "nt" else b[i].float())
                         for i, (lo, hi) in enumerate(zip(offsets.tolist(), offsets.tolist()[1:]))])
        _check_product(torch, c, ref, ("grouped", layout, g, t, n, k, a_how, b_how), buf)


# --- copy, softmax, transpose --------------------------------------------------------------------

def _nd_view(torch, rng, shape, dtype, scale=1.0):
    """A tensor of ``shape``: contiguous, its dims permuted, every other element of some dims,
    or one element past an aligned base."""
    how = ("contiguous", "permuted", "strided", "offset")[int(rng.integers(4))]
    if how == "permuted" and len(shape) > 1:
        order = rng.permutation(len(shape))
        return _values(torch, [shape[d] for d in order], dtype, scale).permute(*np.argsort(order).tolist()), how
    if how == "strided" and shape:
        steps = rng.integers(1, 3, len(shape))
        big = _values(torch, [n * s for n, s in zip(shape, steps)], dtype, scale)
        return big[tuple(slice(None, None, int(s)) for s in steps)], how
    if how == "offset":
        return _values(torch, (math.prod(shape) + 1,), dtype, scale)[1:].view(shape), how
    return _values(torch, shape, dtype, scale), how


def _bits(torch, t):
    # a fresh contiguous clone: .contiguous() keeps an odd stride on a one-element dim, which
    # .view(torch.uint8) refuses
    return t.clone(memory_format=torch.contiguous_format).reshape(-1).view(torch.uint8)


def test_copy_random_ranks_and_layouts(torch, rng):
    for case in range(40):
        rank = case % 5
        shape = _dims(rng, rank, 1 << 22) if case % 7 else [int(n) for n in rng.choice([0, 1, 3], rank)]
        dtype = (torch.float32, torch.bfloat16, torch.int8, torch.float64)[case % 4]
        src, how = _nd_view(torch, rng, shape, dtype)
        dst = None
        if case % 2:
            dst, _ = _nd_view(torch, rng, shape, dtype)
            dst.fill_(-1)  # poisoned
        got = kernels.copy(src, dst)
        assert got.shape == src.shape and (dst is None or got is dst)
        assert torch.equal(_bits(torch, got), _bits(torch, src)), (shape, dtype, how)


def test_copy_named_cases(torch, rng):
    x = torch.randn(127, device="cuda")
    assert torch.equal(kernels.copy(x), x)                            # 1-D
    y = torch.randn(64, 127, device="cuda")                           # 508-byte rows
    assert torch.equal(kernels.copy(y), y)
    assert kernels.copy(torch.empty(0, 5, device="cuda")).shape == (0, 5)
    z = torch.randn(3, 256, 256, device="cuda")                       # 3-D contiguous: a TMA view
    assert torch.equal(kernels.copy(z), z)


def test_softmax_random_ranks_widths_and_layouts(torch, rng):
    for case in range(30):
        rank = 1 + case % 4
        shape = _dims(rng, rank, 1 << 22)
        if case % 10 == 9:
            shape[-1] = 30001  # wider than the TMA kernel's two stages
            shape = [max(1, n // 64) for n in shape[:-1]] + [30001]
        x, how = _nd_view(torch, rng, shape, torch.float32, 4.0)
        out, _ = (None, None) if case % 2 else _nd_view(torch, rng, shape, torch.float32)
        got = kernels.softmax(x, out)
        assert got.shape == x.shape and (out is None or got is out)
        torch.testing.assert_close(got.double(), torch.softmax(x.double(), -1), rtol=1e-4, atol=1e-9,
                                   msg=lambda m: f"{shape} {how}: {m}")


def test_softmax_named_cases(torch, rng):
    x = torch.randn(64, 127, device="cuda")  # the 127 columns
    torch.testing.assert_close(kernels.softmax(x), torch.softmax(x, -1), rtol=1e-5, atol=1e-7)
    v = torch.randn(1000, device="cuda")     # 1-D
    torch.testing.assert_close(kernels.softmax(v), torch.softmax(v, -1), rtol=1e-5, atol=1e-7)
    s = torch.tensor(3.0, device="cuda")     # 0-D: torch gives 1
    assert kernels.softmax(s).item() == 1.0
    assert kernels.softmax(torch.empty(4, 0, device="cuda")).shape == (4, 0)


def test_transpose_random_shapes_and_layouts(torch, rng):
    for case in range(25):
        rows, cols = _dims(rng, 2, 1 << 22)
        x, how = _matrix(torch, rng, (rows, cols), (torch.float32, torch.int32)[case % 2])
        out, buf = (None, None)
        if case % 3 == 0:
            buf = torch.zeros(cols, rows + 3, device="cuda", dtype=x.dtype)
            out = buf[:, 1:rows + 1]
        got = kernels.transpose(x, out)
        assert torch.equal(got, x.t()), (rows, cols, how)
        if buf is not None:
            assert not buf[:, 0].any() and not buf[:, rows + 1:].any()


def test_transpose_of_127_columns_and_empty(torch, rng):
    x = torch.randn(64, 127, device="cuda")
    assert torch.equal(kernels.transpose(x), x.t())
    assert kernels.transpose(torch.empty(0, 7, device="cuda")).shape == (7, 0)


# --- the edge path as a launch: prepare, streams, graphs -------------------------------------

def test_prepared_edge_gemm_repeats_every_launch(torch, rng):
    a = _values(torch, (300, 4100), torch.bfloat16)
    b = _values(torch, (257, 4100), torch.bfloat16)
    prepared = kernels.gemm.prepare(a, b)
    c = prepared()
    _check_product(torch, c, a.float() @ b.float().T, "prepared")
    a.copy_(_values(torch, (300, 4100), torch.bfloat16))
    c.fill_(float("nan"))
    assert prepared() is c
    _check_product(torch, c, a.float() @ b.float().T, "prepared, new a")


def test_staged_gemm_moves_both_operands_in_one_launch_behind_which_the_gemm_waits(torch, rng):
    """129 x 257 x 4095: A and B staged by one stage_rows launch, the GEMM launched behind it
    under PDL, C's window copied back by a row copy under PDL; poisoned output against torch,
    repeated with new operands (a PDL launch that did not wait would read the old staging)."""
    a = _values(torch, (129, 4095), torch.bfloat16)
    b = _values(torch, (257, 4095), torch.bfloat16)
    c = torch.full((129, 257), float("nan"), device="cuda", dtype=torch.bfloat16)
    prepared = kernels.gemm.prepare(a, b, c)
    names = [getattr(getattr(launcher, "kernel", None), "name", None) for launcher, _ in prepared.launcher.steps]
    assert names[0] == "stage_rows" and names[-1] == "stage_rows" and len(names) == 3, names
    pdl = [getattr(getattr(launcher, "launcher", launcher), "config", None) for launcher, _ in prepared.launcher.steps]
    assert [getattr(p, "pdl", None) for p in pdl] == [False, True, True], pdl
    for _ in range(3):
        a.copy_(_values(torch, (129, 4095), torch.bfloat16))
        b.copy_(_values(torch, (257, 4095), torch.bfloat16))
        c.fill_(float("nan"))
        prepared()
        _check_product(torch, c, a.float() @ b.float().T, "staged, one launch")


def test_edge_paths_on_an_explicit_torch_stream(torch, rng):
    s = torch.cuda.Stream()
    a, _ = _matrix(torch, rng, (513, 1001), torch.bfloat16, "offset")
    b, _ = _matrix(torch, rng, (1001, 129), torch.bfloat16, "transposed")
    x = torch.randn(33, 127, device="cuda")
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        c = kernels.gemm(a, b, layout="nn", stream=s)
        y = kernels.softmax(x, stream=s)
    s.synchronize()
    _check_product(torch, c, a.float() @ b.float(), "stream")
    torch.testing.assert_close(y, torch.softmax(x, -1), rtol=1e-5, atol=1e-7)


def test_torch_cuda_graph_replays_staged_gemm(torch, rng):
    a = _values(torch, (129, 4095), torch.bfloat16)
    b = _values(torch, (257, 4095), torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture, as torch asks
        kernels.gemm(a, b)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):  # captured on the stream the state was warmed on
        c = kernels.gemm(a, b)
    for _ in range(5):
        a.copy_(_values(torch, (129, 4095), torch.bfloat16))
        c.fill_(float("nan"))
        g.replay()
        assert torch.equal(c, kernels.gemm(a, b))
    _check_product(torch, c, a.float() @ b.float().T, "graph")


def test_tf_graph_replays_staged_gemm_and_softmax(device, rng):
    from tmaflow.dtypes import bf16_bits

    a = tf.from_numpy(bf16_bits(rng.standard_normal((200, 1003))), dtype="bfloat16")
    b = tf.from_numpy(bf16_bits(rng.standard_normal((1003, 77))), dtype="bfloat16")
    x = tf.from_numpy(rng.standard_normal((5, 6, 127)).astype(np.float32))
    c, y = tf.empty((200, 77), "bfloat16"), tf.empty((5, 6, 127))
    kernels.gemm(a, b, c, layout="nn"), kernels.softmax(x, y)  # warm: compiled, prepared
    with tf.Graph() as graph:
        with graph.capture():
            kernels.gemm(a, b, c, layout="nn")
            kernels.softmax(x, y)
        for _ in range(3):
            x.copy_from(rng.standard_normal((5, 6, 127)).astype(np.float32))
            poison(c), poison(y)
            graph.replay()
            graph.device.synchronize()
            assert np.array_equal(c.numpy().view(np.uint16), kernels.gemm(a, b, layout="nn").numpy().view(np.uint16))
            assert np.array_equal(y.numpy(), kernels.softmax(x).numpy())


def test_cupy_arrays_on_the_edge_path(device, rng):
    cupy = pytest.importorskip("cupy")
    host = rng.standard_normal((33, 127)).astype(np.float32)
    x = cupy.asarray(host)
    y, t, v = kernels.softmax(x), kernels.transpose(x), kernels.copy(x[:, 1:])
    tf.current_device().synchronize()
    assert isinstance(y, cupy.ndarray) and isinstance(t, cupy.ndarray) and isinstance(v, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(t), host.T)
    np.testing.assert_array_equal(cupy.asnumpy(v), host[:, 1:])
    ref = np.exp(host - host.max(1, keepdims=True))
    np.testing.assert_allclose(cupy.asnumpy(y), ref / ref.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
