"""Every TensorMapSpec rule: a rejecting case (checked by message) and an accepting boundary."""
import numpy as np
import pytest

import tmaflow as tf
from tmaflow.tma.spec import MAX_BOX_SMEM, TensorMapSpec

tiled = TensorMapSpec.tiled


class FakeTorchDtype:  # what as_dtype sees of a torch dtype: its module and its str()
    __module__ = "torch"

    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


@pytest.mark.parametrize("dtype,name", [("bf16", "bfloat16"), (np.float16, "float16"),
                                        (np.dtype("int32"), "int32"), ("tf32", "tf32"),
                                        (FakeTorchDtype("bfloat16"), "bfloat16"),
                                        (FakeTorchDtype("float32"), "float32")])
def test_dtypes_by_any_spelling(dtype, name):
    assert tiled(dtype, (64, 64), (8, 32)).dtype.name == name


def test_unknown_dtype():
    with pytest.raises(tf.TensorMapError, match=r"dtype='complex64' is not a supported element type"):
        tiled("complex64", (8, 8), (8, 8))


def test_packed_types_rejected_on_hopper_only():
    with pytest.raises(tf.TensorMapError, match=r"16u4_align8b is a packed Blackwell type; sm_90a rejects it"):
        tiled("16u4_align8b", (8, 32), (8, 32))
    assert tiled("16u4_align8b", (8, 32), (8, 32), arch="sm_100a").dtype.tma_code == 13


@pytest.mark.parametrize("shape,ok", [((), False), ((16,), True), ((2, 2, 2, 2, 16), True),
                                      ((2, 2, 2, 2, 2, 16), False)])
def test_rank(shape, ok):
    if ok:
        tiled("float32", shape, (1,) * (len(shape) - 1) + (4,))
    else:
        with pytest.raises(tf.TensorMapError, match=r"rank=\d+ .* must be in \[1, 5\]"):
            tiled("float32", shape, (1,) * len(shape))


def test_interleave_needs_rank_3():
    with pytest.raises(tf.TensorMapError, match=r"interleave='16B' needs rank >= 3"):
        tiled("float32", (16, 16), (4, 4), interleave="16B")
    tiled("float32", (4, 16, 16), (1, 4, 4), interleave="16B")


def test_32b_interleave_needs_32b_swizzle():
    with pytest.raises(tf.TensorMapError, match=r"interleave='32B' requires swizzle='32B'"):
        tiled("float32", (4, 16, 16), (1, 4, 8), interleave="32B")
    tiled("float32", (4, 16, 16), (1, 4, 8), interleave="32B", swizzle="32B")


def test_nan_fill_needs_float():
    with pytest.raises(tf.TensorMapError, match=r"oob_fill='nan' needs a floating-point dtype TMA knows; int32 is not"):
        tiled("int32", (8, 8), (4, 4), oob_fill="nan")
    # fp8 is a float to us but uint8 to TMA: the driver refuses NaN fill for it (GPU fuzz found it)
    with pytest.raises(tf.TensorMapError, match=r"float8_e4m3fn is not \(TMA moves it as uint8\)"):
        tiled("float8_e4m3fn", (8, 16), (4, 16), oob_fill="nan")
    tiled("bfloat16", (8, 8), (4, 8), oob_fill="nan")


def test_fp8_arrays_are_not_exported_through_dlpack_with_a_guessed_type_code():
    from tmaflow.runtime.memory import DeviceArray

    with pytest.raises(tf.TmaflowError, match=r"float8_e4m3fn arrays are not exported through DLPack"):
        DeviceArray(0x1000, (4, 4), "float8_e4m3fn").__dlpack__()


@pytest.mark.parametrize("n,ok", [(0, False), (1, True), (2**32, True), (2**32 + 1, False)])
def test_global_dims(n, ok):
    shape = (n, 4)
    strides = (16, 4)
    if ok:
        tiled("float32", shape, (1, 4), strides=strides)
    else:
        with pytest.raises(tf.TensorMapError, match=rf"shape\[0\]={n} must be in \[1, 2\^32\]"):
            tiled("float32", shape, (1, 4), strides=strides)


def test_inner_dim_must_be_contiguous():
    with pytest.raises(tf.TensorMapError, match=r"strides\[1\]=8 B: the inner dim must be contiguous"):
        tiled("float32", (8, 8), (4, 4), strides=(64, 8))


@pytest.mark.parametrize("stride,interleave,ok", [(48, "none", True), (40, "none", False),
                                                  (64, "32B", True), (48, "32B", False)])
def test_stride_alignment(stride, interleave, ok):
    kw = dict(interleave=interleave, swizzle="32B" if interleave == "32B" else "none")
    args = ("uint8", (2, 4, 32), (1, 4, 32))
    strides = (stride * 4, stride, 1)
    if ok:
        tiled(*args, strides=strides, **kw)
    else:
        with pytest.raises(tf.TensorMapError, match=rf"strides\[1\]={stride} B must be a positive multiple of"):
            tiled(*args, strides=strides, **kw)


def test_stride_limit():
    tiled("uint8", (2, 16), (1, 16), strides=(2**40 - 16, 1))
    with pytest.raises(tf.TensorMapError, match=r"strides\[0\]=1099511627776 B must be < 2\^40"):
        tiled("uint8", (2, 16), (1, 16), strides=(2**40, 1))


def test_overlapping_rows_rejected():
    # The driver accepts these (measured); the copy would read the same bytes twice.
    with pytest.raises(tf.TensorMapError, match=r"strides\[0\]=240 B is smaller than the 256 B reached by dim 1"):
        tiled("float32", (8, 64), (4, 16), strides=(240, 4))
    with pytest.raises(tf.TensorMapError, match=r"strides\[0\]=0 B: rows would overlap"):
        tiled("float32", (8, 64), (4, 16), strides=(0, 4))
    # the second plane starts where the third row of the first does
    with pytest.raises(tf.TensorMapError, match=r"dims 0 and 1 overlap \(strides\[0\]=64 B, strides\[1\]=32 B\): "
                                                r"index \(1, 0, 0\) and index \(0, 2, 0\) start 0 B apart"):
        tiled("int32", (2, 3, 4), (1, 3, 4), strides=(64, 32, 4))
    tiled("float32", (8, 64), (4, 16), strides=(256, 4))  # exactly one row: fine


@pytest.mark.parametrize("shape,box,strides", [
    ((8, 1, 64), (2, 1, 32), None),             # torch unsqueeze(1): an extent-1 middle dim
    ((8, 1, 64), (2, 1, 32), (256, 16, 4)),     # its stride is free: it never steps
    ((1, 4, 64), (1, 2, 32), (16, 256, 4)),
    ((2, 3, 4), (1, 3, 4), (80, 32, 4)),        # planes reach 80 B, not 3 x 32: the last row's padding is free
])
def test_strides_that_cannot_overlap_are_accepted(shape, box, strides):
    spec = tiled("int32" if shape == (2, 3, 4) else "float32", shape, box, strides=strides)
    assert spec.shape == shape


@pytest.mark.parametrize("stride", [0, 4, 7, 40, -16, 2**40, 2**41 + 3, 48])
def test_extent_one_dims_take_any_stride_and_encode_a_legal_one(stride):
    # torch gives size-1 dims arbitrary strides (0 after expand); they never step.
    spec = tiled("float32", (8, 1, 64), (2, 1, 32), strides=(256, stride, 4))
    assert spec.strides == (256, stride, 4)  # the user's layout, as given
    legal = stride if 0 < stride < 2**40 and stride % 16 == 0 else 16
    assert spec.driver_order()["global_strides"] == (legal, 256)
    outer = tiled("bfloat16", (1, 4, 64), (1, 2, 64), strides=(stride, 128, 2))
    assert outer.driver_order()["global_strides"] == (128, legal)
    interleaved = tiled("float32", (4, 1, 8, 16), (1, 1, 8, 8), strides=(4096, stride, 512, 4),
                        interleave="32B", swizzle="32B")
    assert interleaved.driver_order()["global_strides"][1] == \
        (stride if 0 < stride < 2**40 and stride % 32 == 0 else 32)


def test_extent_one_inner_dim_takes_any_stride():
    spec = tiled("float32", (8, 1), (2, 4), strides=(16, 0))  # x[:, None].expand-like
    assert spec.driver_order()["global_strides"] == (16,)
    with pytest.raises(tf.TensorMapError, match=r"strides\[1\]=0 B: the inner dim must be contiguous"):
        tiled("float32", (8, 2), (2, 4), strides=(16, 0))


def _rows_disjoint(shape, strides, itemsize):
    """Brute force: every addressed element's bytes, as a set; disjoint iff none repeats."""
    seen = set()
    for index in np.ndindex(*shape):
        first = sum(i * s for i, s in zip(index[:-1], strides)) + index[-1] * itemsize
        for b in range(first, first + itemsize):
            if b in seen:
                return False
            seen.add(b)
    return True


@pytest.mark.parametrize("shape,strides", [
    ((3, 2, 4), (32, 48, 4)),       # rows at 0 32 64 and 48 80 112: between each other's
    ((3, 3, 4), (32, 48, 4)),
    ((3, 5, 4), (80, 48, 4)),
    ((2, 2, 2, 4), (16, 48, 80, 4)),
    ((4096, 3, 2, 4), (128, 32, 48, 4)),    # an interleaved pair under a large dim
    ((100000, 3, 2, 4), (128, 32, 48, 4)),  # too many rows to enumerate them all
])
def test_interleaved_but_disjoint_layouts_are_accepted(shape, strides):
    if np.prod(shape) < 1000:
        assert _rows_disjoint(shape, strides, 4)
    assert tiled("int32", shape, (1,) * (len(shape) - 1) + (4,), strides=strides).strides == strides


def test_overlap_found_by_enumeration_names_every_dim_it_takes():
    # 32 + 48 = 80: no two dims meet, all three do
    assert not _rows_disjoint((2, 2, 2, 4), (32, 48, 80, 4), 4)
    with pytest.raises(tf.TensorMapError, match=r"dims 0, 1 and 2 overlap \(strides\[0\]=32 B, strides\[1\]=48 B, "
                                                r"strides\[2\]=80 B\): index \(1, 1, 0, 0\) and index \(0, 0, 1, 0\)"):
        tiled("int32", (2, 2, 2, 4), (1, 1, 1, 4), strides=(32, 48, 80, 4))
    # too many rows to enumerate them all: the collision is among the first indices
    with pytest.raises(tf.TensorMapError, match=r"dims 1, 2 and 3 overlap"):
        tiled("int32", (100000, 2, 2, 2, 4), (1, 1, 1, 1, 4), strides=(176, 32, 48, 80, 4))


def test_two_dims_meeting_far_out_are_refused_by_name():
    # dim 1 steps 16 B 5000 times; dim 0's one step lands on its 4096th row
    with pytest.raises(tf.TensorMapError, match=r"dims 0 and 1 overlap \(strides\[0\]=65536 B, strides\[1\]=16 B\): "
                                                r"index \(1, 0, 0\) and index \(0, 4096, 0\)"):
        tiled("uint8", (2, 5000, 16), (1, 1, 16), strides=(65536, 16, 1))


def test_overlap_rule_is_exact_on_small_layouts(rng):
    # Random small layouts against brute force: refused exactly when elements repeat.
    verdicts = {True: 0, False: 0}
    for _ in range(300):
        rank = int(rng.integers(2, 5))
        shape = tuple(int(rng.integers(1, 4)) for _ in range(rank - 1)) + (int(rng.integers(1, 9)),)
        strides = tuple(16 * int(rng.integers(1, 9)) for _ in range(rank - 1)) + (4,)
        disjoint = _rows_disjoint(shape, strides, 4)
        try:
            tiled("float32", shape, (1,) * (rank - 1) + (4,), strides=strides)
            accepted = True
        except tf.TensorMapError as exc:
            assert "rows would overlap" in str(exc)
            accepted = False
        assert accepted == disjoint, (shape, strides)
        verdicts[disjoint] += 1
    assert min(verdicts.values()) > 30


def test_store_spill_is_modelled_and_flagged(rng):
    parent = rng.integers(-2**31, 2**31, size=(4, 8), dtype=np.int32)
    before = parent.copy()
    view = parent[:, :5]
    spec = tiled("int32", (4, 5), (4, 8), strides=view.strides)
    assert spec.store_spill_bytes == 12
    image = rng.integers(0, 256, size=spec.smem_bytes, dtype=np.uint8)
    tf.reference.tma_store(view, spec, (0, 0), image)
    rows = image.reshape(4, 32)  # the box: 4 rows of 8 int32
    # the hardware writes up to the 16-byte boundary: columns 5..7 too
    assert np.array_equal(parent.view(np.uint8).reshape(4, 32), rows)
    assert not np.array_equal(parent[:, 5:], before[:, 5:])
    alone = np.zeros((4, 5), np.int32)  # no memory around it: the spill is only reported
    spills = tf.reference.tma_store(alone, spec, (0, 0), image)
    assert [(s.offset, s.data) for s in spills] == [(32 * r + 20, rows[r, 20:].tobytes()) for r in range(4)]
    assert np.array_equal(alone.view(np.uint8).reshape(4, 20), rows[:, :20])
    assert tiled("int32", (4, 8), (4, 8)).store_spill_bytes == 0


def test_store_map_that_spills_is_refused_or_flagged():
    from tmaflow.runtime.memory import DeviceArray
    from tmaflow.tma.tensormap import MapTemplate

    view = DeviceArray(0x10000, (4, 5), "int32", strides=(32, 4))
    spec = tiled("int32", (4, 5), (4, 8), strides=(32, 4))
    with pytest.raises(tf.TensorMapError, match=r"rows of 5 x 4 B = 20 B are not a multiple of 16 B: "
                                                r"a TMA store .* writes 12 B past .*\(elements 5\.\.7"):
        MapTemplate(spec, "store")
    MapTemplate(spec)  # a load template is fine
    with pytest.raises(tf.TensorMapError, match=r"access='write' must be 'any', 'load' or 'store'"):
        tf.TensorMap.tiled(view, (4, 8), access="write")


def test_permuted_view_accepted():
    # A (C, H, W) view of an (H, C, W) array: outer strides not decreasing, inner contiguous.
    tiled("float32", (4, 8, 16), (1, 2, 16), strides=(64, 256, 4))


@pytest.mark.parametrize("b,ok", [(0, False), (1, True), (256, True), (257, False)])
def test_box_extent(b, ok):
    if ok:
        tiled("float32", (300, 16), (b, 4))
    else:
        with pytest.raises(tf.TensorMapError, match=rf"box\[0\]={b} must be in \[1, 256\]"):
            tiled("float32", (300, 16), (b, 4))


def test_inner_box_multiple_of_16_bytes():
    with pytest.raises(tf.TensorMapError, match=r"box\[1\]=6 x 2 B = 12 B must be a multiple of 16 B; use a multiple of 8"):
        tiled("float16", (8, 64), (4, 6))
    with pytest.raises(tf.TensorMapError, match=r"box\[2\]=2 x 4 B = 8 B must be a multiple of 16 B"):
        tiled("float32", (4, 8, 64), (1, 4, 2), interleave="16B")
    tiled("float16", (8, 64), (4, 8))


def test_swizzle_span():
    with pytest.raises(tf.TensorMapError, match=r"box\[1\]=64 x 4 B = 256 B exceeds the 128B swizzle span; use box\[1\] <= 32 or swizzle='none'"):
        tiled("float32", (64, 64), (8, 64), swizzle="128B")
    tiled("float32", (64, 64), (8, 32), swizzle="128B")
    with pytest.raises(tf.TensorMapError, match=r"exceeds the 32B swizzle span"):
        tiled("bfloat16", (64, 64), (8, 32), swizzle="32B")
    tiled("bfloat16", (64, 64), (8, 16), swizzle="32B")


@pytest.mark.parametrize("e,ok", [(0, False), (1, True), (8, True), (9, False)])
def test_element_strides(e, ok):
    if ok:
        tiled("float32", (64, 64), (8, 8), element_strides=(e, e))
    else:
        with pytest.raises(tf.TensorMapError, match=rf"element_strides\[0\]={e} must be in \[1, 8\]"):
            tiled("float32", (64, 64), (8, 8), element_strides=(e, 1))


def test_address_alignment():
    tiled("float32", (8, 8), (4, 4), address=0x1000_0010)
    with pytest.raises(tf.TensorMapError, match=r"address=268435464 must be 16-byte aligned"):
        tiled("float32", (8, 8), (4, 4), address=0x1000_0008)
    with pytest.raises(tf.TensorMapError, match=r"must be 32-byte aligned"):
        tiled("float32", (4, 8, 8), (1, 4, 8), interleave="32B", swizzle="32B", address=0x1000_0010)


def test_box_footprint_limit():
    # Measured: the driver multiplies floor(box / element stride) over every dim and accepts
    # at most 228 KB.
    shape = (512, 64, 8)
    tiled("float32", shape, (228, 64, 4))  # 233472 B: the limit itself
    with pytest.raises(tf.TensorMapError, match=rf"counts 234496 B .* at most {MAX_BOX_SMEM} B"):
        tiled("float32", shape, (229, 64, 4))
    # floor(62 / 3) = 20 rows: 230400 B passes (ceil would be 241920 B); without the stride, not
    f64 = ((246, 261, 68), (62, 45, 32))
    tiled("float64", *f64, element_strides=(3, 1, 1))
    with pytest.raises(tf.TensorMapError, match=r"counts 714240 B"):
        tiled("float64", *f64)
    tiled("uint32", (107, 159, 71, 112), (14, 19, 59, 52), element_strides=(1, 2, 2, 4))  # inner too


@pytest.mark.parametrize("field,value", [("swizzle", "16B"), ("interleave", "8B"),
                                         ("l2_promotion", "512B"), ("oob_fill", "inf")])
def test_enum_fields(field, value):
    with pytest.raises(tf.TensorMapError, match=rf"{field}='{value}' is not one of"):
        tiled("float32", (8, 8), (4, 4), **{field: value})


def test_derived_quantities():
    s = tiled("bfloat16", (100, 72), (16, 32), swizzle="128B", element_strides=(3, 1))
    assert s.elements_per_dim == (6, 32)  # ceil(16 / 3); the inner stride is ignored
    assert s.tx_bytes == 6 * 32 * 2
    assert s.row_bytes == 64 and s.row_pitch == 128  # rows padded to the swizzle span
    assert s.smem_bytes == 6 * 128 and s.smem_align == 1024
    assert tiled("float32", (8, 8), (4, 4)).smem_align == 128
    assert tiled("float32", (8, 8), (4, 4), swizzle="32B").smem_align == 256
    d = tiled("float32", (5, 6, 8), (1, 2, 4), element_strides=(1, 2, 1)).driver_order()
    assert d["global_dim"] == (8, 6, 5) and d["global_strides"] == (32, 192)
    assert d["box"] == (4, 2, 1) and d["element_strides"] == (1, 2, 1)
    assert "tx_bytes" in s.describe() and "TensorMapSpec.tiled(bfloat16" in repr(s)


def test_im2col_rules():
    im = TensorMapSpec.im2col
    base = dict(lower_corner=(-1, -1), upper_corner=(1, 1), channels_per_pixel=16, pixels_per_column=64)
    s = im("float16", (2, 8, 8, 16), **base)
    assert s.tx_bytes == 16 * 64 * 2 and s.driver_order()["lower_corner"] == (-1, -1)
    with pytest.raises(tf.TensorMapError, match=r"rank=2 .* must be in \[3, 5\]"):
        im("float16", (8, 16), **dict(base, lower_corner=(), upper_corner=()))
    with pytest.raises(tf.TensorMapError, match=r"lower_corner\[0\]=-129 must be in \[-128, 127\] for a rank-4"):
        im("float16", (2, 8, 8, 16), **dict(base, lower_corner=(-129, 0)))
    im("float16", (2, 8, 16), **dict(base, lower_corner=(-32768,), upper_corner=(0,)))
    with pytest.raises(tf.TensorMapError, match=r"must be in \[-16, 15\] for a rank-5"):
        im("float16", (2, 4, 4, 4, 16), **dict(base, lower_corner=(16, 0, 0), upper_corner=(0, 0, 0)))
    with pytest.raises(tf.TensorMapError, match=r"channels_per_pixel=257 must be in \[1, 256\]"):
        im("uint8", (2, 8, 8, 272), **dict(base, channels_per_pixel=257))
    with pytest.raises(tf.TensorMapError, match=r"pixels_per_column=1025 must be in \[1, 1024\]"):
        im("float16", (2, 8, 8, 16), **dict(base, pixels_per_column=1025))
    with pytest.raises(tf.TensorMapError, match=r"pixel box along spatial dim 0 is empty"):
        im("float16", (2, 8, 8, 16), **dict(base, lower_corner=(5, 0), upper_corner=(-4, 0)))
    with pytest.raises(tf.TensorMapError, match=r"channels_per_pixel=64 x 4 B = 256 B exceeds the 128B swizzle span"):
        im("float32", (2, 8, 8, 64), **dict(base, channels_per_pixel=64), swizzle="128B")


def test_bf16_host_conversion_rounds_to_nearest_even(rng):
    from tmaflow.dtypes import bf16_bits, bf16_to_float32

    x = rng.standard_normal(10000).astype(np.float32)
    back = bf16_to_float32(bf16_bits(x))
    assert np.all(np.abs(back - x) <= np.abs(x) * 2.0 ** -8)       # half an 8-bit-mantissa ulp
    assert np.array_equal(bf16_bits(back), bf16_bits(x))           # bf16 values are fixed points
    # ties go to even: 1 + 2^-8 sits halfway between 1 and 1 + 2^-7
    ties = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8], dtype=np.float32)
    assert list(bf16_to_float32(bf16_bits(ties))) == [1.0, 1 + 2 * 2.0 ** -7]


@pytest.mark.parametrize("address,msg", [
    (1 << 57, r"address=0x200000000000000 is outside \[0, 2\^57\)"),
    (1 << 64, r"address=0x10000000000000000 is outside \[0, 2\^57\)"),
    (-16, r"address=-16 is negative"),
    (24, r"address=24 must be 16-byte aligned"),
    (16.0, r"address=16.0 must be an int"),
    (True, r"address=True must be an int"),
])
def test_addresses(address, msg):
    with pytest.raises(tf.TensorMapError, match=msg):
        tiled("float32", (8, 64), (4, 16), address=address)
    assert tiled("float32", (8, 64), (4, 16), address=(1 << 57) - 16).address == (1 << 57) - 16
