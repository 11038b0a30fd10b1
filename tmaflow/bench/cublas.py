"""cuBLAS paths through torch that the GEMM benchmarks compare against, where torch has them."""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def block_scaled_mm(a, b, sa, sb, out):
    """torch._scaled_mm with 1 x 128 / 128 x 128 block scales (cuBLAS 12.9+ on sm_90), which
    takes scale_a M-major and scale_b as b.T's (K/128, N/128) view: a function writing ``out``,
    or None where this torch or cuBLAS has no such path."""
    import torch  # optional dependency: the peer

    sa_m, sb_t = sa.t().contiguous().t(), sb.t()

    def fn():
        return torch._scaled_mm(a, b.T, scale_a=sa_m, scale_b=sb_t, out_dtype=torch.bfloat16, out=out)
    try:
        fn()
        torch.cuda.synchronize()
    except (RuntimeError, ValueError) as exc:
        log.warning("no block-scaled _scaled_mm here: %s", str(exc).splitlines()[0][:160])
        return None
    return fn
