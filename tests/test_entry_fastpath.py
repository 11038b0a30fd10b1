"""The entry points' per-call checks once a state is cached (issues 30 and 33, no GPU): a state
keyed by the layouts and the addresses' alignment answers ``out`` aliasing and the TMA-path
choice from a few comparisons of addresses. Each test caches a state through the fake builders
of tests/test_streams.py, then calls again with the same layouts at addresses that must be
refused or must take the edge path."""
import itertools
import sys
import types

import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.dtypes import as_dtype
from tmaflow.kernels import checks, edge, entry
from tmaflow.launch.config import resolve_stream
from tmaflow.runtime.memory import DeviceArray, _contiguous_strides

from test_streams import fake_states  # noqa: F401  (a fixture)

_addresses = itertools.count(1)


def view(shape, dtype="bfloat16", ptr=None, strides=None):
    """A tmaflow view; each gets its own 1 GiB range unless ``ptr`` places it."""
    dt = as_dtype(dtype)
    shape = tuple(shape)
    ptr = next(_addresses) << 30 if ptr is None else ptr
    return DeviceArray._view(ptr, shape, dt, strides or _contiguous_strides(shape, dt.itemsize), None,
                             None, None)


def at(arr, ptr):
    """``arr``'s layout at another address."""
    return view(arr.shape, arr.dtype.name, ptr, arr.strides)


# Each case: (make the inputs, the call given inputs and out, a fresh out of the right layout).
ROWS, COLS = (64, 512)
CASES = {
    "softmax": (lambda: (view((ROWS, COLS), "float32"),), lambda i, o: kernels.softmax(*i, o),
                lambda: view((ROWS, COLS), "float32")),
    "copy": (lambda: (view((ROWS, COLS), "float32"),), lambda i, o: kernels.copy(*i, o),
             lambda: view((ROWS, COLS), "float32")),
    "transpose": (lambda: (view((ROWS, COLS), "float32"),), lambda i, o: kernels.transpose(*i, o),
                  lambda: view((COLS, ROWS), "float32")),
    "gemm": (lambda: (view((256, 512)), view((128, 512))), lambda i, o: kernels.gemm(*i, o),
             lambda: view((256, 128))),
    "gemm block scales": (
        lambda: (view((256, 512), "float8_e4m3fn"), view((128, 512), "float8_e4m3fn"),
                 view((256, 4), "float32"), view((1, 4), "float32")),
        lambda i, o: kernels.gemm(i[0], i[1], o, scale_a=i[2], scale_b=i[3]), lambda: view((256, 128))),
    "grouped_gemm": (lambda: (view((256, 512)), view((2, 128, 512)), view((3,), "int32")),
                     lambda i, o: kernels.grouped_gemm(*i, o), lambda: view((256, 128))),
    "attention": (lambda: (view((1, 2, 128, 64)), view((1, 2, 128, 64)), view((1, 2, 128, 64))),
                  lambda i, o: kernels.attention(*i, o), lambda: view((1, 2, 128, 64))),
}
INPUT_NAMES = {"softmax": ("x",), "copy": ("src",), "transpose": ("a",), "gemm": ("a", "b"),
               "gemm block scales": ("a", "b", "scale_a", "scale_b"), "grouped_gemm": ("a", "b", "offsets"),
               "attention": ("q", "k", "v")}


@pytest.mark.parametrize("case", list(CASES))
def test_out_over_any_input_is_refused_after_the_layouts_state_is_cached(fake_states, case):
    built, calls = fake_states
    inputs, call, fresh = CASES[case]
    ins = inputs()
    call(ins, fresh())
    call(inputs(), fresh())
    assert len(built) == 1 and len(calls) == 2  # the second call took the cached state
    out = fresh()
    nbytes = checks.span(out)[1] - out.ptr
    for name, arr in zip(INPUT_NAMES[case], ins):
        end = checks.span(arr)[1]
        start = arr.ptr + 16 if case == "softmax" else arr.ptr  # softmax computes out=x in place
        edge_bytes = 4 if case == "attention" else 2  # attention refuses an out off a 4-byte boundary first
        for ptr in (start, end - edge_bytes, arr.ptr - nbytes + edge_bytes):  # same start, last bytes, first bytes
            with pytest.raises(tf.TmaflowError, match=rf"{case.split()[0]}: out .* overlaps {name} "):
                call(ins, at(out, ptr))
    call(ins, at(out, -(-checks.span(ins[-1])[1] // 16) * 16))  # after the last input: fine
    assert len(built) == 1 and len(calls) == 3


def test_an_allocated_call_leaves_no_windows_for_a_given_out(fake_states, monkeypatch):
    monkeypatch.setattr(entry, "empty", lambda shape, dtype, device=None, stream=None: view(shape, dtype))
    q, k, v = (view((1, 2, 128, 64)) for _ in range(3))
    kernels.attention(q, k, v)
    with pytest.raises(tf.TmaflowError, match=r"attention: out .* overlaps k "):
        kernels.attention(q, k, v, k)


def test_softmax_in_place_stays_allowed_once_cached(fake_states):
    built, calls = fake_states
    x = view((ROWS, COLS), "float32")
    for _ in range(3):
        kernels.softmax(x, x)
    assert len(built) == 1 and len(calls) == 3
    with pytest.raises(tf.TmaflowError, match=r"softmax: out .* overlaps x .* only out=x itself"):
        kernels.softmax(x, at(x, x.ptr + 4 * COLS))


@pytest.mark.parametrize("case,route", [("softmax", "softmax"), ("copy", "copy"), ("transpose", "transpose"),
                                        ("gemm", "gemm"), ("grouped_gemm", "grouped_gemm")])
@pytest.mark.parametrize("which", ["input", "out"])
def test_a_misaligned_address_never_takes_the_state_of_an_aligned_one(fake_states, monkeypatch, case, route, which):
    built, calls = fake_states
    taken = []
    monkeypatch.setattr(edge, route, lambda *args, **kwargs: (taken.append(route), (None, (), None))[1])
    inputs, call, fresh = CASES[case]
    call(inputs(), fresh())
    ins, out = list(inputs()), fresh()
    if which == "input":
        ins[0] = at(ins[0], ins[0].ptr + 4)
    else:
        out = at(out, out.ptr + 4)
    call(tuple(ins), out)
    assert taken == [route] and len(calls) == 1  # the edge path, not the cached TMA launch
    call(inputs(), fresh())
    assert len(built) == 1 and len(calls) == 2


def _layout(rng):
    rank = int(rng.integers(1, 4))
    shape = tuple(int(n) for n in rng.integers(0 if rng.random() < 0.1 else 1, 6, rank))
    itemsize = int(rng.choice([1, 2, 4]))
    strides = tuple(int(s) * itemsize for s in rng.integers(-40, 41, rank))
    return shape, itemsize, strides


def test_windows_agree_with_spans_for_random_layouts_and_addresses(rng):
    dtypes = {1: "uint8", 2: "bfloat16", 4: "float32"}
    for _ in range(300):
        layouts = [_layout(rng) for _ in range(3)]
        arrays = [view(shape, dtypes[item], 1 << 20, strides) for shape, item, strides in layouts]
        out, inputs = arrays[0], arrays[1:]
        windows = checks.no_aliasing("t", at(out, 1 << 30), tuple(zip("bc", inputs)))
        for _ in range(20):
            moved = at(out, (1 << 20) + int(rng.integers(-600, 600)))
            lo, hi = checks.span(moved)
            overlap = lo < hi and any(a_lo < hi and lo < a_hi for a_lo, a_hi in map(checks.span, inputs))
            assert checks.apart(moved.ptr, tuple(a.ptr for a in inputs), windows) is not overlap


def test_options_take_every_combination_of_plain_types_as_given():
    opts = checks.Options("t", stages=checks.integer(2, 32, optional=True), pdl=checks.flag(),
                          box=checks.box())
    assert opts.plain == frozenset()  # a box is a tuple: checked at every call
    opts = checks.Options("t", stages=checks.integer(2, 32, optional=True), pdl=checks.flag())
    assert opts.plain == {(int, bool), (type(None), bool)}
    assert opts(1, True) == (1, True)  # plain: the value is checked when a state is built
    with pytest.raises(tf.TmaflowError, match=r"t: pdl=1 must be"):
        opts(4, 1)


def test_a_replaced_framework_module_is_asked_for_its_own_current_stream(monkeypatch):
    def fake_torch(handle):
        return types.SimpleNamespace(_C=types.SimpleNamespace(_cuda_getCurrentRawStream=lambda ordinal: handle))

    t = DeviceArray._view(1 << 30, (8, 8), as_dtype("bfloat16"), (16, 2), None, None, "torch")
    monkeypatch.setitem(sys.modules, "torch", fake_torch(0x7000))
    assert resolve_stream(None, (t,), 0) == 0x7000
    monkeypatch.setitem(sys.modules, "torch", fake_torch(0x8000))
    assert resolve_stream(None, (None, t), 0) == 0x8000


# --- GPU: the cached state's shortcuts on real memory ------------------------------------------------

@pytest.mark.gpu
def test_gpu_misaligned_views_after_a_cached_state_compute_right_and_aliasing_is_refused(device, rng):
    import numpy as np

    from tmaflow.testing import poison

    host = (rng.standard_normal((64, 1000)) * 4).astype(np.float32)
    ref = np.exp(host - host.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    flat = tf.from_numpy(np.concatenate([np.zeros(1, np.float32), host.ravel()]))
    for _ in range(2):  # aligned: the second call takes the cached state
        out = poison(tf.empty(host.shape, "float32"))
        kernels.softmax(tf.from_numpy(host), out)
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-7)
    shifted = DeviceArray(flat.ptr + 4, host.shape, "float32", owner=flat, device=flat.device)  # 4 B past 16
    out = poison(tf.empty(host.shape, "float32"))
    kernels.softmax(shifted, out)  # same layout, misaligned: the edge path
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-7)
    x = tf.from_numpy(host)
    with pytest.raises(tf.TmaflowError, match=r"softmax: out .* overlaps x "):
        kernels.softmax(x, DeviceArray(x.ptr + 4000, host.shape, "float32", owner=x, device=x.device))
    a, b = tf.zeros((128, 64), "bfloat16"), tf.zeros((64, 64), "bfloat16")
    kernels.gemm(a, b, tf.empty((128, 64), "bfloat16"))
    with pytest.raises(tf.TmaflowError, match=r"gemm: out .* overlaps a "):
        kernels.gemm(a, b, DeviceArray(a.ptr, (128, 64), "bfloat16", owner=a, device=a.device))
