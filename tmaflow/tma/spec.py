"""Tensor map specs: ``TensorMapSpec`` checks every encode rule in pure Python, without a driver.

Python-side shapes, boxes, strides and coordinates are row-major (numpy order, outermost
first). :meth:`TensorMapSpec.driver_order` is the one place they are reversed into the
driver's innermost-first order.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import numpy as np

from .. import checks
from ..dtypes import BY_CODE, DType, TMA_FLOAT_CODES, as_dtype
from ..errors import TensorMapError

SWIZZLE = {"none": 0, "32B": 1, "64B": 2, "128B": 3}
SWIZZLE_SPAN = {"none": 0, "32B": 32, "64B": 64, "128B": 128}
INTERLEAVE = {"none": 0, "16B": 1, "32B": 2}
L2_PROMOTION = {"none": 0, "64B": 1, "128B": 2, "256B": 3}
OOB_FILL = {"zero": 0, "nan": 1}
MAX_BOX = 256
MAX_DIM = 1 << 32
MAX_STRIDE = 1 << 40
# Measured (tools/experiments/explore_encode.py, H200, driver 580): the driver rejects a box whose
# footprint prod(floor(box_i / element_stride_i)) x element size (every dim, the inner one
# included) exceeds 228 KB, the shared memory of one SM.
MAX_BOX_SMEM = 228 * 1024
IM2COL_CORNER = {3: (-32768, 32767), 4: (-128, 127), 5: (-16, 15)}


def _choice(field_name: str, value, table: dict) -> str:
    """One of ``table``'s names (any case), its driver code as an int, or ``None`` for
    "none" where the table has it."""
    if value is None and "none" in table:
        return "none"
    if isinstance(value, str):
        for k in table:
            if k.lower() == value.lower():
                return k
    elif checks.is_int(value):
        for k, v in table.items():
            if v == operator.index(value):
                return k
    raise TensorMapError(f"{field_name}={value!r} is not one of {', '.join(map(repr, table))}")


def _ints(field_name: str, value, rank: int | None = None) -> tuple[int, ...]:
    """A tuple of ints (see ``checks.as_ints``), of the tensor's rank when one is given."""
    out = checks.as_ints(field_name, value, error=TensorMapError)
    if rank is not None and len(out) != rank:
        raise TensorMapError(f"{field_name}={out!r} has {len(out)} entries; the tensor has rank {rank}")
    return out


@dataclass(frozen=True)
class TensorMapSpec:
    """A validated description of a tensor map (no driver involved)."""

    kind: str                      # "tiled" | "im2col"
    dtype: DType
    shape: tuple[int, ...]
    strides: tuple[int, ...]       # bytes, numpy convention
    box: tuple[int, ...]           # tiled: the box; im2col: (pixels_per_column, channels_per_pixel)
    element_strides: tuple[int, ...]
    swizzle: str = "none"
    interleave: str = "none"
    l2_promotion: str = "none"
    oob_fill: str = "zero"
    address: int | None = None
    lower_corner: tuple[int, ...] = ()
    upper_corner: tuple[int, ...] = ()

    # --- construction -----------------------------------------------------------------
    @classmethod
    def tiled(cls, dtype, shape, box, *, strides=None, element_strides=None, swizzle="none",
              interleave="none", l2_promotion="none", oob_fill="zero", address=None,
              arch: str = "sm_90a") -> "TensorMapSpec":
        """Check every encode rule for a tiled map, without a driver.

        ``dtype``: a name ("bfloat16", "float32", "tf32", ...), numpy or torch dtype.
        ``shape``, ``box``, ``strides`` (bytes; default C-contiguous) and ``element_strides``
        are row-major, outermost first; the inner dim must be contiguous. ``swizzle``:
        "none" | "32B" | "64B" | "128B"; ``interleave``: "none" | "16B" | "32B";
        ``l2_promotion``: "none" | "64B" | "128B" | "256B"; ``oob_fill``: "zero" | "nan";
        ``address``: the global address (16-byte aligned, below 2^57), if known.
        A broken rule is a ``TensorMapError`` naming the field, the value and the fix.
        """
        dt, shape, strides, estrides, opts = _common(dtype, shape, strides, element_strides,
                                                     swizzle, interleave, l2_promotion, oob_fill,
                                                     address, arch, ranks=(1, 5))
        box = _ints("box", box, len(shape))
        for i, b in enumerate(box):
            if not 1 <= b <= MAX_BOX:
                raise TensorMapError(f"box[{i}]={b} must be in [1, {MAX_BOX}]")
        footprint = dt.itemsize * math.prod(b // e for b, e in zip(box, estrides))
        if footprint > MAX_BOX_SMEM:
            raise TensorMapError(
                f"box={box} with element_strides={estrides} counts {footprint} B (the driver "
                f"multiplies floor(box / element stride) over every dim); at most {MAX_BOX_SMEM} B "
                "(one SM's shared memory) is accepted. Use a smaller box")
        inner_bytes = box[-1] * dt.itemsize
        _inner_rules(f"box[{len(box) - 1}]", box[-1], inner_bytes, dt, opts["swizzle"],
                     opts["interleave"])
        return cls("tiled", dt, shape, strides, box, estrides, **opts)

    @classmethod
    def im2col(cls, dtype, shape, *, lower_corner, upper_corner, channels_per_pixel,
               pixels_per_column, strides=None, element_strides=None, swizzle="none",
               interleave="none", l2_promotion="none", oob_fill="zero", address=None,
               arch: str = "sm_90a") -> "TensorMapSpec":
        """An im2col map over an N, spatial..., C tensor (rank 3-5, channels innermost).

        ``lower_corner``/``upper_corner`` are the pixel-box corner offsets of the spatial
        dims, row-major (for NHWC: (h, w)).
        """
        dt, shape, strides, estrides, opts = _common(dtype, shape, strides, element_strides,
                                                     swizzle, interleave, l2_promotion, oob_fill,
                                                     address, arch, ranks=(3, 5))
        rank = len(shape)
        lo_lim, hi_lim = IM2COL_CORNER[rank]
        lower = _ints("lower_corner", lower_corner, rank - 2)
        upper = _ints("upper_corner", upper_corner, rank - 2)
        for name, corner in (("lower_corner", lower), ("upper_corner", upper)):
            for i, v in enumerate(corner):
                if not lo_lim <= v <= hi_lim:
                    raise TensorMapError(f"{name}[{i}]={v} must be in [{lo_lim}, {hi_lim}] for a "
                                         f"rank-{rank} im2col map")
        for i, (lo, hi) in enumerate(zip(lower, upper)):
            extent = shape[1 + i] + hi - lo
            if extent < 1:
                raise TensorMapError(
                    f"im2col pixel box along spatial dim {i} is empty: shape {shape[1 + i]} + "
                    f"upper_corner[{i}]={hi} - lower_corner[{i}]={lo} = {extent}; it must be >= 1")
        channels_per_pixel = checks.as_int("channels_per_pixel", channels_per_pixel, 1, 256,
                                           TensorMapError)
        pixels_per_column = checks.as_int("pixels_per_column", pixels_per_column, 1, 1024,
                                          TensorMapError)
        _inner_rules("channels_per_pixel", channels_per_pixel, channels_per_pixel * dt.itemsize,
                     dt, opts["swizzle"], opts["interleave"])
        return cls("im2col", dt, shape, strides, (pixels_per_column, channels_per_pixel),
                   estrides, lower_corner=lower, upper_corner=upper, **opts)

    def with_address(self, address: int) -> "TensorMapSpec":
        """The same map at another global address (checked for the alignment it needs)."""
        address = _check_address(address, self.interleave)
        return TensorMapSpec(self.kind, self.dtype, self.shape, self.strides, self.box,
                             self.element_strides, self.swizzle, self.interleave,
                             self.l2_promotion, self.oob_fill, address, self.lower_corner,
                             self.upper_corner)

    # --- derived quantities -------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """The number of tensor dimensions."""
        return len(self.shape)

    @property
    def elements_per_dim(self) -> tuple[int, ...]:
        """Elements one load brings along each dim (row-major): ceil(box / element stride);
        the inner dim ignores its element stride when interleave is none."""
        if self.kind == "im2col":
            return self.box
        out = [math.ceil(b / e) for b, e in zip(self.box, self.element_strides)]
        if self.interleave == "none":
            out[-1] = self.box[-1]
        return tuple(out)

    @property
    def tx_bytes(self) -> int:
        """Bytes one load delivers: what ``expect_tx`` must announce (OOB elements included)."""
        return math.prod(self.elements_per_dim) * self.dtype.itemsize

    @property
    def row_bytes(self) -> int:
        """Bytes of one inner row of a box, before any swizzle padding."""
        return self.elements_per_dim[-1] * self.dtype.itemsize

    @property
    def row_pitch(self) -> int:
        """Bytes between consecutive inner rows in smem: rows are padded to the swizzle span."""
        return self.row_bytes if self.swizzle == "none" else SWIZZLE_SPAN[self.swizzle]

    @property
    def smem_bytes(self) -> int:
        """Shared memory one box occupies: ``row_pitch`` times the box's outer rows."""
        return self.row_pitch * math.prod(self.elements_per_dim[:-1])

    @property
    def store_spill_bytes(self) -> int:
        """Bytes a TMA store writes past the end of every inner row: the hardware clips the
        innermost dimension at 16-byte granularity, not per element (measured: a store through
        an int32 map of ``x[:, :5]`` of a (4, 8) array overwrites ``x[:, 5:8]``). Zero when the
        inner extent is a multiple of 16 bytes. Loads are unaffected."""
        inner = self.shape[-1] * self.dtype.itemsize
        return -(-inner // 16) * 16 - inner

    @property
    def smem_align(self) -> int:
        """Destination alignment: 128 B, or the swizzle pattern's repeat (8 rows of the span)."""
        return 128 if self.swizzle == "none" else 8 * SWIZZLE_SPAN[self.swizzle]

    def driver_order(self) -> dict:
        """Arguments for cuTensorMapEncode*, reversed to the driver's innermost-first order."""
        args = {
            "dtype": self.dtype.tma_code, "rank": self.rank,
            "global_dim": tuple(reversed(self.shape)),
            "global_strides": tuple(reversed(_encoded_strides(self.shape, self.strides,
                                                              self.interleave)[:-1])),
            "element_strides": tuple(reversed(self.element_strides)),
            "interleave": INTERLEAVE[self.interleave], "swizzle": SWIZZLE[self.swizzle],
            "l2_promotion": L2_PROMOTION[self.l2_promotion], "oob_fill": OOB_FILL[self.oob_fill],
        }
        if self.kind == "tiled":
            args["box"] = tuple(reversed(self.box))
        else:
            args["lower_corner"] = tuple(reversed(self.lower_corner))
            args["upper_corner"] = tuple(reversed(self.upper_corner))
            args["pixels_per_column"], args["channels_per_pixel"] = self.box
        return args

    def describe(self) -> str:
        """A readable summary: kind, dtype, shape, box, swizzle, and the bytes one load moves."""
        rows = [
            f"{self.kind} tensor map, {self.dtype.name} ({self.dtype.itemsize} B), rank {self.rank}",
            f"  shape    {self.shape}   strides {self.strides} B",
            f"  box      {self.box}   element strides {self.element_strides}",
            f"  swizzle {self.swizzle}, interleave {self.interleave}, L2 promotion "
            f"{self.l2_promotion}, OOB fill {self.oob_fill}",
            f"  one load: {self.tx_bytes} B of data (tx_bytes), {self.smem_bytes} B of smem "
            f"(rows of {self.row_bytes} B at a {self.row_pitch} B pitch), align {self.smem_align} B",
        ]
        if self.address is not None:
            rows.append(f"  address  0x{self.address:x}")
        return "\n".join(rows)

    def __repr__(self) -> str:
        return (f"TensorMapSpec.{self.kind}({self.dtype.name}, shape={self.shape}, box={self.box}, "
                f"swizzle={self.swizzle!r}, tx_bytes={self.tx_bytes}, smem_bytes={self.smem_bytes})")


def _common(dtype, shape, strides, element_strides, swizzle, interleave, l2, oob, address,
            arch, ranks):
    dt = as_dtype(dtype)
    arch = checks.as_arch("arch", arch, TensorMapError)
    if not dt.sm90 and arch.startswith("sm_90"):
        raise TensorMapError(f"dtype={dt.name} is a packed Blackwell type; {arch} rejects it. "
                             "Use uint8 for raw bytes")
    shape = _ints("shape", shape)
    rank = len(shape)
    if not ranks[0] <= rank <= ranks[1]:
        raise TensorMapError(f"rank={rank} (shape={shape}) must be in [{ranks[0]}, {ranks[1]}]")
    swizzle = _choice("swizzle", swizzle, SWIZZLE)
    interleave = _choice("interleave", interleave, INTERLEAVE)
    l2 = _choice("l2_promotion", l2, L2_PROMOTION)
    oob = _choice("oob_fill", oob, OOB_FILL)
    if interleave != "none" and rank < 3:
        raise TensorMapError(f"interleave={interleave!r} needs rank >= 3; shape={shape} has rank {rank}")
    if interleave == "32B" and swizzle != "32B":
        raise TensorMapError(f"interleave='32B' requires swizzle='32B' (got swizzle={swizzle!r}); "
                             "the driver accepts it but the copy is undefined")
    if oob == "nan" and dt.tma_code not in TMA_FLOAT_CODES:
        moved = f" (TMA moves it as {BY_CODE[dt.tma_code]})" if dt.is_float else ""
        raise TensorMapError(f"oob_fill='nan' needs a floating-point dtype TMA knows; {dt.name} "
                             f"is not{moved}")
    for i, n in enumerate(shape):
        if not 1 <= n <= MAX_DIM:
            raise TensorMapError(f"shape[{i}]={n} must be in [1, 2^32]")
    if strides is None:
        strides, acc = [], dt.itemsize
        for n in reversed(shape):
            strides.insert(0, acc)
            acc *= n
        strides = tuple(strides)
    strides = _ints("strides", strides, rank)
    _check_strides(shape, strides, dt.itemsize, interleave)
    estrides = _ints("element_strides", element_strides if element_strides is not None
                     else (1,) * rank, rank)
    for i, e in enumerate(estrides):
        if not 1 <= e <= 8:
            raise TensorMapError(f"element_strides[{i}]={e} must be in [1, 8]")
    if address is not None:
        address = _check_address(address, interleave)
    return dt, shape, strides, estrides, {"swizzle": swizzle, "interleave": interleave,
                                          "l2_promotion": l2, "oob_fill": oob, "address": address}


def _check_strides(shape, strides, itemsize: int, interleave: str) -> None:
    """The stride rules, in bytes. A dim of extent 1 never steps, so its stride addresses
    nothing and may be anything (torch gives such dims arbitrary strides, 0 after expand or
    unsqueeze); :func:`_encoded_strides` hands the driver a legal one."""
    rank = len(shape)
    if strides[-1] != itemsize and shape[-1] > 1:
        raise TensorMapError(f"strides[{rank - 1}]={strides[-1]} B: the inner dim must be contiguous "
                             f"(stride = element size {itemsize} B); pass a view whose last dim "
                             "is contiguous")
    align = _stride_align(interleave)
    for i, s in enumerate(strides[:-1]):
        if shape[i] == 1:
            continue
        if s == 0:
            raise TensorMapError(f"strides[{i}]=0 B: rows would overlap (every index of dim {i} "
                                 "reads the same row); the driver accepts it, the copy is undefined")
        if s < 0 or s % align:
            raise TensorMapError(f"strides[{i}]={s} B must be a positive multiple of {align} B; "
                                 "pad the rows (e.g. allocate a wider array and take a slice)")
        if s >= MAX_STRIDE:
            raise TensorMapError(f"strides[{i}]={s} B must be < 2^40")
    collision = _overlap(shape, strides, itemsize)
    if collision is not None:
        raise TensorMapError(_overlap_message(shape, strides, itemsize, *collision))


def _stride_align(interleave: str) -> int:
    return 32 if interleave == "32B" else 16


def _encoded_strides(shape, strides, interleave: str) -> tuple[int, ...]:
    """``strides`` with the stride of every outer dim of extent 1 that the driver would refuse
    (not a positive multiple of 16 B, 32 B with 32B interleave, or >= 2^40) replaced by that
    alignment: the dim never steps, so the value addresses nothing."""
    align = _stride_align(interleave)
    return tuple(align if n == 1 and not (0 < s < MAX_STRIDE and s % align == 0) else s
                 for n, s in zip(shape[:-1], strides[:-1])) + tuple(strides[-1:])


# Layouts that fail the nested test are enumerated up to this many rows (about 20 ms).
_ENUMERATED_ROWS = 1 << 18


def _overlap(shape, strides, itemsize: int):
    """Two row-major indices whose rows share bytes, or None when none can be shown.

    Rows (the contiguous inner dim, ``shape[-1] * itemsize`` bytes) start at sum(i_d *
    strides[d]) over the outer dims; the driver does not check that they are disjoint. Cheap
    and sufficient: sorted by stride, each dim steps past everything the dims below it reach
    (the last row's end, not its padding). Interleaved layouts fail that test yet can be
    disjoint (rows of dim a between those of dim b), so then a collision is searched for:
    one dim stepping within a row, two dims meeting (k steps of one against one of the
    other), and every row enumerated, exactly when there are at most ``_ENUMERATED_ROWS``,
    else over the first indices of each dim. A layout with no collision found is accepted."""
    row = shape[-1] * itemsize
    dims = sorted((d for d in range(len(shape) - 1) if shape[d] > 1), key=lambda d: strides[d])
    reach = row
    for d in dims:
        if strides[d] < reach:
            break
        reach += strides[d] * (shape[d] - 1)
    else:
        return None
    unit = lambda steps: tuple(steps.get(d, 0) for d in range(len(shape)))  # noqa: E731
    for i, a in enumerate(dims):
        if strides[a] < row:
            return unit({}), unit({a: 1})
        for b in dims[i + 1:]:
            k = strides[b] // strides[a]
            for steps in (k, k + 1):
                if steps < shape[a] and abs(strides[b] - steps * strides[a]) < row:
                    return unit({b: 1}), unit({a: steps})
    return _enumerated_overlap(shape, strides, dims, row)


def _enumerated_overlap(shape, strides, dims, row: int):
    extents = {d: shape[d] for d in dims}
    while math.prod(extents.values()) > _ENUMERATED_ROWS:
        widest = max(extents, key=lambda d: extents[d])
        extents[widest] = -(-extents[widest] // 2)
    starts = np.zeros((), np.int64)
    for d in dims:
        starts = np.add.outer(starts, np.arange(extents[d], dtype=np.int64) * strides[d])
    flat = starts.ravel()
    order = np.argsort(flat, kind="stable")
    close = np.flatnonzero(np.diff(flat[order]) < row)
    if not close.size:
        return None
    index = [np.unravel_index(order[close[0] + j], starts.shape) for j in (0, 1)]
    return tuple(tuple(dict(zip(dims, (int(v) for v in ix))).get(d, 0) for d in range(len(shape)))
                 for ix in index)


def _overlap_message(shape, strides, itemsize: int, u, v) -> str:
    rank = len(shape)
    row = shape[-1] * itemsize
    u, v = sorted((u, v), reverse=True)
    gap = abs(sum((a - b) * s for a, b, s in zip(u[:-1], v[:-1], strides)))
    stepped = [d for d in range(rank) if u[d] != v[d]]
    where = (f"index {u} and index {v} start {gap} B apart, inside one row of "
             f"{shape[-1]} x {itemsize} B = {row} B: rows would overlap")
    if len(stepped) == 1:
        d = stepped[0]
        return (f"strides[{d}]={strides[d]} B is smaller than the {row} B reached by dim "
                f"{rank - 1}: dims {d} and {rank - 1} overlap ({where})")
    named = ", ".join(map(str, stepped[:-1])) + f" and {stepped[-1]}"
    given = ", ".join(f"strides[{d}]={strides[d]} B" for d in stepped)
    return f"dims {named} overlap ({given}): {where}"


MAX_ADDRESS = 1 << 57  # measured: the driver rejects global addresses from 2^57 up


def _check_address(address, interleave: str) -> int:
    align = 32 if interleave == "32B" else 16
    if not checks.is_int(address):
        raise TensorMapError(f"address={address!r} must be an int (a device pointer)")
    address = operator.index(address)
    if not 0 <= address < MAX_ADDRESS:
        raise TensorMapError(f"address=0x{address:x} is outside [0, 2^57), the addresses the "
                             "driver encodes" if address >= 0 else f"address={address} is negative")
    if address % align:
        raise TensorMapError(f"address={address!r} must be {align}-byte aligned (a misaligned "
                             "view such as an offset slice cannot be a TMA source)")
    return address


def _inner_rules(field_name: str, count: int, inner_bytes: int, dt: DType, swizzle: str,
                 interleave: str) -> None:
    if inner_bytes % 16:
        raise TensorMapError(f"{field_name}={count} x {dt.itemsize} B = {inner_bytes} B must be a "
                             f"multiple of 16 B; use a multiple of {16 // math.gcd(16, dt.itemsize)} "
                             "elements")
    span = SWIZZLE_SPAN[swizzle]
    if interleave == "none" and span and inner_bytes > span:
        raise TensorMapError(f"{field_name}={count} x {dt.itemsize} B = {inner_bytes} B exceeds the "
                             f"{swizzle} swizzle span; use {field_name} <= {span // dt.itemsize} or "
                             "swizzle='none'")
