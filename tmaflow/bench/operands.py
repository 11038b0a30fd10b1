"""Shapes from the command line ("4096x4096x4096[:nt]") and random operands: tmaflow arrays
(numpy-made) and torch tensors (bf16, fp8 e4m3, DeepSeek-style block scales)."""
from __future__ import annotations

import numpy as np

from ..errors import TmaflowError
from ..runtime.memory import DeviceArray, from_numpy

LAYOUTS = ("nt", "nn")


def parse_shape(text: str, dims: int | None = None) -> tuple[int, ...]:
    """``"MxNxK"`` as a tuple of positive ints (``dims`` of them when given)."""
    parts = str(text).lower().split("x")
    if not all(p.isdigit() and int(p) > 0 for p in parts) or (dims is not None and len(parts) != dims):
        want = "x".join("ABCDEFG"[:dims]) if dims else "AxBx..."
        raise TmaflowError(f"shape {text!r} must be {want}: positive integers joined by 'x' "
                           f"(e.g. 4096x4096x4096)")
    return tuple(int(p) for p in parts)


def parse_gemm_shape(text: str) -> tuple[int, int, int, str]:
    """``"MxNxK"`` or ``"MxNxK:nn"`` as (m, n, k, layout); layout "nt" when left out."""
    dims, _, layout = str(text).partition(":")
    layout = layout or "nt"
    if layout not in LAYOUTS:
        raise TmaflowError(f"shape {text!r}: layout {layout!r} must be one of {LAYOUTS}")
    m, n, k = parse_shape(dims, 3)
    return m, n, k, layout


def parse_shapes(texts, default: list) -> list[tuple[int, int, int]]:
    """``--shape MxNxK`` arguments as (m, n, k) tuples, or ``default`` when none were given."""
    shapes = [parse_shape(text, 3) for text in texts]
    return [(m, n, k) for m, n, k in shapes] or list(default)


def random_array(shape, dtype: str = "float32") -> DeviceArray:
    """A tmaflow array of random values: normal float32, or random 16-bit patterns."""
    rng = np.random.default_rng()
    if dtype == "float32":
        return from_numpy(rng.standard_normal(shape, dtype=np.float32))
    return from_numpy(rng.integers(0, 2**16, size=shape, dtype=np.uint16), dtype=dtype)


def nt_operands(m: int, n: int, k: int, dtype: str = "bfloat16"):
    """Random "nt" torch operands on the GPU: A (m, k) and B (n, k), bf16 or fp8 e4m3 (normal
    x 40, spread over e4m3's range)."""
    import torch  # optional dependency: the peer benchmarks' operands

    if dtype == "float8_e4m3fn":
        return tuple((torch.randn(r, k, device="cuda") * 40).to(torch.float8_e4m3fn) for r in (m, n))
    if dtype != "bfloat16":
        raise TmaflowError(f"nt_operands: dtype={dtype!r} must be 'bfloat16' or 'float8_e4m3fn'")
    return tuple(torch.randn(r, k, device="cuda", dtype=torch.bfloat16) for r in (m, n))


def block_scales(a, b, rows: int = 256):
    """Random block scales for fp8 torch a (M x K) and b (N x K), 1 x 128 and 128 x 128:
    (scale_a, scale_b, the float64 product of the dequantised operands on a's first ``rows``
    rows)."""
    import torch  # optional dependency, as above

    (m, k), n = a.shape, b.shape[0]
    kb = -(-k // 128)
    sa = torch.rand(m, kb, device="cuda") * 0.01 + 0.001
    sb = torch.rand(-(-n // 128), kb, device="cuda") * 0.01 + 0.001
    cols = torch.arange(k, device="cuda") // 128
    a_deq = a[:rows].double() * sa[:rows][:, cols].double()
    b_deq = b.double() * sb[torch.arange(n, device="cuda")[:, None] // 128, cols[None, :]].double()
    return sa, sb, a_deq @ b_deq.T


def rel_error(x, ref) -> float:
    """||x - ref|| / ||ref|| of two torch tensors, in float32."""
    import torch  # optional dependency, as above

    return (torch.linalg.norm(x.float() - ref.float()) / torch.linalg.norm(ref.float())).item()


def poisoned_error(run, c, ref) -> float:
    """Fill the torch output ``c`` with NaN, call ``run`` once, wait for it, and return the
    relative error of ``c``'s first ``len(ref)`` rows against ``ref`` (NaN if any was left)."""
    import torch  # optional dependency, as above

    c.fill_(float("nan"))
    run()
    torch.cuda.synchronize()
    return rel_error(c[: ref.shape[0]], ref)
