"""kernels.attention_decode and append_kv without a GPU: argument checks, the plan (stages,
CTAs an SM, splits), the kernels compile for sm_90a, and the float64 reference the GPU tests
use."""
import itertools

import numpy as np
import pytest

import tmaflow as tf
from tmaflow import kernels
from tmaflow.kernels.decode_entry import MERGE_THREADS
from tmaflow.kernels.decode_plan import (MAX_SPLITS, choose_splits, cluster_merge_default, decode_defaults, decode_plan,
                                         evict_first_default, group_one_cta_default, head_group_default,
                                         persistent_default, slice_merge_default)
from tmaflow.kernels.registry import get_kernel
from tmaflow.runtime.memory import DeviceArray

from decode_reference import paged_decode_reference, random_paged_cache

_FAKE = itertools.count(1 << 32, 1 << 26)


def arr(shape, dtype="bfloat16", strides=None, offset=0):
    return DeviceArray(next(_FAKE) + offset, shape, dtype, strides)  # one range each: no aliasing


def decode_args(**change):
    args = {"q": arr((2, 8, 128)), "k_cache": arr((10, 16, 2, 128)), "v_cache": arr((10, 16, 2, 128)),
            "block_table": arr((2, 5), "int32"), "seq_lens": arr((2,), "int32")}
    kwargs = {name: change.pop(name) for name in list(change) if name not in args}
    args.update(change)
    return args, kwargs


@pytest.mark.parametrize("change,match", [
    ({"q": arr((2, 8, 128, 1))}, r"attention_decode: q's head_dim=1 but the caches' is 128"),
    ({"q": arr((2, 8))}, r"attention_decode: q must be \(batch, heads, head_dim\) or \(batch, tokens, heads, head_dim\); got shape \(2, 8\)"),
    ({"q": arr((2, 9, 2, 128))}, r"9 new tokens a request with 1 query heads a kv head make 9 rows; give 1 to 8 tokens"),
    ({"q": arr((2, 3, 16, 128))}, r"3 new tokens a request with 8 query heads a kv head make 24 rows; .* at most 16 rows"),
    ({"q": arr((2, 8, 128), "float32")}, r"q must be bfloat16 or float16 \(got float32\)"),
    ({"v_cache": arr((10, 16, 2, 128), "float16")}, r"v_cache is float16 but q is bfloat16"),
    ({"k_cache": arr((10, 16, 2, 128), strides=(16 * 2 * 256 * 2, 2 * 256 * 2, 256 * 2, 2))},
     r"k_cache must be contiguous"),
    ({"q": arr((2, 8, 128), offset=8)}, r"q at 0x[0-9a-f]+ must be 16-byte aligned"),
    ({"v_cache": arr((10, 32, 2, 128))}, r"k_cache \(10, 16, 2, 128\) and v_cache \(10, 32, 2, 128\) must be one 4-D shape"),
    ({"k_cache": arr((10, 16, 2, 64)), "v_cache": arr((10, 16, 2, 64))}, r"q's head_dim=128 but the caches' is 64"),
    ({"q": arr((2, 8, 72)), "k_cache": arr((10, 16, 2, 72)), "v_cache": arr((10, 16, 2, 72))},
     r"head_dim=72 must be a multiple of 16 from 32 to 256"),
    ({"q": arr((2, 8, 272)), "k_cache": arr((10, 16, 2, 272)), "v_cache": arr((10, 16, 2, 272))},
     r"head_dim=272 must be a multiple of 16 from 32 to 256"),
    ({"k_cache": arr((10, 24, 2, 128)), "v_cache": arr((10, 24, 2, 128))}, r"page_size=24 \(k_cache.shape\[1\]\) must be a power of two from 16 to 256"),
    ({"k_cache": arr((10, 8, 2, 128)), "v_cache": arr((10, 8, 2, 128))}, r"page_size=8"),
    ({"q": arr((2, 6, 128)), "k_cache": arr((10, 16, 4, 128)), "v_cache": arr((10, 16, 4, 128))},
     r"heads_q=6 must be a multiple of heads_kv=4"),
    ({"q": arr((2, 32, 128)), "k_cache": arr((10, 16, 1, 128)), "v_cache": arr((10, 16, 1, 128))},
     r"heads_q=32 must be a multiple of heads_kv=1 at most 16 times it"),
    ({"k_cache": arr((0, 16, 2, 128)), "v_cache": arr((0, 16, 2, 128))}, r"k_cache has 0 pages of 16 keys"),
    ({"block_table": arr((2, 5), "int64")}, r"block_table must be int32 \(got int64\)"),
    ({"seq_lens": arr((2,), "uint32")}, r"seq_lens must be int32 \(got uint32\)"),
    ({"block_table": arr((3, 5), "int32")}, r"block_table \(3, 5\) must be \(batch=2, max_pages_per_seq\)"),
    ({"seq_lens": arr((2, 1), "int32")}, r"seq_lens \(2, 1\) must be \(batch=2,\)"),
    ({"block_table": arr((2, 5), "int32", strides=(40, 4))}, r"block_table must be contiguous"),
    ({"scale": 0.0}, r"attention_decode: scale=0.0 must be a positive finite float"),
    ({"num_splits": 0}, rf"attention_decode: num_splits=0 must be .*{MAX_SPLITS}"),
    ({"num_splits": MAX_SPLITS + 1}, rf"num_splits={MAX_SPLITS + 1} must be"),
    ({"num_splits": 2.5}, r"num_splits=2.5"),
    ({"evict_first": "yes"}, r"attention_decode: evict_first='yes' must be"),
    ({"evict_first": 1}, r"attention_decode: evict_first=1 must be"),
    ({"persistent": "no"}, r"attention_decode: persistent='no' must be"),
    ({"persistent": True, "num_splits": 2}, r"attention_decode: num_splits=2 with persistent=True; .* give num_splits None or 1"),
    ({"slice_merge": 1}, r"attention_decode: slice_merge=1 must be"),
    ({"l2_promotion": "512B"}, r"attention_decode: l2_promotion='512B' must be"),
    ({"warp_slices": 1}, r"attention_decode: warp_slices=1 must be"),
    ({"merge_kernel": "yes"}, r"attention_decode: merge_kernel='yes' must be"),
    ({"pdl": 1}, r"attention_decode: pdl=1 must be"),
    ({"cooperative": "yes"}, r"attention_decode: cooperative='yes' must be"),
    ({"cooperative": True, "pdl": True}, r"attention_decode: cooperative=True with pdl=True; .* leave one None or False"),
    ({"cooperative": True, "num_splits": 4, "cluster_merge": True},
     r"attention_decode: cooperative=True with cluster_merge=True; .* leave cluster_merge None or False"),
    ({"merge_kernel": True, "num_splits": 1}, r"attention_decode: merge_kernel=True with num_splits=1, .* give num_splits None or 2-64"),
    ({"merge_kernel": True, "num_splits": 4, "cluster_merge": True}, r"merge_kernel=True with num_splits=4, cluster_merge=True"),
    ({"merge_kernel": True, "head_group": True}, r"merge_kernel=True .*head_group=True; the merge kernel merges"),
    ({"slice_merge": True, "num_splits": 1}, r"attention_decode: slice_merge=True with num_splits=1, .* give num_splits None or 2-64"),
    ({"slice_merge": True, "num_splits": 4, "cluster_merge": True}, r"attention_decode: slice_merge=True .*cluster_merge=True"),
    ({"out": arr((2, 8, 64))}, r"attention_decode: out must be a \(2, 8, 128\) bfloat16 array"),
    ({"out": arr((2, 8, 128), offset=2)}, r"attention_decode: out must be contiguous and 16-byte aligned \(strides \(2048, 256, 2\) B, at 0x[0-9a-f]+2\)"),
])
def test_attention_decode_refuses_bad_arguments_by_name(change, match):
    args, kwargs = decode_args(**change)
    with pytest.raises(tf.TmaflowError, match=match):
        kernels.attention_decode(*args.values(), **kwargs)


def test_attention_decode_refuses_out_aliasing_q():
    args, _ = decode_args()
    with pytest.raises(tf.TmaflowError, match=r"attention_decode: out .*q"):
        kernels.attention_decode(*args.values(), out=args["q"])


@pytest.mark.parametrize("change,match", [
    ({"k_new": arr((2, 2, 128), "float16")}, r"append_kv: k_cache is bfloat16 but k_new is float16"),
    ({"k_new": arr((2, 4, 128)), "v_new": arr((2, 4, 128))}, r"append_kv: k_new has 4 heads but the caches have 2"),
    ({"v_new": arr((2, 2, 64))}, r"append_kv: v_new \(2, 2, 64\) bfloat16 at 0x[0-9a-f]+ must be k_new's \(2, 2, 128\)"),
    ({"k_new": arr((2, 2, 2, 128))}, r"append_kv: k_new must be \(batch, heads, head_dim\); got shape"),
    ({"seq_lens": arr((2,), "int64")}, r"append_kv: seq_lens must be int32"),
])
def test_append_kv_refuses_bad_arguments_by_name(change, match):
    args = {"k_cache": arr((10, 16, 2, 128)), "v_cache": arr((10, 16, 2, 128)),
            "block_table": arr((2, 5), "int32"), "seq_lens": arr((2,), "int32"),
            "k_new": arr((2, 2, 128)), "v_new": arr((2, 2, 128)), **change}
    with pytest.raises(tf.TmaflowError, match=match):
        kernels.append_kv(*args.values())


def test_append_kv_refuses_new_rows_inside_the_cache():
    k = arr((10, 16, 2, 128))
    inside = DeviceArray(k.ptr + 4096, (2, 2, 128), "bfloat16")
    with pytest.raises(tf.TmaflowError, match=r"append_kv: .*k_new"):
        kernels.append_kv(k, arr((10, 16, 2, 128)), arr((2, 5), "int32"), arr((2,), "int32"), inside,
                          arr((2, 2, 128)))


@pytest.mark.parametrize("d,ctas,stages", [(32, 2, 6), (64, 2, 6), (96, 2, 3), (128, 2, 3), (192, 2, 2),
                                           (256, 1, 3)])
@pytest.mark.parametrize("page", [16, 64, 256])
def test_decode_plan_fits_shared_memory(d, page, ctas, stages):
    """Two CTAs an SM where two stages fit in half the shared memory (head dims up to 192), else
    one with the stages all of it takes; a box is a page or a tile's 64 keys of one, by 64
    columns (tiles pad the head dim to whole boxes)."""
    spec, layout, got_ctas = decode_plan(d, page)
    pipe = layout.items[0]
    assert (got_ctas, pipe.stages) == (ctas, stages)
    assert (layout.total_bytes + 1024) * ctas <= 228 * 1024
    assert spec.box == (min(page, 64), 1, 64) and pipe.tx_bytes == 2 * 64 * (-(-d // 64) * 64) * 2


@pytest.mark.parametrize("batch,heads_kv,context,splits", [
    (1, 8, 128 * 1024, 32),   # one long request: 256 CTAs in 264 slots (2 a SM on 132 SMs)
    (1, 1, 128 * 1024, MAX_SPLITS),
    (64, 8, 8192, 1),         # 512 CTAs fill two waves of 264
    (16, 8, 8192, 2),         # 256 of 264 slots; three splits would leave a second wave half empty
    (4, 8, 8192, 8),
    (4, 8, 1024, 8),          # 256 CTAs of two tiles each
    (1, 8, 1024, 8),          # two tiles a split at least: 64 CTAs, each with its copies in flight at once
    (1, 8, 300, 3),           # no split shorter than 128 keys
    (1, 8, 16, 1),
    (128, 8, 1024, 1),        # 1024 CTAs: four waves, 97% full
])
def test_choose_splits_fills_the_gpu(batch, heads_kv, context, splits):
    assert choose_splits(batch, heads_kv, context, 132, 2) == splits


@pytest.mark.parametrize("d,page,fp16,evict_first", [(64, 16, 0, 1), (128, 64, 1, 0), (128, 16, 0, 1),
                                                     (256, 256, 0, 0), (96, 32, 0, 1), (32, 16, 1, 0),
                                                     (192, 128, 0, 1)])
def test_decode_kernel_compiles_for_sm90a_without_spills(d, page, fp16, evict_first):
    """mma.sync and ldmatrix on TMA-loaded pages (with an L2 policy when evict-first), the
    splits' merge by bulk copies after one acquire-release count, no local memory."""
    _, layout, _ = decode_plan(d, page)
    k = get_kernel("attention_decode", layout, file="decode",
                   defines={"HEAD_DIM": d, "PAGE_SIZE": page, "MAX_SPLITS": MAX_SPLITS,
                            **({"FP16": 1} if fp16 else {}), **({"EVICT_FIRST": 1} if evict_first else {})})
    sass = k.sass()
    assert k.resources.spills == 0 and k.resources.stack_frame == 0, k.resources
    assert "HMMA" in sass and "LDSM" in sass and "UBLKCP.S.G" in sass
    loads = [line for line in sass.splitlines() if "UTMALDG.3D" in line]
    assert loads and all(("desc[" in line) == bool(evict_first) for line in loads), loads
    assert "MEMBAR.SC.GPU" not in sass and sass.count("ATOMG.E.ADD") == 1  # no sequentially consistent fence
    assert len(k.params) == 15


@pytest.mark.parametrize("d,page,fp16,evict_first", [(128, 16, 0, 1), (128, 64, 1, 0), (64, 16, 0, 0),
                                                     (96, 32, 0, 1), (32, 256, 1, 1)])
def test_persistent_decode_kernel_compiles_without_spills_or_a_split_merge(d, page, fp16, evict_first):
    """One split: no count, no bulk copies of partials; the warps merge in their own buffer,
    and two CTAs still fit an SM with the stages of the one-CTA-an-item plan."""
    _, layout, ctas = decode_plan(d, page, persistent=True)
    _, plain, plain_ctas = decode_plan(d, page)
    assert (ctas, layout.items[0].stages) == (plain_ctas, plain.items[0].stages) == (2, plain.items[0].stages)
    k = get_kernel("attention_decode", layout, file="decode",
                   defines={"HEAD_DIM": d, "PAGE_SIZE": page, "MAX_SPLITS": MAX_SPLITS, "PERSISTENT": 1,
                            **({"FP16": 1} if fp16 else {}), **({"EVICT_FIRST": 1} if evict_first else {})})
    sass = k.sass()
    assert k.resources.spills == 0 and k.resources.stack_frame == 0, k.resources
    assert "HMMA" in sass and "UTMALDG.3D" in sass
    assert "ATOMG" not in sass and "UBLKCP" not in sass
    assert len(k.params) == 15


@pytest.mark.parametrize("d,page,fp16,evict_first", [(128, 16, 0, 0), (128, 64, 1, 1), (64, 16, 0, 1),
                                                     (32, 256, 1, 0), (256, 16, 0, 0), (96, 32, 0, 1)])
def test_cluster_merge_decode_kernel_compiles_without_spills_a_counter_or_a_workspace(d, page, fp16, evict_first):
    """The splits merge through distributed shared memory: no atomic count, no bulk copy of
    partials, no global store but the output's; two cluster barriers (each warp's arrive and wait)."""
    _, layout, _ = decode_plan(d, page)
    k = get_kernel("attention_decode", layout, file="decode",
                   defines={"HEAD_DIM": d, "PAGE_SIZE": page, "MAX_SPLITS": MAX_SPLITS, "CLUSTER_MERGE": 1,
                            **({"FP16": 1} if fp16 else {}), **({"EVICT_FIRST": 1} if evict_first else {})})
    sass = k.sass()
    assert k.resources.spills == 0 and k.resources.stack_frame == 0, k.resources
    assert "HMMA" in sass and "UTMALDG.3D" in sass
    assert "ATOMG" not in sass and "UBLKCP" not in sass
    assert "UCGABAR_ARV" in sass and "UCGABAR_WAIT" in sass
    assert len(k.params) == 15


@pytest.mark.parametrize("d,page,fp16,evict_first", [(128, 16, 0, 0), (128, 64, 1, 1), (64, 16, 0, 1),
                                                     (32, 256, 1, 0), (256, 16, 0, 0), (96, 32, 0, 1)])
def test_slice_merge_decode_kernel_compiles_without_spills_or_bulk_copies(d, page, fp16, evict_first):
    """Every split merges its columns: two counts (arrive, leave), an acquire load to wait on,
    no bulk copy of partials, no sequentially consistent fence, no cluster."""
    _, layout, _ = decode_plan(d, page)
    k = get_kernel("attention_decode", layout, file="decode",
                   defines={"HEAD_DIM": d, "PAGE_SIZE": page, "MAX_SPLITS": MAX_SPLITS, "SLICE_MERGE": 1,
                            **({"FP16": 1} if fp16 else {}), **({"EVICT_FIRST": 1} if evict_first else {})})
    sass = k.sass()
    assert k.resources.spills == 0 and k.resources.stack_frame == 0, k.resources
    assert "HMMA" in sass and "UTMALDG.3D" in sass
    assert "UBLKCP" not in sass and "UCGABAR" not in sass and "MEMBAR.SC.GPU" not in sass
    assert sass.count("ATOMG.E.ADD") == 2 and "LDG.E.STRONG.GPU" in sass, [l for l in sass.splitlines() if "ATOMG" in l or "STRONG" in l]
    assert len(k.params) == 15


@pytest.mark.parametrize("batch,heads_kv,splits,expected", [
    (1, 8, 8, True),      # batch 1 at 1k: 64 CTAs
    (2, 8, 8, True),      # 128 CTAs on 132 SMs
    (4, 8, 8, False),     # 256 CTAs: clusters of 8 at two an SM may not all fit the GPCs at once
    (16, 8, 2, True),     # 256 CTAs in pairs: a pair fits an SM
    (64, 8, 2, True),
    (1, 8, 32, False),    # over a portable cluster
    (16, 8, 1, False),    # nothing to merge
])
def test_cluster_merge_when_few_ctas_split_in_portable_clusters_or_two_splits(batch, heads_kv, splits, expected):
    assert cluster_merge_default(batch, heads_kv, splits, 132) is expected


def test_cluster_merge_needs_two_to_sixteen_splits():
    args, _ = decode_args()
    for extra in ({}, {"num_splits": 1}, {"num_splits": 17}, {"persistent": True}):
        with pytest.raises(tf.TmaflowError, match=r"attention_decode: cluster_merge=True with num_splits=.* a cluster "
                                                  r"merges 2 to 16 splits"):
            kernels.attention_decode(*args.values(), cluster_merge=True, **extra)
    with pytest.raises(tf.TmaflowError, match=r"attention_decode: cluster_merge='yes' must be"):
        kernels.attention_decode(*args.values(), cluster_merge="yes")


@pytest.mark.parametrize("batch,heads_kv,d,splits,expected", [
    (128, 8, 128, 1, True),    # 1024 items in 264 slots
    (33, 8, 128, 1, False),    # 264: one wave
    (34, 8, 128, 1, True),
    (64, 8, 128, 2, False),    # split requests merge across CTAs
    (128, 8, 192, 1, False),   # one CTA an SM at head dim 192 with the warps' buffer
])
def test_persistent_once_one_split_leaves_several_waves(batch, heads_kv, d, splits, expected):
    assert persistent_default(batch, heads_kv, d, splits, 132, 2) is expected


@pytest.mark.parametrize("context,batch,expected", [
    (8192, 1, True),      # 33.5 MB of K+V at 8 kv heads: past half a 50 MB L2
    (4096, 1, False),     # 16.8 MB: kept in L2 for the next call
    (32768, 1, True),     # 134 MB
    (1024, 4, False),
    (1024, 16, True),     # 67 MB
    (1024, 64, True),     # 268 MB: 5.1 L2s
    (131072, 1, False),   # 537 MB: past 8 L2s, normal priority streams faster
    (8192, 16, False),
    (32768, 16, False),   # 2.1 GB
])
def test_evict_first_once_the_caches_outgrow_half_the_l2_up_to_eight_of_them(context, batch, expected):
    assert evict_first_default(batch, 8, 128, context, 2, 50 * 1024 * 1024) is expected
    assert evict_first_default(batch, 8, 128, context, 2, 4 * 2 * batch * 8 * 128 * context) is False


@pytest.mark.parametrize("batch,items,splits,ctas_per_sm,expected", [
    (1, 8, 32, 2, True),      # batch 1 at 8k-128k: 256 CTAs in 264 slots
    (1, 8, 16, 1, True),      # 128 CTAs of six stages on 132 SMs
    (1, 8, 8, 2, False),      # below 16 splits: the cluster or the counter merge
    (2, 8, 16, 2, True),
    (4, 8, 16, 2, False),     # 512 CTAs: not all at once
    (1, 8, 48, 3, True),      # 384 of 396
    (1, 1, 64, 2, True),
])
def test_slice_merge_where_many_splits_all_fit_at_once(batch, items, splits, ctas_per_sm, expected):
    assert slice_merge_default(batch, items, splits, 132, ctas_per_sm) is expected


@pytest.mark.parametrize("batch,context,options,expected", [
    (1, 8192, {}, (32, True, False)),                                  # the b1 8k row: slices
    (1, 131072, {}, (32, True, False)),
    (1, 1024, {}, (8, False, True)),                                   # clusters of 8 at 1k
    (1, 8192, {"slice_merge": False}, (32, False, False)),             # the counter merge, as asked
    (1, 8192, {"num_splits": 16, "ctas": 1}, (16, True, False)),
    (16, 8192, {}, (2, False, True)),                                  # two splits: merged in pairs
    (1, 8192, {"persistent": True}, (1, False, False)),
])
def test_decode_defaults_plan_the_slice_merge_for_batch_one(batch, context, options, expected):
    """(splits, slice merge, cluster merge) at 8 kv heads, head dim 128, page 16, on 132 SMs."""
    from types import SimpleNamespace
    plan = decode_defaults(batch, 8, 128, 16, context, SimpleNamespace(sm_count=132, l2_bytes=50 << 20), **options)
    assert (plan.splits, plan.slice_merge, plan.cluster_merge) == expected


@pytest.mark.parametrize("batch,context,heads_kv,d,options,expected", [
    (64, 8192, 8, 64, {}, (True, 2, True, False)),          # head dim 64, b64 8k: four kv heads a CTA, slices
    (64, 32768, 8, 64, {}, (True, 2, True, False)),
    (64, 1024, 8, 64, {}, (False, 1, False, True)),         # short contexts keep the persistent walk
    (64, 8192, 8, 128, {}, (True, 1, False, False)),        # head dim 128: one group a CTA an SM instead
    (64, 8192, 8, 128, {"persistent": True}, (False, 1, False, True)),   # as asked
    (64, 8192, 8, 128, {"head_group": False}, (False, 1, False, True)),
    (64, 8192, 8, 128, {"ctas": 2}, (False, 1, False, True)),   # a CTA count given keeps the one-head plan
    (64, 16384, 6, 128, {"persistent": True}, (False, 1, False, True)),  # kv heads not in fours: no groups
    (16, 8192, 8, 128, {}, (False, 2, False, False)),       # not persistent: pairs, as planned
    (64, 8192, 8, 64, {"clusters": False}, (True, 2, True, False)),      # a cooperative launch's: the same plan
    (16, 8192, 8, 128, {"clusters": False}, (False, 2, False, False)),   # ... without the pairs' clusters
])
def test_decode_defaults_take_head_groups_merged_by_slices_over_a_persistent_walk(batch, context, heads_kv, d, options,
                                                                                 expected):
    """(head group, splits, slice merge, persistent) at page 16 on 132 SMs."""
    from types import SimpleNamespace
    plan = decode_defaults(batch, heads_kv, d, 16, context, SimpleNamespace(sm_count=132, l2_bytes=50 << 20),
                           **options)
    assert (plan.head_group, plan.splits, plan.slice_merge, plan.persistent) == expected
    assert not (plan.cluster_merge and options.get("clusters") is False)
    if plan.slice_merge:  # the cooperative launch's condition: every CTA at once
        assert batch * plan.items * plan.splits <= 132 * plan.ctas_per_sm


@pytest.mark.parametrize("batch,heads_kv,sm_count,expected", [
    (64, 8, 132, True),      # 128 four-head CTAs: 97% of 132 SMs, one split
    (63, 8, 132, True),      # 126: 95.5%
    (66, 8, 132, True),      # 132: every SM
    (62, 8, 132, False),     # 124: 94%
    (67, 8, 132, False),     # 134: a second wave (at 128, two CTAs an SM: head_group_default's)
    (16, 32, 132, True),     # 32 kv heads: the same 128 groups
    (64, 6, 132, False),     # kv heads not in fours
    (56, 8, 114, True),      # an H100's 114 SMs: 112 groups
    (64, 8, 114, False),
])
def test_one_head_group_a_cta_an_sm_where_the_groups_fill_one_wave(batch, heads_kv, sm_count, expected):
    """group_one_cta_default: four kv heads a CTA of six stages, one CTA an SM, where those
    CTAs fill 95% of the SMs unsplit; decode_defaults plans it only when no option is given
    (head dim 128, any context: measured 1k-32k)."""
    from types import SimpleNamespace
    assert group_one_cta_default(batch, heads_kv, 128, sm_count) is expected
    assert group_one_cta_default(batch, heads_kv, 64, sm_count) is False  # measured at head dim 128 only
    device = SimpleNamespace(sm_count=sm_count, l2_bytes=50 << 20)
    for context in (1024, 8192, 131072):
        plan = decode_defaults(batch, heads_kv, 128, 16, context, device)
        if expected:
            assert (plan.head_group, plan.ctas, plan.ctas_per_sm, plan.splits, plan.persistent, plan.slice_merge) == \
                (True, 1, 1, 1, False, False), (context, vars(plan))
        else:
            assert plan.ctas is None and plan.ctas_per_sm == 2, (context, vars(plan))
    if expected:  # any option given keeps the rules it had
        for options in ({"num_splits": 1}, {"persistent": False}, {"ctas": 1}, {"head_group": True},
                        {"slice_merge": False}, {"wide_box": True}):
            assert decode_defaults(batch, heads_kv, 128, 16, 8192, device, **options).ctas == options.get("ctas"), \
                options


def test_every_decode_plan_keeps_the_merge_region_whole():
    """The splits' merge reuses the K tiles of every stage and then the V tiles as one region:
    the plan refuses a layout where they are apart (it would be a wrong merge, not an error)."""
    for d, page in itertools.product(range(32, 257, 16), (16, 32, 64, 128, 256)):
        _, layout, _ = decode_plan(d, page)
        pipe = layout.items[0]
        assert layout.offset("kv_v") == layout.offset("kv_k") + pipe.stages * pipe.stage_stride(0)
        assert pipe.stages * (pipe.stage_stride(0) + pipe.stage_stride(1)) >= MAX_SPLITS * 64 + 16 * d * 4


def test_append_kv_kernel_compiles():
    k = get_kernel("append_kv", None, file="paged_kv")
    assert k.resources.spills == 0 and len(k.params) == 11


def test_reference_equals_dense_attention_over_the_gathered_keys(rng):
    """The paged reference reads the keys a block table names, in order, and only those."""
    lens, page, hkv, d, group = [37, 0, 1, 64], 16, 2, 32, 4
    k, v, table = random_paged_cache(rng, lens, page, hkv, d)
    q = rng.standard_normal((len(lens), hkv * group, d))
    out = paged_decode_reference(q, k, v, table, lens, 0.3)
    assert not np.isnan(out).any() and not out[1].any()
    for b, n in enumerate(lens):
        if n == 0:
            continue
        keys = np.concatenate([k[p] for p in table[b, :-(-n // page)]])[:n]  # (n, hkv, d)
        vals = np.concatenate([v[p] for p in table[b, :-(-n // page)]])[:n]
        for h in range(hkv * group):
            s = keys[:, h // group] @ q[b, h] * 0.3
            p = np.exp(s - s.max())
            np.testing.assert_allclose(out[b, h], p @ vals[:, h // group] / p.sum(), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(out[2], np.repeat(v[table[2, 0], 0], group, 0))  # one key: its value


def test_reference_of_several_new_tokens_is_causal_among_them(rng):
    """New token i of 3 sees the keys before the last 2 - i: token 2 is the one-token step."""
    lens, page, hkv, d = [5, 2, 40], 16, 1, 32
    k, v, table = random_paged_cache(rng, lens, page, hkv, d)
    q = rng.standard_normal((3, 3, 2, d))
    out = paged_decode_reference(q, k, v, table, lens, 0.2)
    for i in range(3):
        shorter = [max(0, n - 2 + i) for n in lens]
        np.testing.assert_array_equal(out[:, i], paged_decode_reference(q[:, i], k, v, table, shorter, 0.2))
    assert not out[1, 0].any() and out[1, 1].any()  # length 2: token 0 sees nothing, token 1 one key


def _append_args(**change):
    return {"k_cache": arr((10, 16, 2, 128)), "v_cache": arr((10, 16, 2, 128)),
            "block_table": arr((2, 5), "int32"), "seq_lens": arr((2,), "int32"),
            "k_new": arr((2, 2, 128)), "v_new": arr((2, 2, 128)), **change}


def test_append_kv_refuses_a_misaligned_v_new(rng):
    """v_new is read in 16-byte pieces as k_new is: a misaligned one would fault on the GPU."""
    offset = 2 * int(rng.integers(1, 8))
    args = _append_args(v_new=arr((2, 2, 128), offset=offset))
    with pytest.raises(tf.TmaflowError, match=rf"append_kv: v_new \(2, 2, 128\) bfloat16 at 0x[0-9a-f]*"
                                              rf"{offset:x} must be .*16-byte aligned"):
        kernels.append_kv(*args.values())


def test_append_kv_refuses_a_v_cache_overlapping_k_cache(rng):
    """Both caches are written at the same rows: one array for both would keep only the values."""
    k = arr((10, 16, 2, 128))
    shift = 16 * int(rng.integers(0, 10 * 16 * 2 * 128 * 2 // 16))
    v = DeviceArray(k.ptr + shift, k.shape, "bfloat16")
    with pytest.raises(tf.TmaflowError, match=r"append_kv: v_cache: out .* overlaps k_cache"):
        kernels.append_kv(*_append_args(k_cache=k, v_cache=v).values())


@pytest.mark.parametrize("d,persistent,ctas,stages", [(128, False, 1, 6), (128, False, 3, 2), (128, True, 1, 6),
                                                      (128, True, 2, 3), (64, False, 3, 4), (256, False, 1, 3)])
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("wide_box", [False, True])
def test_decode_plan_stages_fill_the_asked_share_of_an_sm(d, persistent, ctas, stages, page, wide_box):
    """ctas_per_sm 1-3: the stages fill all, half or a third of an SM's shared memory (each CTA
    also takes 1 KB). A wide box is a page piece by every column block: a tile is its pieces."""
    spec, layout, got_ctas = decode_plan(d, page, persistent, ctas, wide_box)
    pipe = layout.items[0]
    assert (got_ctas, pipe.stages) == (ctas, stages)
    assert (layout.total_bytes + 1024) * ctas <= 228 * 1024
    assert pipe.tx_bytes == 2 * 64 * d * 2
    assert spec.box == ((1, d // 64, min(page, 64), 64) if wide_box else (min(page, 64), 1, 64))


def test_decode_plan_refuses_three_persistent_ctas_at_head_dim_128():
    with pytest.raises(tf.TmaflowError, match=r"ctas=3 an SM at head_dim=128 persistent leaves 1 stage .* needs two"):
        decode_plan(128, 16, True, 3)


def test_decode_options_ctas_per_sm_and_wide_box_are_checked():
    args, _ = decode_args()
    with pytest.raises(tf.TmaflowError, match=r"attention_decode: ctas_per_sm=4 must be"):
        kernels.attention_decode(*args.values(), ctas_per_sm=4)
    args, _ = decode_args(q=arr((2, 8, 96)), k_cache=arr((10, 16, 2, 96)), v_cache=arr((10, 16, 2, 96)))
    with pytest.raises(tf.TmaflowError, match=r"attention_decode: wide_box=True with head_dim=96; .* multiple of 64"):
        kernels.attention_decode(*args.values(), wide_box=True)


@pytest.mark.parametrize("d,page,persistent,ctas,evict_first", [(128, 16, 0, 2, 1), (128, 64, 1, 2, 0), (256, 16, 0, 1, 0),
                                                               (64, 32, 0, 3, 1), (128, 16, 1, 1, 0)])
def test_wide_box_decode_kernel_compiles_with_one_4d_copy_a_page_piece(d, page, persistent, ctas, evict_first):
    """One UTMALDG.4D each for K and V (no 3-D copy), with the policy when evict-first; no
    spills, and registers that let `ctas` CTAs of 160 threads share an SM."""
    _, layout, _ = decode_plan(d, page, bool(persistent), ctas, True)
    _four_d_decode_kernel(layout, d, page, persistent, evict_first, ctas, {"WIDE_BOX": 1})


def _four_d_decode_kernel(layout, d, page, persistent, evict_first, ctas, extra):
    """The kernel and its SASS, checked: no spills, one UTMALDG.4D each for K and V (with the policy
    when evict-first), registers that let ``ctas`` CTAs of 160 threads share an SM."""
    k = get_kernel("attention_decode", layout, file="decode",
                   defines={"HEAD_DIM": d, "PAGE_SIZE": page, "MAX_SPLITS": MAX_SPLITS, **extra,
                            **({"PERSISTENT": 1} if persistent else {}), **({"EVICT_FIRST": 1} if evict_first else {})})
    sass = k.sass()
    assert k.resources.spills == 0 and k.resources.stack_frame == 0, k.resources
    loads = [line for line in sass.splitlines() if "UTMALDG" in line]
    assert len(loads) == 2 and all("UTMALDG.4D" in line and ("desc[" in line) == bool(evict_first) for line in loads), loads
    assert -(-k.resources.registers // 8) * 8 * 160 * ctas <= 65536, k.resources
    return k, sass


@pytest.mark.parametrize("d,page,persistent,stages", [(128, 16, False, 3), (128, 64, True, 3), (64, 256, False, 6),
                                                      (256, 16, False, 3)])
def test_head_group_plan_holds_sixteen_keys_of_four_kv_heads_a_stage(d, page, persistent, stages):
    """A head group's stage is 16 keys of four kv heads in one 4-D box: the bytes of a 64-key
    tile of one head, so the stages and CTAs an SM are the one-head plan's."""
    spec, layout, ctas = decode_plan(d, page, persistent, head_group=True)
    _, plain, plain_ctas = decode_plan(d, page, persistent)
    pipe = layout.items[0]
    assert spec.box == (4, d // 64, 16, 64)
    assert (ctas, pipe.stages) == (plain_ctas, plain.items[0].stages) and pipe.stages == stages
    assert pipe.tx_bytes == 2 * 64 * d * 2


def test_head_group_plan_refuses_part_column_blocks_and_a_wide_box():
    with pytest.raises(tf.TmaflowError, match=r"decode_plan: head_group with head_dim=96 and wide_box=False; .* multiple of 64"):
        decode_plan(96, 16, head_group=True)
    with pytest.raises(tf.TmaflowError, match=r"decode_plan: head_group with head_dim=128 and wide_box=True; .*no wide_box"):
        decode_plan(128, 16, wide_box=True, head_group=True)


def test_head_group_options_are_checked():
    args, _ = decode_args(k_cache=arr((10, 16, 4, 128)), v_cache=arr((10, 16, 4, 128)))
    with pytest.raises(tf.TmaflowError, match=r"attention_decode: head_group=1 must be"):
        kernels.attention_decode(*args.values(), head_group=1)
    for other in ({"cluster_merge": True, "num_splits": 4}, {"wide_box": True}):
        with pytest.raises(tf.TmaflowError, match=r"attention_decode: head_group=True with cluster_merge=.*leave those None"):
            kernels.attention_decode(*args.values(), head_group=True, **other)
    args, _ = decode_args()  # two kv heads
    with pytest.raises(tf.TmaflowError, match=r"attention_decode: head_group=True with head_dim=128 and heads_kv=2; "
                                              r".*heads_kv a multiple of 4"):
        kernels.attention_decode(*args.values(), head_group=True)
    args, _ = decode_args(q=arr((2, 8, 96)), k_cache=arr((10, 16, 4, 96)), v_cache=arr((10, 16, 4, 96)))
    with pytest.raises(tf.TmaflowError, match=r"attention_decode: head_group=True with head_dim=96 and heads_kv=4"):
        kernels.attention_decode(*args.values(), head_group=True)


@pytest.mark.parametrize("d,page,persistent,fp16,evict_first", [(128, 16, 0, 0, 0), (128, 64, 1, 1, 1), (64, 16, 0, 0, 1),
                                                                (256, 16, 0, 0, 0), (128, 256, 0, 1, 1)])
def test_head_group_decode_kernel_compiles_with_one_4d_copy_a_stage_and_q_in_registers(d, page, persistent, fp16,
                                                                                       evict_first):
    """One UTMALDG.4D each for K and V (with the policy when evict-first); Q's fragments come
    from global memory once, so the ldmatrix are K's and V's only (D / 16 each); the counter
    merge's count and bulk copies only without PERSISTENT; no spills, and registers that keep
    the plan's CTAs an SM."""
    _, layout, ctas = decode_plan(d, page, bool(persistent), head_group=True)
    k, sass = _four_d_decode_kernel(layout, d, page, persistent, evict_first, ctas,
                                    {"HEAD_GROUP": 1, **({"FP16": 1} if fp16 else {})})
    assert sass.count("LDSM") == 2 * (d // 16), sass.count("LDSM")
    assert ("ATOMG" in sass, "UBLKCP" in sass) == (not persistent, not persistent)
    assert len(k.params) == 15


def test_head_group_splits_fill_the_slots_with_a_quarter_of_the_items():
    """The splits of a head-group plan fill the CTA slots with batch x heads_kv / 4 items."""
    from tmaflow.kernels.decode_plan import decode_choices

    class H200:
        sm_count, l2_bytes = 132, 60 << 20
    assert decode_choices(16, 8, 128, 16, 8192, device=H200())[0] == 2
    assert decode_choices(16, 8, 128, 16, 8192, device=H200(), head_group=True)[0] == 8
    assert decode_choices(128, 8, 128, 16, 1024, device=H200(), head_group=True)[0] == 1


@pytest.mark.parametrize("batch,heads_kv,head_dim,page,context,expected", [
    (128, 8, 128, 16, 1024, True),     # 256 four-head items fill the slots with one split
    (128, 8, 128, 64, 1024, True),
    (16, 8, 128, 16, 8192, False),     # the group plan splits: the one-head plan stays
    (64, 8, 128, 16, 1024, False),
    (1, 8, 128, 16, 8192, False),
    (128, 6, 128, 16, 1024, False),    # kv heads not a multiple of four
    (128, 8, 96, 16, 1024, False),     # head dim not a multiple of 64
    (128, 8, 256, 16, 1024, False),    # not measured there
])
def test_head_group_is_the_default_only_where_its_items_fill_the_gpu_unsplit(batch, heads_kv, head_dim, page,
                                                                             context, expected):
    assert head_group_default(batch, heads_kv, head_dim, page, context, 132) is expected
    assert head_group_default(batch, heads_kv, head_dim, page, context, 132, ctas_per_sm=2) is False


@pytest.mark.parametrize("d,page,ctas,extra", [(128, 16, None, {}), (128, 16, None, {"CLUSTER_MERGE": 1}),
                                               (128, 64, 3, {"SLICE_MERGE": 1, "EVICT_FIRST": 1}),
                                               (256, 16, None, {"FP16": 1}), (96, 32, 3, {}), (32, 16, 1, {}),
                                               (128, 16, 1, {"WIDE_BOX": 1}),
                                               (80, 16, None, {"CLUSTER_MERGE": 1, "FP16": 1})])
def test_warp_slices_decode_kernel_drops_the_turns_barrier_without_spills(d, page, ctas, extra):
    """WARP_SLICES: every warp's O in a slice of the K tiles at once, one sum a thread: the
    turn loop (and its barrier, one a warp at run time) is gone; no spills, registers for
    the plan's CTAs an SM."""
    _, layout, ctas = decode_plan(d, page, ctas=ctas, wide_box="WIDE_BOX" in extra)
    bars = []
    for slices in (0, 1):
        k = get_kernel("attention_decode", layout, file="decode",
                       defines={"HEAD_DIM": d, "PAGE_SIZE": page, "MAX_SPLITS": MAX_SPLITS, "WARP_SLICES": slices,
                                **extra})
        assert k.resources.spills == 0 and k.resources.stack_frame == 0, k.resources
        assert -(-k.resources.registers // 8) * 8 * 160 * ctas <= 65536, k.resources
        bars.append(k.sass().count("BAR.SYNC"))
    assert bars[1] in (bars[0] - 1, bars[0] - 4), bars  # the turns' barrier, in a loop or unrolled


def test_warp_slices_refuse_a_persistent_build():
    """A persistent CTA's warps merge in a buffer of one O (its stages hold the next item's tiles)."""
    _, layout, _ = decode_plan(128, 16, True)
    with pytest.raises(tf.TmaflowError, match=r"WARP_SLICES: the warps' O fit the K tiles"):
        get_kernel("attention_decode", layout, file="decode",
                   defines={"HEAD_DIM": 128, "PAGE_SIZE": 16, "MAX_SPLITS": MAX_SPLITS, "WARP_SLICES": 1,
                            "PERSISTENT": 1}).resources  # (compiled on first use)


@pytest.mark.parametrize("d,page,fp16,evict_first", [(128, 16, 0, 1), (256, 64, 1, 0), (32, 16, 0, 0), (96, 32, 1, 1)])
def test_merge_kernel_decode_module_has_no_count_and_a_pdl_merge(d, page, fp16, evict_first):
    """MERGE_KERNEL: attention_decode neither counts nor merges (no atomic, no bulk copy: the
    splits publish and leave) and lets its dependents start (PREEXIT); attention_decode_merge
    waits on it (ACQBULK) and takes the 7 parameters the entry passes; no spills, and a merge CTA
    fits beside the plan's decode CTAs of an SM (it waits there)."""
    _, layout, ctas = decode_plan(d, page)
    defines = {"HEAD_DIM": d, "PAGE_SIZE": page, "MAX_SPLITS": MAX_SPLITS, "MERGE_KERNEL": 1, "WARP_SLICES": 1,
               **({"FP16": 1} if fp16 else {}), **({"EVICT_FIRST": 1} if evict_first else {})}
    k = get_kernel("attention_decode", layout, file="decode", defines=defines)
    merge = get_kernel("attention_decode_merge", layout, file="decode", defines=defines)
    for kern in (k, merge):
        assert kern.resources.spills == 0 and kern.resources.stack_frame == 0, kern.resources
    sass = k.sass()  # the module's: both kernels
    assert "ATOMG" not in sass and "UBLKCP" not in sass and "PREEXIT" in sass and "ACQBULK" in sass
    assert len(k.params) == 15 and len(merge.params) == 7
    # a waiting merge CTA fits beside the plan's decode CTAs of an SM
    assert -(-k.resources.registers // 8) * 8 * 160 * ctas + \
        -(-merge.resources.registers // 8) * 8 * MERGE_THREADS <= 65536, (k.resources, merge.resources)


@pytest.mark.parametrize("extra", [{}, {"CLUSTER_MERGE": 1}, {"PERSISTENT": 1}, {"HEAD_GROUP": 1}])
def test_pdl_decode_kernel_waits_before_its_first_global_load(extra):
    """PDL: the CTA may start while the kernel before it runs, so griddepcontrol.wait (ACQBULK)
    comes before every global load (the lengths, the block table, q) and every TMA copy, and
    the kernel lets the next one start (PREEXIT); no spills."""
    _, layout, _ = decode_plan(128, 16, "PERSISTENT" in extra, head_group="HEAD_GROUP" in extra)
    k = get_kernel("attention_decode", layout, file="decode",
                   defines={"HEAD_DIM": 128, "PAGE_SIZE": 16, "MAX_SPLITS": MAX_SPLITS, "PDL": 1, **extra})
    assert k.resources.spills == 0 and k.resources.stack_frame == 0, k.resources
    lines = k.sass().splitlines()
    first = {op: next((n for n, line in enumerate(lines) if op in line), None)
             for op in ("ACQBULK", "PREEXIT", "LDG", "UTMALDG")}
    assert None not in first.values(), first
    assert first["ACQBULK"] < first["LDG"] and first["ACQBULK"] < first["UTMALDG"], first


@pytest.mark.parametrize("d,page,ctas,fp16,evict_first", [(128, 16, 1, 0, 0), (128, 64, 2, 1, 1), (64, 16, 1, 0, 1),
                                                          (256, 16, None, 0, 0)])
def test_head_group_slice_merge_kernel_compiles_without_bulk_copies(d, page, ctas, fp16, evict_first):
    """Four kv heads a CTA, each split merging its share of the four heads' columns: the slice
    merge's two counts and acquire load, no bulk copy, no spills, the plan's CTAs an SM."""
    _, layout, got_ctas = decode_plan(d, page, ctas=ctas, head_group=True)
    k, sass = _four_d_decode_kernel(layout, d, page, 0, evict_first, got_ctas,
                                    {"HEAD_GROUP": 1, "SLICE_MERGE": 1, **({"FP16": 1} if fp16 else {})})
    assert "UBLKCP" not in sass and "MEMBAR.SC.GPU" not in sass
    assert sass.count("ATOMG.E.ADD") == 2 and "LDG.E.STRONG.GPU" in sass
    assert len(k.params) == 15


def test_head_group_takes_the_slice_merge_where_asked_and_its_ctas_fit():
    """Batch 1 at 8k, one CTA an SM: two groups x 63 splits in 132 slots (95% of them)."""
    from types import SimpleNamespace
    plan = decode_defaults(1, 8, 128, 16, 8192, SimpleNamespace(sm_count=132, l2_bytes=50 << 20), head_group=True,
                           slice_merge=True, ctas=1)
    assert (plan.splits, plan.items, plan.slice_merge, plan.ctas_per_sm) == (63, 2, True, 1)
    assert not decode_defaults(1, 8, 128, 16, 8192, SimpleNamespace(sm_count=132, l2_bytes=50 << 20),
                               head_group=True).slice_merge  # not by default


def _bench_attention():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "peers" / "bench_attention.py"
    spec = importlib.util.spec_from_file_location("bench_attention_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("sm_count", [132, 114], ids=["h200", "h100-pcie"])
def test_every_decode_bench_alternative_is_a_call_the_entry_takes(sm_count):
    """Session 25's quick record died on batch 16's "c3" (cluster_merge=True without its splits):
    every alternative of every row the decode bench can time passes the entry's option checks."""
    from types import SimpleNamespace

    from tmaflow.kernels.decode_entry import check_decode_options

    bench_attention = _bench_attention()
    device = SimpleNamespace(sm_count=sm_count, l2_bytes=50 << 20)
    args = SimpleNamespace(quick=False, decode_grid="quick", decode_rows=None, decode_alts=None, decode_batches=None)
    rows = set(bench_attention.DECODE_QUICK) | set(bench_attention.DECODE_FOCUS) | {
        (group, page, batch, ctx) for group in bench_attention.DECODE_GROUPS for page in bench_attention.DECODE_PAGES
        for batch in bench_attention.DECODE_BATCHES for ctx in bench_attention.DECODE_CONTEXTS}
    checked = set()
    for group, page, batch, ctx in sorted(rows):
        alternatives = bench_attention._decode_alternatives(args, batch, ctx, 8, page, device)
        assert "pr256" in alternatives and f"ef{int(not decode_defaults(batch, 8, 128, page, ctx, device).evict_first)}" \
            in alternatives, (group, page, batch, ctx)
        for name, choice in alternatives.items():
            ordered, options = bench_attention.decode_call(choice)
            check_decode_options(**options)  # raises TmaflowError naming the rule a choice breaks
            checked.add(name)
    assert {"c3", "s18", "mk1", "hg", "s1", "wb"} <= checked, sorted(checked)


def test_decode_options_are_checked_without_a_gpu():
    from tmaflow.kernels.decode_entry import check_decode_options

    assert check_decode_options() == (None,) * 13
    assert check_decode_options(num_splits=4, cluster_merge=True)[:4] == (4, None, None, True)
    with pytest.raises(tf.TmaflowError, match=r"cluster_merge=True with num_splits=None .* give num_splits 2-16"):
        check_decode_options(persistent=False, cluster_merge=True, ctas_per_sm=3)
    with pytest.raises(tf.TmaflowError, match=r"ctas_per_sm"):
        check_decode_options(ctas_per_sm=4)
