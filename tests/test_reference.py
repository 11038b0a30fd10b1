"""tf.reference from first principles: expectations are built by slicing and by the row-chunk
statements of the swizzle modes, never by re-running the model's own address formula."""
import numpy as np
import pytest

import tmaflow as tf
from tmaflow.tma.reference import tma_load, tma_store
from tmaflow.tma.spec import TensorMapSpec


def chunks(image, row_pitch):
    """image as [row][16-byte chunk] -> bytes."""
    return image.reshape(-1, row_pitch // 16, 16)


def test_plain_load_is_the_box_slice(rng):
    g = rng.standard_normal((40, 64)).astype(np.float32)
    spec = TensorMapSpec.tiled("float32", g.shape, (8, 16))
    img = tma_load(g, spec, (5, 12))
    np.testing.assert_array_equal(img.view(np.float32).reshape(8, 16), g[5:13, 12:28])


def test_rank5_load_is_the_box_slice(rng):
    g = rng.integers(0, 2**16, size=(3, 4, 5, 6, 24), dtype=np.uint16)
    spec = TensorMapSpec.tiled("uint16", g.shape, (2, 3, 2, 4, 16))
    img = tma_load(g, spec, (1, 0, 2, 1, 8))
    np.testing.assert_array_equal(img.view(np.uint16).reshape(2, 3, 2, 4, 16), g[1:3, 0:3, 2:4, 1:5, 8:24])


def test_out_of_bounds_zero_fill_and_tx_bytes(rng):
    g = rng.standard_normal((10, 32)).astype(np.float32) + 5
    spec = TensorMapSpec.tiled("float32", g.shape, (8, 8))
    img = tma_load(g, spec, (-3, 28)).view(np.float32).reshape(8, 8)
    want = np.zeros((8, 8), np.float32)
    want[3:8, 0:4] = g[0:5, 28:32]
    np.testing.assert_array_equal(img, want)
    assert spec.tx_bytes == 8 * 8 * 4  # out-of-bounds elements count too


def test_nan_fill_lanes(rng):
    g = rng.standard_normal((4, 16)).astype(np.float32)
    spec = TensorMapSpec.tiled("float32", g.shape, (4, 8), oob_fill="nan")
    img = tma_load(g, spec, (2, 8)).view(np.float32).reshape(4, 8)
    assert np.isnan(img[2:]).all() and not np.isnan(img[:2]).any()
    assert set(img[2:].view(np.uint32).ravel()) == {0x7FF77FF7}  # measured pattern


def test_element_strides_pick_every_kth(rng):
    g = rng.integers(0, 255, size=(20, 32), dtype=np.uint8)
    spec = TensorMapSpec.tiled("uint8", g.shape, (8, 16), element_strides=(3, 1))
    img = tma_load(g, spec, (1, 16)).reshape(3, 16)  # ceil(8 / 3) rows
    np.testing.assert_array_equal(img, g[[1, 4, 7], 16:32])


def test_128b_swizzle_rows_permute_chunks(rng):
    # PTX swizzle table: in every 1024-byte block, 16-byte chunk j of row r (128-byte rows)
    # is stored at chunk j ^ (r % 8).
    g = rng.integers(0, 2**16, size=(16, 64), dtype=np.uint16)
    spec = TensorMapSpec.tiled("bfloat16", g.shape, (16, 64), swizzle="128B")
    img = chunks(tma_load(g, spec, (0, 0)), 128)
    logical = chunks(g.view(np.uint8).ravel(), 128)
    for r in range(16):
        for j in range(8):
            np.testing.assert_array_equal(img[r, j ^ (r % 8)], logical[r, j])


def test_64b_swizzle(rng):
    # 64-byte rows: chunk j of row r lands at chunk j ^ ((r // 2) % 4).
    g = rng.integers(0, 255, size=(16, 64), dtype=np.uint8)
    spec = TensorMapSpec.tiled("uint8", g.shape, (16, 64), swizzle="64B")
    img = chunks(tma_load(g, spec, (0, 0)), 64)
    logical = chunks(g.ravel(), 64)
    for r in range(16):
        for j in range(4):
            np.testing.assert_array_equal(img[r, j ^ ((r // 2) % 4)], logical[r, j])


def test_32b_swizzle(rng):
    # 32-byte rows: rows 4..7 of every 8 swap their two halves.
    g = rng.integers(0, 255, size=(16, 32), dtype=np.uint8)
    spec = TensorMapSpec.tiled("uint8", g.shape, (16, 32), swizzle="32B")
    img = chunks(tma_load(g, spec, (0, 0)), 32)
    logical = chunks(g.ravel(), 32)
    for r in range(16):
        swap = (r % 8) >= 4
        np.testing.assert_array_equal(img[r, 0], logical[r, 1 if swap else 0])


def test_narrow_rows_are_padded_and_padding_untouched(rng):
    g = rng.integers(0, 255, size=(8, 32), dtype=np.uint8)
    spec = TensorMapSpec.tiled("uint8", g.shape, (8, 32), swizzle="128B")
    img = tma_load(g, spec, (0, 0), background=0xEE).reshape(8, 128)
    assert spec.smem_bytes == 8 * 128
    for r in range(8):  # 32 data bytes per 128-byte row, in chunks j ^ r for j = 0, 1
        used = {(0 ^ r) % 8, (1 ^ r) % 8}
        for c in range(8):
            seg = img[r, 16 * c:16 * c + 16]
            assert (seg == 0xEE).all() == (c not in used)


def test_swizzle_depends_on_absolute_base(rng):
    # A base one row into the 1024-byte pattern shifts it: row r behaves like row r + 1.
    g = rng.integers(0, 255, size=(8, 128), dtype=np.uint8)
    spec = TensorMapSpec.tiled("uint8", g.shape, (8, 128), swizzle="128B")
    img = chunks(tma_load(g, spec, (0, 0), smem_base=128), 128)
    logical = chunks(g.ravel(), 128)
    for r in range(8):
        for j in range(8):
            np.testing.assert_array_equal(img[r, j ^ ((r + 1) % 8)], logical[r, j])


def test_faulting_inputs_raise():
    g = np.zeros((8, 32), np.float32)
    spec = TensorMapSpec.tiled("float32", g.shape, (4, 8))
    with pytest.raises(tf.TmaflowError, match=r"smem_base=64 must be 128-byte aligned"):
        tma_load(g, spec, (0, 0), smem_base=64)
    with pytest.raises(tf.TmaflowError, match=r"coords\[1\]=2: the inner coordinate's byte offset \(8 B\)"):
        tma_load(g, spec, (0, 2))
    with pytest.raises(tf.TmaflowError, match=r"a TMA store needs non-negative coordinates"):
        tma_store(g, spec, (-1, 0), np.zeros(spec.smem_bytes, np.uint8))


def test_store_round_trip_discards_out_of_bounds(rng):
    g = rng.standard_normal((12, 40)).astype(np.float32)
    spec = TensorMapSpec.tiled("float32", g.shape, (8, 32), swizzle="128B")
    img = tma_load(g, spec, (8, 16))  # overhangs the bottom and the right
    out = np.full_like(g, -1.0)
    tma_store(out, spec, (8, 16), img)
    want = np.full_like(g, -1.0)
    want[8:12, 16:40] = g[8:12, 16:40]
    np.testing.assert_array_equal(out, want)


def test_tf32_loads_round_to_nearest_even(rng):
    vals = np.array([1.0, 1.0 + 2**-11, 1.0 + 3 * 2**-11, 3.4028235e38, np.inf, -np.inf, np.nan,
                     -np.nan, 1e-40, -2.5], np.float32)
    want = [0x3F800000, 0x3F800000, 0x3F804000, 0x7F800000, 0x7F800000, 0xFF800000, 0x7FFFE000,
            0x7FFFE000, 0x00012000, 0xC0200000]
    g = np.zeros(16, np.float32)
    g[:vals.size] = vals
    for name in ("tf32", "tf32_ftz"):
        spec = tf.TensorMapSpec.tiled(name, (16,), (16,))
        got = tf.reference.tma_load(g, spec, (0,)).view("<u4")
        assert [int(x) for x in got[:vals.size]] == want, name
    raw = rng.standard_normal(16).astype(np.float32)
    raw[3] = 1e-41  # a denormal: float32_ftz copies it as it is
    spec = tf.TensorMapSpec.tiled("float32_ftz", (16,), (16,))
    assert np.array_equal(tf.reference.tma_load(raw, spec, (0,)).view(np.float32), raw)


# --- stores: the 16-byte spill past each row's end ------------------------------------------
# Measured (TMA-FACTS.md): a store clips the inner dim at 16-byte granules, so a box reaching
# a row's end writes the rest of that row's last granule with the box's data for it.

def spills_of(spills):
    return [(s.offset, s.data) for s in spills]


def test_store_spill_of_a_1d_tensor(rng):
    # int32, 5 elements, box of 16: 20 B of tensor, then 12 B of spill up to byte 32
    spec = TensorMapSpec.tiled("int32", (5,), (16,))
    image = rng.integers(0, 256, size=spec.smem_bytes, dtype=np.uint8)
    g = np.zeros(5, np.int32)
    spills = tma_store(g, spec, (0,), image)
    assert spills_of(spills) == [(20, image[20:32].tobytes())]
    assert np.array_equal(g.view(np.uint8), image[:20])
    # a buffer around the tensor receives them; the rest of the box is discarded
    alloc = np.full(12, -1, np.int32)
    assert spills_of(tma_store(alloc[:5], spec, (0,), image)) == spills_of(spills)
    assert np.array_equal(alloc[:8].view(np.uint8), image[:32])
    assert (alloc[8:] == -1).all()


def test_store_spill_of_a_column_slice(rng):
    # x[:, :5] of an int32 (4, 8) array: the store writes x[:, 5:8] too
    x = rng.integers(-2**31, 2**31, size=(4, 8), dtype=np.int32)
    spec = TensorMapSpec.tiled("int32", (4, 5), (4, 8), strides=(32, 4))
    image = rng.integers(0, 256, size=spec.smem_bytes, dtype=np.uint8)
    rows = image.reshape(4, 32)
    spills = tma_store(x[:, :5], spec, (0, 0), image)
    assert spills_of(spills) == [(32 * r + 20, rows[r, 20:32].tobytes()) for r in range(4)]
    assert np.array_equal(x.view(np.uint8).reshape(4, 32), rows)


@pytest.mark.parametrize("dtype,width", [("uint8", 37), ("bfloat16", 13), ("float32", 6),
                                         ("float64", 3)])
def test_store_spill_for_every_element_size(rng, dtype, width):
    E = np.dtype(dtype if dtype != "bfloat16" else np.uint16).itemsize
    row = width * E
    end = -(-row // 16) * 16               # the granule the last element is in ends here
    pitch = end + 32                       # rows padded past it: the spill's neighbours
    alloc = rng.integers(0, 256, size=(5, pitch), dtype=np.uint8)
    before = alloc.copy()
    g = np.ndarray((5, width), np.dtype(f"u{E}"), buffer=alloc, strides=(pitch, E))
    box_inner = -(-end // E)               # box bytes reach exactly the granule's end
    spec = TensorMapSpec.tiled(dtype, (5, width), (3, box_inner), strides=(pitch, E))
    image = rng.integers(0, 256, size=spec.smem_bytes, dtype=np.uint8).reshape(3, -1)
    spills = tma_store(g, spec, (2, 0), image)
    assert spec.store_spill_bytes == end - row
    assert spills_of(spills) == [((2 + r) * pitch + row, image[r, row:end].tobytes()) for r in range(3)]
    want = before.copy()
    want[2:5, :end] = image[:, :end]
    assert np.array_equal(alloc, want)


def test_store_spill_through_a_128b_swizzle(rng):
    # uint8 rows of 100 B, box (8, 128): chunk j of box row r sits at chunk j ^ (r % 8)
    logical = rng.integers(0, 256, size=(8, 128), dtype=np.uint8)
    image = np.empty_like(logical)
    for r in range(8):
        for j in range(8):
            image[r, 16 * (j ^ r):16 * (j ^ r) + 16] = logical[r, 16 * j:16 * j + 16]
    alloc = np.zeros((8, 128), np.uint8)
    spec = TensorMapSpec.tiled("uint8", (8, 100), (8, 128), strides=(128, 1), swizzle="128B")
    spills = tma_store(alloc[:, :100], spec, (0, 0), image.ravel())
    assert spills_of(spills) == [(128 * r + 100, logical[r, 100:112].tobytes()) for r in range(8)]
    want = np.zeros_like(alloc)
    want[:, :112] = logical[:, :112]
    assert np.array_equal(alloc, want)


def test_store_spill_with_element_strides(rng):
    # every other row: box rows 0, 1, 2 land on tensor rows 1, 3, 5
    alloc = np.zeros((7, 8), np.int32)
    spec = TensorMapSpec.tiled("int32", (7, 5), (6, 8), strides=(32, 4), element_strides=(2, 1))
    image = rng.integers(0, 256, size=spec.smem_bytes, dtype=np.uint8).reshape(3, 32)
    spills = tma_store(alloc[:, :5], spec, (1, 0), image)
    assert spills_of(spills) == [(32 * t + 20, image[r, 20:32].tobytes()) for r, t in enumerate((1, 3, 5))]
    want = np.zeros((7, 32), np.uint8)
    want[[1, 3, 5]] = image
    assert np.array_equal(alloc.view(np.uint8).reshape(7, 32), want)


def test_store_spills_only_where_the_box_reaches_the_row_end(rng):
    spec = TensorMapSpec.tiled("int32", (2, 10), (2, 4), strides=(64, 4))  # 40 B rows
    image = rng.integers(0, 256, size=spec.smem_bytes, dtype=np.uint8).reshape(2, 16)
    alloc = np.zeros((2, 16), np.int32)
    assert tma_store(alloc[:, :10], spec, (0, 4), image) == ()
    spills = tma_store(alloc[:, :10], spec, (0, 8), image)  # elements 8, 9, then 10, 11 spill
    assert spills_of(spills) == [(64 * r + 40, image[r, 8:16].tobytes()) for r in range(2)]
    assert tma_store(alloc[:, :12], TensorMapSpec.tiled("int32", (2, 12), (2, 4), strides=(64, 4)),
                     (0, 8), image) == ()  # 48 B rows: nothing to spill


def test_spill_outside_the_buffer_or_layout_is_reported_not_written(rng):
    spec = TensorMapSpec.tiled("int32", (5,), (16,))
    image = rng.integers(0, 256, size=spec.smem_bytes, dtype=np.uint8)
    short = np.full(6, -1, np.int32)       # holds 4 of the 12 spill bytes: none are written
    assert spills_of(tma_store(short[:5], spec, (0,), image)) == [(20, image[20:32].tobytes())]
    assert short[5] == -1
    # a host array laid out unlike the map (rows of 20 B, the map's of 32 B) is no model of
    # the memory around the device tensor
    packed = np.full((3, 5), -1, np.int32)
    spec2 = TensorMapSpec.tiled("int32", (2, 5), (2, 8), strides=(32, 4))
    assert [s.offset for s in tma_store(packed[:2], spec2, (0, 0), image)] == [20, 52]
    assert (packed[2] == -1).all()


def test_store_through_extent_one_dims_with_any_stride(rng):
    # torch's unsqueeze / expand strides on extent-1 dims, the inner one included
    spec = TensorMapSpec.tiled("float32", (1, 3, 1), (1, 2, 4), strides=(0, 16, 0))
    image = rng.integers(0, 256, size=spec.smem_bytes, dtype=np.uint8).reshape(2, 16)
    alloc = np.zeros((3, 4), np.float32)
    g = np.ndarray((1, 3, 1), np.float32, buffer=alloc, strides=(0, 16, 0))
    spills = tma_store(g, spec, (0, 1, 0), image)
    assert spills_of(spills) == [(16 * t + 4, image[r, 4:16].tobytes()) for r, t in enumerate((1, 2))]
    want = np.zeros((3, 16), np.uint8)
    want[1:3] = image
    assert np.array_equal(alloc.view(np.uint8).reshape(3, 16), want)


def test_coordinates_and_shared_addresses_out_of_range():
    g = np.zeros((8, 32), np.float32)
    spec = TensorMapSpec.tiled("float32", g.shape, (4, 8))
    with pytest.raises(tf.TmaflowError, match=r"coords\[0\]=2147483648 must fit a signed 32-bit int"):
        tma_load(g, spec, (2**31, 0))
    with pytest.raises(tf.TmaflowError, match=r"coords\[1\]=-2147483652 must fit a signed 32-bit int"):
        tma_load(g, spec, (0, -2**31 - 4))
    tma_load(g, spec, (-2**31, 2**31 - 4))  # the s32 range itself: all out of bounds, zeros
    with pytest.raises(tf.TmaflowError, match=r"smem_base=233472: the box's 128 B from there end past "
                                              r"the 233472 B of shared memory"):
        tma_load(g, spec, (0, 0), smem_base=228 * 1024)
    tma_load(g, spec, (0, 0), smem_base=228 * 1024 - 128)
