"""GEMM operands and scales: shape and layout checks, per-tensor and block scales and their
layouts, grouped offsets."""
from __future__ import annotations

import numbers

from ...errors import TmaflowError
from ...launch.args import arg_kind
from ...runtime import driver
from ...runtime.graph import capturing
from ...runtime.memory import DeviceArray, as_array, empty, from_numpy
from ...tma.spec import TensorMapSpec
from ...tma.tensormap import MapTemplate
from .. import checks, edge
from ..entry import new_output
from .config import FP8_BK, _readable_scale_a, _row_major
from .splitk import _foreign_capture


_OPERAND_TYPES = ("bfloat16", "float8_e4m3fn")


def _check_operands(A, B, layout: str):
    if len(A.shape) != 2 or len(B.shape) != 2 or A.dtype is not B.dtype or A.dtype.name not in _OPERAND_TYPES:
        _refuse_operands(A, B)
    m, k = A.shape
    if layout == "nt":
        n, kb = B.shape
        want = "(N, K) for layout 'nt' (C = A @ B.T)"
    else:
        kb, n = B.shape
        want = "(K, N) for layout 'nn' (C = A @ B)"
    if kb != k:
        raise TmaflowError(f"gemm: a is {A.shape} (M, K) but b is {B.shape}; b must be {want}")
    return m, n, k


def _refuse_operands(A, B):
    for name, arr in (("a", A), ("b", B)):
        if arr.ndim != 2:
            raise TmaflowError(f"gemm: {name} must be 2-D (got shape {arr.shape})")
        if arr.dtype.name not in _OPERAND_TYPES:
            raise TmaflowError(f"gemm: {name} must be bfloat16 or float8_e4m3fn (got {arr.dtype.name})")
    raise TmaflowError(f"gemm: a is {A.dtype.name} but b is {B.dtype.name}; both must be one type")


def _check_rows(name: str, arr) -> None:
    if name == "out" and arr.shape[1] % 8:
        raise TmaflowError(
            f"gemm: out has {arr.shape[1]} columns; TMA stores write whole 16-byte chunks, so a "
            "row that is not a multiple of 8 bf16 would spill into the next columns. Use an out "
            "with a multiple of 8 columns and slice the result")
    item = arr.dtype.itemsize
    if arr.strides[1] != item or arr.strides[0] % 16:
        raise TmaflowError(
            f"gemm: {name} has strides {arr.strides} B; rows must be contiguous and start "
            f"16-byte aligned (TMA row pitch rule: a multiple of 16 B, i.e. {16 // item} "
            f"{arr.dtype.name}). Pad the leading dimension to a multiple of {16 // item} or copy "
            "to a contiguous array")


def _template(arr, spec: TensorMapSpec, access: str = "load") -> MapTemplate:
    """Maps of ``arr``'s shape and row pitch with the box, swizzle and L2 promotion the plan
    chose (the plan's specs assume contiguous rows; the array's real pitch is used)."""
    return MapTemplate(TensorMapSpec.tiled(arr.dtype, arr.shape, spec.box, strides=arr.strides,
                                           swizzle=spec.swizzle, l2_promotion=spec.l2_promotion),
                       access)


def _scale_map_view(scale_a, mode: str):
    """scale_a as the 2-D array its TMA map covers: (M, KB) row-major, or (KB, M) rows of one
    k-block for the M-major layout."""
    if mode == "m_major":
        return scale_a._as(scale_a.shape[::-1], scale_a.strides[::-1])
    return scale_a


def _scales(A, B, scale_a, scale_b) -> tuple:
    """(the epilogue's factor, block scales or None, their SCALE_MODES key or None). fp8
    operands take per-tensor scales (finite floats, 1 when None; their product scales the fp32
    sum) or block scales: scale_a an (M, ceil(K/128)) and scale_b a (ceil(N/128), ceil(K/128))
    float32 device array, applied at every k-block of 128. bf16 products take none."""
    if A.dtype.name != "float8_e4m3fn":
        if scale_a is not None or scale_b is not None:
            raise TmaflowError("gemm: scale_a / scale_b dequantise fp8 operands; a and b are "
                               f"{A.dtype.name} (scale the output instead)")
        return 1.0, None, None
    for name, value in (("scale_a", scale_a), ("scale_b", scale_b)):
        if value is not None and (isinstance(value, bool) or
                                  not (isinstance(value, numbers.Real) or arg_kind(value) == "array")):
            raise TmaflowError(f"gemm: {name}={value!r} must be a finite float > 0 (a per-tensor "
                               "dequantisation factor) or a float32 device array of block scales")
    if "array" in (arg_kind(scale_a), arg_kind(scale_b)):
        m, k = A.shape
        n, kb = B.shape[0], -(-k // FP8_BK)
        views = []
        for name, value, shape, what in (("scale_a", scale_a, (m, kb), "1 x 128 blocks of a"),
                                         ("scale_b", scale_b, (-(-n // 128), kb), "128 x 128 blocks of b")):
            arr = as_array(value) if value is not None else None
            if arr is None or arr.shape != shape or arr.dtype.name != "float32":
                got = "None" if arr is None else f"{arr.shape} {arr.dtype.name} strides {arr.strides} B"
                raise TmaflowError(f"gemm: block scales need both scale_a and scale_b as float32 device "
                                   f"arrays; {name} must be {shape} ({what}), got {got}")
            if not arr.alive:
                raise TmaflowError(f"gemm: {name} {arr!r} was freed")
            checks.same_device("gemm", name, arr, A)
            views.append(arr)
        sa, sb = views
        if not (_readable_scale_a(sa) and _row_major(sb)):  # other layouts are staged (edge.py)
            return 1.0, tuple(views), edge.STAGED
        return 1.0, tuple(views), "row_major" if _row_major(sa) else "m_major"
    return checks.tensor_scale("gemm", scale_a, scale_b), None, None


def _empty_product(a, A, out, C, shape: tuple, k: int, stream, dtype=None):
    """A product with no rows, columns or terms: nothing to launch, or zeros where a sum has
    no terms (written in order on the stream, at any strides of out)."""
    result, C = (out, C) if C is not None else new_output(a, A, shape, dtype, stream)
    return (*edge.empty_product(C, k, stream), result)


def _device_offsets(offsets) -> bool:
    """Offsets given as a device array (tmaflow, torch, cupy), not host values."""
    return isinstance(offsets, DeviceArray) or hasattr(offsets, "data_ptr") or \
        hasattr(offsets, "__cuda_array_interface__")  # last: hasattr builds the interface


def _offsets(name: str, offsets, groups: int, rows: int, device, stream: int):
    """The offsets as a device int32 array: device arrays as given (their values are the
    caller's to keep right), host sequences checked and uploaded in order on ``stream``."""
    if _device_offsets(offsets):
        arr = as_array(offsets)
        if arr.shape != (groups + 1,) or arr.dtype.name != "int32":
            raise TmaflowError(f"{name}: offsets must be {groups + 1} int32 values (got "
                               f"{arr.shape} {arr.dtype.name})")
        if groups and arr.strides != (4,):
            raise TmaflowError(f"{name}: device offsets must be contiguous (got strides {arr.strides} B): "
                               "the kernel reads them as packed int32 values")
        return offsets
    return _upload(checks.host_offsets(name, offsets, groups, rows), device, stream)


def _upload(host, device, stream: int) -> DeviceArray:
    """``host`` copied into memory allocated on ``stream`` and copied there (pageable memory is
    staged at once), so its free, also on ``stream``, waits for the launch reading it. While a
    tf.Graph captures: eagerly, as the graph's own array."""
    if capturing() is not None:
        return from_numpy(host, device=device)
    if _foreign_capture(stream):
        raise TmaflowError("grouped_gemm: offsets given as host values are uploaded at each call, "
                           "which a CUDA graph capture cannot hold; pass them as a device int32 "
                           "tensor (a replay then reads their new values)")
    arr = empty(host.shape, host.dtype, device, stream=stream)
    driver.call("cuMemcpyHtoDAsync", arr.ptr, host.ctypes.data, arr.nbytes, stream)
    return arr
