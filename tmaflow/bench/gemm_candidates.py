"""Every configuration the GEMM kernels can run for one bf16 shape, pruned by wave arithmetic:
what ``tools/peers/gemm_sweep.py`` times against cuBLAS to decide each shape's configuration by
measurement. Pure host code (no device): the tool's ``--precompile`` compiles the same list.

A candidate's ``cost`` is a model, not a measurement: rounds of work items the resident CTAs
(or clusters) take, times an item's k-blocks at its tile width's relative speed, plus a fixed
cost per item and the fix-up of a split. It only orders and prunes; the sweep measures."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import TmaflowError
from ..kernels.matmul.config import WIDTHS
from ..kernels.matmul import (BK, BM, GemmConfig, SKINNY_M, SkinnyConfig, choose_config, gemm_plan,
                              skinny_plan, tail_splits)

# Relative speed of a tile's k-blocks by width: the heuristics' table (H200, full waves) for
# multiples of 64, interpolated for the widths between (not yet measured)
_MEASURED = {64: 0.85, 128: 0.96, 192: 0.98, 256: 1.0}
WIDTH_SPEED = {w: _MEASURED.get(w) or _MEASURED[w - w % 64] + (_MEASURED[w - w % 64 + 64] - _MEASURED[w - w % 64])
               * (w % 64) / 64 for w in WIDTHS}

# Modeled costs, in k-blocks of a 128 x 256 tile (about 0.5 us at full clocks): an item's
# prologue and epilogue, global split-K's partial round trip (history: a split tail's part cost
# about 9-12 k-blocks of 128 x 128 tiles, rounded up), a cluster K-split's exchange in shared
# memory (not yet measured: a guess kept small so the sweep tries it)
ITEM_COST, SPLIT_COST, CLUSTER_SPLIT_COST = 1.0, 6.0, 1.0

SPLITS = (1, 2, 3, 4)    # global split_k
CLUSTER_KS = (1, 2, 4)   # GemmConfig.cluster_k
SKINNY_SPLITS = (None, 1, 2, 4, 8)


@dataclass(frozen=True)
class Candidate:
    """One configuration to time for a shape: ``config`` as the entry point takes it, its
    modeled ``cost`` and its ``family`` (what kind of schedule, for keeping the list varied)."""

    config: GemmConfig | SkinnyConfig
    cost: float
    family: str
    default: bool = False


def _epi_cols(bn: int, cluster_m: int) -> int:
    """The heuristics' epilogue rounds: 128 columns for 128-column and clustered 256-column
    tiles, 64 otherwise (every width's whole 64-column boxes)."""
    return 128 if bn == 128 or (bn == 256 and cluster_m == 2) else 64


def dense_configs(m: int, n: int, k: int, sms: int, layout: str = "nt") -> list[GemmConfig]:
    """Every dense-kernel configuration worth timing: tile widths (those that are no multiple
    of 64 for "nt" products only), clusters of two along M,
    global K splits, cluster K-splits and split tails (only where a tail would be split), at
    the heuristics' epilogue width and as many stages as fit (the other fields have not
    mattered below 8192^3)."""
    tiles_m, k_blocks = math.ceil(m / BM), math.ceil(k / BK)
    out = []
    for bn in WIDTH_SPEED:
        if bn % 64 and layout != "nt":
            continue
        for cm in (1, 2) if tiles_m > 1 else (1,):
            base = dict(bn=bn, cluster_m=cm, epi_cols=_epi_cols(bn, cm))
            out += [GemmConfig(**base, split_k=split) for split in SPLITS if split == 1 or k_blocks >= 2 * split]
            if cm == 1:
                out += [GemmConfig(**base, cluster_k=ck) for ck in CLUSTER_KS[1:] if k_blocks >= ck]
            items = math.ceil(tiles_m / cm) * math.ceil(n / bn)
            if tail_splits(items, sms // cm, k_blocks) > 1:
                out.append(GemmConfig(**base, split_tail=True))
    return out


def dense_cost(config: GemmConfig, m: int, n: int, k: int, sms: int) -> float:
    """Modeled time of ``config`` (see the module doc): whole rounds of items on the clusters
    that run at once, a split tail's parts dealt as gemm.cu deals them. Pairs sharing B by
    multicast are counted 2% faster from two rounds on (the heuristics' rule)."""
    bn, cm, ck = config.bn, config.cluster_m, config.cluster_k
    tiles_m, tiles_n, k_blocks = math.ceil(m / BM), math.ceil(n / bn), math.ceil(k / BK)
    clusters = max(1, sms // (cm * ck))
    items = math.ceil(tiles_m / cm) * tiles_n
    per_kb = (bn / 256) / WIDTH_SPEED[bn] * (0.98 if cm == 2 and items > clusters else 1.0)
    fixed = ITEM_COST * (0.5 + bn / 512)
    split = config.split_k
    if config.split_tail:
        parts = tail_splits(items, clusters, k_blocks)
        tail = items % clusters if parts > 1 else 0
        whole = math.ceil((items - tail) / clusters) * (k_blocks * per_kb + fixed)
        part = math.ceil(k_blocks / parts) * per_kb + fixed + SPLIT_COST
        return whole + math.ceil(tail * parts / clusters) * part
    rounds = math.ceil(items * split / clusters)
    kb = math.ceil(k_blocks / (split * ck))
    extra = (SPLIT_COST if split > 1 else 0.0) + (CLUSTER_SPLIT_COST * (ck - 1) if ck > 1 else 0.0)
    return rounds * (kb * per_kb + fixed + extra)


def skinny_configs(m: int, n: int, k: int, sms: int) -> list[SkinnyConfig]:
    """The skinny path's choices ("nt", M <= 128): 64- or 128-row CTAs, alone or in pairs
    sharing A, K split as the heuristics do (None), unsplit, or in twice as many splits; for
    65-128 rows also in pairs computing M's two 64-row halves (``m_halves=2``, K split as the
    heuristics do)."""
    out = []
    for rows in (64, 128):
        for cl in (1, 2):
            auto = skinny_plan(m, n, k, SkinnyConfig(rows=rows, cluster=cl), sms).config.split_k or 1
            out += [SkinnyConfig(rows=rows, cluster=cl, split_k=split) for split in (None, 1, min(64, 2 * auto))]
        if 64 < m <= 128:
            out.append(SkinnyConfig(rows=rows, m_halves=2))
    return out


def skinny_cost(config: SkinnyConfig, m: int, n: int, k: int, sms: int) -> float:
    """Modeled time of a skinny launch: one CTA per (rows of N, K split), in waves; a k-block
    costs its bytes (B's rows and A's padded ones) against a 128 x 256 tile's 384 rows."""
    plan = skinny_plan(m, n, k, config, sms)
    split, rows, cl, mp = plan.config.split_k or 1, config.rows, config.cluster, plan.defines["MP"]
    ctas = math.ceil(math.ceil(n / rows) / cl) * cl * split * config.m_halves
    kb = math.ceil(math.ceil(k / BK) / split)
    return math.ceil(ctas / sms) * (kb * (rows + mp) / 384 + ITEM_COST) + (SPLIT_COST if split > 1 else 0.0)


def family(config) -> str:
    """The schedule kind of a config: the pruned list takes the cheapest of each first."""
    if isinstance(config, SkinnyConfig):
        return f"skinny rows{config.rows} c{config.cluster} k{config.split_k or 'auto'} mh{config.m_halves}"
    kind = ("tail" if config.split_tail else f"ck{config.cluster_k}" if config.cluster_k > 1
            else f"k{config.split_k}" if config.split_k > 1 else "whole")
    return f"{'odd' if config.bn % 64 else 'whole'} boxes c{config.cluster_m} {kind}"


def normalized(config, m: int, n: int, k: int, layout: str, sms: int):
    """The configuration as the kernel runs it (splits that cannot all hold k-blocks merged,
    stages filled in): two candidates that normalise alike are one."""
    if isinstance(config, SkinnyConfig):
        return skinny_plan(m, n, k, config, sms).config
    return gemm_plan(m, n, k, layout, config).config


LARGE_FLOP = 2e11  # above this (about 0.3 ms) the heuristics' tiles already match cuBLAS: fewer candidates
SMALL_FLOP = 1e10  # below this (about 20 us) a candidate costs little to time: more of them


def candidates(m: int, n: int, k: int, layout: str, sms: int, limit: int | None = None) -> list[Candidate]:
    """The configurations to time for an (m, n, k) bf16 product, the default first, then its
    unsplit twin where it splits K (history: 512x512x2048 in two K splits ran 0.69x cuBLAS,
    unsplit 0.79x). Skinny shapes ("nt", M <= SKINNY_M): every skinny choice, then the 4
    cheapest dense ones by modeled cost. Others: the cheapest dense configuration of each
    family, then the cheapest left, ``limit`` in all (default 10; 12 below SMALL_FLOP, 5 above
    LARGE_FLOP). Equal configurations (once normalised) are timed once; ones whose plan does
    not fit are left out."""
    default = choose_config(m, n, k, sms, layout)
    chosen: list[Candidate] = []
    seen: set = set()

    def take(cost, cfg, is_default=False) -> bool:
        try:
            key = normalized(cfg, m, n, k, layout, sms)
        except TmaflowError:  # LayoutError included: the stages do not fit
            return False
        if key in seen:
            return False
        seen.add(key)
        chosen.append(Candidate(cfg, cost, family(cfg), is_default))
        return True

    def cost_of(cfg) -> float:
        return skinny_cost(cfg, m, n, k, sms) if isinstance(cfg, SkinnyConfig) else dense_cost(cfg, m, n, k, sms)

    try:
        normalized(default, m, n, k, layout, sms)
    except TmaflowError as exc:
        raise TmaflowError(f"gemm candidates: the TMA kernel cannot run {m}x{n}x{k} as given ({exc}); the "
                           "sweep takes shapes whose N and K are multiples of 8 (others take the edge path)") from None
    take(cost_of(default), default, True)
    if isinstance(default, GemmConfig) and (default.split_k > 1 or default.cluster_k > 1 or default.split_tail):
        whole = replace(default, split_k=1, cluster_k=1, split_tail=False)
        take(cost_of(whole), whole)
    skinny = layout == "nt" and m <= SKINNY_M
    if skinny:
        for cfg in skinny_configs(m, n, k, sms):
            take(cost_of(cfg), cfg)
    flop = 2.0 * m * n * k
    dense_limit = limit or (len(chosen) + 4 if skinny else 5 if flop > LARGE_FLOP else 12 if flop < SMALL_FLOP else 10)
    pool = sorted(((dense_cost(cfg, m, n, k, sms), i, cfg) for i, cfg in enumerate(dense_configs(m, n, k, sms, layout))),
                  key=lambda item: item[:2])
    families = {c.family for c in chosen}
    for cost, _, cfg in pool:  # the cheapest of each family first
        if len(chosen) < dense_limit and family(cfg) not in families and take(cost, cfg):
            families.add(family(cfg))
    for cost, _, cfg in pool:  # then the cheapest left
        if len(chosen) < dense_limit:
            take(cost, cfg)
    return chosen
