"""The edge path without a GPU (tmaflow/kernels/edge.py): which calls keep their TMA kernels and
which are staged or run plain kernels, and why; the staging plans; the launches of the edge
kernels run on a numpy model of those kernels over fake device memory, against numpy; the
kernels compiled to CUBIN."""
import itertools
import math

import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.kernels import edge
from tmaflow.kernels.edge import collapse, copy_launches, product_staging, softmax_launches
from tmaflow.kernels.registry import get_kernel
from tmaflow.runtime.memory import DeviceArray

FAKE = 1 << 32  # device addresses of the fake memory below; never dereferenced by a GPU


_ranges = itertools.count()


def arr(shape, dtype="bfloat16", strides=None, ptr=None):
    """A fake array; without ``ptr``, one of its own 256 MiB-aligned ranges above FAKE (entry
    points refuse an out that aliases an input)."""
    ptr = FAKE + (next(_ranges) << 28) if ptr is None else ptr
    return DeviceArray(ptr, shape, dtype, strides=strides)


# --- which calls take the TMA kernels -----------------------------------------------------------

# The shapes the issue found refused: (M, N, K), and whether the TMA GEMM takes them as given.
NAMED = [((4097, 4099, 4104), False), ((7, 13, 64), False), ((4096, 4096, 4100), False),
         ((129, 257, 4095), False), ((3, 5, 7), False), ((2048, 2048, 1), False),
         ((4096, 4096, 4096), True), ((1000, 760, 520), True)]


@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize("mnk,tma", NAMED)
def test_gemm_dispatch_of_the_named_shapes(mnk, tma, layout):
    m, n, k = mnk
    A, B = arr((m, k)), arr((n, k) if layout == "nt" else (k, n))
    # "nn" 4096 x 4096 x 4100 reads B's rows of N = 4096: only A is unaligned, still staged
    assert edge.gemm_takes_tma(A, B, None, n, None) is tma


def test_gemm_dispatch_of_views_and_outputs():
    A, B = arr((256, 512)), arr((128, 512))
    assert edge.gemm_takes_tma(A, B, arr((256, 128)), 128, None)
    assert edge.gemm_takes_tma(A, B, arr((256, 128), strides=(512, 2)), 128, None)  # a wider pitch: fine
    assert not edge.gemm_takes_tma(arr((256, 512), ptr=FAKE + 2), B, None, 128, None)  # base 2 B off
    assert not edge.gemm_takes_tma(arr((256, 512), strides=(2, 512)), B, None, 128, None)  # A transposed
    assert not edge.gemm_takes_tma(A, arr((128, 512), strides=(2048, 4)), None, 128, None)  # every other element
    assert not edge.gemm_takes_tma(A, B, arr((256, 128), strides=(264, 2)), 128, None)  # out pitch 264 B
    assert not edge.gemm_takes_tma(A, B, None, 128, edge.STAGED)  # block scales in an unreadable layout
    # the 4099-column out view of a 4104-wide buffer: a 16-byte pitch, but a TMA store
    # would spill over columns 4099-4103, which belong to the caller
    out = arr((4097, 4099), strides=(8208, 2))
    assert edge.rows_ok(out) and not edge.gemm_takes_tma(arr((4097, 4104)), arr((4099, 4104)), out, 4099, None)


def test_grouped_dispatch():
    A, C = arr((300, 256)), arr((300, 384))
    assert edge.grouped_takes_tma(A, arr((4, 384, 256)), C, 384, "nt")
    assert edge.grouped_takes_tma(A, arr((4, 256, 384)), C, 384, "nn")
    assert not edge.grouped_takes_tma(arr((300, 72)), arr((4, 72, 384)), C, 384, "nn")  # nn: K % 64
    assert edge.grouped_takes_tma(arr((300, 72)), arr((4, 384, 72)), C, 384, "nt")
    assert not edge.grouped_takes_tma(A, arr((4, 384, 256), strides=(256 * 512, 512, 2)), C, 384, "nt")  # experts apart


@pytest.mark.parametrize("shape,strides,ptr,transposed,tma", [
    ((64, 256), None, FAKE, False, True),
    ((64, 127), None, FAKE, False, False),         # the 127 float32 columns: 508-byte rows
    ((127, 64), None, FAKE, True, False),          # transposed: the output's rows are 508 B
    ((127, 64), None, FAKE, False, True),
    ((64, 256), None, FAKE + 4, False, False),     # base 4 B off
    ((64, 256), (4, 256), FAKE, False, False),     # column-major
    ((0, 256), None, FAKE, False, False),          # empty
    ((256,), None, FAKE, False, False),            # 1-D
    ((2, 3, 256), None, FAKE, False, False),       # 3-D (the edge path may still find a TMA view)
])
def test_two_d_dispatch(shape, strides, ptr, transposed, tma):
    assert edge.takes_tma(arr(shape, "float32", strides, ptr), None, transposed) is tma


def test_two_d_dispatch_checks_the_given_output():
    a = arr((64, 256), "float32")
    assert edge.takes_tma(a, arr((64, 256), "float32", (1040, 4)))
    assert not edge.takes_tma(a, arr((64, 256), "float32", (1028, 4)))
    assert not edge.takes_tma(a, arr((64, 256), "float32", ptr=FAKE + 8))


@pytest.mark.parametrize("entry,call,tma", [
    ("gemm", lambda: kernels.gemm(arr((64, 36)), arr((48, 36)), arr((64, 48))), False),
    ("gemm", lambda: kernels.gemm(arr((64, 32)), arr((32, 48), strides=(2, 64)), arr((64, 48)), layout="nn"), False),
    ("gemm", lambda: kernels.gemm(arr((3, 7)), arr((5, 7))), False),
    ("gemm", lambda: kernels.gemm(arr((64, 32)), arr((48, 32)), arr((64, 48))), True),
    ("grouped_gemm", lambda: kernels.grouped_gemm(arr((10, 72)), arr((3, 72, 32)), arr((4,), "int32"), layout="nn"), False),
    ("grouped_gemm", lambda: kernels.grouped_gemm(arr((10, 64)), arr((3, 32, 64), strides=(8192, 128, 2)), arr((4,), "int32")), False),
    ("grouped_gemm", lambda: kernels.grouped_gemm(arr((10, 64)), arr((3, 32, 64)), arr((4,), "int32")), True),
    ("copy", lambda: kernels.copy(arr((64,), "float32")), False),
    ("copy", lambda: kernels.copy(arr((64, 127), "float32")), False),
    ("copy", lambda: kernels.copy(arr((64, 128), "float32")), True),
    ("softmax", lambda: kernels.softmax(arr((64, 127), "float32")), False),
    ("softmax", lambda: kernels.softmax(arr((2, 64, 128), "float32")), False),
    ("softmax", lambda: kernels.softmax(arr((8, 30000), "float32")), False),   # wider than two stages
    ("softmax", lambda: kernels.softmax(arr((8, 25600), "float32")), True),
    ("transpose", lambda: kernels.transpose(arr((64, 127), "float32")), False),
    ("transpose", lambda: kernels.transpose(arr((127, 64), "float32")), False),
    ("transpose", lambda: kernels.transpose(arr((128, 64), "float32")), True),
])
def test_entry_points_hand_what_tma_cannot_take_to_the_edge_path(monkeypatch, entry, call, tma):
    """The one check at the top of each entry point: an edge call reaches edge.<entry>; a TMA
    call goes on to its TMA state (which needs a GPU here)."""
    monkeypatch.setattr(edge, entry, lambda *args, **kwargs: (None, (), "edge"))
    if tma:
        with pytest.raises(tf.DriverNotFoundError):
            call()
    else:
        assert call() == "edge"


def test_edge_softmax_checks_the_element_type():
    with pytest.raises(tf.TmaflowError, match=r"softmax: needs a float32 array \(got \(2, 3, 5\) float16\)"):
        kernels.softmax(arr((2, 3, 5), "float16"))


# --- staging plans ---------------------------------------------------------------------------

@pytest.mark.parametrize("case,a,b,c,k,why", [
    # (M, N, K, layout, dtype, out): staged shapes of a, b, c; the K run; words of the reasons
    ((4096, 4096, 4100, "nt", "bfloat16", None), (4096, 4104), (4096, 4104), None, 4104, ["a: strides (8200, 2) B", "b: strides (8200, 2) B"]),
    ((4097, 4099, 4104, "nt", "bfloat16", None), None, (4104, 4104), (4097, 4104), 4104, ["b: (4099, 4104) zero-padded to (4104, 4104)", "out: strides (8198, 2) B"]),
    ((7, 13, 64, "nn", "bfloat16", None), None, (64, 16), (7, 16), 64, ["b: strides (26, 2) B", "out: strides (26, 2) B"]),
    ((3, 5, 7, "nt", "bfloat16", None), (3, 8), (8, 8), (3, 8), 8, ["a: strides (14, 2) B"]),
    ((2048, 2048, 1, "nn", "bfloat16", None), (2048, 8), (8, 2048), None, 8, ["a: strides (2, 2) B"]),
    ((129, 257, 4095, "nt", "float8_e4m3fn", None), (129, 4096), (264, 4096), (129, 264), 4096, ["a: strides (4095, 1) B"]),
    ((300, 4096, 2060, "nt", "float8_e4m3fn", None), (300, 2064), (4096, 2064), None, 2064, ["a: strides (2060, 1) B"]),
    ((4097, 4099, 4104, "nt", "bfloat16", (8208, 2)), None, (4104, 4104), (4097, 4104), 4104, ["out: 4099 columns"]),
    ((256, 128, 64, "nt", "bfloat16", (264, 2)), None, None, (256, 128), 64, ["out: strides (264, 2) B"]),
])
def test_product_staging_plans(case, a, b, c, k, why):
    m, n, kk, layout, dtype, out_strides = case
    A = arr((m, kk), dtype)
    B = arr((n, kk) if layout == "nt" else (kk, n), dtype)
    C = arr((m, n), "bfloat16", out_strides)
    plan = product_staging(A, B, C, layout)
    assert (plan.a, plan.b, plan.c, plan.k) == (a, b, c, k)
    for words in why:
        assert any(r.startswith(words) for r in plan.reasons), plan.reasons


def test_grouped_staging_pads_k_to_64_for_nn_and_packs_the_experts():
    A, C = arr((300, 72)), arr((300, 384))
    plan = product_staging(A, arr((4, 72, 384)), C, "nn", edge.GROUPED_NN_K, b_packed=True)
    assert (plan.a, plan.b, plan.c, plan.k) == ((300, 128), (4, 128, 384), None, 128)
    A = arr((300, 256), strides=(1024, 2))  # a wider pitch: legal, used as given
    B = arr((4, 384, 256), strides=(256 * 512, 512, 2))  # every expert 256 elements apart from the next
    plan = product_staging(A, B, C, "nt", b_packed=True)
    assert (plan.a, plan.b, plan.c) == (None, (4, 384, 256), None)
    assert plan.reasons == ("b: strides (131072, 512, 2) B (the grouped kernel reads every expert as one array)",)


def test_collapse_merges_what_every_layout_steps_through_as_one():
    assert collapse((2, 3, 4), (48, 16, 4), (48, 16, 4)) == ((24,), [(4,), (4,)])
    assert collapse((2, 3, 4), (48, 16, 4), (4, 32, 8)) == ((2, 12), [(48, 4), (4, 8)])  # only the last pair for both
    assert collapse((1, 5, 1, 7), (999, 28, 0, 4)) == ((35,), [(4,)])  # size-1 dims carry any stride
    assert collapse((1, 1), (0, 4)) == ((), [()])


# --- the edge kernels' launches, on a model of the kernels ---------------------------------------

class Memory:
    """Host bytes standing in for device memory at address FAKE, with views of it as DeviceArrays."""

    def __init__(self, nbytes: int, rng):
        self.buf = rng.integers(0, 256, nbytes, dtype=np.uint8)
        self.used = 0

    def take(self, count: int, np_dtype) -> np.ndarray:
        start = -(-self.used // 16) * 16
        self.used = start + count * np.dtype(np_dtype).itemsize
        if self.used > self.buf.size:
            raise MemoryError("fake memory exhausted")
        return self.buf[start:self.used].view(np_dtype)

    def device(self, view: np.ndarray, dtype: str) -> DeviceArray:
        offset = view.__array_interface__["data"][0] - self.buf.ctypes.data
        return DeviceArray(FAKE + offset, view.shape, dtype, view.strides)

    def addressed(self, view: np.ndarray) -> np.ndarray:
        """Mask of the bytes ``view``'s elements occupy."""
        mask = np.zeros(self.buf.size, bool)
        if view.size:
            first = view.__array_interface__["data"][0] - self.buf.ctypes.data
            idx = np.asarray(first + sum(np.indices(view.shape)[i] * st for i, st in enumerate(view.strides)))
            for byte in range(view.itemsize):
                mask[(idx + byte).ravel()] = True
        return mask

    def words(self, item: int) -> np.ndarray:
        return self.buf.view(f"u{item}")


def run_strided_copy(mem: Memory, args) -> None:
    """edge.cu strided_copy, element by element."""
    dst, src, batch, rows, cols, src_rows, src_cols, db, dr, dc, sb, sr, sc = args
    item = dst.dtype.itemsize
    b, r, c = np.meshgrid(np.arange(batch), np.arange(rows), np.arange(cols), indexing="ij")
    keep = (r < src_rows) & (c < src_cols)
    words = mem.words(item)
    s = (src.ptr - FAKE) // item + b * sb + r * sr + c * sc
    d = (dst.ptr - FAKE) // item + b * db + r * dr + c * dc
    words[d] = np.where(keep, words[np.where(keep, s, 0)], 0)


def run_softmax_rows(mem: Memory, args) -> None:
    """edge.cu softmax_rows, in float64."""
    out, x, outer, inner, cols, xo, xi, xc, oo, oi, oc = args
    o, i, c = np.meshgrid(np.arange(outer), np.arange(inner), np.arange(cols), indexing="ij")
    f = mem.words(4).view(np.float32)
    v = f[(x.ptr - FAKE) // 4 + o * xo + i * xi + c * xc].astype(np.float64)
    e = np.exp(v - v.max(-1, keepdims=True))
    f[(out.ptr - FAKE) // 4 + o * oo + i * oi + c * oc] = e / e.sum(-1, keepdims=True)


def random_view(mem: Memory, rng, shape, np_dtype, packed=False) -> np.ndarray:
    """A view of ``shape`` into fresh fake memory: dims in a random order, every other element
    skipped along some, the base one element past 16-byte alignment at times (``packed``: a
    plain contiguous array)."""
    if packed:
        return mem.take(max(math.prod(shape), 1), np_dtype)[:math.prod(shape)].reshape(shape)
    order = rng.permutation(len(shape))
    steps = rng.integers(1, 3, len(shape))
    big = [shape[d] * steps[d] for d in order]
    skew = int(rng.integers(0, 2))
    region = mem.take(math.prod(big) + 1, np_dtype)[skew:skew + math.prod(big)].reshape(big)
    view = region[(*(slice(None, None, steps[d]) for d in order), ...)]  # a view even at rank 0
    return view.transpose(np.argsort(order))


DTYPES = [("float32", np.float32), ("bfloat16", np.uint16), ("int8", np.int8), ("float64", np.float64)]


def _random_shape(rng, rank, sizes=(0, 1, 1, 2, 3, 5, 7, 33), most=2048):
    """A shape of ``rank`` dims drawn from ``sizes``, at most ``most`` elements."""
    while True:
        shape = tuple(int(n) for n in rng.choice(sizes, rank))
        if math.prod(shape) <= most:
            return shape


def test_copy_launches_copy_every_rank_and_layout(rng):
    for case in range(120):
        rank = case % 7
        shape = _random_shape(rng, rank) if case % 5 else _random_shape(rng, rank, range(1, 9))
        name, np_dtype = DTYPES[case % len(DTYPES)]
        mem = Memory(1 << 22, rng)
        src = random_view(mem, rng, shape, np_dtype)
        dst = random_view(mem, rng, shape, np_dtype, packed=case % 3 == 0)
        before = mem.buf.copy()
        want = src.copy()
        _, launches = copy_launches(mem.device(dst, name), mem.device(src, name))
        assert bool(launches) == bool(want.size)
        for args in launches:
            run_strided_copy(mem, args)
        np.testing.assert_array_equal(dst, want, err_msg=f"{shape} {name} case {case}")
        outside = ~mem.addressed(dst)
        assert np.array_equal(mem.buf[outside], before[outside]), f"{shape} {name}: wrote outside dst"


def test_copy_of_five_dims_that_do_not_collapse_loops_the_outer_ones_on_the_host(rng):
    mem = Memory(1 << 16, rng)
    src = mem.take(720, np.float32).reshape(6, 5, 4, 3, 2).T  # dims reversed: no neighbours merge
    dst = mem.take(720, np.float32).reshape(2, 3, 4, 5, 6)
    _, launches = copy_launches(mem.device(dst, "float32"), mem.device(src, "float32"))
    assert [a[2:5] for a in launches] == [(4, 5, 6)] * 6  # (batch, rows, cols) of each of 2 x 3 launches
    for args in launches:
        run_strided_copy(mem, args)
    np.testing.assert_array_equal(dst, src)


@pytest.mark.parametrize("lead,rows,cols,pad_rows,pad_cols", [
    ((), 129, 4095, 0, 1), ((), 7, 13, 0, 3), ((3,), 5, 7, 3, 9), ((), 1, 1, 7, 7)])
def test_staging_copies_zero_pad(rng, lead, rows, cols, pad_rows, pad_cols):
    mem = Memory(1 << 23, rng)
    src = random_view(mem, rng, (*lead, rows, cols), np.uint16)
    want = src.copy()
    dst = mem.take(math.prod(lead) * (rows + pad_rows) * (cols + pad_cols), np.uint16).reshape(
        *lead, rows + pad_rows, cols + pad_cols)
    _, launches = copy_launches(mem.device(dst, "bfloat16"), mem.device(src, "bfloat16"))
    for args in launches:
        run_strided_copy(mem, args)
    np.testing.assert_array_equal(dst[..., :rows, :cols], want)
    assert not dst[..., rows:, :].any() and not dst[..., :, cols:].any()


def test_zeros_of_a_product_without_terms(rng):
    mem = Memory(1 << 16, rng)
    out = mem.take(64 * 40, np.uint16).reshape(64, 40)[:, 3:36]  # a view: no memset covers it
    before = mem.buf.copy()
    C = mem.device(out, "bfloat16")
    for args in copy_launches(C, C._as((C.shape[0], 0), C.strides))[1]:
        run_strided_copy(mem, args)
    assert not out.any()
    outside = ~mem.addressed(out)
    assert np.array_equal(mem.buf[outside], before[outside])  # columns 0-2 and 36-39 kept


def run_stage_rows(mem: Memory, args) -> None:
    """edge.cu stage_rows, job by job; a job's 16-byte accesses (its flags) must be aligned."""
    for job in (args[:9], args[9:]):
        dst, src, rows, cols, src_rows, src_cols, dp, sp, flags = job
        if not rows:
            continue
        item = dst.dtype.itemsize
        if flags & edge.DST_VEC:
            assert not (dst.ptr - FAKE) % 16 and not dp * item % 16, job
        if flags & edge.SRC_VEC:
            assert not (src.ptr - FAKE) % 16 and not sp * item % 16, job
        r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        keep = (r < src_rows) & (c < src_cols)
        words = mem.words(item)
        s = (src.ptr - FAKE) // item + r * sp + c if src_rows and src_cols else 0
        words[(dst.ptr - FAKE) // item + r * dp + c] = np.where(keep, words[np.where(keep, s, 0)], 0)


def _staged(mem, src, dst, name):
    return edge.row_job(mem.device(dst, name), mem.device(src, name))


@pytest.mark.parametrize("name,np_dtype", [("bfloat16", np.uint16), ("float8_e4m3fn", np.uint8),
                                           ("float32", np.float32), ("float64", np.float64)])
def test_stage_rows_stage_two_operands_in_one_launch_and_copy_back(rng, name, np_dtype):
    """A GEMM's staging: A (129 x 4095, rows 8190 B apart when bf16) and B (257 x 4095, from a
    base one element past 16-byte alignment) zero-padded into aligned scratch by one launch, and
    C's window copied back out of the staged (129 x 264) output into rows that are no 16-byte
    multiple; nothing written outside the destinations."""
    mem = Memory(1 << 25, rng)
    a = mem.take(129 * 4095, np_dtype).reshape(129, 4095)
    b = mem.take(257 * 4095 + 1, np_dtype)[1:].reshape(257, 4095)
    a2 = mem.take(129 * 4096, np_dtype).reshape(129, 4096)
    b2 = mem.take(264 * 4096, np_dtype).reshape(264, 4096)
    jobs = [_staged(mem, a, a2, name), _staged(mem, b, b2, name)]
    assert [j[8] for j in jobs] == [edge.DST_VEC] * 2  # the sources' rows are no 16-byte multiple
    launches = edge.stage_launches(jobs)
    assert len(launches) == 1 and launches[0][1] == (129 + 264) * 4096 * a.itemsize // 16
    before = mem.buf.copy()
    run_stage_rows(mem, launches[0][2])
    np.testing.assert_array_equal(a2[:, :4095], a)
    np.testing.assert_array_equal(b2[:257, :4095], b)
    assert not a2[:, 4095:].any() and not b2[257:].any() and not b2[:, 4095:].any()
    outside = ~(mem.addressed(a2) | mem.addressed(b2))
    assert np.array_equal(mem.buf[outside], before[outside])

    c2 = mem.take(129 * 264, np_dtype).reshape(129, 264)
    c = mem.take(129 * 257 + 3, np_dtype)[3:].reshape(129, 257)
    C2 = mem.device(c2, name)
    job = edge.row_job(mem.device(c, name), C2._as((129, 257), C2.strides))
    assert job[8] == (edge.SRC_VEC if 264 * c2.itemsize % 16 == 0 else 0)  # rows of 264 fp8 bytes are not
    before = mem.buf.copy()
    run_stage_rows(mem, edge.stage_launches([job])[0][2])
    np.testing.assert_array_equal(c, c2[:, :257])
    outside = ~mem.addressed(c)
    assert np.array_equal(mem.buf[outside], before[outside])


def test_stage_rows_random_views(rng):
    """Views with rows at any pitch and base (elements packed along rows), zero padding in both
    dims, jobs paired per element size."""
    for case in range(40):
        name, np_dtype = DTYPES[case % len(DTYPES)]
        mem = Memory(1 << 21, rng)
        rows, cols = (int(x) for x in rng.integers(1, 40, 2))
        pad_r, pad_c = (int(x) for x in rng.integers(0, 9, 2))
        pitch, skew = cols + int(rng.integers(0, 5)), int(rng.integers(0, 3))
        src = mem.take(rows * pitch + skew, np_dtype)[skew:].reshape(rows, pitch)[:, :cols]
        dst = mem.take((rows + pad_r) * (cols + pad_c), np_dtype).reshape(rows + pad_r, cols + pad_c)
        want = src.copy()
        job = _staged(mem, src, dst, name)
        assert job is not None, (case, src.strides)
        for launch in edge.stage_launches([job]):
            run_stage_rows(mem, launch[2])
        np.testing.assert_array_equal(dst[:rows, :cols], want, err_msg=f"case {case}")
        assert not dst[rows:].any() and not dst[:, cols:].any()


def test_stage_rows_take_grouped_experts_as_rows(rng):
    """A grouped GEMM's experts (G, N, K) with K no multiple of 8, into (G, N, K') scratch: the
    groups' rows merge into one job of G x N rows on both sides."""
    mem = Memory(1 << 20, rng)
    src = mem.take(3 * 5 * 13, np.uint16).reshape(3, 5, 13)
    dst = mem.take(3 * 5 * 16, np.uint16).reshape(3, 5, 16)
    want = src.copy()
    job = _staged(mem, src, dst, "bfloat16")
    assert job[2:6] == (15, 16, 15, 13) and job[6:8] == (16, 13)
    run_stage_rows(mem, edge.stage_launches([job])[0][2])
    np.testing.assert_array_equal(dst[..., :13], want)
    assert not dst[..., 13:].any()


def test_stage_rows_take_only_row_copies():
    f = "bfloat16"
    packed = arr((8, 16), f, ptr=FAKE)
    assert edge.row_job(packed, arr((8, 16), f, (4, 64), ptr=FAKE)) is None  # src elements 2 apart
    assert edge.row_job(packed, arr((8, 16), f, (2, 16), ptr=FAKE)) is None  # transposed src
    assert edge.row_job(packed, arr((9, 16), f, ptr=FAKE)) is None            # src larger than dst
    assert edge.row_job(arr((2, 8, 16), f, ptr=FAKE), arr((2, 7, 16), f, ptr=FAKE)) is None  # rows padded per group
    assert edge.row_job(arr((2, 8, 16), f, ptr=FAKE), arr((2, 8, 16), f, (512, 32, 2), ptr=FAKE)) is None  # groups apart
    assert edge.row_job(packed, arr((8, 16), f, ptr=FAKE + 1)) is None          # half an element off
    assert edge.row_job(packed, arr((8, 0), f, ptr=FAKE))[5] == 0              # zeros only
    # the kernel numbers 16-byte chunks in 32 bits: two jobs share a launch below 2^31 of them
    big = [edge.row_job(arr((1 << 16, 1 << 14), f, ptr=FAKE), arr((1 << 16, 1 << 14), f, ptr=FAKE))] * 2
    assert [n for _, n, _ in edge.stage_launches(big)] == [1 << 28]
    huge = [edge.row_job(arr((1 << 19, 1 << 14), f, ptr=FAKE), arr((1 << 19, 1 << 14), f, ptr=FAKE))] * 2
    assert [n for _, n, _ in edge.stage_launches(huge)] == [1 << 30] * 2
    assert edge.row_job(arr((1 << 20, 1 << 14), f, ptr=FAKE), arr((1 << 20, 1 << 14), f, ptr=FAKE)) is None
    fp8 = edge.row_job(arr((8, 16), "float8_e4m3fn", ptr=FAKE), arr((8, 16), "float8_e4m3fn", ptr=FAKE))
    assert [item for item, _, _ in edge.stage_launches([big[0], fp8])] == [2, 1]  # one element size a launch


def test_transposing_copy(rng):
    """edge.transpose writes x into out viewed with its strides reversed."""
    for shape in [(127, 64), (5, 3), (1, 300), (257, 129)]:
        mem = Memory(1 << 21, rng)
        x = random_view(mem, rng, shape, np.float32)
        want = x.T.copy()
        out = mem.take(math.prod(shape), np.float32).reshape(shape[::-1])
        o = mem.device(out, "float32")
        for args in copy_launches(o._as(shape, o.strides[::-1]), mem.device(x, "float32"))[1]:
            run_strided_copy(mem, args)
        np.testing.assert_array_equal(out, want)


def test_softmax_launches_cover_every_row_of_any_rank(rng):
    for case in range(60):
        rank = case % 6
        shape = _random_shape(rng, rank, (1, 2, 3, 7, 127))
        mem = Memory(1 << 22, rng)
        x = random_view(mem, rng, shape, np.float32)
        x[...] = rng.standard_normal(shape).astype(np.float32) * 4
        out = random_view(mem, rng, shape, np.float32, packed=case % 2 == 0)
        rows, launches = softmax_launches(mem.device(out, "float32"), mem.device(x, "float32"))
        assert rows * len(launches) * (shape[-1] if shape else 1) == max(x.size, 1)
        h = x.astype(np.float64).reshape(shape or (1,))
        for args in launches:
            run_softmax_rows(mem, args)
        ref = np.exp(h - h.max(-1, keepdims=True))
        np.testing.assert_allclose(out.reshape(shape or (1,)), ref / ref.sum(-1, keepdims=True), rtol=1e-6,
                                   err_msg=f"{shape} case {case}")


def test_edge_strides_must_be_whole_elements():
    with pytest.raises(tf.TmaflowError, match=r"src: strides \(6, 4\) B and address 0x100000000 must be "
                                              r"multiples of its 4-byte elements"):
        copy_launches(arr((3, 5), "float32"), arr((3, 5), "float32", (6, 4), ptr=FAKE))


# --- the kernels compile -----------------------------------------------------------------------

@pytest.mark.parametrize("name,defines", [("strided_copy", {"ELEM_BYTES": 1}), ("strided_copy", {"ELEM_BYTES": 2}),
                                          ("strided_copy", {"ELEM_BYTES": 4}), ("strided_copy", {"ELEM_BYTES": 8}),
                                          ("stage_rows", {"ELEM_BYTES": 1}), ("stage_rows", {"ELEM_BYTES": 2}),
                                          ("stage_rows", {"ELEM_BYTES": 4}), ("stage_rows", {"ELEM_BYTES": 8}),
                                          ("softmax_rows", None)])
@pytest.mark.parametrize("debug", [None, True], ids=["release", "debug"])
def test_edge_kernels_compile_to_cubin(tmp_cache, name, defines, debug):
    k = get_kernel(name, None, defines, debug=debug)
    assert k.cubin[:4] == b"\x7fELF"
    assert k.resources.spills == 0 and k.resources.registers <= 64  # 256 threads, 8 blocks an SM
    kinds = [p.kind for p in k.params]
    jobs = [kinds[i:i + 9] for i in range(0, len(kinds), 9)] if name == "stage_rows" else [kinds]  # two jobs
    assert all(j[:2] == ["pointer", "pointer"] and set(j[2:]) == {"int"} for j in jobs) and all(p.size == 8 for p in k.params)
