"""Decode attention over a paged KV cache (``decode.cu``, flash-decoding): the plan (a 3-D tensor
map over each cache, a K+V pipeline sized for two CTAs an SM, the split count, persistent CTAs)
and the entry points ``kernels.attention_decode`` and ``kernels.append_kv`` (``paged_kv.cu``)."""
from __future__ import annotations

import functools
import math
from threading import get_ident
from types import SimpleNamespace
from typing import NamedTuple

from ..errors import TmaflowError
from ..launch.config import resolve_stream
from ..runtime.device import current_device, current_ordinal
from ..runtime.memory import as_array
from ..tma.layout import HOPPER_SMEM_LIMIT, Barrier, Buffer, Pipeline, SharedLayout
from ..tma.spec import TensorMapSpec
from ..tma.tensormap import MapTemplate
from . import checks
from .attention_entry import DTYPES, _given_out, _scale
from .entry import (STATES, cached_state, contiguous_strides, entry_point, new_output, on_current_device,
                    packed)
from .matmul.splitk import _split_k_buffers, _with_split_k
from .registry import get_kernel

KEYS_PER_TILE = 64        # keys a pipeline stage (as decode.cu's kKeys): 16 for each consumer warp
HEAD_DIMS = range(32, 257, 16)  # multiples of 16: the mma's k-step; tiles pad to 64 columns
PAGE_SIZES = (16, 32, 64, 128, 256)
MAX_ROWS = 16             # new tokens x query heads per kv head: the 16 rows of an mma.sync
MAX_TOKENS = 8            # new tokens a request (speculative decoding)
MAX_SPLITS = 64           # splits of one request (the merge's log-sum-exps in shared memory)
HEAD_GROUP = 4           # kv heads a CTA of a head-group plan (decode.cu's kHeads: a consumer warp each)
MAX_CLUSTER = 16          # splits a cluster merge takes (decode.cu's kMaxCluster; over 8: non-portable)
MIN_KEYS_PER_SPLIT = 128  # two tiles: a split's copies all in flight at once (three stages hold them)
THREADS = 160             # four consumer warps and a producer warp
MERGE_THREADS = 64        # attention_decode_merge's CTAs (decode.cu's __launch_bounds__: at most 128)
_TWO_CTAS = HOPPER_SMEM_LIMIT // 2 - 1024  # an SM's 228 KB less 1 KB a CTA, halved
_SM_SMEM = 228 * 1024  # an SM's shared memory (three CTAs: a third each, less their 1 KB)
_MAX_STAGES = 8
EVICT_FIRST_MAX_L2S = 8   # evict-first K/V up to this many L2s of them (evict_first_default)
EVICT_FIRST_MIN_L2S = 0.5  # ... from this share of an L2 on
GROUP_SLICE_MIN_CONTEXT = 8192  # head groups merged by slices replace a persistent plan from here (group_slice_default)
MIN_SLICE_SPLITS = 16     # splits a default slice merge takes at least (below: the cluster or counter merge)


@functools.lru_cache(maxsize=64)
def decode_plan(head_dim: int, page_size: int, persistent: bool = False, ctas: int | None = None,
                wide_box: bool = False, head_group: bool = False) -> tuple[TensorMapSpec, SharedLayout, int]:
    """(K/V box spec, shared layout, CTAs an SM) for a head dim and page size. A box is one page
    (or a 64-key tile's part of one) by 64 columns (the last one reaching past the head dim when
    it is not a multiple of 64: TMA fills zeros); a stage holds a tile of K and of V. Stages
    fill half the shared memory when two fit there (two CTAs an SM overlap one's start and end
    with the other's loads), else all of it. The K tiles of every stage, then the V tiles, are
    one region: the splits' merge reuses it whole. ``persistent``: the warps' merge has its own
    buffer (the stages hold the next item's tiles meanwhile). ``ctas`` (1-3): the stages fill
    that share of the shared memory instead (1: six stages at head dim 128, 3: two).
    ``wide_box`` (head dims a multiple of 64): one box a page piece covers every 64-column block
    (a 4-D map over (kv head, column block, cache row, 64)): half the copies at head dim 128.
    ``head_group`` (head dims a multiple of 64): a stage is 16 keys of HEAD_GROUP kv heads, one
    box of the same 4-D map (four heads' rows side by side: 1 KB runs at head dim 128), as many
    bytes as a 64-key tile of one head. The spec's shape is a placeholder."""
    box_keys = min(page_size, KEYS_PER_TILE)
    tile_cols = -(-head_dim // 64) * 64
    if head_group:
        if head_dim % 64 or wide_box:
            raise TmaflowError(f"decode_plan: head_group with head_dim={head_dim} and wide_box={wide_box}; a head "
                               "group's box spans whole 64-column blocks of four kv heads' rows: give a head_dim "
                               "that is a multiple of 64 and no wide_box")
        step = KEYS_PER_TILE // HEAD_GROUP
        spec = TensorMapSpec.tiled("bfloat16", (HEAD_GROUP, tile_cols // 64, step, 64),
                                   (HEAD_GROUP, tile_cols // 64, step, 64), swizzle="128B")
        boxes = 1
    elif wide_box:
        if head_dim % 64:
            raise TmaflowError(f"decode_plan: wide_box with head_dim={head_dim}; a box spans whole 64-column "
                               "blocks of a kv head's row: give a head_dim that is a multiple of 64")
        spec = TensorMapSpec.tiled("bfloat16", (1, tile_cols // 64, box_keys, 64), (1, tile_cols // 64, box_keys, 64),
                                   swizzle="128B")
        boxes = KEYS_PER_TILE // box_keys
    else:
        spec = TensorMapSpec.tiled("bfloat16", (box_keys, 1, head_dim), (box_keys, 1, 64), swizzle="128B")
        boxes = (tile_cols // 64) * (KEYS_PER_TILE // box_keys)
    q = Buffer("q", MAX_ROWS * (head_dim * 2 + 16))  # then the splits' merge's row statistics
    warps = [Buffer("warps", 4 * MAX_ROWS * (head_dim + 2 * 4 + 2))] if persistent else []  # O, statistics
    fixed_bytes = q.total_bytes + sum(w.total_bytes for w in warps) + 1024
    stage_bytes = 2 * KEYS_PER_TILE * tile_cols * 2
    if ctas is None:
        ctas = 2 if (_TWO_CTAS - fixed_bytes) // stage_bytes >= 2 else 1
    budget = {1: HOPPER_SMEM_LIMIT, 2: _TWO_CTAS}.get(ctas, _SM_SMEM // ctas - 1024)
    stages = min(_MAX_STAGES, (budget - fixed_bytes) // stage_bytes)
    if stages < 2:
        raise TmaflowError(f"decode_plan: ctas={ctas} an SM at head_dim={head_dim}{' persistent' if persistent else ''} "
                           f"leaves {stages} stage of {stage_bytes} B in {budget} B of shared memory a CTA; the "
                           "pipeline needs two: give fewer CTAs an SM")
    pipe = Pipeline("kv", stages=stages, tiles={"k": (spec, boxes), "v": (spec, boxes)}, consumers=4)
    layout = SharedLayout([pipe, q, *warps, Barrier("merged")], limit=budget)
    if layout.offset("kv_v") != layout.offset("kv_k") + stages * pipe.stage_stride(0):
        raise TmaflowError(f"decode_plan({head_dim}, {page_size}): the V tiles do not follow the K tiles; "
                           "the splits' merge needs them as one region")
    return spec, layout, ctas


def choose_splits(batch: int, heads_kv: int, max_context: int, sm_count: int, ctas_per_sm: int) -> int:
    """Splits of each request's keys: the fewest whose CTAs fill 95% of the GPU's CTA slots
    over whole waves (else the count that fills most), none shorter than MIN_KEYS_PER_SPLIT keys
    of the longest possible context (the block table's width x page size: lengths live on the
    device). Three splits of 128 (request, kv head) pairs would run 384 CTAs in 264 slots, a
    second wave half empty; two fill one wave."""
    slots, pairs = sm_count * ctas_per_sm, max(1, batch * heads_kv)
    counts = range(1, max(1, min(MAX_SPLITS, -(-max_context // MIN_KEYS_PER_SPLIT))) + 1)

    def filled(splits: int) -> float:  # of the slots the waves hold, the share CTAs use
        ctas = pairs * splits
        return ctas / (-(-ctas // slots) * slots)
    return next((s for s in counts if filled(s) >= 0.95), max(counts, key=filled))


def persistent_default(batch: int, heads_kv: int, head_dim: int, splits: int, sm_count: int,
                       ctas_per_sm: int) -> bool:
    """Whether CTAs walk several (request, kv head) items instead of one each: with one split
    and more items than CTA slots (several waves), at head dims to 128 (the plans that keep two
    CTAs an SM with the warps' own merge buffer). A wave's CTAs start and end together, and
    between one's last copy and the next one's first (its length, block table, first tile: a
    few microseconds) the SM reads nothing; a walking CTA's producer runs on into the next item."""
    return splits == 1 and head_dim <= 128 and batch * heads_kv > sm_count * ctas_per_sm


def head_group_default(batch: int, heads_kv: int, head_dim: int, page_size: int, max_context: int, sm_count: int,
                       ctas_per_sm: int | None = None) -> bool:
    """Whether CTAs read four kv heads of a request when the call does not say: where the four
    heads' items fill the GPU with one split (H200, session 17 call 2, cold / back to back, time
    over the one-head plan: batch 128, 1k keys, 8:1 page 16 0.935 / 0.892, 4:1 page 64 0.951 /
    0.919, one split each; where the group plan splits, 0.99-1.06 cold: batch 16 8k-32k, batch 64
    1k)."""
    if heads_kv % HEAD_GROUP or head_dim not in (64, 128) or ctas_per_sm is not None:
        return False  # (measured at head dim 128; a given CTA count keeps the one-head plan it was for)
    group_ctas = decode_plan(head_dim, page_size, ctas=ctas_per_sm, head_group=True)[2]
    return choose_splits(batch, heads_kv // HEAD_GROUP, max_context, sm_count, group_ctas) == 1


def group_one_cta_default(batch: int, heads_kv: int, head_dim: int, sm_count: int) -> bool:
    """Whether a call the two-CTA head-group plan would split (``head_group_default`` False)
    takes four kv heads a CTA at one CTA an SM of six stages instead, when it says nothing:
    where those items fill 95% of one wave of SMs unsplit (batch 64 at 8 kv heads on 132 SMs:
    128 CTAs, each a request's four heads in 1 KB runs, no split to merge). H200, session 27,
    time over the plan's (one kv head a CTA walking items to 4k, head groups of two splits merged
    by slices from 8k), cold / back to back, batch 64: 8:1 page 16 1k 0.943 / 0.898; 4:1 page 16
    1k 0.960 / 0.888 (a second run), page 64 0.959 / 0.906, 2k 0.945 / 0.947, 4k 0.966 / 0.961
    (8:1 0.957 / 0.960), 8k 0.985 / 0.983 (8:1 page 64 0.998 / 0.992), 32k 0.989 / 0.988.
    Measured at head dim 128 only, and in one wave (past it the two-CTA plan's slots fill)."""
    items = batch * heads_kv // HEAD_GROUP
    return heads_kv % HEAD_GROUP == 0 and head_dim == 128 and 0.95 * sm_count <= items <= sm_count


def cluster_merge_default(batch: int, heads_kv: int, splits: int, sm_count: int) -> bool:
    """Whether the splits of a (request, kv head) merge in a cluster, through distributed shared
    memory, when the call does not say: 2-8 splits (a portable cluster) and at most one CTA an
    SM in all (every cluster fits at once whatever the GPCs' sizes). That is a short call (batch
    1 at 1k: 8 splits x 8 kv heads), whose time is a chain of round trips: the counter's merge
    adds a workspace write, an atomic (in DRAM after a cold flush) and a copy of the partials.
    Two splits merge in pairs at any CTA count (a pair shares an SM of two CTAs): H200, session
    16, two runs, time over the counter merge's, cold / back to back: batch 16 8k 4:1 0.985-0.990
    / 0.975-0.979, 32k 8:1 0.987-0.988 / 0.979-0.987 (256 CTAs; eight a cluster at batch 4 8k:
    1.17-1.22)."""
    return splits == 2 or (2 <= splits <= 8 and batch * heads_kv * splits <= sm_count)


def slice_merge_default(batch: int, items: int, splits: int, sm_count: int, ctas_per_sm: int) -> bool:
    """Whether the splits of a (request, kv head) merge by slices when the call does not say:
    at MIN_SLICE_SPLITS or more splits (a short call's: batch 1 at 8k-128k, 32 splits of 8 kv
    heads) whose CTAs all fit the GPU at once (the launch is cooperative: the driver runs it
    only with every CTA resident, as the splits wait on each other). Each split then merges its
    share of the columns after one count, where the counter's last CTA copies in every split's
    partials and merges them alone (H200, session 16, batch 1, cold / back to back, time over
    the counter merge's: 8k 0.940 / 0.884 (8:1) and 0.969 / 0.975 (4:1), 32k 0.972 / 0.953 and
    0.986 / 0.966, 128k 0.985 / 0.980 and 0.996 / 0.992; at 1k 1.07 against the cluster merge)."""
    return splits >= MIN_SLICE_SPLITS and batch * items * splits <= sm_count * ctas_per_sm


def evict_first_default(batch: int, heads_kv: int, head_dim: int, max_context: int, itemsize: int,
                        l2_bytes: int) -> bool:
    """Whether K and V pass through L2 at evict-first priority when the call does not say: when
    the keys and values a call may read (every request at the block table's full width) are
    more than half the L2, up to EVICT_FIRST_MAX_L2S times it. Such a cache does not stay in L2
    from one call to the next beside a model's other layers, and read at normal priority its
    lines push out everything else there, dirty lines written back to DRAM on the way (a cold
    benchmark's flush leaves the whole L2 dirty: up to 50 MB more DRAM traffic a call; H200,
    session 19, batch 1 8k, 34 MB: evict-first 0.940 / 0.949 of normal priority's time cold,
    0.999 / 0.978 back to back, 8:1 page 16 / 4:1 page 64). A smaller cache keeps normal
    priority, so a second read of it hits L2. A much larger one keeps it too: there the
    evict-first stream ran slower than the write-backs it saves (H200, session 16, three runs,
    cold, time at normal priority over evict-first's: 537 MB of K+V 0.959-0.965 at batch 1 128k
    and 0.958-0.963 at batch 16 8k, 2.1 GB 0.958-0.973 at batch 16 32k and batch 64 8k, 537 MB
    at batch 128 1k 0.981-0.996; against 1.007-1.010 at 268 MB (batch 64 1k) and 1.05-1.09 at
    134 MB (batch 1 32k, batch 4 8k); after a clean flush 0.996-1.003 at 537 MB and up)."""
    kv_bytes = 2 * batch * heads_kv * head_dim * max_context * itemsize
    return EVICT_FIRST_MIN_L2S * l2_bytes < kv_bytes <= EVICT_FIRST_MAX_L2S * l2_bytes


def group_slice_default(batch: int, max_context: int, persistent: bool) -> bool:
    """Whether a call whose one-head plan walks items persistently takes four kv heads a CTA
    with their automatic splits merged by slices instead (when the call says nothing and
    those CTAs all fit at once: the caller checks): H200, session 19, batch 64 8k 8:1 page 64,
    time over the persistent plan's 0.972 cold / 0.974 back to back (two splits, 256 CTAs)."""
    return persistent and batch > 1 and max_context >= GROUP_SLICE_MIN_CONTEXT


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
    part, counters = _split_k_buffers(st)
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


def decode_choices(batch: int, heads_kv: int, head_dim: int, page_size: int, max_context: int,
                   num_splits: int | None = None, evict_first: bool | None = None, device=None,
                   ctas_per_sm: int | None = None, head_group: bool = False) -> tuple[int, bool]:
    """(splits, evict_first) a call plans on ``device`` (the current one by default): the
    given values, else choose_splits (over CTAs of HEAD_GROUP kv heads with ``head_group``) and
    evict_first_default's (bf16 and fp16 alike)."""
    device = device or current_device()
    ctas_per_sm = decode_plan(head_dim, page_size, ctas=ctas_per_sm, head_group=head_group)[2]
    items = heads_kv // HEAD_GROUP if head_group else heads_kv
    splits = num_splits or choose_splits(batch, items, max_context, device.sm_count, ctas_per_sm)
    if evict_first is None:
        evict_first = evict_first_default(batch, heads_kv, head_dim, max_context, 2, device.l2_bytes)
    return splits, evict_first


def decode_defaults(batch: int, heads_kv: int, head_dim: int, page_size: int, max_context: int, device,
                    num_splits=None, evict_first=None, persistent=None, cluster_merge=None, slice_merge=None,
                    ctas=None, wide_box=False, head_group=None, clusters: bool = True) -> SimpleNamespace:
    """What a call plans on ``device`` for the options it was given (None: the defaults, in this
    order): head groups (at one CTA an SM where ``group_one_cta_default`` holds), splits and
    evict-first, persistence, the cluster and slice merges; also the CTAs a request and split
    (``items``), the CTAs an SM of the non-persistent plan, and ``ctas``: decode_plan's argument
    (the call's, or 1 from group_one_cta_default).
    ``clusters`` False: no cluster merge by default (a cooperative launch has no clusters), the
    other defaults as without it."""
    free = head_group is None and num_splits is None and persistent is None and ctas is None and \
        cluster_merge is None and slice_merge is None and not wide_box
    if head_group is None:
        head_group = num_splits is None and persistent is None and not (cluster_merge or slice_merge or wide_box) \
            and head_group_default(batch, heads_kv, head_dim, page_size, max_context, device.sm_count, ctas)
        if free and not head_group and group_one_cta_default(batch, heads_kv, head_dim, device.sm_count):
            head_group, ctas = True, 1
    items = heads_kv // HEAD_GROUP if head_group else heads_kv
    splits, evict_first = decode_choices(batch, heads_kv, head_dim, page_size, max_context,
                                         1 if persistent else num_splits, evict_first, device, ctas, head_group)
    ctas_per_sm = decode_plan(head_dim, page_size, ctas=ctas, head_group=head_group)[2]
    if persistent is None:
        persistent = persistent_default(batch, items, head_dim, splits, device.sm_count, ctas_per_sm)
        if persistent:  # not asked for: a persistent plan that leaves too few stages is not taken
            try:
                decode_plan(head_dim, page_size, True, ctas, wide_box, head_group)
            except TmaflowError:
                persistent = False
    if cluster_merge is None:
        cluster_merge = clusters and not persistent and not slice_merge and not head_group and \
            cluster_merge_default(batch, heads_kv, splits, device.sm_count)
    if slice_merge is None:
        slice_merge = not (persistent or cluster_merge or head_group) and \
            slice_merge_default(batch, items, splits, device.sm_count, ctas_per_sm)
    slice_merge = bool(slice_merge) and splits > 1 and not persistent and not cluster_merge
    if free and not head_group and heads_kv % HEAD_GROUP == 0 and head_dim in (64, 128) and \
            group_slice_default(batch, max_context, persistent):
        grouped = decode_defaults(batch, heads_kv, head_dim, page_size, max_context, device, evict_first=evict_first,
                                  head_group=True, slice_merge=True, clusters=clusters)
        if grouped.slice_merge and batch * grouped.items * grouped.splits <= device.sm_count * grouped.ctas_per_sm:
            return grouped
    return SimpleNamespace(splits=splits, evict_first=evict_first, persistent=persistent,
                           cluster_merge=cluster_merge, slice_merge=slice_merge, head_group=head_group, items=items,
                           ctas_per_sm=ctas_per_sm, ctas=ctas)


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
    ordinal = current_ordinal()
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
