"""Decode attention over a paged KV cache (``decode.cu``, flash-decoding): the entry points
``kernels.attention_decode`` (its checks, then the launch ``decode_plan`` plans: tensor maps
over each cache, the grid, the splits' workspace) and ``kernels.append_kv`` (``paged_kv.cu``)."""
from __future__ import annotations

import math
from threading import get_ident
from types import SimpleNamespace
from typing import NamedTuple

from ..errors import TmaflowError
from ..launch.config import resolve_stream
from ..runtime.device import current_device, current_ordinal
from ..runtime.memory import as_array
from ..tma.spec import TensorMapSpec
from ..tma.tensormap import MapTemplate
from . import checks
from .attention_entry import DTYPES, _given_out, _scale
from .decode_plan import HEAD_GROUP, MAX_ROWS, MAX_SPLITS, decode_defaults, decode_plan
from .entry import (STATES, cached_state, contiguous_strides, entry_point, new_output, on_current_device,
                    packed)
from .matmul.splitk import _split_k_buffers, _with_split_k
from .registry import get_kernel

HEAD_DIMS = range(32, 257, 16)  # multiples of 16: the mma's k-step; tiles pad to 64 columns
PAGE_SIZES = (16, 32, 64, 128, 256)
MAX_TOKENS = 8            # new tokens a request (speculative decoding)
MAX_CLUSTER = 16          # splits a cluster merge takes (decode.cu's kMaxCluster; over 8: non-portable)
THREADS = 160             # four consumer warps and a producer warp
MERGE_THREADS = 64        # attention_decode_merge's CTAs (decode.cu's __launch_bounds__: at most 128)


class Problem(NamedTuple):
    batch: int
    tokens: int      # new tokens a request
    heads_q: int
    head_dim: int
    pages: int
    page_size: int
    heads_kv: int
    group: int       # query heads a kv head
    max_pages: int   # the block table's width


def _check_cache(who, Q, K, V, T, L, q_name="q", max_tokens=MAX_TOKENS) -> Problem:
    """The problem's sizes after the rules. ``Q`` is (batch, heads, head_dim), one token a
    request, or (with max_tokens > 1) (batch, tokens, heads, head_dim); ``q_name`` in messages."""
    if Q.ndim != 3 and not (Q.ndim == 4 and max_tokens > 1):
        shapes = "(batch, heads, head_dim)" + (" or (batch, tokens, heads, head_dim)" if max_tokens > 1 else "")
        raise TmaflowError(f"{who}: {q_name} must be {shapes}; got shape {Q.shape}")
    for name, arr in ((q_name, Q), ("k_cache", K), ("v_cache", V)):
        if arr.dtype.name not in DTYPES:
            raise TmaflowError(f"{who}: {name} must be {' or '.join(DTYPES)} (got {arr.dtype.name})")
        if arr.dtype != Q.dtype:
            raise TmaflowError(f"{who}: {name} is {arr.dtype.name} but {q_name} is {Q.dtype.name}; "
                               f"{q_name} and the caches must have one dtype")
        if arr.strides != contiguous_strides(arr.shape, 2):
            raise TmaflowError(f"{who}: {name} must be contiguous; strides {arr.strides} B")
        if arr.ptr % 16:
            raise TmaflowError(f"{who}: {name} at 0x{arr.ptr:x} must be 16-byte aligned (rows are "
                               "read in 16-byte pieces)")
    if K.ndim != 4 or K.shape != V.shape:
        raise TmaflowError(f"{who}: k_cache {K.shape} and v_cache {V.shape} must be one 4-D shape "
                           "(num_pages, page_size, heads_kv, head_dim)")
    b, tokens, (hq, d) = Q.shape[0], Q.shape[1] if Q.ndim == 4 else 1, Q.shape[-2:]
    pages, page_size, hkv, dk = K.shape
    if dk != d:
        raise TmaflowError(f"{who}: {q_name}'s head_dim={d} but the caches' is {dk}; they must match")
    if d not in HEAD_DIMS:
        raise TmaflowError(f"{who}: head_dim={d} must be a multiple of 16 from 32 to 256")
    if page_size not in PAGE_SIZES:
        raise TmaflowError(f"{who}: page_size={page_size} (k_cache.shape[1]) must be a power of two "
                           "from 16 to 256")
    if hkv == 0 or hq % hkv or hq // hkv > MAX_ROWS:
        raise TmaflowError(f"{who}: heads_q={hq} must be a multiple of heads_kv={hkv} at most "
                           f"{MAX_ROWS} times it (the query heads of a kv head are one mma's rows)")
    if not 1 <= tokens <= max_tokens or tokens * (hq // hkv) > MAX_ROWS:
        raise TmaflowError(f"{who}: {tokens} new tokens a request with {hq // hkv} query heads a kv head "
                           f"make {tokens * (hq // hkv)} rows; give 1 to {max_tokens} tokens and at most "
                           f"{MAX_ROWS} rows (one mma's)")
    if pages == 0 or pages * page_size >= 1 << 31:
        raise TmaflowError(f"{who}: k_cache has {pages} pages of {page_size} keys; give from 1 page "
                           "to 2^31 keys in all")
    for name, arr, shape in (("block_table", T, None), ("seq_lens", L, (b,))):
        if arr.dtype.name != "int32":
            raise TmaflowError(f"{who}: {name} must be int32 (got {arr.dtype.name})")
        if arr.strides != contiguous_strides(arr.shape, 4):
            raise TmaflowError(f"{who}: {name} must be contiguous; strides {arr.strides} B")
    if T.ndim != 2 or T.shape[0] != b or L.shape != (b,):
        raise TmaflowError(f"{who}: block_table {T.shape} must be (batch={b}, max_pages_per_seq) and "
                           f"seq_lens {L.shape} must be (batch={b},)")
    return Problem(b, tokens, hq, d, pages, page_size, hkv, hq // hkv, T.shape[1])


@entry_point
def attention_decode(q, k_cache, v_cache, block_table, seq_lens, *, scale: float | None = None,
                     num_splits: int | None = None, evict_first: bool | None = None, persistent: bool | None = None,
                     cluster_merge: bool | None = None, slice_merge: bool | None = None, l2_promotion: str | None = None,
                     ctas_per_sm: int | None = None, wide_box: bool | None = None, head_group: bool | None = None,
                     warp_slices: bool | None = None, merge_kernel: bool | None = None, pdl: bool | None = None,
                     cooperative: bool | None = None, out=None, stream=None):
    """One decode step of attention over a paged KV cache: ``out[b, h] = softmax(scale * q[b, h]
    . K_b^T) V_b`` where request b's keys are its first ``seq_lens[b]`` cache rows, key j at
    ``k_cache[block_table[b, j // page_size], j % page_size, h // (heads_q / heads_kv)]``.

    q: (batch, heads_q, head_dim) bfloat16 or float16 (head_dim a multiple of 16, 32-256), or
    (batch, tokens, heads_q, head_dim) for 1-8 new tokens a request (speculative decoding: their
    keys are the last ``tokens`` of the length, and new token i sees keys up to seq_lens[b] -
    tokens + i; tokens x heads_q / heads_kv at most 16); k_cache, v_cache: (num_pages,
    page_size, heads_kv, head_dim) as vLLM and FlashInfer lay them out (page_size 16-256, a
    power of two; heads_q 1-16 times heads_kv); block_table: int32 (batch, max_pages_per_seq),
    whose entries for the pages a length covers must be pages of the cache (0 to num_pages - 1:
    the kernel reads them without a check, and a page outside the cache gives a wrong result,
    not an error, as TMA fills rows outside its map with zeros); seq_lens: int32 (batch,) in
    device memory, read by the kernel (so a captured graph serves any lengths), clamped to [0,
    max_pages_per_seq x page_size]. A token that sees no key (a request of length 0) gets
    zeros. ``num_splits`` (1-64) splits each request's keys (flash-decoding); None picks it from
    the batch, kv heads, SM count and the block table's width. ``evict_first``: K and V pass
    through L2 at evict-first priority (read once a step, they push nothing else out); None:
    when the caches a call may read (the block table's width for every request) exceed half the
    L2, up to eight times it (``evict_first_default``). ``persistent``: at most as many CTAs as run at once, each walking whole (request, kv
    head) items (one split: num_splits None or 1); None: when one split leaves more items than
    CTA slots, unless four kv heads a CTA merged by slices take the call instead (from 8k keys
    where those CTAs all fit: ``group_slice_default``). ``cluster_merge``: the splits of a (request, kv head) run as one thread-block
    cluster and merge through distributed shared memory instead of a workspace and a counter
    (2-16 splits: give num_splits); None: at 2-8 splits when the CTAs are at most the SMs, and at
    two splits whatever the count (``cluster_merge_default``).
    ``slice_merge``: the workspace-and-counter merge, but every split merges a share of the
    output's columns once all have counted (no last CTA reads every split); it waits on the
    other splits, so every CTA of the call must fit on the GPU at once (refused otherwise, by
    the kernel's occupancy). None: at 16 or more splits (one kv head a CTA) whose CTAs all fit
    (``slice_merge_default``), and with head groups where ``group_slice_default`` takes them.
    Launched plainly (``cooperative=False`` or ``pdl=True``), its waiting CTAs rely on the rest
    getting SMs: do not run another grid that spins on its peers concurrently.
    ``cooperative``: the grid is launched cooperative (the driver runs it only with every CTA
    resident at once; it refuses a grid larger than the GPU holds). None: with the slice merge
    (not with ``pdl``; True with ``pdl=True`` is refused).
    ``l2_promotion``: the K/V maps' L2 promotion ("none", "64B", "128B", "256B": a box row's
    miss fetches that much from DRAM; a kv head's key row is head_dim x 2 bytes); None: "none".
    ``ctas_per_sm`` (1-3): the K/V pipeline's stages fill that share of an SM's shared memory
    (at head dim 128: 1 CTA of six 32 KB stages, 2 of three, 3 of two; persistent: 1-2); None:
    two when three stages fit, else one (and one with the head groups ``group_one_cta_default``
    takes). ``wide_box`` (head dims a multiple of 64): each copy
    brings a page piece's every column (a 4-D map), half the copies at head dim 128; None: off.
    ``head_group`` (heads_kv a multiple of 4, head dims a multiple of 64): a CTA reads four kv
    heads of a request (each copy 16 keys of all four: runs four times as long), a consumer
    warp each; splits merge by the workspace and counter, or by slices. None: ``head_group_default``
    when no split count, persistence or other merge / box option is given (and with the slice
    merge where ``group_slice_default`` takes it), or where ``group_one_cta_default`` holds (at
    one CTA an SM, when no CTA count is given either).
    ``warp_slices``: the CTA's four consumer warps merge from a slice of O each, written at once
    (two barriers), where the plan merges them in its stages (not persistent, one kv head a
    CTA); False: a warp at a time (four more barriers). The same bits either way. None: True.
    ``merge_kernel``: several splits of one kv head a CTA publish their partials and leave, and
    a second kernel, launched with PDL (its CTAs wait on the first grid's completion), merges
    them, a thread a 4-column group of the output (no counter, no last CTA reading every
    split); the counter merge's bits. None: off.
    ``pdl``: the kernel is launched with programmatic dependent launch: its CTAs may start while
    the kernel before it on the stream finishes (setting up barriers and descriptors), and wait
    for that kernel's completion before reading anything; it lets the kernel after it (when
    that one is launched with PDL) start early too. None: off.
    Returns out, q's shape, of q's kind."""
    num_splits, evict_first, persistent, cluster_merge, slice_merge, l2_promotion, ctas_per_sm, wide_box, \
        head_group, warp_slices, merge_kernel, pdl, cooperative = check_decode_options(
            num_splits=num_splits, evict_first=evict_first, persistent=persistent, cluster_merge=cluster_merge,
            slice_merge=slice_merge, l2_promotion=l2_promotion, ctas_per_sm=ctas_per_sm, wide_box=wide_box,
            head_group=head_group, warp_slices=warp_slices, merge_kernel=merge_kernel, pdl=pdl,
            cooperative=cooperative)
    Q, K, V, T, L = (packed(as_array(a)) for a in (q, k_cache, v_cache, block_table, seq_lens))
    who = "attention_decode"
    p = _check_cache(who, Q, K, V, T, L)
    if wide_box and p.head_dim % 64:
        raise TmaflowError(f"{who}: wide_box=True with head_dim={p.head_dim}; a wide box spans whole 64-column "
                           "blocks of a kv head's row: give a head_dim that is a multiple of 64, or wide_box None")
    if head_group and (p.head_dim % 64 or p.heads_kv % HEAD_GROUP):
        raise TmaflowError(f"{who}: head_group=True with head_dim={p.head_dim} and heads_kv={p.heads_kv}; a CTA "
                           f"reads whole 64-column blocks of {HEAD_GROUP} kv heads: give a head_dim that is a multiple "
                           f"of 64 and heads_kv a multiple of {HEAD_GROUP}, or head_group None")
    scale = _scale(scale, p.head_dim, who)
    O = _given_out(out, Q, who, align=16)
    if O is not None:
        checks.no_aliasing(who, O, (("q", Q), ("k_cache", K), ("v_cache", V), ("block_table", T),
                                    ("seq_lens", L)))
    ordinal = current_ordinal()
    stream = resolve_stream(stream, (Q, K, V, T, L, O), ordinal)
    key = (who, Q.dtype.name, Q.shape, K.shape, T.shape, num_splits, evict_first, persistent, cluster_merge,
           slice_merge, l2_promotion, ctas_per_sm, wide_box, head_group, warp_slices, merge_kernel, pdl, cooperative,
           stream, Q.device, ordinal, get_ident())
    try:
        st = STATES[key]
    except (KeyError, TypeError):
        st = cached_state(key, lambda: _decode_state(Q, p, num_splits, evict_first, persistent, cluster_merge,
                                                          slice_merge, l2_promotion, stream, ctas_per_sm, bool(wide_box),
                                                          head_group, warp_slices is not False, bool(merge_kernel),
                                                          bool(pdl), cooperative))
    result, O = (out, O) if O is not None else new_output(q, Q, Q.shape, None, stream)
    if p.batch * p.heads_q == 0:
        return None, (), result
    part, counters = _split_k_buffers(st, q, Q)
    part_lse = part.ptr + 4 * st.partial_floats if st.workspace is not None else 0
    args = (st.tk.bind(K._as(*st.view)), st.tv.bind(V._as(*st.view)), Q, O, T, L,
            part, part_lse, counters, p.heads_kv, p.group, p.tokens, p.max_pages, float(scale) * math.log2(math.e),
            p.batch)
    return st.launcher, args, result


_OPTIONS = checks.Options("attention_decode", num_splits=checks.integer(1, MAX_SPLITS, optional=True),
                          evict_first=checks.flag(optional=True), persistent=checks.flag(optional=True),
                          cluster_merge=checks.flag(optional=True), slice_merge=checks.flag(optional=True),
                          l2_promotion=checks.choice(*checks.L2_PROMOTIONS, optional=True),
                          ctas_per_sm=checks.integer(1, 3, optional=True), wide_box=checks.flag(optional=True),
                          head_group=checks.flag(optional=True), warp_slices=checks.flag(optional=True),
                          merge_kernel=checks.flag(optional=True), pdl=checks.flag(optional=True),
                          cooperative=checks.flag(optional=True))


def check_decode_options(*, num_splits=None, evict_first=None, persistent=None, cluster_merge=None,
                         slice_merge=None, l2_promotion=None, ctas_per_sm=None, wide_box=None, head_group=None,
                         warp_slices=None, merge_kernel=None, pdl=None, cooperative=None) -> tuple:
    """attention_decode's plan options checked alone and together, before any tensor is read (a
    benchmark or a caller can check a choice without a GPU); returns them in the signature's
    order, each None or of its checked type. Raises TmaflowError naming the option, the value and
    the rule."""
    options = (num_splits, evict_first, persistent, cluster_merge, slice_merge, l2_promotion, ctas_per_sm, wide_box,
               head_group, warp_slices, merge_kernel, pdl, cooperative)
    if all(option is None for option in options):
        return options
    checked = _OPTIONS.check(*options)
    num_splits, evict_first, persistent, cluster_merge, slice_merge, l2_promotion, ctas_per_sm, wide_box, \
        head_group, warp_slices, merge_kernel, pdl, cooperative = checked
    if persistent and num_splits not in (None, 1):
        raise TmaflowError(f"attention_decode: num_splits={num_splits} with persistent=True; a persistent "
                           "CTA walks whole requests: give num_splits None or 1")
    if cluster_merge and (num_splits is None or not 2 <= num_splits <= MAX_CLUSTER or persistent):
        raise TmaflowError(f"attention_decode: cluster_merge=True with num_splits={num_splits} and persistent="
                           f"{persistent}; a cluster merges 2 to {MAX_CLUSTER} splits of one request: give "
                           f"num_splits 2-{MAX_CLUSTER} and persistent None or False")
    if slice_merge and (cluster_merge or persistent or num_splits == 1):
        raise TmaflowError(f"attention_decode: slice_merge=True with num_splits={num_splits}, cluster_merge="
                           f"{cluster_merge} and persistent={persistent}; the slice merge merges the splits of the "
                           "workspace-and-counter path: give num_splits None or 2-64 and leave the others off")
    if head_group and (cluster_merge or wide_box):
        raise TmaflowError(f"attention_decode: head_group=True with cluster_merge={cluster_merge} and wide_box="
                           f"{wide_box}; a head group's splits merge by the workspace (the counter or slices), "
                           "its box is already wide: leave those None or False")
    if cooperative and pdl:
        raise TmaflowError("attention_decode: cooperative=True with pdl=True; the two launch attributes together "
                           "are not tested: leave one None or False (pdl=True launches the slice merge plainly)")
    if cooperative and cluster_merge:
        raise TmaflowError("attention_decode: cooperative=True with cluster_merge=True; a cooperative grid is "
                           "launched without clusters: leave cluster_merge None or False")
    if merge_kernel and (cluster_merge or slice_merge or persistent or head_group or num_splits == 1):
        raise TmaflowError(f"attention_decode: merge_kernel=True with num_splits={num_splits}, cluster_merge="
                           f"{cluster_merge}, slice_merge={slice_merge}, persistent={persistent} and head_group="
                           f"{head_group}; the merge kernel merges the splits of one kv head a CTA in place of "
                           "the counter: give num_splits None or 2-64 and leave the others None or False")
    return checked


def _decode_state(Q, p: Problem, num_splits, evict_first, persistent, cluster_merge, slice_merge, l2_promotion,
                  stream, ctas, wide_box, head_group, warp_slices=True, merge_kernel=False,
                  pdl=False, cooperative=None) -> SimpleNamespace:
    b, d, hkv = p.batch, p.head_dim, p.heads_kv
    on_current_device("attention_decode", Q)
    device = current_device()
    if merge_kernel:  # the counter path's splits, one kv head a CTA
        persistent, cluster_merge, head_group = bool(persistent), bool(cluster_merge), bool(head_group)
        slice_merge = bool(slice_merge)
    plan = decode_defaults(b, hkv, d, p.page_size, p.max_pages * p.page_size, device, num_splits, evict_first,
                           persistent, cluster_merge, slice_merge, ctas, wide_box, head_group,
                           clusters=not cooperative)  # a cooperative grid has no clusters
    splits, evict_first, persistent, cluster_merge, slice_merge, head_group, items, ctas_per_sm = (
        plan.splits, plan.evict_first, plan.persistent, plan.cluster_merge, plan.slice_merge, plan.head_group,
        plan.items, plan.ctas_per_sm)
    if slice_merge and b * items * splits > device.sm_count * ctas_per_sm:
        raise TmaflowError(f"attention_decode: slice_merge=True with {b * items * splits} CTAs (batch {b} x {items} "
                           f"CTAs a request x {splits} splits); its splits wait on each other, so every CTA must run "
                           f"at once: at most {device.sm_count * ctas_per_sm} ({device.sm_count} SMs x {ctas_per_sm})")
    if cooperative is None:  # (a PDL launch's CTAs wait on nothing but the kernel before: they all start)
        cooperative = slice_merge and not pdl
    if cooperative and not persistent and b * items * splits > device.sm_count * ctas_per_sm:
        raise TmaflowError(f"attention_decode: cooperative=True with {b * items * splits} CTAs (batch {b} x {items} "
                           f"items x {splits} splits); a cooperative grid runs all at once: at most "
                           f"{device.sm_count * ctas_per_sm} ({device.sm_count} SMs x {ctas_per_sm}); give "
                           "cooperative None or False")
    spec, layout, ctas_per_sm = decode_plan(d, p.page_size, persistent, plan.ctas, wide_box, head_group)
    defines = {"HEAD_DIM": d, "PAGE_SIZE": p.page_size, "MAX_SPLITS": MAX_SPLITS,
               **({"FP16": 1} if Q.dtype.name == "float16" else {}),
               **({"EVICT_FIRST": 1} if evict_first else {}), **({"PERSISTENT": 1} if persistent else {}),
               **({"CLUSTER_MERGE": 1} if cluster_merge else {}), **({"SLICE_MERGE": 1} if slice_merge else {}),
               **({"WIDE_BOX": 1} if wide_box else {}), **({"HEAD_GROUP": 1} if head_group else {}),
               **({"WARP_SLICES": 1} if warp_slices and not (persistent or head_group) else {})}
    merge_kernel = merge_kernel and splits > 1
    if merge_kernel:
        defines["MERGE_KERNEL"] = 1
    if pdl:
        defines["PDL"] = 1
    kern = get_kernel("attention_decode", layout, defines=defines, file="decode")
    grid = (max(1, min(b * items, device.sm_count * ctas_per_sm)), 1, 1) if persistent else (splits, items, max(b, 1))
    decode = kern.launcher(grid=grid, block=THREADS, cluster=(splits, 1, 1) if cluster_merge else (1, 1, 1),
                           stream=stream, pdl=pdl, cooperative=bool(cooperative))
    if (slice_merge or cooperative) and not persistent:
        # the check above counts CTAs an SM by shared memory; registers may allow fewer (a head
        # group at three CTAs an SM: 155 registers, two fit), and a slice merge whose CTAs are not
        # all resident waits forever (a cooperative launch is refused by the driver)
        resident = decode.max_active_clusters()
        if b * items * splits > resident:
            raise TmaflowError(f"attention_decode: {'slice_merge' if slice_merge else 'cooperative'}=True with "
                               f"{b * items * splits} CTAs (batch {b} x {items} CTAs a request x {splits} splits), but "
                               f"the device runs {resident} of this kernel at once (its registers and shared memory); "
                               "every CTA must run at once: give fewer num_splits, ctas_per_sm None, or "
                               f"{'slice_merge' if slice_merge else 'cooperative'} None or False")
    if merge_kernel:  # a thread a 4-column group of a kv head's rows, in CTAs of two warps (more SMs reading)
        columns = p.tokens * p.group * d // 4
        merge = get_kernel("attention_decode_merge", layout, defines=defines, file="decode").launcher(
            grid=(-(-columns // MERGE_THREADS), hkv, max(b, 1)), block=MERGE_THREADS, stream=stream, pdl=True)
    launcher, workspace = _with_split_k(_DecodeThenMerge(decode, merge, splits) if merge_kernel else decode,
                                        splits > 1 and not cluster_merge, device, stream)
    rows = b * p.tokens * p.heads_q * splits  # partial rows: O (head_dim floats) each
    lse_floats = b * hkv * splits * MAX_ROWS  # a log-sum-exp slot for each of an mma's rows: 64 B a split
    rows_all = p.pages * p.page_size  # the maps' view: all rows of all pages
    view: tuple[tuple[int, ...], tuple[int, ...]]
    if wide_box or head_group:  # (kv head, 64-column block, row, 64): one box a page piece, every block of it
        view = ((hkv, d // 64, rows_all, 64), (d * 2, 128, hkv * d * 2, 2))
    else:
        view = ((rows_all, hkv, d), (hkv * d * 2, d * 2, 2))
    template = MapTemplate(TensorMapSpec.tiled(Q.dtype.name, view[0], spec.box, strides=view[1],
                                               swizzle="128B", l2_promotion=l2_promotion or "none"))
    return SimpleNamespace(launcher=launcher, workspace=workspace, splits=splits, evict_first=evict_first,
                           persistent=persistent, cluster_merge=cluster_merge, slice_merge=slice_merge,
                           cooperative=bool(cooperative),
                           partial_floats=rows * d, workspace_sizes=(b * hkv, rows * d + lse_floats),
                           tk=template, tv=template, view=view)


class _DecodeThenMerge:
    """attention_decode (its splits publish their partials), then attention_decode_merge on the
    same stream with PDL: the merge's CTAs wait on the decode grid's completion in place."""

    def __init__(self, decode, merge, splits: int):
        self.decode, self.merge, self.splits, self.config = decode, merge, splits, decode.config

    def __call__(self, tk, tv, q, out, table, lens, part, part_lse, counters, heads_kv, group, tokens, *rest) -> None:
        self.decode(tk, tv, q, out, table, lens, part, part_lse, counters, heads_kv, group, tokens, *rest)
        self.merge(part, part_lse, out, heads_kv, group, tokens, self.splits)


@entry_point
def append_kv(k_cache, v_cache, block_table, seq_lens, k_new, v_new, *, stream=None):
    """Write each request's new key and value (k_new, v_new: (batch, heads_kv, head_dim)) into
    the paged caches at position ``seq_lens[b]``, read on the device (graph-capturable): cache
    row ``seq_lens[b] % page_size`` of page ``block_table[b, seq_lens[b] // page_size]``.
    ``seq_lens`` is not changed (the next decode step passes the lengths plus one). A position
    past the block table, or a page outside the cache, writes nothing. Returns None."""
    Q, K, V, T, L = (packed(as_array(a)) for a in (k_new, k_cache, v_cache, block_table, seq_lens))
    who = "append_kv"
    b, _, hkv, d, pages, page_size, _, _, max_pages = _check_cache(who, Q, K, V, T, L, "k_new", max_tokens=1)
    Vn = packed(as_array(v_new))
    if Vn.shape != Q.shape or Vn.dtype != Q.dtype or Vn.strides != Q.strides or Vn.ptr % 16:
        raise TmaflowError(f"{who}: v_new {Vn.shape} {Vn.dtype.name} at 0x{Vn.ptr:x} must be k_new's "
                           f"{Q.shape} {Q.dtype.name}, contiguous and 16-byte aligned (rows are read "
                           "in 16-byte pieces)")
    if K.shape[2] != hkv:
        raise TmaflowError(f"{who}: k_new has {hkv} heads but the caches have {K.shape[2]}; they must match")
    checks.no_aliasing(f"{who}: k_cache", K, (("k_new", Q), ("v_new", Vn), ("block_table", T), ("seq_lens", L)))
    checks.no_aliasing(f"{who}: v_cache", V, (("k_cache", K), ("k_new", Q), ("v_new", Vn),
                                              ("block_table", T), ("seq_lens", L)))
    ordinal = on_current_device(who, K)
    stream = resolve_stream(stream, (Q, Vn, K, V, T, L), ordinal)
    grid = max(1, min(b, _APPEND_GRID))
    key = (who, grid, stream, ordinal, get_ident())
    try:
        launcher = STATES[key]
    except (KeyError, TypeError):
        launcher = cached_state(key, lambda: get_kernel("append_kv", None, file="paged_kv").launcher(
            grid=grid, block=128, stream=stream))
    if b == 0:
        return None, (), None
    return launcher, (K, V, Q, Vn, T, L, hkv * d, page_size, max_pages, pages, b), None


_APPEND_GRID = 1024  # CTAs of append_kv at most; each strides over the requests
