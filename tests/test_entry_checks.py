"""The entry points' silent wrong answers, refused by name: host offsets wrapping to int32,
fp8 scale products outside float32, ``out`` overlapping an input, lookalike config fields and
options (also when a state for the value they imitate is cached). CPU: the operands are views
on a device no machine has (tests/hostile_entry.py), so a call whose arguments pass stops with
"lives on device 99". GPU: the accepted spellings give the answers of the canonical ones."""
import numpy as np
import pytest

import tmaflow as tf
from hostile_entry import REACHED, fake
from tmaflow import kernels
from tmaflow.kernels import checks
from tmaflow.kernels import examples
from tmaflow.kernels.matmul import dense
from tmaflow.runtime.memory import DeviceArray


def reaches_the_device(call):
    with pytest.raises(tf.TmaflowError, match=REACHED):
        call()


# --- grouped_gemm host offsets ------------------------------------------------------------------

@pytest.mark.parametrize("offsets", [
    np.array([0, 2**32 + 4, 8], dtype=np.uint64),       # wraps to [0, 4, 8]
    np.array([0, 2**64 - 1, 8], dtype=np.uint64),       # decreasing, invisible to an unsigned diff
    np.array([0, 2**32, 2**32 + 8], dtype=np.int64),    # ends at 8 once narrowed
    np.array([0, -4, 8], dtype=np.int64),
    [0, 9, 8],
])
def test_offsets_are_checked_before_narrowing(offsets):
    with pytest.raises(tf.TmaflowError, match=r"grouped_gemm: offsets \[.*\] must start at 0, never decrease "
                                              r"and end at the 8 rows of a"):
        kernels.grouped_gemm(fake((8, 128)), fake((2, 128, 128)), offsets)


@pytest.mark.parametrize("offsets", [np.array([0, 4, 8], dtype=np.uint64), (v for v in (0, 4, 8)),
                                     [np.int16(0), np.uint8(4), 8]])
def test_host_offsets_of_any_int_type_are_narrowed_exactly(offsets):
    got = checks.host_offsets("grouped_gemm", offsets, 2, 8)
    assert got.dtype == np.int32 and got.tolist() == [0, 4, 8]


@pytest.mark.parametrize("offsets", [[0.0, 4.0, 8.0], [True, False, True], [0, 2**70, 8], "048", None])
def test_offsets_that_are_not_ints_are_refused(offsets):
    with pytest.raises(tf.TmaflowError, match=r"grouped_gemm: offsets.* must be 3 ints"):
        kernels.grouped_gemm(fake((8, 128)), fake((2, 128, 128)), offsets)


# --- fp8 per-tensor scales ------------------------------------------------------------------------

def _fp8(**scales):
    return kernels.gemm(fake((256, 128), "float8_e4m3fn"), fake((256, 128), "float8_e4m3fn"), **scales)


@pytest.mark.parametrize("sa,sb,why", [(1e30, 1e30, "inf"), (1e-30, 1e-30, "0"), (3e38, 2.0, "inf"),
                                       (1e-20, 1e-19, "subnormal")])
def test_scale_products_outside_float32_are_refused(sa, sb, why):
    with pytest.raises(tf.TmaflowError, match=r"gemm: scale_a \* scale_b = .* is outside float32's normal range"):
        _fp8(scale_a=sa, scale_b=sb)


@pytest.mark.parametrize("name", ["scale_a", "scale_b"])
@pytest.mark.parametrize("value", [0, 0.0, -1.0, float("nan"), float("inf"), -float("inf"), True, np.float32("nan"),
                                   "2", 1 + 2j])
def test_each_scale_is_a_finite_float_above_zero(name, value):
    with pytest.raises(tf.TmaflowError, match=rf"gemm: {name}=.* must be a finite float > 0"):
        _fp8(**{name: value})


@pytest.mark.parametrize("sa,sb", [(np.float32(0.5), np.float64(0.25)), (2, np.int64(3)), (1e19, 1e19),
                                   (float(np.finfo(np.float32).tiny), 1.0), (float(np.finfo(np.float32).max), None)])
def test_scale_spellings_and_edges_are_accepted(sa, sb):
    assert checks.tensor_scale("gemm", sa, sb) == pytest.approx(float(sa) * (1.0 if sb is None else float(sb)))
    reaches_the_device(lambda: _fp8(scale_a=sa, scale_b=sb))


def test_block_scales_of_another_device_are_refused():
    a, b = DeviceArray(1 << 33, (256, 256), "float8_e4m3fn"), DeviceArray(1 << 34, (256, 256), "float8_e4m3fn")
    sa, sb = fake((256, 2), "float32"), fake((2, 2), "float32")
    a.device = type("Device", (), {"ordinal": 0})()
    with pytest.raises(tf.TmaflowError, match=r"gemm: scale_a lives on device 99 but a on device 0"):
        kernels.gemm(a, b, scale_a=sa, scale_b=sb)


# --- out aliasing an input ------------------------------------------------------------------------

def _view(base: DeviceArray, shape, offset=0, strides=None):
    return DeviceArray(base.ptr + offset, shape, base.dtype, strides, device=base.device)


def test_span_covers_negative_strides_and_empty_arrays():
    base = fake((4, 8), "float32")
    assert checks.span(base) == (base.ptr, base.ptr + 128)
    flipped = DeviceArray(base.ptr + 96, (4, 8), "float32", (-32, 4))
    assert checks.span(flipped) == (base.ptr, base.ptr + 128)
    assert checks.span(DeviceArray(base.ptr, (0, 8), "float32")) == (base.ptr, base.ptr)


@pytest.mark.parametrize("call,name", [
    (lambda a, b: kernels.gemm(a, b, a), "a"),
    (lambda a, b: kernels.gemm(a, b, _view(b, (128, 128), 64)), "b"),        # a shifted, partial overlap
    (lambda a, b: kernels.gemm(a, b, _view(a, (128, 128), 256 * 128 - 2)), "a"),  # one element shared
])
def test_gemm_out_overlapping_an_operand_is_refused(call, name):
    a, b = fake((128, 128)), fake((128, 128))
    with pytest.raises(tf.TmaflowError, match=rf"gemm: out \(bytes 0x[0-9a-f]+\.\.0x[0-9a-f]+\) overlaps {name} "):
        call(a, b)


def test_gemm_out_next_to_an_operand_is_accepted():
    a, b = fake((128, 128)), fake((128, 128))
    reaches_the_device(lambda: kernels.gemm(a, b, _view(a, (128, 128), 128 * 128 * 2)))


def test_fp8_out_over_block_scales_is_refused():
    a8, b8 = fake((256, 256), "float8_e4m3fn"), fake((256, 256), "float8_e4m3fn")
    sa, sb = fake((256, 2), "float32"), fake((2, 2), "float32")
    with pytest.raises(tf.TmaflowError, match=r"overlaps scale_b"):
        kernels.gemm(a8, b8, DeviceArray(sb.ptr, (256, 256), "bfloat16", device=sb.device), scale_a=sa, scale_b=sb)


def test_grouped_out_over_device_offsets_is_refused():
    a, b, offs = fake((256, 128)), fake((2, 128, 128)), fake((3,), "int32")
    out = DeviceArray(offs.ptr - 256 * 128 * 2 + 4, (256, 128), "bfloat16", device=offs.device)
    with pytest.raises(tf.TmaflowError, match=r"grouped_gemm: out .* overlaps offsets"):
        kernels.grouped_gemm(a, b, offs, out)


@pytest.mark.parametrize("who,call", [
    ("attention", lambda q, k, v: kernels.attention(q, k, v, v)),
    ("attention_cp_async", lambda q, k, v: kernels.attention_cp_async(q, k, v, q)),
])
def test_attention_out_over_an_input_is_refused(who, call):
    shape = (1, 2, 128, 64)
    with pytest.raises(tf.TmaflowError, match=rf"{who}: out .* overlaps [qv] "):
        call(fake(shape), fake(shape), fake(shape))


def test_examples_refuse_out_over_an_input():
    x = fake((64, 64), "float32")
    with pytest.raises(tf.TmaflowError, match=r"transpose: out .* overlaps a "):
        kernels.transpose(x, x)
    with pytest.raises(tf.TmaflowError, match=r"copy: out .* overlaps src "):
        kernels.copy(x, x)
    with pytest.raises(tf.TmaflowError, match=r"reduce_add: out .* overlaps parts "):
        kernels.reduce_add(DeviceArray(x.ptr, (2, 32, 64), "float32", device=x.device), _view(x, (32, 64), 4096))
    v = fake((4096,), "float32")
    with pytest.raises(tf.TmaflowError, match=r"axpb: out .* overlaps x "):
        kernels.axpb(v, 1.0, 0.0, v)
    xs, w = fake((64, 256), "float32"), fake((64, 256), "float32")
    with pytest.raises(tf.TmaflowError, match=r"broadcast_scale: out .* overlaps w "):
        kernels.broadcast_scale(xs, w, w)


def test_softmax_works_in_place_but_refuses_a_shifted_view():
    x = fake((64, 1024), "float32")
    reaches_the_device(lambda: kernels.softmax(x, x))
    with pytest.raises(tf.TmaflowError, match=r"softmax: out .* overlaps x .* only out=x itself"):
        kernels.softmax(x, _view(x, (64, 1024), 4096))


# --- lookalike config fields and options ---------------------------------------------------------

@pytest.mark.parametrize("kw,match", [
    (dict(bn=128.0), r"GemmConfig: bn=128.0 must be an int"),
    (dict(cluster_m=True), r"GemmConfig: cluster_m=True must be an int"),
    (dict(split_k=1.5), r"GemmConfig: split_k=1.5 must be an int"),
    (dict(epi_cols=0), r"GemmConfig: epi_cols=0 must be in \[64, 256\]"),
    (dict(group_m="16"), r"GemmConfig: group_m='16' must be an int"),
    (dict(group_m=0), r"GemmConfig: group_m=0 must be in"),
    (dict(l2_promotion=None), r"GemmConfig: l2_promotion=None must be one of"),
    (dict(promote=np.float64(4)), r"GemmConfig: promote=.* must be an int"),
])
def test_gemm_config_refuses_lookalikes(kw, match):
    with pytest.raises(tf.TmaflowError, match=match):
        kernels.GemmConfig(**kw)


@pytest.mark.parametrize("kw,match", [(dict(rows=64.0), r"SkinnyConfig: rows=64.0 must be an int"),
                                      (dict(cluster=True), r"SkinnyConfig: cluster=True must be an int"),
                                      (dict(split_k=2.0), r"SkinnyConfig: split_k=2.0 must be an int"),
                                      (dict(stages=0), r"SkinnyConfig: stages=0 must be in \[2, 16\]")])
def test_skinny_config_refuses_lookalikes(kw, match):
    with pytest.raises(tf.TmaflowError, match=match):
        kernels.SkinnyConfig(**kw)


def test_configs_hold_numpy_ints_as_ints():
    config = kernels.GemmConfig(bn=np.int64(128), cluster_m=np.uint8(1), split_k=np.int32(2), split_tail=np.bool_(False))
    assert config == kernels.GemmConfig(bn=128, cluster_m=1, split_k=2)
    assert hash(config) == hash(kernels.GemmConfig(bn=128, cluster_m=1, split_k=2))
    assert type(config.bn) is int and type(config.split_tail) is bool
    skinny = kernels.SkinnyConfig(rows=np.int64(128), split_k=np.int16(3))
    assert (type(skinny.rows), type(skinny.split_k)) == (int, int)


class _EveryStateCached(dict):
    """A state cache that has every key: what a lookalike would meet after the value it
    imitates was used once."""

    def __getitem__(self, key):
        raise AssertionError(f"a cached state was looked up for {key!r}")


@pytest.mark.parametrize("module,call", [
    (examples, lambda x: kernels.copy(x, ctas_per_sm=True)),
    (examples, lambda x: kernels.copy(x, stages=4.0)),
    (examples, lambda x: kernels.copy(x, box=(32.0, 64.0))),
    (examples, lambda x: kernels.copy(x, evict_first=1)),
    (examples, lambda x: kernels.softmax(x, pdl=1)),
    (examples, lambda x: kernels.transpose(x, debug=0)),
    (dense, lambda x: kernels.gemm(fake((64, 64)), fake((64, 64)), pdl=0)),
    (dense, lambda x: kernels.gemm(fake((64, 64)), fake((64, 64)), trace=1.0)),
])
def test_lookalike_options_are_refused_before_the_state_lookup(monkeypatch, module, call):
    monkeypatch.setattr(module, "STATES", _EveryStateCached())
    with pytest.raises(tf.TmaflowError, match=r"must be"):
        call(fake((64, 64), "float32"))


@pytest.mark.parametrize("call", [
    lambda: kernels.attention(*(fake((1, 2, 128, 64)),) * 3, scale=np.float32(0.125), causal=np.bool_(True)),
    lambda: kernels.attention_cp_async(*(fake((1, 2, 128, 64)),) * 3, scale=np.float64(0.1), causal=np.bool_(False)),
    lambda: kernels.copy(fake((64, 256), "float32"), stages=np.int64(4), stores=np.int8(2), box=np.array([8, 64])),
    lambda: kernels.softmax(fake((64, 256), "float32"), pdl=np.bool_(False), trace=np.bool_(False)),
    lambda: kernels.gemm(fake((64, 64)), fake((64, 64)), config=kernels.GemmConfig(bn=np.int64(128), cluster_m=1)),
    lambda: kernels.axpb(fake((4096,), "float32"), np.float32(2), np.int64(1), method="ldgsts"),
])
def test_valid_spellings_are_accepted(call):
    reaches_the_device(call)


def test_options_normalise_numpy_spellings_for_the_key():
    opts = checks.Options("copy", stages=checks.integer(2, 32, optional=True), pdl=checks.flag())
    assert opts(None, False) == (None, False)
    got = opts(np.int64(4), np.bool_(True))
    assert got == (4, True) and (type(got[0]), type(got[1])) == (int, bool)
    with pytest.raises(tf.TmaflowError, match=r"copy: stages=1 must be in \[2, 32\]"):
        opts.check(1, False)  # a plain int passes the per-call test; its value is checked on a build


# --- GPU: accepted spellings give the canonical answers ---------------------------------------------

@pytest.mark.gpu
def test_gpu_softmax_in_place_equals_out_of_place(device, rng):
    from tmaflow.testing import poison

    host = (rng.standard_normal((100, 1000)) * 4).astype(np.float32)
    out = poison(tf.empty(host.shape, "float32"))
    kernels.softmax(tf.from_numpy(host), out)
    x = tf.from_numpy(host)
    kernels.softmax(x, x)
    np.testing.assert_array_equal(x.numpy(), out.numpy())
    ref = np.exp(host - host.max(1, keepdims=True))
    np.testing.assert_allclose(x.numpy(), ref / ref.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


@pytest.mark.gpu
def test_gpu_uint64_host_offsets_equal_int32_ones(device, rng):
    from tmaflow.dtypes import bf16_bits
    from tmaflow.testing import poison

    a = tf.from_numpy(bf16_bits(rng.uniform(-1, 1, (300, 128))), "bfloat16")
    b = tf.from_numpy(bf16_bits(rng.uniform(-1, 1, (3, 256, 128))), "bfloat16")
    outs = []
    for offsets in (np.array([0, 100, 100, 300], np.int32), np.array([0, 100, 100, 300], np.uint64),
                    (v for v in (0, 100, 100, 300))):
        out = poison(tf.empty((300, 256), "bfloat16"))
        kernels.grouped_gemm(a, b, offsets, out)
        outs.append(out.numpy())
    for got in outs[1:]:
        np.testing.assert_array_equal(got, outs[0])


@pytest.mark.gpu
def test_gpu_numpy_fp8_scales_equal_float_ones(device, rng):
    from tmaflow.dtypes import e4m3_bits
    from tmaflow.testing import poison

    a = tf.from_numpy(e4m3_bits(rng.standard_normal((256, 512)) * 40), dtype="float8_e4m3fn")
    b = tf.from_numpy(e4m3_bits(rng.standard_normal((384, 512)) * 40), dtype="float8_e4m3fn")
    outs = []
    for sa, sb in ((0.004, 0.002), (np.float64(0.004), np.float64(0.002))):
        out = poison(tf.empty((256, 384), "bfloat16"))
        kernels.gemm(a, b, out, scale_a=sa, scale_b=sb)
        outs.append(out.numpy())
    np.testing.assert_array_equal(outs[1], outs[0])
    with pytest.raises(tf.TmaflowError, match=r"outside float32's normal range"):
        kernels.gemm(a, b, scale_a=1e-25, scale_b=1e-25)


@pytest.mark.gpu
def test_gpu_out_aliasing_real_arrays_is_refused(device):
    a, b = tf.zeros((128, 64), "bfloat16"), tf.zeros((64, 64), "bfloat16")
    with pytest.raises(tf.TmaflowError, match=r"gemm: out .* overlaps a "):
        kernels.gemm(a, b, a)
    x = tf.zeros((64, 64), "float32")
    with pytest.raises(tf.TmaflowError, match=r"transpose: out .* overlaps a "):
        kernels.transpose(x, x)


def fake_using(device: list, guarded: list):
    """entry.using's stand-in: ``device[0]`` is the ordinal for the block; each guard noted."""
    import contextlib

    @contextlib.contextmanager
    def using(ordinal):
        before, device[0] = device[0], ordinal
        guarded.append(ordinal)
        try:
            yield
        finally:
            device[0] = before

    return using


def test_a_call_on_another_devices_arrays_runs_there_under_a_guard(monkeypatch):
    """As torch's ops follow their tensors: arrays on device 1 with the thread on device 0 run
    on device 1 (a guard around the call, the prepared launch too), then the thread is back."""
    import types
    from tmaflow.kernels import entry

    now, guarded, launched = [0], [], []
    monkeypatch.setattr(entry, "current_ordinal", lambda: now[0])
    monkeypatch.setattr(entry, "using", fake_using(now, guarded))
    monkeypatch.setattr(entry, "usable", lambda ordinal: ordinal < 2)
    arr = types.SimpleNamespace(device=types.SimpleNamespace(ordinal=1))

    @entry.entry_point
    def probe(x):
        entry.on_current_device("probe", x)
        return (lambda: launched.append(now[0])), (), "out"

    assert probe(arr) == "out" and launched == [1] and guarded == [1] and now[0] == 0
    prepared = probe.prepare(arr)
    assert prepared.ordinal == 1 and guarded == [1, 1] and launched == [1]
    prepared()
    assert launched == [1, 1] and guarded == [1, 1, 1] and now[0] == 0
    now[0] = 1  # a thread already on the arrays' device: no guard
    probe(arr)
    probe.prepare(arr)()
    assert launched == [1, 1, 1, 1] and guarded == [1, 1, 1]
    other = types.SimpleNamespace(device=types.SimpleNamespace(ordinal=2))

    @entry.entry_point
    def two(x, y):
        entry.on_current_device("two", x)
        entry.on_current_device("two", y)
        return None, (), None

    now[0] = 0
    with pytest.raises(tf.TmaflowError, match=r"two: the array lives on device 2 but the call runs on device 1; "
                                              r"a call's arrays live on one device"):
        two(arr, other)


def test_a_launch_refused_for_another_devices_context_runs_again_under_a_guard(monkeypatch):
    """Another library made device 1's context current: the launcher raises ContextMoved (the
    driver ran nothing) and the entry point, or a prepared launch, launches again under a guard
    of the launcher's device, without preparing again; any other error is the caller's."""
    from tmaflow.kernels import entry
    from tmaflow.launch.launcher import ContextMoved

    context, guarded, prepared_calls, launched = [1], [], [], []

    def launcher():
        if context[0] != 0:
            raise ContextMoved("refused", 0)
        launched.append(context[0])

    monkeypatch.setattr(entry, "current_ordinal", lambda: 0)
    monkeypatch.setattr(entry, "using", fake_using(context, guarded))

    @entry.entry_point
    def probe():
        prepared_calls.append(1)
        return launcher, (), "out"

    assert probe() == "out" and launched == [0] and guarded == [0] and prepared_calls == [1]
    assert context[0] == 1, "the guard put device 1's context back"
    run = probe.prepare()
    run()
    assert launched == [0, 0] and guarded == [0, 0] and prepared_calls == [1, 1]

    def broken():
        raise tf.LaunchError("the kernel's own failure")

    @entry.entry_point
    def other():
        return broken, (), None

    with pytest.raises(tf.LaunchError, match="the kernel's own failure") as caught:
        other()
    assert guarded == [0, 0] and caught.value.__context__ is None

    def fails_there():
        if context[0] != 0:
            raise ContextMoved("refused", 0)
        raise tf.LaunchError("failed on its own device")

    @entry.entry_point
    def third():
        return fails_there, (), None

    with pytest.raises(tf.LaunchError, match="failed on its own device") as caught:
        third()
    assert guarded == [0, 0, 0] and caught.value.__context__ is None, "not chained under the refusal"
