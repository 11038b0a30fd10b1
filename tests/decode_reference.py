"""Paged-KV decode attention in float64 numpy, and random paged caches to feed it: the
reference of tests/test_gpu_decode.py, itself checked in tests/test_decode_plan.py."""
import numpy as np

from tmaflow.dtypes import bf16_bits, bf16_to_float32


def paged_decode_reference(q, k_cache, v_cache, block_table, seq_lens, scale):
    """float64 of q's shape: (batch, heads_q, head_dim), or (batch, tokens, heads_q, head_dim)
    where new token i of request b sees its first seq_lens[b] - tokens + 1 + i keys (causal).
    Key j is row j % page_size of page block_table[b, j // page_size]; query head h reads kv
    head h // (heads_q / heads_kv); a token that sees no key gets zeros."""
    q, k_cache, v_cache = (np.asarray(a, np.float64) for a in (q, k_cache, v_cache))
    if q.ndim == 3:
        return paged_decode_reference(q[:, None], k_cache, v_cache, block_table, seq_lens, scale)[:, 0]
    batch, tokens, heads_q, head_dim = q.shape
    page_size, heads_kv = k_cache.shape[1], k_cache.shape[2]
    group = heads_q // heads_kv
    out = np.zeros(q.shape)
    for b in range(batch):
        for i in range(tokens):
            keys = np.arange(max(0, int(seq_lens[b]) - tokens + 1 + i))
            if keys.size == 0:
                continue
            pages, rows = block_table[b, keys // page_size], keys % page_size
            k, v = k_cache[pages, rows], v_cache[pages, rows]  # (keys, heads_kv, head_dim)
            for h in range(heads_kv):  # its query heads together: no copy of the keys a query head
                s = q[b, i, h * group:(h + 1) * group] @ k[:, h].T * scale  # (group, keys)
                p = np.exp(s - s.max(1, keepdims=True))
                out[b, i, h * group:(h + 1) * group] = p / p.sum(1, keepdims=True) @ v[:, h]
    return out


def random_paged_cache(rng, seq_lens, page_size, heads_kv, head_dim, spare_pages=3, width=None):
    """(k_cache, v_cache, block_table) as float64 values a 16-bit type holds exactly (bf16),
    where each request owns ceil(len / page_size) pages in a random order among spare ones;
    every row no request owns is NaN (a kernel that reads past a length shows it), and table
    entries past a request's pages are -1 (a kernel that follows them reads out of bounds)."""
    needed = [-(-int(n) // page_size) for n in seq_lens]
    width = width or max(max(needed), 1)
    pages = sum(needed) + spare_pages
    order = rng.permutation(pages)
    table = np.full((len(seq_lens), width), -1, np.int32)
    shape = (pages, page_size, heads_kv, head_dim)
    k, v = (bf16_to_float32(bf16_bits(rng.standard_normal(shape))).astype(np.float64) for _ in "kv")
    owned = np.zeros((pages, page_size), bool)
    start = 0
    for b, (n, count) in enumerate(zip(seq_lens, needed)):
        table[b, :count] = order[start:start + count]
        keys = np.arange(n)
        owned[table[b, keys // page_size], keys % page_size] = True
        start += count
    k[~owned], v[~owned] = np.nan, np.nan
    return k, v, table
