"""One timing line each for the backward's new capabilities (H200, bf16, L2 warm, median of
10): the varlen backward beside the dense backward (both the Hopper kernel at head dims 64
and 128) at equal total tokens (16k: 8 sequences of 2048, 16 heads), with the varlen
schedule before it took the dense plan's defines (VARLEN_BEFORE: 64-row steps, one dQ buffer)
as an A/B, the three timed in turns (three rounds, a median of 10 each; the line gives the
median over the rounds, time ratios to the dense per round); the 192 / 128 backward
(multi-head latent attention's head dims: 4 x 4096, 16 heads) in TFLOP/s, beside torch's SDPA
backends where they take v's head dim apart from q's.

    PYTHONPATH=. python3 tools/experiments/backward_capabilities_bench.py [--varlen]

--varlen: the varlen lines only.
"""
from __future__ import annotations

import statistics
import sys

import torch

from tmaflow import bench, kernels
from tmaflow.kernels.attention_backward_sm90 import VARLEN_BEFORE
from tmaflow.kernels.registry import extra_defines


def _flops(tokens_q: int, seq_k: int, heads: int, d: int, dv: int, causal: bool) -> float:
    """S, dP, dV, dK and dQ: 2 (3 d + 2 dv) a (query, key) pair, halved under a causal mask."""
    return 2.0 * (3 * d + 2 * dv) * tokens_q * seq_k * heads * (0.5 if causal else 1.0)


def _ms(fn) -> float:
    return bench.do_bench(fn, warmup=3, repeats=10, return_mode="median") * 1e3


def varlen_vs_dense(causal: bool, d: int = 128, rounds: int = 3) -> str:
    b, s, h = 8, 2048, 16
    q, k, v, dout = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True)
    packed = [x.transpose(1, 2).reshape(b * s, h, d).contiguous() for x in (q, k, v, dout)]
    cu = torch.arange(0, b * s + 1, s, device="cuda", dtype=torch.int32)
    pout, plse = kernels.attention_varlen(*packed[:3], cu, cu, s, s, causal=causal, return_lse=True)
    grads = {}

    def dense():
        return kernels.attention_backward(q, k, v, out, dout, lse, causal=causal)

    def varlen():
        return kernels.attention_varlen_backward(*packed[:3], pout, packed[3], plse, cu, cu, s, s, causal=causal)
    times: dict = {"varlen": [], "before": [], "dense": []}
    for _ in range(rounds):  # extra_defines drops the prepared states: each block plans anew (warmup)
        with extra_defines(VARLEN_BEFORE[d]):
            times["before"].append(_ms(varlen))
            grads["before"] = varlen()
        times["varlen"].append(_ms(varlen))
        times["dense"].append(_ms(dense))
    grads["varlen"] = varlen()
    want = [x.transpose(1, 2).reshape(b * s, h, d) for x in dense()]
    agree = {name: max(_rel(a, w) for a, w in zip(grads[name], want)) for name in ("varlen", "before")}
    med = {name: statistics.median(t) for name, t in times.items()}
    ratio = {name: statistics.median([a / z for a, z in zip(times[name], times["dense"])])
             for name in ("varlen", "before")}
    f = _flops(b * s, s, h, d, d, causal)
    return (f"bwd varlen hd{d} 16k tokens (8 x 2048) h16 {'causal' if causal else 'full  '}: varlen "
            f"{med['varlen']:.3f} ms {f / med['varlen'] / 1e9:.0f} TFLOP/s | before {med['before']:.3f} ms "
            f"{f / med['before'] / 1e9:.0f} TFLOP/s | dense {med['dense']:.3f} ms {f / med['dense'] / 1e9:.0f} TFLOP/s "
            f"| varlen/dense time {ratio['varlen']:.3f} (before {ratio['before']:.3f}) | grads rel to dense's: "
            f"varlen {agree['varlen']:.1e} before {agree['before']:.1e}")


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def mla(causal: bool) -> str:
    b, s, h, d, dv = 4, 4096, 16, 192, 128
    q, k = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v, dout = (torch.randn(b, h, s, dv, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True)
    ours = _ms(lambda: kernels.attention_backward(q, k, v, out, dout, lse, causal=causal))
    f = _flops(b * s, s, h, d, dv, causal)
    line = f"bwd 192/128 4 x 4096 h16 {'causal' if causal else 'full  '}: tmaflow {ours:.3f} ms {f / ours / 1e9:.0f} TFLOP/s"
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        try:
            qs, ks, vs = (x.detach().requires_grad_() for x in (q, k, v))
            with sdpa_kernel([backend]):
                o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
            ms = _ms(lambda: torch.autograd.grad(o, (qs, ks, vs), dout, retain_graph=True))
            line += f" | {name} {ms:.3f} ms {f / ms / 1e9:.0f} TFLOP/s"
        except Exception as exc:  # a backend that refuses unequal head dims
            line += f" | {name} n/a ({type(exc).__name__})"
    return line


if __name__ == "__main__":
    for d in (128, 64):
        for causal in (False, True):
            print(varlen_vs_dense(causal, d), flush=True)
    if "--varlen" not in sys.argv[1:]:
        for causal in (False, True):
            print(mla(causal), flush=True)
