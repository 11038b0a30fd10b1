"""Element types: one table from every spelling (numpy, torch, names) to the TMA enum."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import TensorMapError


@dataclass(frozen=True)
class DType:
    name: str
    itemsize: int
    tma_code: int          # CUtensorMapDataType value
    is_float: bool
    numpy_name: str        # storage dtype used for host copies
    sm90: bool = True      # encodable on Hopper (the packed types are Blackwell-only)

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype of host copies (bfloat16: ml_dtypes' when installed, else uint16 bits)."""
        if self.name == "bfloat16":
            try:
                import ml_dtypes

                return np.dtype(ml_dtypes.bfloat16)
            except ImportError:
                return np.dtype(np.uint16)
        return np.dtype(self.numpy_name)

    def __str__(self) -> str:
        return self.name


_TABLE = [
    DType("uint8", 1, 0, False, "uint8"),
    DType("uint16", 2, 1, False, "uint16"),
    DType("uint32", 4, 2, False, "uint32"),
    DType("int32", 4, 3, False, "int32"),
    DType("uint64", 8, 4, False, "uint64"),
    DType("int64", 8, 5, False, "int64"),
    DType("float16", 2, 6, True, "float16"),
    DType("float32", 4, 7, True, "float32"),
    DType("float64", 8, 8, True, "float64"),
    DType("bfloat16", 2, 9, True, "uint16"),
    DType("float32_ftz", 4, 10, True, "float32"),
    DType("tf32", 4, 11, True, "float32"),
    DType("tf32_ftz", 4, 12, True, "float32"),
    DType("16u4_align8b", 1, 13, False, "uint8", sm90=False),
    DType("16u4_align16b", 1, 14, False, "uint8", sm90=False),
    DType("16u6_align16b", 1, 15, False, "uint8", sm90=False),
    # Types TMA has no enum for are moved as raw bytes of the same width.
    DType("float8_e4m3fn", 1, 0, True, "uint8"),  # fp8 (1-4-3, no inf, max 448): wgmma e4m3
    DType("int8", 1, 0, False, "int8"),
    DType("int16", 2, 1, False, "int16"),
    DType("bool", 1, 0, False, "bool"),
]
BY_NAME = {d.name: d for d in _TABLE}
BY_CODE = {d.tma_code: d.name for d in reversed(_TABLE[:16])}  # TMA's own name of each enum value
TMA_FLOAT_CODES = frozenset(d.tma_code for d in _TABLE[:16] if d.is_float)  # NaN fill allowed
_ALIASES = {
    "bf16": "bfloat16", "fp16": "float16", "half": "float16", "f16": "float16",
    "fp32": "float32", "f32": "float32", "float": "float32", "single": "float32",
    "fp64": "float64", "f64": "float64", "double": "float64",
    "u8": "uint8", "i8": "int8", "u16": "uint16", "i16": "int16", "u32": "uint32",
    "i32": "int32", "int": "int32", "u64": "uint64", "i64": "int64", "long": "int64",
    "tfloat32": "tf32", "char": "int8", "byte": "uint8", "short": "int16",
    "e4m3": "float8_e4m3fn", "fp8": "float8_e4m3fn", "float8_e4m3": "float8_e4m3fn",
}


def as_dtype(obj) -> DType:
    """Resolve a numpy dtype, a torch dtype, a ``DType`` or a name into a ``DType``."""
    if isinstance(obj, DType):
        return obj
    key = None
    if isinstance(obj, str):
        key = obj.lower().strip()
    elif type(obj).__module__.startswith("torch"):
        key = str(obj).split(".")[-1]  # torch.bfloat16 -> "bfloat16"
    elif isinstance(obj, np.dtype) or (isinstance(obj, type) and issubclass(obj, np.generic)):
        key = np.dtype(obj).name  # a numpy dtype or scalar type; not None (numpy's float64)
    if key is not None:
        key = _ALIASES.get(key, key)
        if key in BY_NAME:
            return BY_NAME[key]
    names = ", ".join(sorted(n for n in BY_NAME))
    raise TensorMapError(f"dtype={obj!r} is not a supported element type; use one of: {names}")


def bf16_bits(x) -> np.ndarray:
    """Host floats -> bfloat16 bit patterns (uint16), rounded to nearest even; upload them with
    ``tf.from_numpy(bits, dtype="bfloat16")``. NaN and overflow are not special-cased."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_to_float32(bits) -> np.ndarray:
    """bfloat16 values (uint16 bit patterns, or ml_dtypes.bfloat16 as ``DeviceArray.numpy()``
    returns when it is installed) -> float32, exactly."""
    return (np.asarray(bits).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _e4m3_table() -> np.ndarray:
    """The float32 value of every e4m3fn byte (sign, 4 exponent bits of bias 7, 3 mantissa
    bits; exponent 0 is subnormal; S.1111.111 is NaN, there is no infinity)."""
    b = np.arange(256)
    e, m = (b >> 3) & 15, (b & 7).astype(np.float64)
    mag = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e - 7))
    mag = np.where((e == 15) & (m == 7), np.nan, mag)
    return np.where(b >> 7, -mag, mag).astype(np.float32)


E4M3 = _e4m3_table()
E4M3_MAX = 448.0


def e4m3_to_float32(bits) -> np.ndarray:
    """float8_e4m3fn bytes -> float32, exactly."""
    return E4M3[np.asarray(bits).view(np.uint8)]


def e4m3_bits(x) -> np.ndarray:
    """Host floats -> float8_e4m3fn bytes, rounded to nearest (ties to the even pattern) and
    saturated at +-448; NaN stays NaN."""
    x = np.asarray(x, dtype=np.float32)
    grid = E4M3[:127]  # the non-negative finite values, ascending (bytes 0..126)
    a = np.minimum(np.abs(x), E4M3_MAX)
    hi = np.clip(np.searchsorted(grid, a), 0, 126)
    lo = np.maximum(hi - 1, 0)
    d_lo, d_hi = a - grid[lo], grid[hi] - a
    pick = np.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo).astype(np.uint8)
    out = np.where(np.signbit(x), pick | 0x80, pick).astype(np.uint8)
    return np.where(np.isnan(x), np.uint8(0x7F), out)

