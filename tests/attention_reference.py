"""Attention forward and backward in float64 numpy: the reference of
tests/test_gpu_attention_backward.py, itself checked against finite differences in
tests/test_attention_backward.py."""
import numpy as np


def _scores(q, k, causal, scale):
    """scale q k^T with k's heads repeated over their query heads; causal masks are top-left
    aligned (query i sees keys j <= i)."""
    k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if causal:
        s = np.where(np.triu(np.ones(s.shape[-2:], bool), 1), -np.inf, s)
    return s


def attention_forward(q, k, v, causal, scale):
    """(out, lse): softmax(scale q k^T) v and the natural log-sum-exp of each row's scores."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = _scores(q, k, causal, scale)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    total = p.sum(-1, keepdims=True)
    v = np.repeat(v, q.shape[1] // v.shape[1], axis=1)
    return np.einsum("bhqk,bhkd->bhqd", p / total, v), (m + np.log(total))[..., 0]


def attention_backward(q, k, v, dout, causal, scale):
    """(dq, dk, dv) of attention_forward's out given dout; dk and dv of a kv head sum over the
    query heads that read it."""
    q, k, v, dout = (np.asarray(a, np.float64) for a in (q, k, v, dout))
    group = q.shape[1] // k.shape[1]
    s = _scores(q, k, causal, scale)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    kr, vr = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    dv = np.einsum("bhqk,bhqd->bhkd", p, dout)
    dp = np.einsum("bhqd,bhkd->bhqk", dout, vr)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True)) * scale
    dq = np.einsum("bhqk,bhkd->bhqd", ds, kr)
    dk = np.einsum("bhqk,bhqd->bhkd", ds, q)

    def per_kv_head(x):  # (batch, heads_q, ...) -> (batch, heads_kv, ...): sum each group
        return x.reshape(x.shape[0], k.shape[1], group, *x.shape[2:]).sum(2)
    return dq, per_kv_head(dk), per_kv_head(dv)
