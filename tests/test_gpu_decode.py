"""kernels.attention_decode and append_kv against the float64 paged reference: ragged lengths
(0, 1, not multiples of a page), random non-contiguous block tables with NaN in every row no
request owns, GQA 1:1 to 16:1, pages 16-256, head dims 32-256 (96, 80, 192 too), bf16 and fp16,
one and several splits (up to 64, merged in several rounds), persistent CTAs walking several
requests (bit-equal to one CTA a request), K and V at normal or evict-first L2 priority, 1-8
new tokens a request, one request of 128k keys, poisoned outputs and split workspace; a torch
CUDA graph replayed with new lengths; append then decode; both under torch.compile; the splits
merged by slices (slice_merge: the default at 16+ splits that fit, a cooperative launch; four
kv heads a CTA too) or by a second kernel (merge_kernel), the maps' L2 promotion
and the warps merged a warp at a time (warp_slices=False), bit-equal to the default paths;
PDL launches (pdl=True) in a chain that reads what the kernel before wrote."""
import re

import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.dtypes import bf16_bits, bf16_to_float32
from tmaflow.testing import poison, rel_error

from decode_reference import paged_decode_reference, random_paged_cache

pytestmark = pytest.mark.gpu


def _upload(x, dtype):
    if dtype == "bfloat16":
        return tf.from_numpy(bf16_bits(x), dtype="bfloat16")
    return tf.from_numpy(np.asarray(x, np.float16))


def _download(arr, dtype):
    host = arr.numpy()
    return (bf16_to_float32(host) if dtype == "bfloat16" else host).astype(np.float64)


def _problem(rng, lens, heads_q, heads_kv, d, page, dtype, width=None, tokens=None):
    """Host float64 values (exact in dtype) and their device copies; q is (batch, tokens,
    heads_q, d) when ``tokens`` is given."""
    k, v, table = random_paged_cache(rng, lens, page, heads_kv, d, width=width)
    shape = (len(lens), heads_q, d) if tokens is None else (len(lens), tokens, heads_q, d)
    q = bf16_to_float32(bf16_bits(rng.standard_normal(shape))).astype(np.float64)
    lens = np.asarray(lens, np.int32)
    host = (q, k, v, table, lens)
    dev = (_upload(q, dtype), _upload(k, dtype), _upload(v, dtype), tf.from_numpy(table), tf.from_numpy(lens))
    return host, dev


CASES = [  # lens, heads_q, heads_kv, head_dim, page_size, dtype
    ([0, 1, 15, 16, 17, 100, 1000], 32, 8, 128, 16, "bfloat16"),
    ([1, 63, 64, 65, 333, 2049, 5], 8, 1, 64, 64, "float16"),
    ([700, 0, 257, 3, 1500], 4, 4, 256, 256, "bfloat16"),
    ([2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 3001], 16, 2, 128, 64, "bfloat16"),
    ([999, 1, 129], 12, 4, 64, 32, "bfloat16"),
    ([4000], 16, 1, 128, 128, "float16"),
    ([300, 0], 2, 2, 256, 16, "float16"),
    ([5, 77, 300, 1], 8, 2, 96, 16, "bfloat16"),     # head dims that are not whole 64-column boxes
    ([1000, 3], 4, 4, 32, 64, "float16"),
    ([129, 2000], 16, 2, 192, 32, "bfloat16"),
    ([64, 65], 4, 1, 80, 128, "bfloat16"),
]


@pytest.mark.parametrize("lens,heads_q,heads_kv,d,page,dtype", CASES)
@pytest.mark.parametrize("num_splits", [None, 1, 7])
def test_decode_against_float64(device, rng, lens, heads_q, heads_kv, d, page, dtype, num_splits):
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, lens, heads_q, heads_kv, d, page, dtype)
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(d))
    results = []
    for _ in range(2):  # again: the split counters were reset, and the merge order is fixed
        out = poison(tf.empty(q.shape, dtype))
        kernels.attention_decode(Q, K, V, T, L, num_splits=num_splits, out=out)
        results.append(out.numpy())
    got = _download(out, dtype)
    assert rel_error(got, ref) < 1e-2, (lens, heads_q, heads_kv, d, page, dtype, num_splits, rel_error(got, ref))
    assert not got[host_lens == 0].any(), "a request of length 0 gives zeros"
    np.testing.assert_array_equal(results[0].view(np.uint16), results[1].view(np.uint16))


@pytest.mark.parametrize("lens,tokens,heads_q,heads_kv,d,page,dtype", [
    ([0, 1, 2, 3, 17, 80, 1000], 4, 8, 2, 128, 16, "bfloat16"),   # 16 rows; tokens that see no key
    ([66, 130, 5, 2049], 8, 2, 1, 64, 64, "float16"),
    ([31, 33, 700], 5, 3, 1, 256, 32, "bfloat16"),
    ([1, 400], 2, 4, 4, 64, 256, "bfloat16"),
])
@pytest.mark.parametrize("num_splits", [None, 1, 5])
def test_decode_of_several_new_tokens_is_causal_among_them(device, rng, lens, tokens, heads_q, heads_kv, d,
                                                          page, dtype, num_splits):
    """(batch, tokens, heads_q, head_dim) queries, token i seeing keys up to len - tokens + i."""
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, lens, heads_q, heads_kv, d, page, dtype,
                                                           tokens=tokens)
    out = poison(tf.empty(q.shape, dtype))
    kernels.attention_decode(Q, K, V, T, L, num_splits=num_splits, out=out)
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(d))
    got = _download(out, dtype)
    assert rel_error(got, ref) < 1e-2, (lens, tokens, heads_q, heads_kv, d, page, dtype, num_splits, rel_error(got, ref))
    assert not got[ref == 0].any(), "a token that sees no key gets zeros"


def test_decode_of_one_long_request_splits_and_matches(device, rng):
    """40k keys of one request on one kv head: the automatic split count spreads it over the
    GPU, and the merge of many splits stays exact to bf16."""
    (q, k, v, table, lens), (Q, K, V, T, L) = _problem(rng, [40000], 8, 1, 128, 16, "bfloat16")
    out = poison(tf.empty(q.shape, "bfloat16"))
    kernels.attention_decode(Q, K, V, T, L, out=out, scale=0.05)
    ref = paged_decode_reference(q, k, v, table, lens, 0.05)
    assert rel_error(_download(out, "bfloat16"), ref) < 1e-2


ACCEPTANCE = [  # lens, heads_q, heads_kv, page_size: GQA 4:1 and 8:1 at head dim 128, the benchmark's
    ([0, 1, 2, 15, 16, 17, 130, 1999], 32, 8, 16),
    ([1, 0, 700, 64, 65, 4096], 32, 4, 64),
    ([5000, 1, 0, 257], 16, 4, 256),
    ([3, 2500, 1], 64, 8, 64),
]


@pytest.mark.parametrize("lens,heads_q,heads_kv,page", ACCEPTANCE)
@pytest.mark.parametrize("num_splits", [None, 2, 64])
@pytest.mark.parametrize("evict_first", [False, True])
def test_decode_of_the_benchmark_shapes_against_float64(device, rng, lens, heads_q, heads_kv, page, num_splits,
                                                       evict_first):
    """64 splits of 4 or 8 rows take two or three merge rounds (as many splits as fit the stages
    a round); the L2 priority changes nothing but speed; two runs give the same bits."""
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, lens, heads_q, heads_kv, 128, page, "bfloat16")
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(128))
    results = []
    for _ in range(2):
        out = poison(tf.empty(q.shape, "bfloat16"))
        kernels.attention_decode(Q, K, V, T, L, num_splits=num_splits, evict_first=evict_first, out=out)
        results.append(out.numpy())
    got = _download(out, "bfloat16")
    assert rel_error(got, ref) < 1e-2, (lens, heads_q, heads_kv, page, num_splits, evict_first, rel_error(got, ref))
    assert not got[host_lens == 0].any(), "a request of length 0 gives zeros"
    np.testing.assert_array_equal(results[0].view(np.uint16), results[1].view(np.uint16))


@pytest.mark.parametrize("d,num_splits", [(256, 64), (128, 40), (64, 13)])
def test_decode_merges_sixteen_rows_of_many_splits_in_rounds(device, rng, d, num_splits):
    """2 new tokens x 8 query heads: 16 rows a kv head, 16 x d x 4 bytes a split's O; the
    merge takes the splits a stage area holds at a time (11 at head dim 256: six rounds)."""
    lens = [3000, 0, 1, 64 * 64 + 5, 2]
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, lens, 16, 2, d, 64, "bfloat16", tokens=2)
    out = poison(tf.empty(q.shape, "bfloat16"))
    kernels.attention_decode(Q, K, V, T, L, num_splits=num_splits, out=out)
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(d))
    got = _download(out, "bfloat16")
    assert rel_error(got, ref) < 1e-2, (d, num_splits, rel_error(got, ref))
    assert not got[ref == 0].any(), "a token that sees no key gets zeros"


def test_decode_reads_no_stale_slot_of_a_poisoned_split_workspace(device, rng):
    """The merge copies every split's 16 log-sum-exp slots and uses only the rows it has: NaN
    everywhere in the workspace's floats (the counters stay zero) changes nothing."""
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, [900, 17, 0, 2048], 12, 3, 128, 16, "bfloat16")
    out = poison(tf.empty(q.shape, "bfloat16"))
    prepared = kernels.attention_decode.prepare(Q, K, V, T, L, num_splits=24, out=out)
    prepared()
    before = out.numpy()
    partials = prepared.args[6]  # the split workspace's float view: partial O, then log-sum-exps
    poison(partials)
    out.fill_bytes(0xFF)
    prepared()
    np.testing.assert_array_equal(out.numpy().view(np.uint16), before.view(np.uint16))
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(128))
    assert rel_error(_download(out, "bfloat16"), ref) < 1e-2


@pytest.mark.parametrize("lens,heads_q,heads_kv,d,page,tokens,dtype,num_splits", [
    ([0, 1, 15, 16, 17, 100, 1000], 32, 4, 128, 16, None, "bfloat16", 8),   # GQA 8:1, page 16, portable cluster
    ([1, 63, 64, 65, 333, 2049, 5], 16, 4, 128, 64, None, "bfloat16", 3),   # 4:1, page 64, an odd cluster
    ([700, 0, 257, 3, 1500], 8, 2, 64, 16, None, "float16", 2),
    ([1, 4000, 1023], 8, 1, 128, 64, None, "bfloat16", 16),                 # a non-portable cluster of 16
    ([0, 1, 2, 3, 17, 80, 1000], 8, 2, 128, 16, 4, "bfloat16", 5),          # 4 new tokens x 4 query heads
    ([129, 2000], 16, 2, 192, 32, None, "bfloat16", 7),
    ([5, 77, 300, 1], 8, 2, 96, 16, None, "float16", 4),
])
def test_cluster_merge_decode_against_float64_and_bit_equal_to_the_counter_merge(device, rng, lens, heads_q, heads_kv,
                                                                               d, page, tokens, dtype, num_splits):
    """Splits merged through distributed shared memory (a cluster a (request, kv head)): against
    float64 (ragged lengths, 0 and 1, NaN in every row no request owns, splits with no key),
    the same bits run to run and as the workspace-and-counter merge of the same splits."""
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, lens, heads_q, heads_kv, d, page, dtype,
                                                           tokens=tokens)
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(d))

    def run(out, cluster_merge):
        prepared = kernels.attention_decode.prepare(Q, K, V, T, L, num_splits=num_splits, cluster_merge=cluster_merge,
                                                    out=out)
        prepared()
        if cluster_merge:  # (the counter's launcher wraps the workspace)
            assert prepared.launcher.config.cluster == (num_splits, 1, 1), prepared.launcher.config

    _twice_then_the_counter_merge(run, ref, q.shape, dtype)


def _twice_then_the_counter_merge(run, ref, shape, dtype, repeats=2):
    """``run(out, True)`` ``repeats`` times and ``run(out, False)`` (the counter merge) into
    poisoned outputs: each against float64 (a token that sees no key gets zeros), all the same
    bits."""
    results = []
    for variant in (True,) * repeats + (False,):
        out = poison(tf.empty(shape, dtype))
        run(out, variant)
        got = _download(out, dtype)
        assert rel_error(got, ref) < 1e-2, (variant, rel_error(got, ref))
        assert not got[ref == 0].any(), "a token that sees no key gets zeros"
        results.append(out.numpy())
    for other in results[1:]:
        np.testing.assert_array_equal(results[0].view(np.uint16), other.view(np.uint16))


@pytest.mark.parametrize("lens,heads_q,heads_kv,d,page,tokens,dtype,num_splits", [
    ([0, 1, 15, 16, 17, 100, 1000], 32, 4, 128, 16, None, "bfloat16", 8),   # GQA 8:1, splits with no key
    ([8192], 64, 8, 128, 16, None, "bfloat16", 32),                         # the b1 8k row: 256 CTAs
    ([1, 63, 64, 65, 333, 2049, 5], 16, 4, 128, 64, None, "float16", 3),
    ([0, 1, 2, 3, 17, 80, 1000], 8, 2, 128, 16, 4, "bfloat16", 5),          # 4 new tokens x 4 query heads
    ([4000, 129], 16, 1, 256, 32, None, "bfloat16", 64),                    # more splits than a slice's columns
    ([5, 77, 300, 1], 8, 2, 96, 16, None, "float16", 7),
])
def test_slice_merge_decode_against_float64_and_bit_equal_to_the_counter_merge(device, rng, lens, heads_q, heads_kv,
                                                                             d, page, tokens, dtype, num_splits):
    """Every split merges its share of the columns once all have counted: against float64,
    the same bits launch after launch (the counter back at 0 each time) and as the counter
    merge's (one CTA reading every split)."""
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, lens, heads_q, heads_kv, d, page, dtype,
                                                           tokens=tokens)
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(d))
    _twice_then_the_counter_merge(
        lambda out, slice_merge: kernels.attention_decode(Q, K, V, T, L, num_splits=num_splits, slice_merge=slice_merge,
                                                          cluster_merge=False, out=out),
        ref, q.shape, dtype, repeats=3)


@pytest.mark.parametrize("lens,heads_q,heads_kv,d,page,num_splits", [
    ([8192], 64, 8, 128, 16, None),                 # the b1 8k plan: 32 splits, the counter merge
    ([300, 17, 0, 100] * 40, 16, 4, 128, 16, None),  # 640 items: persistent CTAs
    ([129, 2000, 5], 16, 2, 96, 32, 3),             # head_dim 96: the last box reaches past the row
])
@pytest.mark.parametrize("l2_promotion", ["256B", "128B"])
def test_decode_with_l2_promotion_gives_the_same_bits(device, rng, lens, heads_q, heads_kv, d, page, num_splits,
                                                      l2_promotion):
    """The maps' L2 promotion changes what DRAM fetches, not what lands in shared memory:
    against float64 and bit-equal to the call without it."""
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, lens, heads_q, heads_kv, d, page, "bfloat16")
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(d))
    results = []
    for promotion in (l2_promotion, None):
        out = poison(tf.empty(q.shape, "bfloat16"))
        kernels.attention_decode(Q, K, V, T, L, num_splits=num_splits, l2_promotion=promotion, out=out)
        results.append(out.numpy())
        assert rel_error(_download(out, "bfloat16"), ref) < 1e-2, promotion
    np.testing.assert_array_equal(results[0].view(np.uint16), results[1].view(np.uint16))


@pytest.mark.parametrize("lens,heads_q,heads_kv,page,dtype", [
    ([8192], 64, 8, 16, "bfloat16"),          # the b1 8k row: 32 splits, 256 CTAs
    ([5000], 32, 8, 64, "float16"),           # a length short of the table: splits past it see no key
    ([40000], 8, 1, 16, "bfloat16"),          # one kv head: 64 splits
])
def test_decode_plans_a_cooperative_slice_merge_for_one_long_request(device, rng, lens, heads_q, heads_kv, page,
                                                                     dtype):
    """Batch 1 past 16 splits: the default merges by slices in a cooperative grid; against
    float64, the same bits again, as the counter merge's and as the slice merge launched plainly."""
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, lens, heads_q, heads_kv, 128, page, dtype,
                                                           width=-(-8192 // page) if lens == [5000] else None)
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(128))
    results = []
    for options in ({}, {}, {"slice_merge": False}, {"cooperative": False}):
        out = poison(tf.empty(q.shape, dtype))
        prepared = kernels.attention_decode.prepare(Q, K, V, T, L, out=out, **options)
        config = getattr(prepared.launcher, "launcher", prepared.launcher).config  # (the split workspace wraps it)
        assert config.cooperative is (options == {}), (options, config)
        assert config.grid[0] >= 16 and config.cluster == (1, 1, 1), config
        prepared()
        results.append(out.numpy())
        got = _download(out, dtype)
        assert rel_error(got, ref) < 1e-2, (options, rel_error(got, ref))
    for other in results[1:]:
        np.testing.assert_array_equal(results[0].view(np.uint16), other.view(np.uint16))


def test_decode_plans_pairs_of_clusters_for_two_splits(device, rng):
    """Batch 16, 8 kv heads: two splits (256 CTAs in 264 slots) merge in clusters of two by
    default, more CTAs than the SMs; against float64 and bit-equal to the counter merge."""
    lens = [1000] * 15 + [17]
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, lens, 32, 8, 128, 16, "bfloat16")
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(128))
    results = []
    for options in ({}, {"cluster_merge": False}):
        out = poison(tf.empty(q.shape, "bfloat16"))
        prepared = kernels.attention_decode.prepare(Q, K, V, T, L, out=out, **options)
        config = getattr(prepared.launcher, "launcher", prepared.launcher).config
        assert config.grid == (2, 8, 16) and config.cluster == ((2, 1, 1) if not options else (1, 1, 1)), config
        prepared()
        results.append(out.numpy())
        assert rel_error(_download(out, "bfloat16"), ref) < 1e-2, options
    np.testing.assert_array_equal(results[0].view(np.uint16), results[1].view(np.uint16))


def test_cooperative_decode_refuses_more_ctas_than_fit_at_once(device, rng):
    _, (Q, K, V, T, L) = _problem(rng, [2048, 2048], 8, 8, 32, 16, "bfloat16")
    with pytest.raises(tf.TmaflowError, match=r"cooperative=True with 512 CTAs .* a cooperative grid runs all at once"):
        kernels.attention_decode(Q, K, V, T, L, num_splits=32, cooperative=True)


def test_slice_merge_refuses_more_ctas_than_fit_at_once(device, rng):
    """Its splits wait on each other: a grid that does not fit the GPU at once could hang."""
    _, (Q, K, V, T, L) = _problem(rng, [2048, 2048], 8, 8, 32, 16, "bfloat16")
    with pytest.raises(tf.TmaflowError, match=r"slice_merge=True with 512 CTAs .* every CTA must run at once"):
        kernels.attention_decode(Q, K, V, T, L, num_splits=32, slice_merge=True)


def test_slice_merge_checks_residency_by_the_kernels_occupancy(device, rng):
    """Four kv heads a CTA at three CTAs an SM by shared memory: their registers (155 under
    NVRTC 13.5) let two run, and a slice merge sized by shared memory alone would wait forever
    (review, session 19). Refused by name, or, where this compiler's registers let three run,
    right against float64: never a hang."""
    batch = device.sm_count * 3 // 12  # 2 CTAs a request x 6 splits: three an SM by shared memory
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, [1024] * batch, 32, 8, 128, 16, "bfloat16")
    out = poison(tf.empty(q.shape, "bfloat16"))
    try:
        kernels.attention_decode(Q, K, V, T, L, head_group=True, slice_merge=True, ctas_per_sm=3, num_splits=6,
                                 out=out)
    except tf.TmaflowError as e:
        assert re.search(r"slice_merge=True with \d+ CTAs .* the device runs \d+ of this kernel at once", str(e)), e
        return
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(128))
    assert rel_error(_download(out, "bfloat16"), ref) < 1e-2


def test_decode_plans_a_cluster_merge_for_one_short_request(device, rng):
    """Batch 1 at 1k, 8 kv heads, GQA 8:1 (the benchmark's row): 8 splits x 8 kv heads = 64
    CTAs, merged in clusters of 8 by default, against float64 and graph-free replays."""
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, [1024], 64, 8, 128, 16, "bfloat16")
    out = poison(tf.empty(q.shape, "bfloat16"))
    prepared = kernels.attention_decode.prepare(Q, K, V, T, L, out=out)
    prepared()
    assert prepared.launcher.config.cluster == (8, 1, 1), prepared.launcher.config
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(128))
    assert rel_error(_download(out, "bfloat16"), ref) < 1e-2


@pytest.mark.parametrize("heads_q,heads_kv,d,page,tokens,dtype", [
    (16, 2, 128, 16, None, "bfloat16"),   # GQA 8:1, page 16
    (8, 2, 128, 64, None, "bfloat16"),    # 4:1, page 64
    (8, 2, 64, 32, 2, "float16"),         # 2 new tokens x 4 query heads
])
def test_persistent_decode_walks_many_requests_bit_for_bit_as_one_cta_each(device, rng, heads_q, heads_kv, d, page,
                                                                        tokens, dtype):
    """300 requests x 2 kv heads: 600 items over at most the CTAs that fit at once, so a CTA
    walks two or three of them (lengths 0, 1, a page and one past it, ragged to 400; NaN in
    every row no request owns). Each item's math and order are the grid's own: the bits equal
    one split without walking, run to run."""
    lens = rng.integers(0, 401, size=300)
    lens[:8] = [0, 1, page - 1, page, page + 1, 64, 65, 0]
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, lens, heads_q, heads_kv, d, page, dtype,
                                                           tokens=tokens)
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(d))
    results = []
    for persistent in (True, True, False):
        out = poison(tf.empty(q.shape, dtype))
        kernels.attention_decode(Q, K, V, T, L, num_splits=1 if persistent is False else None, persistent=persistent,
                                 out=out)
        results.append(out.numpy())
        got = _download(out, dtype)
        assert rel_error(got, ref) < 1e-2, (persistent, rel_error(got, ref))
        assert not got[ref == 0].any(), "a token that sees no key gets zeros"
    np.testing.assert_array_equal(results[0].view(np.uint16), results[1].view(np.uint16))
    np.testing.assert_array_equal(results[0].view(np.uint16), results[2].view(np.uint16))


def test_decode_plans_persistent_for_many_short_requests(device, rng):
    """128 requests x 8 kv heads of up to 320 keys: one split, 1024 items in the CTA slots of
    two waves or more, so the automatic plan walks them (the benchmark's batch 128 at 1k)."""
    lens = rng.integers(1, 321, size=128)
    lens[:3] = [1, 320, 17]
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, lens, 32, 8, 128, 16, "bfloat16", width=20)
    out = poison(tf.empty(q.shape, "bfloat16"))
    prepared = kernels.attention_decode.prepare(Q, K, V, T, L, out=out)
    prepared()
    assert prepared.args[-1] == 128 and prepared.launcher.grid[0] < 1024, prepared.launcher.grid
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(128))
    assert rel_error(_download(out, "bfloat16"), ref) < 1e-2


@pytest.mark.parametrize("num_splits,evict_first", [(None, None), (16, False)])
def test_decode_of_one_request_of_128k_keys(device, rng, num_splits, evict_first):
    """131072 keys on one kv head, GQA 8:1: the automatic plan spreads it over 64 splits of
    2048 keys, evict-first (67 MB of K+V outgrow the L2), merged by slices in a cooperative
    grid; the merge stays exact to bf16."""
    (q, k, v, table, lens), (Q, K, V, T, L) = _problem(rng, [1 << 17], 8, 1, 128, 64, "bfloat16")
    out = poison(tf.empty(q.shape, "bfloat16"))
    kernels.attention_decode(Q, K, V, T, L, num_splits=num_splits, evict_first=evict_first, out=out, scale=0.1)
    ref = paged_decode_reference(q, k, v, table, lens, 0.1)
    assert rel_error(_download(out, "bfloat16"), ref) < 1e-2


@pytest.mark.parametrize("num_splits,evict_first,merge_kernel,slice_merge", [
    (5, None, None, None), (None, True, None, None), (5, None, True, None), (5, None, None, True)])
def test_decode_in_a_torch_cuda_graph_replays_with_new_lengths(device, rng, num_splits, evict_first, merge_kernel,
                                                                slice_merge):
    """Captured at the table's full width (the block-table window loaded with the length is
    the right one), replayed at lengths where it is not; the merge kernel's PDL launch and the
    slice merge's cooperative launch too."""
    torch = pytest.importorskip("torch")
    width, page = 40, 16
    (q, k, v, table, lens), _ = _problem(rng, [width * page] * 5, 32, 8, 128, page, "bfloat16")

    def tensor(x):
        return torch.from_numpy(np.asarray(x, np.float32)).to("cuda", torch.bfloat16)
    Q, K, V = tensor(q), tensor(k), tensor(v)
    T, L = torch.from_numpy(table).cuda(), torch.from_numpy(lens).cuda()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture: the split workspace is made here
        kernels.attention_decode(Q, K, V, T, L, num_splits=num_splits, evict_first=evict_first,
                                 merge_kernel=merge_kernel, slice_merge=slice_merge)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        out = kernels.attention_decode(Q, K, V, T, L, num_splits=num_splits, evict_first=evict_first,
                                       merge_kernel=merge_kernel, slice_merge=slice_merge)
    for replay in range(4):
        new = rng.integers(0, width * page + 1, size=5).astype(np.int32)
        new[replay] = [0, 1, 17, width * page][replay]
        L.copy_(torch.from_numpy(new))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref = paged_decode_reference(q, k, v, table, new, 1 / np.sqrt(128))
        got = out.float().cpu().numpy().astype(np.float64)
        assert rel_error(got, ref) < 1e-2, (replay, new, rel_error(got, ref))


def test_append_kv_then_decode_equals_the_reference(device, rng):
    lens = np.array([0, 5, 16, 31, 200], np.int32)
    heads_kv, d, page = 2, 64, 16
    (q, k, v, table, _), (Q, K, V, T, _) = _problem(rng, lens + 1, 8, heads_kv, d, page, "bfloat16")
    k_new, v_new = (bf16_to_float32(bf16_bits(rng.standard_normal((len(lens), heads_kv, d)))).astype(np.float64)
                    for _ in "kv")
    L = tf.from_numpy(lens)
    kernels.append_kv(K, V, T, L, _upload(k_new, "bfloat16"), _upload(v_new, "bfloat16"))
    for b, n in enumerate(lens):
        k[table[b, n // page], n % page], v[table[b, n // page], n % page] = k_new[b], v_new[b]
    np.testing.assert_array_equal(K.numpy().view(np.uint16), bf16_bits(k))  # that row and no other
    np.testing.assert_array_equal(V.numpy().view(np.uint16), bf16_bits(v))
    out = poison(tf.empty(q.shape, "bfloat16"))
    kernels.attention_decode(Q, K, V, T, tf.from_numpy(lens + 1), out=out)
    ref = paged_decode_reference(q, k, v, table, lens + 1, 1 / np.sqrt(d))
    assert rel_error(_download(out, "bfloat16"), ref) < 1e-2


def test_torch_compile_fullgraph_runs_append_and_decode_as_custom_ops(device, rng):
    torch = pytest.importorskip("torch")
    import tmaflow.torch  # noqa: F401  registers torch.ops.tmaflow.*
    lens = np.array([5, 40], np.int32)
    (q, k, v, table, _), _ = _problem(rng, lens + 1, 8, 2, 64, 16, "bfloat16")

    def tensor(x):
        return torch.from_numpy(np.asarray(x, np.float32)).to("cuda", torch.bfloat16)
    Q, K, V = tensor(q), tensor(k), tensor(v)
    T, L = torch.from_numpy(table).cuda(), torch.from_numpy(lens).cuda()
    k_new, v_new = (torch.randn(2, 2, 64, device="cuda").to(torch.bfloat16) for _ in "kv")

    def step(q, k_cache, v_cache, block_table, seq_lens, k_new, v_new):
        kernels.append_kv(k_cache, v_cache, block_table, seq_lens, k_new, v_new)
        return kernels.attention_decode(q, k_cache, v_cache, block_table, seq_lens + 1)

    got = torch.compile(step, fullgraph=True)(Q, K, V, T, L, k_new, v_new)
    for b, n in enumerate(lens):
        assert torch.equal(K[table[b, n // 16], n % 16], k_new[b]) and torch.equal(V[table[b, n // 16], n % 16], v_new[b])
    assert torch.equal(got, kernels.attention_decode(Q, K, V, T, L + 1))


@pytest.mark.parametrize("heads_q,heads_kv,d,page,tokens,dtype", [
    (16, 2, 128, 16, None, "bfloat16"),   # GQA 8:1, page 16: four page pieces a tile
    (8, 2, 128, 64, None, "float16"),     # 4:1, page 64: a piece is the tile
    (8, 2, 256, 16, 2, "bfloat16"),       # 2 new tokens x 4 query heads, four column blocks a box
])
@pytest.mark.parametrize("num_splits,persistent", [(1, False), (3, False), (None, True)])
def test_decode_stage_counts_and_wide_boxes_give_the_plans_bits(device, rng, heads_q, heads_kv, d, page, tokens, dtype,
                                                                 num_splits, persistent):
    """ctas_per_sm (1-3: six, three or two stages at head dim 128) and wide_box (one 4-D box a
    page piece) change where tiles lie and when they arrive, not the math or its order: equal
    bits to the default plan, near the float64 reference (lengths 0, 1, a page and one past it,
    ragged to 700; NaN in every row no request owns; outputs poisoned)."""
    lens = rng.integers(0, 701, size=40)
    lens[:8] = [0, 1, page - 1, page, page + 1, 64, 65, 700]
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, lens, heads_q, heads_kv, d, page, dtype,
                                                           tokens=tokens)
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(d))
    variants = [{}, {"wide_box": True}, {"ctas_per_sm": 1}, {"ctas_per_sm": 1, "wide_box": True}]
    if not persistent and d <= 128:
        variants += [{"ctas_per_sm": 3}, {"ctas_per_sm": 3, "wide_box": True}]
    results = []
    for options in variants:
        out = poison(tf.empty(q.shape, dtype))
        kernels.attention_decode(Q, K, V, T, L, num_splits=num_splits, persistent=persistent, out=out, **options)
        got = _download(out, dtype)
        assert rel_error(got, ref) < 1e-2, (options, rel_error(got, ref))
        assert not got[ref == 0].any(), "a token that sees no key gets zeros"
        results.append(out.numpy())
    for options, bits in zip(variants[1:], results[1:]):
        np.testing.assert_array_equal(bits.view(np.uint16), results[0].view(np.uint16), err_msg=str(options))


def test_decode_refuses_three_persistent_ctas_an_sm_at_head_dim_128(device, rng):
    _, (Q, K, V, T, L) = _problem(rng, [5, 77], 8, 2, 128, 16, "bfloat16")
    with pytest.raises(tf.TmaflowError, match=r"ctas=3 an SM at head_dim=128 persistent leaves 1 stage"):
        kernels.attention_decode(Q, K, V, T, L, persistent=True, ctas_per_sm=3)


def test_decode_three_ctas_an_sm_without_persistent_asked_falls_back(device, rng):
    """ctas_per_sm=3 at head dim 128 on a shape whose default would walk items (more items than
    CTA slots, one split): the persistent plan leaves one stage, so the default runs one item a
    CTA instead of refusing a call that never asked for persistence (a review found the raise)."""
    lens = [int(x) for x in rng.integers(1, 120, 132 * 3 // 8 + 40)]
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, lens, 16, 8, 128, 16, "bfloat16")
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(128))
    out = poison(tf.empty(q.shape, "bfloat16"))
    kernels.attention_decode(Q, K, V, T, L, num_splits=1, ctas_per_sm=3, out=out)
    assert rel_error(_download(out, "bfloat16"), ref) < 1e-2


@pytest.mark.parametrize("heads_q,heads_kv,d,page,tokens,dtype", [
    (32, 8, 128, 16, None, "bfloat16"),   # GQA 4:1, page 16: the benchmark's heads, two groups a request
    (64, 8, 128, 64, None, "float16"),    # 8:1, page 64: four 16-key steps a page
    (4, 4, 64, 256, 2, "bfloat16"),       # 1:1, 2 new tokens (causal among them), page 256
    (16, 4, 256, 16, 4, "float16"),       # 4 new tokens x 4 query heads: all 16 rows, four column blocks
    (64, 4, 128, 32, None, "bfloat16"),   # 16:1: every row of the mma
])
@pytest.mark.parametrize("num_splits,persistent,ctas", [(1, False, None), (3, False, None), (None, None, None),
                                                     (None, True, None), (None, None, 1), (2, False, 1)])
def test_head_group_decode_against_float64(device, rng, heads_q, heads_kv, d, page, tokens, dtype, num_splits,
                                           persistent, ctas):
    """head_group=True (four kv heads a CTA, a warp each; the splits' merge takes the group's
    heads in turn) near the float64 reference: lengths 0, 1, 15-17, a page and one past it,
    ragged to 900; NaN in every cache row no request owns; outputs poisoned; 150 requests so
    the persistent plan walks several items a CTA. Run twice: equal bits."""
    lens = rng.integers(0, 901, size=150)
    lens[:10] = [0, 1, 15, 16, 17, page - 1, page, page + 1, 65, 900]
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, lens, heads_q, heads_kv, d, page, dtype,
                                                           tokens=tokens)
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(d))
    results = []
    for _ in range(2):
        out = poison(tf.empty(q.shape, dtype))
        kernels.attention_decode(Q, K, V, T, L, num_splits=num_splits, persistent=persistent, head_group=True,
                                 ctas_per_sm=ctas, out=out)
        got = _download(out, dtype)
        assert rel_error(got, ref) < 1e-2, rel_error(got, ref)
        assert not got[ref == 0].any(), "a token that sees no key gets zeros"
        results.append(out.numpy())
    np.testing.assert_array_equal(results[0].view(np.uint16), results[1].view(np.uint16))


@pytest.mark.parametrize("heads_q,page", [(32, 16), (64, 64)])
def test_default_reads_four_kv_heads_a_cta_one_cta_an_sm_where_they_fill_the_sms(device, rng, heads_q, page):
    """Half the SMs' requests at 8 kv heads, head dim 128 (batch 66 on an H200, 57 on an H100:
    group_one_cta_default, a CTA of four kv heads on every SM): the default call near float64
    over ragged lengths (0, 1, a page and one past it, up to 3000), outputs poisoned, and
    bit-equal to the explicit head_group=True, ctas_per_sm=1 call."""
    from tmaflow.kernels.decode_plan import group_one_cta_default
    from tmaflow.runtime.device import current_device

    batch = current_device().sm_count // 2
    assert group_one_cta_default(batch, 8, 128, current_device().sm_count)
    lens = rng.integers(0, 3001, size=batch)
    lens[:6] = [0, 1, page, page + 1, 64, 3000]
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, lens, heads_q, 8, 128, page, "bfloat16")
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(128))
    results = []
    for options in ({}, {"head_group": True, "ctas_per_sm": 1}):
        out = poison(tf.empty(q.shape, "bfloat16"))
        kernels.attention_decode(Q, K, V, T, L, out=out, **options)
        got = _download(out, "bfloat16")
        assert rel_error(got, ref) < 1e-2, (options, rel_error(got, ref))
        assert not got[ref == 0].any(), "a token that sees no key gets zeros"
        results.append(out.numpy())
    np.testing.assert_array_equal(results[0].view(np.uint16), results[1].view(np.uint16))


def test_head_group_decode_of_one_long_request_merges_many_splits(device, rng):
    """Batch 1, 8 kv heads, 20000 keys: the automatic splits (up to 64) of two head groups,
    each merged by its last CTA head after head, against float64 and the default plan."""
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, [20000], 32, 8, 128, 16, "bfloat16")
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(128))
    for options in ({"head_group": True}, {"head_group": True, "num_splits": 64}, {}):
        out = poison(tf.empty(q.shape, "bfloat16"))
        kernels.attention_decode(Q, K, V, T, L, out=out, **options)
        assert rel_error(_download(out, "bfloat16"), ref) < 1e-2, (options, rel_error(_download(out, "bfloat16"), ref))


@pytest.mark.parametrize("lens,heads_q,heads_kv,page,tokens,dtype,options", [
    ([20000], 32, 8, 16, None, "bfloat16", {"ctas_per_sm": 1}),            # batch 1, one CTA an SM: 2 x 63 splits
    ([0, 1, 15, 17, 100, 1000], 32, 4, 64, None, "float16", {"num_splits": 7}),  # splits without keys
    ([3, 2500, 1], 16, 8, 16, 2, "bfloat16", {"num_splits": 13}),          # 2 new tokens x 1 query head a kv head
])
def test_head_group_slice_merge_against_float64_and_bit_equal_to_its_counter_merge(device, rng, lens, heads_q,
                                                                                   heads_kv, page, tokens, dtype,
                                                                                   options):
    """Four kv heads a CTA, every split merging its share of the group's columns: against
    float64, the same bits launch after launch and as the group's counter merge."""
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, lens, heads_q, heads_kv, 128, page, dtype,
                                                           tokens=tokens)
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(128))

    def run(out, slice_merge):
        prepared = kernels.attention_decode.prepare(Q, K, V, T, L, head_group=True, slice_merge=slice_merge, out=out,
                                                    **options)
        config = getattr(prepared.launcher, "launcher", prepared.launcher).config
        assert config.cooperative is slice_merge and config.grid[1] == heads_kv // 4, config
        prepared()

    _twice_then_the_counter_merge(run, ref, q.shape, dtype)


@pytest.mark.parametrize("lens,heads_q,heads_kv,d,page,tokens,dtype,options", [
    ([0, 1, 15, 16, 17, 100, 1000], 32, 4, 128, 16, None, "bfloat16", {"num_splits": 1}),
    ([0, 1, 15, 16, 17, 100, 1000], 32, 4, 128, 16, None, "bfloat16", {"num_splits": 7}),   # the counter's merge
    ([1, 63, 64, 65, 333, 2049, 5], 16, 4, 128, 64, None, "bfloat16", {"num_splits": 4, "cluster_merge": True}),
    ([1, 63, 64, 65, 333, 2049, 5], 8, 2, 80, 16, None, "float16", {"num_splits": 3, "cluster_merge": True}),  # O's
    # 16-float swizzle (head dim not a multiple of 32) read across the cluster
    ([0, 1, 2, 3, 17, 80, 1000], 8, 2, 128, 16, 4, "bfloat16", {"num_splits": 5, "slice_merge": True}),
    ([4000, 129], 16, 1, 256, 32, None, "float16", {"num_splits": 64}),                      # 4 rounds of merge
    ([5, 77, 300, 1], 8, 2, 96, 16, None, "float16", {"num_splits": 3, "ctas_per_sm": 3}),   # two stages
    ([8192], 32, 8, 128, 16, None, "bfloat16", {}),                                          # the b1 8k 4:1 row
])
def test_warp_slices_decode_against_float64_and_bit_equal_to_the_turns(device, rng, lens, heads_q, heads_kv, d, page,
                                                                        tokens, dtype, options):
    """The warps' merge from a slice a warp (the default) and a warp at a time (warp_slices=False):
    against float64 (lengths 0 and 1, ragged, NaN in every row no request owns, splits with no
    key, 4 new tokens), the same bits, under each merge of the splits."""
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, lens, heads_q, heads_kv, d, page, dtype,
                                                           tokens=tokens)
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(d))
    results = []
    for warp_slices in (None, False):
        out = poison(tf.empty(q.shape, dtype))
        kernels.attention_decode(Q, K, V, T, L, warp_slices=warp_slices, out=out, **options)
        got = _download(out, dtype)
        assert rel_error(got, ref) < 1e-2, (warp_slices, rel_error(got, ref))
        assert not got[ref == 0].any(), "a token that sees no key gets zeros"
        results.append(out.numpy())
    np.testing.assert_array_equal(results[0].view(np.uint16), results[1].view(np.uint16))


@pytest.mark.parametrize("lens,heads_q,heads_kv,d,page,tokens,dtype,num_splits", [
    ([0, 1, 15, 16, 17, 100, 1000], 32, 4, 128, 16, None, "bfloat16", 8),   # GQA 8:1, splits with no key
    ([8192], 32, 8, 128, 16, None, "bfloat16", None),                       # the b1 8k 4:1 row's 32 splits
    ([1, 63, 64, 65, 333, 2049, 5], 16, 4, 128, 64, None, "float16", 3),
    ([0, 1, 2, 3, 17, 80, 1000], 8, 2, 128, 16, 4, "bfloat16", 5),          # 4 new tokens x 4 query heads
    ([4000, 129], 16, 1, 256, 32, None, "bfloat16", 64),                    # 64 splits, four column blocks
    ([5, 77, 300, 1], 8, 2, 96, 16, None, "float16", 7),
    ([3000, 2], 64, 4, 64, 64, 1, "bfloat16", 2),                           # 16 rows, head dim 64
])
def test_merge_kernel_decode_against_float64_and_bit_equal_to_the_counter_merge(device, rng, lens, heads_q, heads_kv,
                                                                              d, page, tokens, dtype, num_splits):
    """The splits merged by a second kernel launched with PDL: against float64, the same bits
    launch after launch (outputs poisoned each time) and as the counter's merge."""
    (q, k, v, table, host_lens), (Q, K, V, T, L) = _problem(rng, lens, heads_q, heads_kv, d, page, dtype,
                                                           tokens=tokens)
    ref = paged_decode_reference(q, k, v, table, host_lens, 1 / np.sqrt(d))
    _twice_then_the_counter_merge(
        lambda out, merge_kernel: kernels.attention_decode(Q, K, V, T, L, num_splits=num_splits,
                                                           merge_kernel=merge_kernel, cluster_merge=False, out=out),
        ref, q.shape, dtype)


@pytest.mark.parametrize("options", [{}, {"num_splits": 5}, {"num_splits": 4, "cluster_merge": True},
                                     {"num_splits": 3, "merge_kernel": True}, {"num_splits": 2, "head_group": True},
                                     {"persistent": True}, {"num_splits": 5, "slice_merge": True}])
def test_pdl_decode_chain_sees_every_write_before_it(device, rng, options):
    """pdl=True, launched back to back with no host sync: append_kv writes each request's new
    key and value, a decode reads them, and a second decode's q is the first one's output (the
    first lets it start early). Each waits for the kernel before it: float64 references, and
    the bits of the same chain without PDL."""
    lens = np.array([0, 5, 16, 31, 200, 1000], np.int32)
    heads_q, heads_kv, d, page = 16, 4, 128, 16
    (q, k, v, table, _), (Q, _, _, T, _) = _problem(rng, lens + 1, heads_q, heads_kv, d, page, "bfloat16")
    k_new, v_new = (bf16_to_float32(bf16_bits(rng.standard_normal((len(lens), heads_kv, d)))).astype(np.float64)
                    for _ in "kv")
    k_old, v_old = k.copy(), v.copy()
    for b, n in enumerate(lens):
        k[table[b, n // page], n % page], v[table[b, n // page], n % page] = k_new[b], v_new[b]
    ref1 = paged_decode_reference(q, k, v, table, lens + 1, 1 / np.sqrt(d))
    L, L1 = tf.from_numpy(lens), tf.from_numpy(lens + 1)
    Kn, Vn = _upload(k_new, "bfloat16"), _upload(v_new, "bfloat16")
    results = []
    for pdl in (None, True):
        K, V = _upload(k_old, "bfloat16"), _upload(v_old, "bfloat16")
        out1, out2 = poison(tf.empty(q.shape, "bfloat16")), poison(tf.empty(q.shape, "bfloat16"))
        kernels.append_kv(K, V, T, L, Kn, Vn)
        kernels.attention_decode(Q, K, V, T, L1, out=out1, pdl=pdl, **options)
        kernels.attention_decode(out1, K, V, T, L1, out=out2, pdl=pdl, **options)
        got1, got2 = _download(out1, "bfloat16"), _download(out2, "bfloat16")
        ref2 = paged_decode_reference(got1, k, v, table, lens + 1, 1 / np.sqrt(d))
        assert rel_error(got1, ref1) < 1e-2 and rel_error(got2, ref2) < 1e-2, (pdl, rel_error(got1, ref1),
                                                                              rel_error(got2, ref2))
        results.append(np.concatenate([out1.numpy(), out2.numpy()]))
    np.testing.assert_array_equal(results[0].view(np.uint16), results[1].view(np.uint16))
