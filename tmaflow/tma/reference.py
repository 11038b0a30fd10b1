"""A numpy model of TMA: the exact shared-memory image of a tile load, and a tile store.

The model follows TMA-FACTS.md ("What a tile load writes into shared memory"): elements
are laid out inner row by inner row, rows padded to the swizzle span, and each 16-byte
chunk's address bits [4:6] are XORed with bits [7:9] of the *absolute* shared address.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np

from .. import checks
from ..errors import TmaflowError
from .spec import MAX_BOX_SMEM, SWIZZLE_SPAN, TensorMapSpec

NAN_FILL_LANE = 0x7FF7  # measured: every 16-bit lane of a NaN-filled element
_SWIZZLE_MASK = {"none": 0, "32B": 1, "64B": 3, "128B": 7}


def swizzle_address(addr, swizzle: str):
    """Physical shared address of logical address ``addr`` under ``swizzle`` (vectorised)."""
    m = _SWIZZLE_MASK[swizzle]
    return addr ^ (((addr >> 7) & m) << 4)


def _global(np_global, store: bool = False) -> np.ndarray:
    if not isinstance(np_global, np.ndarray) or np_global.dtype == object:
        raise TmaflowError(f"np_global must be a numpy array of the map's element type (got "
                           f"{type(np_global).__name__}{' of objects' if isinstance(np_global, np.ndarray) else ''})")
    if store:
        if not np_global.flags.writeable:
            raise TmaflowError("np_global is read-only; a store model writes into it")
        if np_global.ndim and np_global.shape[-1] > 1 and np_global.strides[-1] != np_global.itemsize:
            raise TmaflowError(f"np_global has strides {np_global.strides}: a store model writes "
                               "through its memory, so its inner axis must be contiguous (as TMA's is)")
        return np_global
    return np_global if not np_global.ndim or np_global.strides[-1] == np_global.itemsize \
        else np.ascontiguousarray(np_global)  # a load only reads values


def _check(spec: TensorMapSpec, g: np.ndarray, coords, smem_base: int) -> tuple[int, ...]:
    if not isinstance(spec, TensorMapSpec):
        raise TmaflowError(f"spec={spec!r} must be a tf.TensorMapSpec (a TensorMap's .spec)")
    if not checks.is_int(smem_base):
        raise TmaflowError(f"smem_base={smem_base!r} must be an int (a shared address)")
    smem_base = operator.index(smem_base)
    if smem_base < 0:
        raise TmaflowError(f"smem_base={smem_base} must be >= 0 (a shared address)")
    coords = checks.as_ints("coords", coords)
    if spec.kind != "tiled":
        raise TmaflowError("tf.reference models tiled maps only (im2col is not modelled)")
    if spec.interleave != "none":
        raise TmaflowError(f"tf.reference does not model interleave={spec.interleave!r}")
    if tuple(g.shape) != spec.shape:
        raise TmaflowError(f"np_global shape {g.shape} differs from spec.shape {spec.shape}")
    if g.dtype.itemsize != spec.dtype.itemsize:
        raise TmaflowError(f"np_global dtype {g.dtype} ({g.dtype.itemsize} B) does not match "
                           f"{spec.dtype.name} ({spec.dtype.itemsize} B)")
    if len(coords) != spec.rank:
        raise TmaflowError(f"coords={coords} must have {spec.rank} entries (row-major)")
    for i, c in enumerate(coords):
        if not -2**31 <= c < 2**31:
            raise TmaflowError(f"coords[{i}]={c} must fit a signed 32-bit int (TMA coordinates are s32)")
    if (coords[-1] * spec.dtype.itemsize) % 16:
        raise TmaflowError(f"coords[{spec.rank - 1}]={coords[-1]}: the inner coordinate's byte offset "
                           f"({coords[-1] * spec.dtype.itemsize} B) must be a multiple of 16; the "
                           "hardware raises an illegal-instruction fault")
    if smem_base % 128:
        raise TmaflowError(f"smem_base={smem_base} must be 128-byte aligned: the hardware faults "
                           "(misaligned address) on any other destination")
    if smem_base + spec.smem_bytes > MAX_BOX_SMEM:
        raise TmaflowError(f"smem_base={smem_base}: the box's {spec.smem_bytes} B from there end past "
                           f"the {MAX_BOX_SMEM} B of shared memory an SM has")
    return coords


def _geometry(spec: TensorMapSpec, coords, smem_base: int, inner_extent: int | None = None):
    """Per element of the box: global index arrays, in-bounds mask, byte address in smem.
    ``inner_extent`` overrides the innermost bound (a store's 16-byte-granular clip)."""
    n = spec.elements_per_dim
    estr = list(spec.element_strides)
    estr[-1] = 1  # inner element stride is ignored with interleave none
    idx = np.indices(n).reshape(spec.rank, -1)                      # row-major box indices
    gidx = np.array(coords)[:, None] + idx * np.array(estr)[:, None]
    bounds = list(spec.shape)
    if inner_extent is not None:
        bounds[-1] = inner_extent
    inside = np.all((gidx >= 0) & (gidx < np.array(bounds)[:, None]), axis=0)
    outer = np.ravel_multi_index(idx[:-1], n[:-1]) if spec.rank > 1 else np.zeros(idx.shape[1], int)
    offset = idx[-1] * spec.dtype.itemsize + spec.row_pitch * outer
    byte = np.arange(spec.dtype.itemsize)
    logical = smem_base + offset[:, None] + byte[None, :]
    physical = swizzle_address(logical, spec.swizzle) - smem_base
    return gidx, inside, physical


def tma_load(np_global: np.ndarray, spec: TensorMapSpec, coords, smem_base: int = 0,
             background: int = 0) -> np.ndarray:
    """The uint8 image of ``spec.smem_bytes`` bytes that a load at ``coords`` writes at
    ``smem_base``. Padding bytes (rows narrower than the swizzle span) keep ``background``."""
    g = _global(np_global)
    background = checks.as_int("background", background, 0, 255)
    coords = _check(spec, g, coords, smem_base)
    gidx, inside, physical = _geometry(spec, coords, smem_base)
    E = spec.dtype.itemsize
    values = np.zeros((inside.size, E), np.uint8)
    if spec.oob_fill == "nan":
        values[:] = np.frombuffer(np.full(E // 2 or 1, NAN_FILL_LANE, "<u2").tobytes()[:E], np.uint8)
    src = _bytes_of(g) if g.ndim else g.view(np.uint8)
    picked = tuple(gidx[:, inside])
    loaded = src[picked]
    if spec.dtype.name in ("tf32", "tf32_ftz"):
        loaded = _round_tf32(loaded)
    values[inside] = loaded
    image = np.full(spec.smem_bytes, background, np.uint8)
    image[physical.ravel()] = values.ravel()
    return image


def _round_tf32(raw: np.ndarray) -> np.ndarray:
    """What a TF32 load delivers (measured): float32 rounded to a 10-bit mantissa, to nearest
    even, overflowing to Inf; every NaN becomes 0x7FFFE000; denormals are rounded, not flushed.
    ``raw`` is (n, 4) little-endian bytes."""
    u = raw.copy().view("<u4").reshape(-1).astype(np.uint64)
    nan = ((u & 0x7F800000) == 0x7F800000) & ((u & 0x007FFFFF) != 0)
    rounded = ((u + 0xFFF + ((u >> 13) & 1)) & 0xFFFFE000) & 0xFFFFFFFF
    out = np.where(nan, 0x7FFFE000, rounded).astype("<u4")
    return out.view(np.uint8).reshape(raw.shape)


@dataclass(frozen=True)
class Spill:
    """Bytes a TMA store writes past the end of a row (``spec.store_spill_bytes`` of them):
    ``data`` at ``offset`` bytes from the tensor's first element, in the map's layout
    (``spec.strides``). The hardware clips the innermost dimension at 16-byte granularity,
    so a box reaching a row's end writes the rest of its last 16-byte granule too."""

    offset: int
    data: bytes


def tma_store(np_global: np.ndarray, spec: TensorMapSpec, coords, smem_image: np.ndarray,
              smem_base: int = 0) -> tuple[Spill, ...]:
    """Write the box at ``coords`` from ``smem_image`` (read at ``smem_base``) into
    ``np_global`` in place, as the hardware does: elements outside the tensor are discarded,
    except the spill. Returns the spill, one :class:`Spill` per row whose end the box
    reaches, in address order (empty when rows are a multiple of 16 bytes).

    When ``np_global`` is a view into a larger writeable numpy array laid out as the map
    says (``parent[:, :5]``, or ``np.ndarray(shape, dtype, buffer=alloc, offset=...,
    strides=spec.strides)``), the spill bytes that fall inside that array's memory are
    written there too, as they would be on the device."""
    g = _global(np_global, store=True)
    coords = _check(spec, g, coords, smem_base)
    if any(c < 0 for c in coords):
        raise TmaflowError(f"coords={coords}: a TMA store needs non-negative coordinates "
                           "(the hardware faults on negative ones)")
    if isinstance(smem_image, (bytes, bytearray, memoryview)):
        smem_image = np.frombuffer(smem_image, np.uint8)
    if not isinstance(smem_image, np.ndarray) or smem_image.dtype != np.uint8:
        raise TmaflowError(f"smem_image must be a uint8 numpy array or bytes (got "
                           f"{type(smem_image).__name__}{'' if not isinstance(smem_image, np.ndarray) else ' of ' + str(smem_image.dtype)})")
    image = smem_image.ravel()
    if image.size < spec.smem_bytes:
        raise TmaflowError(f"smem_image has {image.size} B; the box needs {spec.smem_bytes} B")
    E, width = spec.dtype.itemsize, spec.shape[-1]
    gidx, written, physical = _geometry(spec, coords, smem_base, width + spec.store_spill_bytes // E)
    values = image[physical]
    in_rows = written & (gidx[-1] < width)
    _bytes_of(g)[tuple(gidx[:, in_rows])] = values[in_rows]
    spilled = written & ~in_rows
    # bytes per index step: the element size for the inner dim, whose stride at extent 1 may
    # be anything (and is multiplied by 0 everywhere else an extent is 1)
    steps = np.array(spec.strides[:-1] + (E,))
    offsets = (gidx[:, spilled] * steps[:, None]).sum(axis=0)
    spills = _runs(offsets, values[spilled], E)
    _write_spills(g, spec, spills)
    return spills


def _runs(offsets: np.ndarray, values: np.ndarray, itemsize: int) -> tuple[Spill, ...]:
    """Elements at byte ``offsets`` with ``values`` (n, itemsize), merged into contiguous runs."""
    order = np.argsort(offsets, kind="stable")
    offsets, values = offsets[order], values[order]
    cuts = np.flatnonzero(np.diff(offsets) != itemsize) + 1
    return tuple(Spill(int(offsets[lo]), values[lo:hi].tobytes())
                 for lo, hi in zip([0, *cuts], [*cuts, offsets.size]) if hi > lo)


def _write_spills(g: np.ndarray, spec: TensorMapSpec, spills: tuple[Spill, ...]) -> None:
    """Write ``spills`` into the memory around ``g``: the numpy array it is a view into, when
    that array is writeable and contiguous and ``g`` has the map's layout (otherwise the host
    array does not model the device's memory around the tensor)."""
    root = g
    while isinstance(root.base, np.ndarray):
        root = root.base
    same_layout = all(n == 1 or a == b for n, a, b in zip(g.shape, g.strides, spec.strides))
    if not spills or root is g or not same_layout or not root.flags.writeable or \
            not (root.flags.c_contiguous or root.flags.f_contiguous):
        return
    lo, hi = _byte_bounds(root)
    memory = root.ravel(order="K").view(np.uint8)
    first = g.__array_interface__["data"][0]
    for spill in spills:
        at = first + spill.offset
        if lo <= at and at + len(spill.data) <= hi:
            memory[at - lo:at - lo + len(spill.data)] = np.frombuffer(spill.data, np.uint8)


# numpy's (first, one past last) byte address of an array's memory; moved in numpy 2
_byte_bounds = getattr(np, "byte_bounds", None) or np.lib.array_utils.byte_bounds


def _bytes_of(g: np.ndarray) -> np.ndarray:
    """A (..., itemsize) uint8 view of ``g``, whose inner axis is contiguous (a TMA rule), so
    writes land in ``g``'s memory even when ``g`` is a strided view."""
    return np.lib.stride_tricks.as_strided(g.view(np.uint8), shape=g.shape + (g.itemsize,),
                                           strides=g.strides + (1,))


def element_positions(spec: TensorMapSpec, smem_base: int = 0) -> np.ndarray:
    """For each box element (row-major box indices), the smem byte offset of its first byte."""
    coords = (0,) * spec.rank
    _, _, physical = _geometry(spec, coords, smem_base)
    return physical[:, 0].reshape(spec.elements_per_dim)


def swizzle_span(spec: TensorMapSpec) -> int:
    """Bytes of the span a spec's swizzle permutes within: 32, 64 or 128 (0 without swizzle)."""
    return SWIZZLE_SPAN[spec.swizzle]
