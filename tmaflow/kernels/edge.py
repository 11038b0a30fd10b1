"""The edge path: every shape and stride torch takes, where the TMA kernels cannot go.

A TMA map addresses rows whose pitch and base address are 16-byte multiples, with packed
elements; its stores write whole 16-byte chunks. The entry points keep their TMA kernels for
every call that fits those rules (one check per call: ``takes_tma``, ``gemm_takes_tma``,
``grouped_takes_tma``) and hand the rest here:

- GEMMs (bf16, fp8 with per-tensor or block scales, grouped) are *staged*: each operand the TMA
  cannot read is copied into aligned scratch, zero-padded along K (the product is unchanged)
  and along N where the output is staged too; the aligned kernel runs on the scratch; the valid
  window of a staged output is copied into the caller's. ``product_staging`` plans it. Copies
  of packed rows (the usual case: a K or N that is no multiple of 8) go two to a
  ``stage_rows`` launch, 16 bytes a thread; the GEMM and the copy back follow under PDL.
- copy, transpose and softmax of any rank, width and stride run plain kernels (edge.cu), or,
  where collapsing dims leaves a TMA-legal 2-D view, the TMA kernel on that view.

Every launch is ordered on the call's stream; scratch comes from the caller's allocator (torch,
cupy) or tmaflow's stream-ordered pool and lives as long as the launches that use it
(``Launches.keep``), so a ``.prepare()``d call or a captured graph replays them all.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

from ..errors import TmaflowError
from ..runtime.device import current_device
from ..runtime.memory import DeviceArray, as_array
from .entry import contiguous_strides, new_output, on_current_device, scratch
from .matmul.config import BF16, _readable_scale_a, _row_major
from .registry import get_kernel

ALIGN = 16                 # bytes: TMA base addresses, row pitches and store chunks
TILE = 32                  # strided_copy's square tile (edge.cu)
THREADS = 256              # threads per block of both edge kernels (edge.cu)
BLOCKS_PER_SM = 8          # grid of the grid-stride edge kernels
KERNEL_RANK = 3            # dims a strided_copy launch covers; more are looped on the host
ROW_RANK = 2               # leading dims a softmax_rows launch covers
GROUPED_NN_K = 64          # matmul.BK: the grouped kernel's K granule in layout "nn"
STAGED = "staged"          # the scale mode of block scales the kernels cannot read as given


# --- which calls take the TMA kernels ---------------------------------------------------------

def rows_ok(arr: DeviceArray) -> bool:
    """True when a TMA map can address ``arr``: packed elements along the last dim, every other
    stride a positive multiple of 16 bytes, the base address 16-byte aligned."""
    strides = arr.strides
    if strides[-1] != arr.dtype.itemsize:
        return False
    bits = arr.ptr
    for s in strides[:-1]:
        if s <= 0:
            return False
        bits |= s
    return not bits % ALIGN


def why_not_rows(name: str, arr: DeviceArray) -> str | None:
    """Why a TMA map cannot address ``arr`` (None when it can): the reason a call is staged."""
    if arr.strides[-1] != arr.dtype.itemsize:
        return f"{name}: elements {arr.strides[-1]} B apart (TMA rows are packed)"
    bad = [s for s in arr.strides[:-1] if s <= 0 or s % ALIGN]
    if bad:
        return f"{name}: strides {arr.strides} B (TMA pitches are positive multiples of {ALIGN} B)"
    if arr.ptr % ALIGN:
        return f"{name}: base address 0x{arr.ptr:x} is not {ALIGN}-byte aligned"
    return None


def aligned(a: DeviceArray, b: DeviceArray | None, c: DeviceArray | None = None) -> bool:
    """Whether every base address is 16-byte aligned (None: an output the call allocates,
    which is): with the layouts, all a cache key needs to imply ``takes_tma`` and
    ``gemm_takes_tma``."""
    bits = a.ptr
    if b is not None:
        bits |= b.ptr
    if c is not None:
        bits |= c.ptr
    return not bits % ALIGN


def takes_tma(a: DeviceArray, o: DeviceArray | None, transposed: bool = False) -> bool:
    """True when the 2-D TMA kernels (copy, softmax; transpose with ``transposed``) can run
    ``a`` into ``o``, or into a new contiguous output: both non-empty 2-D with rows TMA can
    address."""
    if a.ndim != 2 or not a.size or not rows_ok(a):
        return False
    if o is not None:
        return rows_ok(o)
    return a.shape[0 if transposed else 1] * a.dtype.itemsize % ALIGN == 0


def gemm_takes_tma(A: DeviceArray, B: DeviceArray, C: DeviceArray | None, n: int,
                   scale_mode: str | None) -> bool:
    """True when the TMA GEMM can run A, B into C (or a new (M, N) output) as given: rows TMA can
    address, N a multiple of 8 (a store writes whole 16-byte chunks: a narrower row would spill
    into the next columns), block scales in a layout the kernels read."""
    return (rows_ok(A) and rows_ok(B) and not n % 8 and (C is None or rows_ok(C))
            and scale_mode != STAGED)


def grouped_takes_tma(A: DeviceArray, B: DeviceArray, C: DeviceArray | None, n: int,
                      layout: str) -> bool:
    """``gemm_takes_tma`` for the grouped GEMM, whose B must also be contiguous (the experts are
    one 2-D map) and, for layout "nn", have K a multiple of 64 (a group's last k-block would
    read the next group's rows)."""
    return (gemm_takes_tma(A, B, C, n, None) and B.strides == _packed(B.shape, B.dtype.itemsize)
            and (layout == "nt" or not A.shape[1] % GROUPED_NN_K))


# --- staging plans ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProductStaging:
    """How a product the TMA kernel cannot run as given runs on it anyway: the shape of the
    aligned scratch each staged operand is copied into, zero-padded (None: the operand is used
    as given), the K the kernel runs, and why each operand is staged."""

    a: tuple | None  # (M, K')
    b: tuple | None  # (N', K') for "nt", (K', N') for "nn", after B's leading (group) dims
    c: tuple | None  # (M, N'): the kernel's output, whose (M, N) window is copied out
    k: int
    reasons: tuple


def product_staging(A: DeviceArray, B: DeviceArray, C: DeviceArray, layout: str,
                    k_granule: int | None = None, b_packed: bool = False) -> ProductStaging:
    """The staging of C = A @ B^T ("nt") or A @ B ("nn"). K is padded with zeros to a multiple
    of ``k_granule`` (default: one 16-byte chunk of A's elements), which leaves the product
    unchanged; N to a multiple of 8 where C is staged (the scratch's rows are whole chunks, and
    B's N extent matches them). ``b_packed``: B must also be contiguous (grouped experts)."""
    m, k = A.shape
    n = C.shape[1]
    c_why = why_not_rows("out", C) or (
        f"out: {n} columns (TMA stores write whole {ALIGN}-byte chunks: the rows would spill)"
        if n % 8 else None)
    kp = _round_up(k, k_granule or ALIGN // A.dtype.itemsize)
    np_ = _round_up(n, 8) if c_why else n
    b_shape = (*B.shape[:-2], *((np_, kp) if layout == "nt" else (kp, np_)))
    reasons = []

    def plan(name, arr, shape):
        why = why_not_rows(name, arr)
        if why is None and b_packed and name == "b" and arr.strides != _packed(arr.shape, arr.dtype.itemsize):
            why = f"{name}: strides {arr.strides} B (the grouped kernel reads every expert as one array)"
        if why is None and arr.shape != shape:
            why = f"{name}: {arr.shape} zero-padded to {shape}"
        if why is None:
            return None
        reasons.append(why)
        return shape

    a_shape = plan("a", A, (m, kp))
    b_shape = plan("b", B, b_shape)
    if c_why:
        reasons.append(c_why)
    return ProductStaging(a_shape, b_shape, (m, np_) if c_why else None, kp, tuple(reasons))


def _round_up(x: int, granule: int) -> int:
    return -(-x // granule) * granule


def _packed(shape: tuple, itemsize: int) -> tuple:
    return contiguous_strides(tuple(shape), itemsize)


def collapse(shape: tuple, *strides: tuple) -> tuple:
    """(shape, [strides, ...]) with size-1 dims dropped and neighbouring dims merged wherever
    every stride set steps through them as one: fewer dims over the same elements, in order."""
    dims: list = []
    for i, n in enumerate(shape):
        if n == 1:
            continue
        st = [s[i] for s in strides]
        if dims and all(outer == inner * n for outer, inner in zip(dims[-1][1], st)):
            dims[-1] = (dims[-1][0] * n, st)
        else:
            dims.append((n, st))
    return tuple(n for n, _ in dims), [tuple(st[j] for _, st in dims) for j in range(len(strides))]


# --- launches -----------------------------------------------------------------------------------

class Launches:
    """Several launches made in order on one stream: the launcher an entry point returns when a
    call stages operands or needs more than one kernel (``Prepared`` repeats them all).
    ``keep`` holds the scratch the launches use for as long as they may run."""

    __slots__ = ("steps", "keep")

    def __init__(self, steps, keep=()):
        self.steps, self.keep = tuple(steps), tuple(keep)

    def __call__(self, *_) -> None:
        for launcher, args in self.steps:
            launcher(*args)

    def __repr__(self) -> str:
        names = [getattr(getattr(launcher, "kernel", None), "name", type(launcher).__name__)
                 for launcher, _ in self.steps]
        return f"Launches({', '.join(names)}; {len(self.keep)} scratch arrays)"


def _elements(name: str, arr: DeviceArray) -> tuple:
    """``arr``'s strides in elements (the edge kernels index elements)."""
    item = arr.dtype.itemsize
    if arr.ptr % item or any(s % item for s in arr.strides):
        raise TmaflowError(f"{name}: strides {arr.strides} B and address 0x{arr.ptr:x} must be "
                           f"multiples of its {item}-byte elements")
    return tuple(s // item for s in arr.strides)


def _at(arr: DeviceArray, offset: int) -> DeviceArray:
    """The view of ``arr`` starting ``offset`` bytes further (a host-looped dim's slice)."""
    return DeviceArray._view(arr.ptr + offset, arr.shape, arr.dtype, arr.strides, arr.owner,
                             arr.device, arr._origin, arr._alloc)


def _grid(work: int) -> int:
    return max(1, min(work, current_device().sm_count * BLOCKS_PER_SM))


def _host_loop(lead: tuple, *strides: tuple, itemsize: int):
    """Byte offsets, per array, of every index of the ``lead`` dims a launch does not cover."""
    for index in itertools.product(*map(range, lead)):
        yield [itemsize * sum(i * s for i, s in zip(index, st)) for st in strides]


def copy_launches(dst: DeviceArray, src: DeviceArray) -> tuple:
    """(blocks, [args of each ``strided_copy`` launch]) writing ``dst`` from ``src`` at any
    element strides: the same shape (dims collapsed, those past the kernel's three looped on
    the host), or (staging) ``src`` as large in every dim but the last two, whose extra rows and
    columns in ``dst`` get zeros. Pure: the CPU tier checks it against a model of the kernel."""
    item = dst.dtype.itemsize
    if item not in (1, 2, 4, 8) or src.dtype.itemsize != item:
        raise TmaflowError(f"copy: elements of {src.dtype.itemsize} B into {item} B: the edge "
                           "copy moves elements of 1, 2, 4 or 8 bytes, the same size on both sides")
    if not dst.size:
        return 0, []
    tiles, parts = _copy_geometry(dst.shape, _elements("dst", dst), src.shape, _elements("src", src), item)
    return tiles, [(_at(dst, d), _at(src, s), *scalars) for d, s, scalars in parts]


@functools.lru_cache(maxsize=256)  # a repeated call plans nothing
def _copy_geometry(dst_shape: tuple, ds: tuple, src_shape: tuple, ss: tuple, item: int) -> tuple:
    """(blocks, ((dst offset, src offset, scalar arguments), ...)) of ``copy_launches``."""
    if src_shape == dst_shape:
        shape, (ds, ss) = collapse(dst_shape, ds, ss)
        src_rows = src_cols = None
    else:
        shape, (src_rows, src_cols) = dst_shape, src_shape[-2:]
    lead = max(0, len(shape) - KERNEL_RANK)
    pad = KERNEL_RANK - len(shape) + lead
    batch, rows, cols = (1,) * pad + shape[lead:]
    if src_rows is None:
        src_rows, src_cols = rows, cols
    scalars = (batch, rows, cols, src_rows, src_cols, *(0,) * pad, *ds[lead:], *(0,) * pad, *ss[lead:])
    tiles = batch * -(-rows // TILE) * -(-cols // TILE)
    return tiles, tuple((d, s, scalars) for d, s in _host_loop(shape[:lead], ds[:lead], ss[:lead], itemsize=item))


def copy_steps(dst: DeviceArray, src: DeviceArray, stream=None, debug=None) -> list:
    """(launcher, args) of every ``strided_copy`` launch of ``copy_launches``."""
    tiles, launches = copy_launches(dst, src)
    if not launches:
        return []
    k = get_kernel("strided_copy", None, {"ELEM_BYTES": dst.dtype.itemsize}, debug=debug)
    launcher = k.launcher(grid=_grid(tiles), block=THREADS, stream=stream)
    return [(launcher, args) for args in launches]


# stage_rows (edge.cu): flags of a job whose side takes 16-byte loads / stores
SRC_VEC, DST_VEC = 1, 2
_NO_JOB = (0, 0, 0, 0, 0, 0, 0, 0, 0)  # the second job of a launch with one


def row_job(dst: DeviceArray, src: DeviceArray) -> tuple | None:
    """``stage_rows``' arguments for one job writing ``dst`` from ``src`` (2-D and no larger in
    either dim: zeros past it; or of more dims, the same but in the last, whose leading dims
    merge into rows on both sides: a grouped GEMM's experts), elements packed along rows and
    positive row pitches; None where the strided copy must move it. Pure, as ``copy_launches``."""
    item = dst.dtype.itemsize
    if dst.ndim != src.ndim or dst.ndim < 2:
        return None
    if dst.ndim > 2:  # the leading dims must merge into one of rows on both sides
        if dst.shape[:-1] != src.shape[:-1]:
            return None
        lead, (ds, ss) = collapse(dst.shape[:-1], dst.strides[:-1], src.strides[:-1])
        if len(lead) != 1:
            return None
        dst = dst._as((lead[0], dst.shape[-1]), (ds[0], dst.strides[-1]))
        src = src._as((lead[0], src.shape[-1]), (ss[0], src.strides[-1]))
    if src.dtype.itemsize != item or item not in (1, 2, 4, 8) or not dst.size:
        return None
    (rows, cols), (src_rows, src_cols) = dst.shape, src.shape
    if src_rows > rows or src_cols > cols or rows * -(-cols // (ALIGN // item)) >= 1 << 31:
        return None
    sides = [(dst, rows, cols), (src, src_rows, src_cols)]
    if any(a.strides[1] != item or a.strides[0] <= 0 or (a.ptr | a.strides[0]) % item for a, r, c in sides if r and c):
        return None
    flags = sum(bit for bit, (a, r, c) in zip((DST_VEC, SRC_VEC), sides)
                if r and c and not (a.ptr | a.strides[0]) % ALIGN)
    return (dst, src, rows, cols, src_rows, src_cols, dst.strides[0] // item,
            src.strides[0] // item if src_rows and src_cols else 0, flags)


def stage_launches(jobs: list) -> list:
    """(element bytes, chunks, args) of each ``stage_rows`` launch moving ``jobs``
    (``row_job``'s): two a launch where their elements are of one size and their 16-byte chunks
    stay below 2^31 together (the kernel numbers them in 32 bits). Pure."""
    out: list = []
    open_: dict = {}  # element bytes -> (chunks, job) of a launch with one job so far
    for job in jobs:
        item = job[0].dtype.itemsize
        chunks = job[2] * -(-job[3] // (ALIGN // item))
        held = open_.pop(item, None)
        if held is not None and held[0] + chunks < 1 << 31:
            out.append((item, held[0] + chunks, (*held[1], *job)))
        else:
            if held is not None:
                out.append((item, held[0], (*held[1], *_NO_JOB)))
            open_[item] = (chunks, job)
    out += [(item, chunks, (*job, *_NO_JOB)) for item, (chunks, job) in open_.items()]
    return out


def stage_steps(jobs: list, stream=None, debug=None, pdl: bool = False) -> list:
    """(launcher, args) of the ``stage_launches`` of ``jobs``; ``pdl``: each launched behind
    the previous kernel (stage_rows waits for that grid before it reads)."""
    steps = []
    for item, chunks, args in stage_launches(jobs):
        k = get_kernel("stage_rows", None, {"ELEM_BYTES": item}, debug=debug)
        steps.append((k.launcher(grid=_grid(-(-chunks // THREADS)), block=THREADS, stream=stream, pdl=pdl), args))
    return steps


def zero_steps(dst: DeviceArray, stream=None, debug=None) -> list:
    """Launches writing zeros over the 2-D ``dst`` at any strides (a sum of no terms)."""
    return copy_steps(dst, dst._as((dst.shape[0], 0), dst.strides), stream, debug)


def softmax_launches(out: DeviceArray, x: DeviceArray) -> tuple:
    """(rows, [args of each ``softmax_rows`` launch]) over the last dim of ``x``, any rank,
    width and strides: the leading dims collapsed into (outer, inner), those past two looped
    on the host. Pure, as ``copy_launches``."""
    if not x.size:
        return 0, []
    xs, os_ = _elements("softmax", x) or (1,), _elements("softmax: out", out) or (1,)
    shape = x.shape or (1,)
    lead_shape, (xl, ol) = collapse(shape[:-1], xs[:-1], os_[:-1])
    lead = max(0, len(lead_shape) - ROW_RANK)
    pad = ROW_RANK - len(lead_shape) + lead
    outer, inner = (1,) * pad + lead_shape[lead:]
    x2, o2 = (0,) * pad + xl[lead:], (0,) * pad + ol[lead:]
    return outer * inner, [(_at(out, o), _at(x, i), outer, inner, shape[-1], *x2, xs[-1], *o2, os_[-1])
                           for i, o in _host_loop(lead_shape[:lead], xl[:lead], ol[:lead], itemsize=4)]


def softmax_steps(out: DeviceArray, x: DeviceArray, stream=None, debug=None) -> list:
    """(launcher, args) of every ``softmax_rows`` launch of ``softmax_launches``: a warp a row."""
    rows, launches = softmax_launches(out, x)
    if not launches:
        return []
    launcher = get_kernel("softmax_rows", None, debug=debug).launcher(
        grid=_grid(-(-rows // (THREADS // 32))), block=THREADS, stream=stream)
    return [(launcher, args) for args in launches]


# --- the entry points' edge paths ---------------------------------------------------------------



class _Staging:
    """Scratch of the caller's kind for one staged call, and the launches that fill it: row
    copies gathered into ``stage_rows`` launches of two jobs, the rest strided copies."""

    def __init__(self, like, like_arr: DeviceArray, stream, debug):
        self.like, self.like_arr, self.stream, self.debug = like, like_arr, stream, debug
        self.steps: list = []
        self.keep: list = []
        self.rows: list = []  # row_job's, launched by ``flush``

    def empty(self, shape: tuple, dtype) -> DeviceArray:
        arr = scratch(self.like, self.like_arr, shape, dtype, self.stream)  # zeroed for the sanitizer:
        self.keep.append(arr)  # a GEMM fills it by TMA stores, a copy reads it
        return arr

    def copy(self, src: DeviceArray, shape: tuple | None) -> DeviceArray:
        """``src`` itself (``shape`` None), or new contiguous scratch of ``shape`` holding
        ``src``, zero-padded."""
        if shape is None:
            return src
        arr = self.empty(shape, src.dtype)
        job = row_job(arr, src)
        if job is None:
            self.add(copy_steps(arr, src, self.stream, self.debug))
        else:
            self.rows.append(job)
        return arr

    def flush(self) -> None:
        """The gathered row copies' launches, after the steps so far."""
        self.add(stage_steps(self.rows, self.stream, self.debug))
        self.rows = []

    def product(self, launcher, args) -> None:
        """The GEMM on the staged operands, launched behind the copies under PDL (its prologue
        overlaps their tail; it waits for them before it reads)."""
        self.flush()
        self.add([(launcher, args)])

    def copy_back(self, dst: DeviceArray, staged: DeviceArray) -> None:
        """``staged``'s (dst-shaped) window into the caller's ``dst``, behind the GEMM under PDL
        where it is a row copy."""
        view = staged._as(dst.shape, staged.strides)
        job = row_job(dst, view)
        self.add(copy_steps(dst, view, self.stream, self.debug) if job is None else
                 stage_steps([job], self.stream, self.debug, pdl=True))

    def add(self, steps) -> None:
        self.steps.extend(steps)

    def launches(self) -> Launches:
        return Launches(self.steps, self.keep)


def gemm(prepare, a, A: DeviceArray, B: DeviceArray, out, C: DeviceArray | None, *, layout: str,
         scale_a, scale_b, scale_mode: str | None, options: dict):
    """``kernels.gemm`` of operands the TMA GEMM cannot take as given (``prepare`` is its
    undecorated body, ``options`` its remaining keywords): staged as ``product_staging`` says."""
    stream, debug = options["stream"], options["debug"]
    m, n = A.shape[0], B.shape[0] if layout == "nt" else B.shape[1]
    result, C = (out, C) if C is not None else new_output(a, A, (m, n), BF16, stream)
    plan = product_staging(A, B, C, layout)
    st = _Staging(a, A, stream, debug)
    A2, B2 = st.copy(A, plan.a), st.copy(B, plan.b)
    if scale_mode == STAGED:
        sa, sb = as_array(scale_a), as_array(scale_b)
        if not _readable_scale_a(sa):  # M-major with a 16-byte pitch: what the TMA loads with A
            rows = _round_up(sa.shape[0], 4)
            scale_a = st.empty((sa.shape[1], rows), sa.dtype)._as(sa.shape, (4, 4 * rows))
            st.add(copy_steps(scale_a, sa, stream, debug))
        if not _row_major(sb):
            scale_b = st.copy(sb, sb.shape)
    C2 = st.empty(plan.c, BF16) if plan.c else C
    st.product(*prepare(A2, B2, C2, layout=layout, scale_a=scale_a, scale_b=scale_b, **dict(options, pdl=True))[:2])
    if plan.c:
        st.copy_back(C, C2)
    return st.launches(), (), result


def grouped_gemm(prepare, a, A: DeviceArray, B: DeviceArray, offsets, out, C: DeviceArray | None,
                 *, layout: str, options: dict):
    """``kernels.grouped_gemm`` of operands its TMA kernel cannot take as given: staged as
    ``product_staging`` says, with K padded to 64 for layout "nn"."""
    stream, debug = options["stream"], options["debug"]
    t, n = A.shape[0], B.shape[1] if layout == "nt" else B.shape[2]
    result, C = (out, C) if C is not None else new_output(a, A, (t, n), None, stream)
    plan = product_staging(A, B, C, layout, GROUPED_NN_K if layout == "nn" else None, b_packed=True)
    st = _Staging(a, A, stream, debug)
    A2, B2 = st.copy(A, plan.a), st.copy(B, plan.b)
    C2 = st.empty(plan.c, C.dtype) if plan.c else C
    st.product(*prepare(A2, B2, offsets, C2, layout=layout, **dict(options, pdl=True))[:2])
    if plan.c:
        st.copy_back(C, C2)
    return st.launches(), (), result


def empty_product(C: DeviceArray, k: int, stream) -> tuple:
    """(launcher, args) of a product with no rows, columns or terms: zeros where a sum has no
    terms (K = 0), written in order on the stream; nothing to launch otherwise."""
    if k or not C.size:
        return None, ()
    return Launches(zero_steps(C, stream)), ()


def _output(who: str, src, a: DeviceArray, out, o: DeviceArray | None, shape: tuple, stream):
    """(out, its view): the caller's, or a new one of ``src``'s kind; ``a`` checked to live on
    the current device when it has elements to move."""
    if a.size:  # (before the output: a call on another device's arrays runs again there)
        on_current_device(who, a)
    if o is None:  # no out given
        out, o = new_output(src, a, shape, None, stream)
    return out, o


def copy(prepare, src, a: DeviceArray, dst, o: DeviceArray | None, options: dict):
    """``kernels.copy`` of what the 2-D TMA copy cannot take as given: any rank, empty arrays,
    rows that are not 16-byte multiples, element strides. A TMA-legal 2-D view of both arrays
    (after collapsing dims) takes the TMA copy; the rest the strided copy."""
    stream = options["stream"]
    dst, o = _output("copy", src, a, dst, o, a.shape, stream)
    if not a.size:
        return None, (), dst
    views = _tma_views(a, o)
    if views is not None:
        launcher, args, _ = prepare(*views, **options)
        return launcher, args, dst
    return Launches(copy_steps(o, a, stream, options["debug"])), (), dst


def _tma_views(a: DeviceArray, o: DeviceArray):
    """2-D views of ``a`` and ``o`` (the same elements in the same order) the TMA copy takes,
    or None: collapsed dims, and for packed arrays rows of 256 elements or of a's last dim."""
    shape, (sa, so) = collapse(a.shape, a.strides, o.strides)
    item = a.dtype.itemsize
    candidates = [(shape, sa, so)] if len(shape) == 2 else []
    if len(shape) == 1 and sa[0] == so[0] == item:
        for width in (256, a.shape[-1]):
            if width and shape[0] % width == 0:
                row = (shape[0] // width, width)
                candidates.append((row, (width * item, item), (width * item, item)))
    for shape2, sa2, so2 in candidates:
        av, ov = a._as(shape2, sa2), o._as(shape2, so2)
        if takes_tma(av, ov):
            return av, ov
    return None


def transpose(src, x: DeviceArray, out, o: DeviceArray | None, stream, debug):
    """``kernels.transpose`` of what the TMA transpose cannot take: the strided copy of x into
    the transposed view of out (its tiles keep both sides coalesced)."""
    out, o = _output("transpose", src, x, out, o, x.shape[::-1], stream)
    if not x.size:
        return None, (), out
    return Launches(copy_steps(o._as(x.shape, o.strides[::-1]), x, stream, debug)), (), out


def softmax(prepare, src, a: DeviceArray, out, o: DeviceArray | None, max_cols: int, options: dict):
    """``kernels.softmax`` over the last dim of what the TMA softmax cannot take as given: any
    rank, empty arrays, rows wider than ``max_cols`` or not 16-byte multiples, element strides.
    Leading dims that collapse into TMA-legal rows take the TMA kernel; the rest softmax_rows."""
    if a.dtype.name != "float32":
        raise TmaflowError(f"softmax: needs a float32 array (got {a.shape} {a.dtype})")
    stream = options["stream"]
    out, o = _output("softmax", src, a, out, o, a.shape, stream)
    if not a.size:
        return None, (), out
    if not a.ndim:  # a 0-D array is one row of one column (torch's softmax of a scalar is 1)
        a, o = a._as((1,), (4,)), o._as((1,), (4,))
    cols = a.shape[-1]
    lead, (sa, so) = collapse(a.shape[:-1], a.strides[:-1], o.strides[:-1]) if a.ndim else ((), [(), ()])
    if len(lead) == 1 and cols <= max_cols:
        av = a._as((lead[0], cols), (sa[0], a.strides[-1]))
        ov = o._as((lead[0], cols), (so[0], o.strides[-1]))
        if takes_tma(av, ov):
            launcher, args, _ = prepare(av, ov, **options)
            return launcher, args, out
    return Launches(softmax_steps(o, a, stream, options["debug"])), (), out
