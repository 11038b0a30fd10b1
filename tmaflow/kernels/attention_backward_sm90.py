"""The Hopper attention backward (``attention_backward_sm90.cu``) for head dims 64 and 128: its
tensor maps, shared memory, launches and arguments (``attention_backward_entry`` routes here)."""
from __future__ import annotations

import math

from ..tma.spec import TensorMapSpec
from ..tma.tensormap import MapTemplate
from .registry import get_kernel

SM90_HEAD_DIMS = (64, 128)
KEYS = 128      # keys a CTA (attention_backward_sm90.cu's BN): two consumer warpgroups of 64
ROWS = 64       # query rows a step (BM)
STAGES = 3      # Q / dO stages in flight (a stage is refilled a step and more before its use)
THREADS = 384   # a producer warpgroup and two consumers
# Head dims whose dQ leaves through shared memory and bulk reductions (the kernel's DQ_BULK);
# the others add it with red.global.add.v2.f32 (H200, same rounds, cold: head dim 128 bulk
# 1.04-1.12x red at 1k-16k; head dim 64 bulk 0.74-0.83x red)
DQ_BULK_HEAD_DIMS = (128,)
_PREP_ROWS = 8  # padded query rows a CTA of the prep kernel (a warp each)
_DQ_GRID = 1024


def sm90_smem(head_dim: int, stages: int = STAGES) -> int:
    """Dynamic shared memory of ``attention_bwd_sm90`` with DQ_BULK (its kSmemBytes): K and V,
    the stages of Q and dO, two dS^T buffers, the dQ buffers in fp32 (rows padded by 16 B; two
    at head dim 64, one at 128), the stages' LSE and Delta rows, the barriers. Launches reserve
    it whether DQ_BULK is on or not (the kernel without it uses less), so an override of the
    define (kernels.registry.extra_defines) always fits."""
    kv = 2 * KEYS * head_dim
    q = ROWS * 2 * head_dim
    dq_bufs = 2 if head_dim == 64 else 1
    dq = dq_bufs * ROWS * (4 * head_dim + 16)
    return 2 * kv + 2 * stages * q + 2 * KEYS * 128 + dq + stages * 2 * ROWS * 4 + (1 + 2 * stages + 2 * dq_bufs) * 8


def padded_rows(seq: int) -> int:
    """Query rows a head in the LSE / Delta workspace: whole ROWS-row blocks (bulk copies)."""
    return -(-seq // ROWS) * ROWS


class Sm90Plan:
    """The launches of one (shape, dtype, causal, deterministic, stream) and how a call's
    arguments are laid out: prep (Delta, LSE in log2, zeroed dQ accumulator and counters),
    the main kernel, dQ to the output dtype."""

    def __init__(self, Q, K, causal: bool, deterministic: bool, stream):
        b, hq, sq, d = Q.shape
        hkv, skv = K.shape[1], K.shape[2]
        dt = Q.dtype.name
        fp16 = {"FP16": 1} if dt == "float16" else {}
        defines = {"HEAD_DIM": d, "DETERMINISTIC": int(deterministic), **fp16}
        self.shape = (b, hq, sq, d, hkv, skv)
        self.seq_pad = padded_rows(sq)
        self.rows_pad = b * hq * self.seq_pad
        self.chain_count = b * hq * (self.seq_pad // ROWS) if deterministic else 0

        def launcher(name, file, defs, **config):
            return get_kernel(name, None, defines=defs, file=file).launcher(stream=stream, **config)
        rows = b * hq * sq
        self.launches = [
            launcher("attention_bwd_sm90_prep", "attention_backward_sm90", defines,
                     grid=-(-self.rows_pad // _PREP_ROWS), block=32 * _PREP_ROWS),
            launcher("attention_bwd_sm90", "attention_backward_sm90",
                     {**defines, "CAUSAL": int(causal), "STAGES": STAGES, "DQ_BULK": int(d in DQ_BULK_HEAD_DIMS)},
                     grid=(-(-skv // KEYS), hkv, b), block=THREADS, smem=sm90_smem(d)),
            launcher("attention_bwd_dq", "attention_backward", fp16, grid=min(_DQ_GRID, -(-rows * d // 512)), block=256),
        ]
        qspec = TensorMapSpec.tiled(dt, (b * hq, sq, d), (1, ROWS, 64), swizzle="128B")
        kspec = TensorMapSpec.tiled(dt, (b * hkv, skv, d), (1, KEYS, d // 2), swizzle=f"{d}B")
        self.tq, self.tdo = MapTemplate(qspec), MapTemplate(qspec)
        self.tk, self.tv = MapTemplate(kspec), MapTemplate(kspec)

    def args(self, Q, K, V, O, G, L, DQ, DK, DV, scale: float, workspace) -> tuple:
        """(prep, main, dq) arguments and the fp32 workspace they point into: dQ's accumulator,
        LSE (log2), Delta, then the chain counters; ``workspace(n)`` allocates n floats."""
        b, hq, sq, d, hkv, skv = self.shape
        rows = b * hq * sq
        ws = workspace(rows * d + 2 * self.rows_pad + self.chain_count)
        accum = ws.ptr
        lse2 = accum + 4 * rows * d
        delta = lse2 + 4 * self.rows_pad
        chain = delta + 4 * self.rows_pad
        q3, k3 = (b * hq, sq, d), (b * hkv, skv, d)
        maps = (self.tq.bind(Q._as(q3, Q.strides[1:])), self.tk.bind(K._as(k3, K.strides[1:])),
                self.tv.bind(V._as(k3, V.strides[1:])), self.tdo.bind(G._as(q3, G.strides[1:])))
        return ((O, G, L, lse2, delta, accum, chain, self.rows_pad, sq, self.seq_pad, self.chain_count),
                (*maps, lse2, delta, accum, chain, DK, DV, sq, skv, self.seq_pad, hq, hq // hkv, scale,
                 scale * math.log2(math.e)),
                (accum, DQ, rows * d // 2, scale), ws)
