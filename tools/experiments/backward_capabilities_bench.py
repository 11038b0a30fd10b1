"""One timing line each for the backward's new capabilities (H200, bf16, L2 warm, median of
10): the varlen backward beside the dense backward (both the Hopper kernel at head dims 64
and 128) at equal total tokens (16k: 8 sequences of 2048, 16 heads), as A/B rows: the plan's
dQ tiles ("varlen", DQ_TILE) against the row reductions they replaced ("rows", DQ_ROWS_DEFINES),
the varlen prep before its loads came first (PREP_LOADS_FIRST=0, "oldprep"), a head-major dQ
accumulator of rows (DQ_HEAD_MAJOR=1, "headmaj": a head's rows contiguous as the dense kernel's
were) and the varlen build over
the dense layout ("bhsd": the dense tensors as 128 sequences of one head, so Q / dO / K / V
boxes and the dQ accumulator rows are contiguous as in the dense kernel; same FLOPs), all
timed in turns (three rounds, a median of 10 each; the line gives the median over the rounds,
time ratios to the dense per round), then each one's kernels (CUPTI: prep, main, dQ in µs);
the 192 / 128 backward (multi-head latent attention's head dims: 4 x 4096, 16 heads) in
TFLOP/s, beside torch's SDPA backends where they take v's head dim apart from q's.

    PYTHONPATH=. python3 tools/experiments/backward_capabilities_bench.py [--varlen] [--hd64]

--varlen: the varlen lines only; --hd64: head dim 64 only.
"""
from __future__ import annotations

import statistics
import sys

import torch

from tmaflow import bench, kernels
from tmaflow.kernels.attention_backward_sm90 import DQ_ROWS_DEFINES
from tmaflow.kernels.registry import extra_defines


def _flops(tokens_q: int, seq_k: int, heads: int, d: int, dv: int, causal: bool) -> float:
    """S, dP, dV, dK and dQ: 2 (3 d + 2 dv) a (query, key) pair, halved under a causal mask."""
    return 2.0 * (3 * d + 2 * dv) * tokens_q * seq_k * heads * (0.5 if causal else 1.0)


def _ms(fn) -> float:
    return bench.do_bench(fn, warmup=3, repeats=10, return_mode="median") * 1e3


def variants(d: int) -> dict:
    """The varlen A/B rows at head dim d: extra_defines of the plan's kernels (an empty dict:
    the plan's own)."""
    return {"varlen": {}, "rows": DQ_ROWS_DEFINES[d], "oldprep": {"PREP_LOADS_FIRST": 0},
            "headmaj": {**DQ_ROWS_DEFINES[d], "DQ_HEAD_MAJOR": 1}, "bhsd": {}}


def varlen_vs_dense(causal: bool, d: int = 128, rounds: int = 3) -> str:
    b, s, h = 8, 2048, 16
    q, k, v, dout = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True)
    packed = [x.transpose(1, 2).reshape(b * s, h, d).contiguous() for x in (q, k, v, dout)]
    cu = torch.arange(0, b * s + 1, s, device="cuda", dtype=torch.int32)
    pout, plse = kernels.attention_varlen(*packed[:3], cu, cu, s, s, causal=causal, return_lse=True)
    # bhsd: the dense tensors as b h sequences of one head (rows of a (sequence, head) contiguous)
    flat = [x.reshape(b * h * s, 1, d) for x in (q, k, v, out, dout)]
    cu_flat = torch.arange(0, b * h * s + 1, s, device="cuda", dtype=torch.int32)
    lse_flat = lse.reshape(1, b * h * s)

    def dense():
        return kernels.attention_backward(q, k, v, out, dout, lse, causal=causal)

    def varlen():
        return kernels.attention_varlen_backward(*packed[:3], pout, packed[3], plse, cu, cu, s, s, causal=causal)

    def bhsd():
        return kernels.attention_varlen_backward(*flat, lse_flat, cu_flat, cu_flat, s, s, causal=causal)
    VARIANTS = variants(d)
    calls = {"varlen": varlen, "rows": varlen, "oldprep": varlen, "headmaj": varlen, "bhsd": bhsd}
    times: dict = {name: [] for name in (*VARIANTS, "dense")}
    grads, kernel_us = {}, {}
    for r in range(rounds):  # extra_defines drops the prepared states: each block plans anew (warmup)
        for name, defines in VARIANTS.items():
            with extra_defines(defines):
                times[name].append(_ms(calls[name]))
                if r == 0:
                    grads[name] = calls[name]()
                    kernel_us[name] = _kernels(calls[name])
        times["dense"].append(_ms(dense))
    kernel_us["dense"] = _kernels(dense)
    want = [x.transpose(1, 2).reshape(b * s, h, d) for x in dense()]
    grads["bhsd"] = [x.reshape(b, h, s, d).transpose(1, 2).reshape(b * s, h, d) for x in grads["bhsd"]]
    agree = {name: max(_rel(a, w) for a, w in zip(grads[name], want)) for name in VARIANTS}
    med = {name: statistics.median(t) for name, t in times.items()}
    ratio = {name: statistics.median([a / z for a, z in zip(times[name], times["dense"])]) for name in VARIANTS}
    f = _flops(b * s, s, h, d, d, causal)
    line = f"bwd varlen hd{d} 16k tokens (8 x 2048) h16 {'causal' if causal else 'full  '}:"
    for name in ("dense", *VARIANTS):
        line += f" | {name} {med[name]:.3f} ms {f / med[name] / 1e9:.0f} TFLOP/s"
        if name != "dense":
            line += f" /dense {ratio[name]:.3f}"
    line += " | grads rel to dense's: " + " ".join(f"{n} {e:.1e}" for n, e in agree.items())
    for name in ("dense", *VARIANTS):
        line += f"\n    kernels {name:<8s} " + "  ".join(f"{k} {us:.1f}" for k, us in kernel_us[name].items()) + " µs"
    return line


def _kernels(fn) -> dict:
    """{prep, main, dq: mean µs} of fn's kernels over 10 calls (CUPTI)."""
    got = {}
    for name, t in bench.kernel_times(fn, 10).items():
        dq = name.endswith(("_dq", "_dq_tile")) or name.startswith("attention_bwd_dq")
        short = ("prep" if "prep" in name else "dq" if dq else "main" if name.startswith("attention_bwd_sm90") else
                 name[:24])
        got[short] = got.get(short, 0.0) + t.mean_us * t.calls / 10
    return got


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
    for d in (64,) if "--hd64" in sys.argv[1:] else (128, 64):
        for causal in (False, True):
            print(varlen_vs_dense(causal, d), flush=True)
    if "--varlen" not in sys.argv[1:]:
        for causal in (False, True):
            print(mla(causal), flush=True)
