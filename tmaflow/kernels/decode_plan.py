"""Decode attention's plan (``decode.cu``): the K/V box and shared-memory layout of a head dim
and page size (``decode_plan``), and what a call takes where it does not say: the splits,
evict-first, persistence, head groups and the splits' merge (``decode_defaults``), each rule
with the measurements behind it. ``decode_entry`` launches what they plan."""
from __future__ import annotations

import functools
from types import SimpleNamespace

from ..errors import TmaflowError
from ..runtime.device import current_device
from ..tma.layout import HOPPER_SMEM_LIMIT, Barrier, Buffer, Pipeline, SharedLayout
from ..tma.spec import TensorMapSpec

KEYS_PER_TILE = 64        # keys a pipeline stage (as decode.cu's kKeys): 16 for each consumer warp
MAX_ROWS = 16             # new tokens x query heads per kv head: the 16 rows of an mma.sync
MAX_SPLITS = 64           # splits of one request (the merge's log-sum-exps in shared memory)
HEAD_GROUP = 4           # kv heads a CTA of a head-group plan (decode.cu's kHeads: a consumer warp each)
MIN_KEYS_PER_SPLIT = 128  # two tiles: a split's copies all in flight at once (three stages hold them)
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
    time over the persistent plan's 0.972 cold / 0.974 back to back (two splits, 256 CTAs).
    Where ``group_one_cta_default`` holds (head dim 128) its plan comes first: one CTA an SM,
    unsplit, 0.985-0.998 of this one's time at batch 64 8k-32k (session 27)."""
    return persistent and batch > 1 and max_context >= GROUP_SLICE_MIN_CONTEXT


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
