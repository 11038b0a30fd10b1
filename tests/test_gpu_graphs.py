"""GPU tier: tmaflow inside real programs. Programmatic dependent launch, tf.Graph capture,
replay and in-place update, torch.cuda.graph, and the torch custom ops under torch.compile."""
import numpy as np
import pytest

import tmaflow as tf
from tmaflow.dtypes import bf16_bits, bf16_to_float32
from tmaflow import kernels
from tmaflow.testing import poison

pytestmark = pytest.mark.gpu


def softmax_ref(x):
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def bf16_random(rng, shape):
    """Random bfloat16 values in [-2, 2) as (tf array, float64 numpy)."""
    bits = bf16_bits(rng.uniform(-2, 2, shape))
    return tf.from_numpy(bits, "bfloat16"), bf16_to_float32(bits).astype(np.float64)


# --- programmatic dependent launch ------------------------------------------------------------

def test_pdl_copy_chain_carries_data_through(device, rng):
    """Each copy reads what the previous one wrote: without griddep::wait a PDL launch could
    read stale data."""
    host = rng.standard_normal((512, 512)).astype(np.float32)
    xs = [tf.from_numpy(host)] + [poison(tf.empty((512, 512), "float32")) for _ in range(8)]
    for _ in range(3):
        for i in range(8):
            xs[i + 1].fill_bytes(0xFF)  # poisoned again before every chain
        for i in range(8):
            kernels.copy(xs[i], xs[i + 1], pdl=True)
        np.testing.assert_array_equal(xs[8].numpy(), host)


def test_pdl_softmax_gemm_chain_matches_plain(device, rng):
    x = tf.from_numpy(rng.standard_normal((16, 4096)).astype(np.float32))
    a, a64 = bf16_random(rng, (16, 512))
    b, b64 = bf16_random(rng, (384, 512))
    results = {}
    for pdl in (False, True):
        y, c = poison(tf.empty((16, 4096), "float32")), poison(tf.empty((16, 384), "bfloat16"))
        for _ in range(4):
            kernels.softmax(x, y, pdl=pdl)
            kernels.gemm(a, b, c, pdl=pdl)
        results[pdl] = (y.numpy(), c.numpy())
    np.testing.assert_array_equal(results[True][0], results[False][0])
    np.testing.assert_array_equal(results[True][1], results[False][1])
    np.testing.assert_allclose(results[True][0], softmax_ref(x.numpy().astype(np.float64)), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(results[True][1].astype(np.float64), a64 @ b64.T, rtol=2e-2, atol=2e-1)


def test_pdl_launch_attribute_reaches_the_driver(device):
    k = tf.Kernel('#include <tmaflow.cuh>\nextern "C" __global__ void k(int* o) {'
                  ' tmaflow::griddep::wait(); o[threadIdx.x] = threadIdx.x; tmaflow::griddep::launch_dependents(); }', "k")
    out = poison(tf.empty(32, "int32"))
    run = k.bind(grid=1, block=32, pdl=True)
    assert run.config.pdl
    run(out)
    np.testing.assert_array_equal(out.numpy(), np.arange(32))


# --- tf.Graph ---------------------------------------------------------------------------------

def test_graph_replays_with_new_values_and_new_buffers(device, rng):
    """1,000 replays, bit-exact against eager launches of the same kernels: new values every
    replay, new buffers every 100 (a re-capture, applied to the instance in place)."""
    shape = (64, 1024)

    def buffers():
        x = tf.empty(shape, "float32")
        a, _ = bf16_random(rng, (64, 256))
        b, _ = bf16_random(rng, (128, 256))
        return x, a, b

    g = tf.Graph()
    x = a = b = y = c = None
    try:
        for replay in range(1000):
            if replay % 100 == 0:
                x, a, b = buffers()
                with g.capture():
                    y = kernels.softmax(x)        # outputs allocated in the capture
                    c = kernels.gemm(a, b)
                assert len(g.launches) == 2
            host = rng.standard_normal(shape).astype(np.float32)
            x.copy_from(host)
            poison(y), poison(c)
            g.replay()
            y_eager, c_eager = kernels.softmax(x), kernels.gemm(a, b)
            got_y, got_c = y.numpy(), c.numpy()
            assert np.array_equal(got_y, y_eager.numpy()), f"softmax differs at replay {replay}"
            assert np.array_equal(got_c, c_eager.numpy()), f"gemm differs at replay {replay}"
        np.testing.assert_allclose(got_y, softmax_ref(host.astype(np.float64)), rtol=1e-5, atol=1e-8)
        assert g.updates == 9  # every re-capture after the first updated the instance in place
    finally:
        g.close()


def test_graph_refuses_a_freed_buffer_before_replay(device, rng):
    x = tf.from_numpy(rng.standard_normal((64, 512)).astype(np.float32))
    y = tf.empty((64, 512), "float32")
    with tf.Graph() as g:
        with g.capture():
            kernels.softmax(x, y)
        g.replay()
        x.free()
        with pytest.raises(tf.LaunchError, match=r"replay\(\): launch 0 \(softmax\), argument 0: "
                                                 r"TensorMap.*was freed after the capture"):
            g.replay()


def test_graph_capture_errors_are_named(device, rng):
    x = tf.from_numpy(rng.standard_normal((64, 512)).astype(np.float32))
    y = tf.empty((64, 512), "float32")
    with tf.Graph() as g:
        with pytest.raises(tf.TmaflowError, match=r"nothing was captured.*stream=None"):
            with g.capture():
                kernels.softmax(x, y, stream=tf.Stream())  # another stream: ran eagerly
        with pytest.raises(tf.TmaflowError, match=r"replay\(\): nothing captured yet"):
            g.replay()
        kernels.softmax(x, y, debug=True)  # the debug build exists (its watchdog memory too)
        with pytest.raises(tf.LaunchError, match=r"debug build.*cannot be captured"):
            with g.capture():
                kernels.softmax(x, y, debug=True)
        with g.capture():  # the graph still works after both
            kernels.softmax(x, y)
        poison(y)
        g.replay()
        np.testing.assert_allclose(y.numpy(), softmax_ref(x.numpy().astype(np.float64)), rtol=1e-5, atol=1e-8)



def test_graph_split_k_gemm_first_used_in_the_capture(device, rng):
    """The split-K workspace made during a capture is zeroed at once (the graph's stream has its
    own; eager launches on the legacy stream use theirs)."""
    from tmaflow.kernels.matmul import splitk

    splitk._workspaces.__dict__.clear()
    a, a64 = bf16_random(rng, (64, 8192))
    b, b64 = bf16_random(rng, (256, 8192))
    with tf.Graph() as g:
        with g.capture():
            c = kernels.gemm(a, b)
            c.fill_bytes(0xFF)  # captured: a memset node before the second gemm
            d = kernels.gemm(a, b, c)
        assert d is c and g.nodes == 3
        eager = kernels.gemm(a, b)
        np.testing.assert_allclose(eager.numpy().astype(np.float64), a64 @ b64.T, rtol=2e-2, atol=1.0)
        for _ in range(3):
            poison(c)
            g.replay()
            assert np.array_equal(c.numpy(), eager.numpy())

def test_graph_of_a_pdl_chain(device, rng):
    host = rng.standard_normal((512, 512)).astype(np.float32)
    xs = [tf.from_numpy(host)] + [tf.empty((512, 512), "float32") for _ in range(8)]
    with tf.Graph() as g:
        with g.capture():
            for i in range(8):
                kernels.copy(xs[i], xs[i + 1], pdl=True)
        assert g.nodes == 8
        for _ in range(20):
            poison(xs[8])
            g.replay()
            np.testing.assert_array_equal(xs[8].numpy(), host)


# --- torch ------------------------------------------------------------------------------------

def test_torch_cuda_graph_captures_entry_points(device, rng):
    torch = pytest.importorskip("torch")
    x = torch.randn(64, 1024, device="cuda")
    a = torch.randn(64, 256, device="cuda").to(torch.bfloat16)
    b = torch.randn(128, 256, device="cuda").to(torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture, as torch asks
        kernels.softmax(x), kernels.gemm(a, b)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = kernels.softmax(x)
        c = kernels.gemm(a, b)
    for replay in range(1000):
        x.copy_(torch.randn(64, 1024, device="cuda"))
        a.copy_(torch.randn(64, 256, device="cuda").to(torch.bfloat16))
        y.fill_(float("nan")), c.fill_(float("nan"))
        g.replay()
        assert torch.equal(y, kernels.softmax(x)), f"softmax differs at replay {replay}"
        assert torch.equal(c, kernels.gemm(a, b)), f"gemm differs at replay {replay}"
    torch.testing.assert_close(y, torch.softmax(x, -1), rtol=1e-5, atol=1e-7)


def test_torch_compile_fullgraph_runs_the_custom_ops(device, rng):
    torch = pytest.importorskip("torch")
    import tmaflow.torch  # noqa: F401  registers torch.ops.tmaflow.*

    def f(x, a, b):  # the entry points as users call them: traced as torch.ops.tmaflow.*
        return kernels.softmax(x * 2.0) + 1.0, kernels.gemm(a, b)

    compiled = torch.compile(f, fullgraph=True)
    for m in (64, 96):  # a second shape: recompiled or dynamic, either way correct
        x = torch.randn(m, 512, device="cuda")
        a = torch.randn(m, 256, device="cuda").to(torch.bfloat16)
        b = torch.randn(128, 256, device="cuda").to(torch.bfloat16)
        got, want = compiled(x, a, b), f(x, a, b)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        torch.testing.assert_close(got[0], torch.softmax(x * 2.0, -1) + 1.0, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got[1].float(), (a.float() @ b.float().T), rtol=2e-2, atol=2e-1)
    graphed = torch.compile(f, fullgraph=True, mode="reduce-overhead")  # torch's CUDA graphs
    for _ in range(4):  # recorded, then replayed with new inputs copied into its buffers
        x = torch.randn(64, 512, device="cuda")
        a = torch.randn(64, 256, device="cuda").to(torch.bfloat16)
        b = torch.randn(128, 256, device="cuda").to(torch.bfloat16)
        got, want = [t.clone() for t in graphed(x, a, b)], f(x, a, b)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    ops = torch.compile(lambda x: torch.ops.tmaflow.copy(torch.ops.tmaflow.softmax(x)), fullgraph=True)
    torch.testing.assert_close(ops(x), torch.softmax(x, -1), rtol=1e-5, atol=1e-7)
    with pytest.raises(Exception, match=r"kernels.softmax\(...\) inside torch.compile.*takes no out"):
        torch.compile(lambda x, y: kernels.softmax(x, y), fullgraph=True)(x, torch.empty_like(x))


def test_torch_compile_fullgraph_runs_fp8_gemms(device, rng):
    """fp8 GEMMs called as users call them inside a compiled function: per-tensor scales
    (torch.ops.tmaflow.gemm) and block scales, scale_a row-major or M-major
    (torch.ops.tmaflow.gemm_block_scaled); bf16 out, equal to the eager calls."""
    torch = pytest.importorskip("torch")
    import tmaflow.torch  # noqa: F401  registers torch.ops.tmaflow.*

    m, n, k = 200, 384, 1024
    a = (torch.randn(m, k, device="cuda") * 30).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, device="cuda") * 30).to(torch.float8_e4m3fn)
    sa = torch.rand(m, k // 128, device="cuda") * 0.01 + 0.001
    sb = torch.rand(-(-n // 128), k // 128, device="cuda") * 0.01 + 0.001

    def f(a, b, sa, sb):
        return kernels.gemm(a, b, scale_a=0.5, scale_b=0.25), kernels.gemm(a, b, scale_a=sa, scale_b=sb)

    compiled = torch.compile(f, fullgraph=True)
    cols = torch.arange(k, device="cuda") // 128
    ref_blocks = ((a.double() * sa[:, cols].double()) @
                  (b.double() * sb[torch.arange(n, device="cuda")[:, None] // 128, cols[None, :]].double()).T)
    for scale_a in (sa, sa.t().contiguous().t()):  # row-major, then M-major
        got, want = compiled(a, b, scale_a, sb), f(a, b, scale_a, sb)
        assert all(t.dtype == torch.bfloat16 and t.shape == (m, n) for t in got)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        ref = 0.125 * (a.double() @ b.double().T)
        assert (torch.linalg.norm(got[0].double() - ref) / torch.linalg.norm(ref)).item() < 1e-2
        assert (torch.linalg.norm(got[1].double() - ref_blocks) / torch.linalg.norm(ref_blocks)).item() < 1e-2
    with pytest.raises(Exception, match=r"block scales need both scale_a and scale_b as tensors"):
        torch.compile(lambda a, b, s: kernels.gemm(a, b, scale_a=s, scale_b=0.5), fullgraph=True)(a, b, sa)


def test_torch_custom_op_fake_shapes_and_user_ops(device):
    torch = pytest.importorskip("torch")
    import tmaflow.torch as tft

    meta = torch.empty(32, 64, device="meta")
    assert torch.ops.tmaflow.softmax(meta).shape == (32, 64)
    ab = torch.empty(16, 256, device="meta", dtype=torch.bfloat16)
    bb = torch.empty(256, 96, device="meta", dtype=torch.bfloat16)
    assert torch.ops.tmaflow.gemm(ab, bb, "nn").shape == (16, 96)
    a8 = torch.empty(16, 256, device="meta", dtype=torch.float8_e4m3fn)
    b8 = torch.empty(200, 256, device="meta", dtype=torch.float8_e4m3fn)
    c8 = torch.ops.tmaflow.gemm(a8, b8, "nt", 0.5, 2.0)
    assert c8.shape == (16, 200) and c8.dtype == torch.bfloat16
    sa, sb = torch.empty(16, 2, device="meta"), torch.empty(2, 2, device="meta")
    c8 = torch.ops.tmaflow.gemm_block_scaled(a8, b8, sa, sb)
    assert c8.shape == (16, 200) and c8.dtype == torch.bfloat16
    with pytest.raises(Exception, match=r"tmaflow.gemm_block_scaled: scale_a must be \(16, 2\) and scale_b \(2, 2\)"):
        torch.ops.tmaflow.gemm_block_scaled(a8, b8, sb, sb)
    with pytest.raises(Exception, match=r"tmaflow.gemm: fp8 operands take layout 'nt'"):
        torch.ops.tmaflow.gemm(a8, torch.empty(256, 200, device="meta", dtype=torch.float8_e4m3fn), "nn")
    with pytest.raises(Exception, match=r"tmaflow.gemm: scale_a / scale_b dequantise fp8 operands"):
        torch.ops.tmaflow.gemm(ab, bb, "nn", 2.0)
    with pytest.raises(Exception, match=r"tmaflow.softmax: needs a float32 tensor"):
        torch.ops.tmaflow.softmax(torch.empty(4, device="meta", dtype=torch.float16))
    assert torch.ops.tmaflow.softmax(torch.empty(2, 3, 5, device="meta")).shape == (2, 3, 5)  # any rank

    k = tf.Kernel('extern "C" __global__ void twice(const float* x, float* y, int n) {'
                  ' int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 2.f * x[i]; }', "twice")

    @tft.op("tmaflow_test::twice", fake=lambda x: torch.empty_like(x))
    def twice(x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        k.launch(x, y, x.numel(), grid=(x.numel() + 255) // 256, block=256)
        return y

    x = torch.randn(1000, device="cuda")
    out = torch.compile(lambda t: twice(t) + 1, fullgraph=True)(x)
    torch.testing.assert_close(out, 2 * x + 1)
