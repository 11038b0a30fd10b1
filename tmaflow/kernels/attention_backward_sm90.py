"""The Hopper attention backward (``attention_backward_sm90.cu``) for head dims 64 and 128: its
tensor maps, shared memory, launches and arguments (``attention_backward_entry`` routes here)."""
from __future__ import annotations

import math

from ..errors import TmaflowError
from ..tma.spec import TensorMapSpec
from ..tma.tensormap import MapTemplate
from .registry import get_kernel

SM90_HEAD_DIMS = (64, 128)
KEYS = 128      # keys a CTA (attention_backward_sm90.cu's BN): two consumer warpgroups of 64
ROWS = 64       # query rows a step (BM, the kernel's BLOCK_M) ...
# ... but 128 at these head dims (FA3's tile at 64: S^T and dP^T as m64n128 wgmmas, a step's
# waits and barriers paid once for twice the work)
WIDE_STEP_HEAD_DIMS = (64,)
STAGES = 3      # Q / dO stages in flight (a stage is refilled a step and more before its use)
THREADS = 384   # a producer warpgroup and two consumers
# Head dims whose dQ leaves through shared memory and bulk reductions (the kernel's DQ_BULK);
# the others add it with red.global.add.v2.f32 (H200, same rounds, cold: head dim 128 bulk
# 1.04-1.12x red at 1k-16k; head dim 64 bulk 0.74-0.83x red)
DQ_BULK_HEAD_DIMS = (128,)
_PREP_ROWS = 8  # padded query rows a CTA of the prep kernel (a warp each)
_DQ_GRID = 1024


def step_rows(head_dim: int) -> int:
    """Query rows a step of the plan at ``head_dim`` (the kernel's BLOCK_M)."""
    return 2 * ROWS if head_dim in WIDE_STEP_HEAD_DIMS else ROWS


def kernel_smem(head_dim: int, rows: int = ROWS, dq_bulk: bool = True, stages: int = STAGES,
                dq_bufs: int | None = None, dq_pack: bool = False) -> int:
    """Dynamic shared memory of ``attention_bwd_sm90`` (its kSmemBytes): K and V, the stages of
    Q and dO, two dS^T buffers, the dQ buffers in fp32 (DQ_BULK; DQ_BUFS of them, by default two
    at head dim 64 with 64-row steps, else one; rows padded by 16 B, or with DQ_PACK 96 B a
    buffer), the stages' LSE and Delta rows, the barriers (K / V full and empty, the stages',
    the dQ buffers')."""
    kv = 2 * KEYS * head_dim
    q = rows * 2 * head_dim
    if dq_bufs is None:
        dq_bufs = 2 if head_dim == 64 and rows == ROWS else 1
    dq = dq_bufs * dq_buffer_bytes(head_dim, rows, dq_pack) if dq_bulk else 0
    return (2 * kv + 2 * stages * q + 2 * KEYS * 2 * rows + dq + stages * 2 * rows * 4 +
            (2 + 2 * stages + 2 * dq_bufs) * 8)


def dq_buffer_bytes(head_dim: int, rows: int, dq_pack: bool) -> int:
    """Bytes of a shared dQ buffer (the kernel's kDQBuf): ``rows`` fp32 rows of ``head_dim``,
    each padded by 16 B, or (DQ_PACK) packed with 96 B of shifts; DQ_TILE's tile is its image."""
    return rows * 4 * head_dim + 96 if dq_pack else rows * (4 * head_dim + 16)


def defines_smem(head_dim: int, defines: dict) -> int:
    """``kernel_smem`` of a built kernel's ``defines`` (the plan's with any override): the
    kernel's defaults where a define is absent."""
    bufs = defines.get("DQ_BUFS")
    return kernel_smem(head_dim, int(defines.get("BLOCK_M", ROWS)), bool(int(defines.get("DQ_BULK", 1))),
                       int(defines.get("STAGES", 2)), None if bufs is None else int(bufs),
                       bool(int(defines.get("DQ_PACK", 0))))


def sm90_smem(head_dim: int, stages: int = STAGES) -> int:
    """What launches reserve: the most any variant of the kernel that compiles at ``head_dim``
    needs (64-row steps with DQ_BULK; head dim 64 also 128-row steps without it, the plan's),
    so an override of BLOCK_M or DQ_BULK (kernels.registry.extra_defines) always fits."""
    wide = [kernel_smem(head_dim, 2 * ROWS, False, stages)] if head_dim in WIDE_STEP_HEAD_DIMS else []
    return max([kernel_smem(head_dim, ROWS, True, stages)] + wide)


# Head dim 128 outside the deterministic mode: two dQ buffers (rows packed into four runs, so
# they fit) with two Q / dO stages, the consumers' next dQ stores no longer waiting for the bulk
# reductions of the last (H200, same rounds, cold, against one buffer and three stages: 1k
# 1.09 / 1.08x, 4k 1.09 / 1.09x, 16k 1.08 / 1.10x full / causal; deterministic: equal, kept)
TWO_DQ_BUFFERS = {"STAGES": 2, "DQ_BUFS": 2, "DQ_PACK": 1}
# The deterministic mode at head dim 128, every walk (dense and varlen): a dQ buffer and every
# other step a producer warp (DQ_WARPS). A step's chain wait, reduction, wait for its completion
# and release are one serial chain in the warp that issues the reduction, about a step long: H200,
# session 19, TFLOP/s over the default mode's, cold, one warp / two: causal 4k 0.837 / 0.988, 16k
# 0.775 / 0.944; the chain from key block 0 (full) 4k 0.742 / 0.863, 16k 0.795 / 1.010; the rotated
# walk 4k 0.837 / 1.009, 16k 0.822 / 1.033.
TWO_DQ_WARPS = {**TWO_DQ_BUFFERS, "DQ_WARPS": 2}


# The dQ accumulator in tiles, each the shared dQ buffer's image, a step's dQ one bulk reduction
# (the kernel's DQ_TILE, FA3's) instead of one a row (head dim 128) or red.global (64: its tile
# variant takes the bulk path with two stages; a 128-row buffer beside three does not fit).
DQ_TILE_DEFINES = {128: {"DQ_TILE": 1}, 64: {"DQ_TILE": 1, "DQ_BULK": 1, "STAGES": 2}}
# The row reductions' schedule the tiles replaced (an A/B's override, kernels.registry.extra_defines)
DQ_ROWS_DEFINES = {128: {"DQ_TILE": 0}, 64: {"DQ_TILE": 0, "DQ_BULK": 0, "STAGES": STAGES}}
# Head dims whose dense plan takes DQ_TILE_DEFINES (H200, session 17 call 4, same rounds, cold,
# TFLOP/s tiles / rows: head dim 128 4k 540 / 466 full, 472 / 408 causal, 16k 552 / 466, 553 /
# 464; head dim 64 4k 494 / 402, 412 / 366, 16k 534 / 423, 504 / 438; deterministic 4k: 1.16-1.44x)
DQ_TILE_HEAD_DIMS: tuple[int, ...] = (64, 128)


def main_defines(head_dim: int, causal: bool, deterministic: bool, fp16: bool, varlen: bool = False) -> dict:
    """The defines of the plans' ``attention_bwd_sm90`` (the dense prep kernel's are the first
    three): the dense and the varlen (VARLEN) plan run the same schedule, dQ tiles included
    (DQ_TILE_HEAD_DIMS; the varlen plan's tiles per sequence, varlen_tiles_per_head)."""
    two_buffers = {} if head_dim != 128 else TWO_DQ_WARPS if deterministic else TWO_DQ_BUFFERS
    tiles = DQ_TILE_DEFINES[head_dim] if head_dim in DQ_TILE_HEAD_DIMS else {}
    return {"HEAD_DIM": head_dim, "DETERMINISTIC": int(deterministic), **({"FP16": 1} if fp16 else {}),
            **({"VARLEN": 1} if varlen else {}), "CAUSAL": int(causal), "STAGES": STAGES,
            "BLOCK_M": step_rows(head_dim), "DQ_BULK": int(head_dim in DQ_BULK_HEAD_DIMS), **two_buffers, **tiles}


# The varlen plan's schedule before it took main_defines (64-row steps; head dim 128 one dQ
# buffer and three stages; dQ rows): an A/B's override (kernels.registry.extra_defines) of the plan's.
VARLEN_BEFORE = {64: {**DQ_ROWS_DEFINES[64], "BLOCK_M": ROWS},
                 128: {**DQ_ROWS_DEFINES[128], "STAGES": 3, "DQ_BUFS": 1, "DQ_PACK": 0, "DQ_WARPS": 1}}


# The deterministic full-attention walk (dense): a persistent, cooperative grid of whole (batch,
# kv head) groups a wave, each key block's walk rotated, each query block's chain in the order
# its key blocks reach it (the kernel's DET_ROTATE). Where a group's key blocks do not all fit
# the GPU at once (persistent_slots 0) the plan takes the chain from key block 0 (main_defines',
# as an override of DET_ROTATE=0 does). Head dim 128's two dQ buffers and warps come with
# main_defines (TWO_DQ_WARPS, every deterministic walk).
DET_ROTATE_DEFINES = {64: {"DET_ROTATE": 1}, 128: {"DET_ROTATE": 1}}
# Head dim 64 keeps the chain past 64 key blocks a group (8k keys): H200, session 18, TFLOP/s
# over the default mode's, cold: 4k rotate 0.910 / chain 0.717, 16k rotate 0.872 / chain 0.897
# (one group a wave leaves the rotation 4 idle SMs and no skew to remove); head dim 128 rotates
# (4k 0.834 / 0.739, 16k 0.806 / 0.789).
ROTATE_KEY_BLOCKS_64 = 64
# The rotated walk with one dQ buffer (so one dQ warp) and three stages at head dim 128 (an A/B's override)
ROTATE_ONE_BUFFER = {"STAGES": STAGES, "DQ_BUFS": 1, "DQ_PACK": 0, "DQ_WARPS": 1}
# Head dim 128's rotated walk with one dQ warp (session 18's plan; an A/B's override)
ROTATE_ONE_DQ_WARP = {"DQ_WARPS": 1}
# The kernel's DET_DIAG builds (A/B diagnostics of the deterministic dQ warp, sums in no fixed
# order: never a plan's): no chain at all, no chain wait, the release once a reduction is read
DET_DIAGNOSTICS = {"nochain": {"DET_DIAG": 1}, "nowait": {"DET_DIAG": 2}, "nodone": {"DET_DIAG": 3}}


def persistent_slots(key_blocks: int, groups: int, resident: int) -> int:
    """DET_ROTATE's slots: (batch, kv head) groups a wave, each ``key_blocks`` CTAs, all of a
    wave resident at once (``resident`` CTAs fit the GPU): no group may span two waves, its
    chain waits on every one of its key blocks. 0 where one group does not fit (or has no keys)."""
    if key_blocks < 1 or groups < 1:
        return 0
    return min(resident // key_blocks, groups)


def rotated_chain_rank(i: int, j: int, key_blocks: int, per_head: int) -> int:
    """DET_ROTATE: how many key blocks add to query block i before key block j (the kernel's
    chain_rank): key block j's walk starts at query block j per_head // key_blocks, and the
    order is that of arrival, j0 (the last to start at or before i), j0 - 1, .., 0, key_blocks
    - 1, .., j0 + 1."""
    j0 = min(key_blocks - 1, -(-(i + 1) * key_blocks // per_head) - 1)
    return (j0 - j) % key_blocks


def padded_rows(seq: int, rows: int = ROWS) -> int:
    """Query rows a head in the LSE / Delta workspace: whole steps of ``rows`` (bulk copies)."""
    return -(-seq // rows) * rows


def main_launcher_of(name: str, defines: dict, stream, **config):
    """A launcher of kernel ``name`` of attention_backward_sm90.cu built with ``defines``."""
    return get_kernel(name, None, defines=defines, file="attention_backward_sm90").launcher(stream=stream, **config)


def _main_kernel(defines: dict, full_deterministic: bool, key_blocks: int, heads_kv: int, batch: int, stream):
    """(kernel, grid, slots) of the dense plan's ``attention_bwd_sm90``: for the deterministic
    full attention the persistent rotated walk (DET_ROTATE, ``slots`` groups a wave) where a
    group's key blocks fit the GPU at once, else (and elsewhere) a CTA a (key block, kv head,
    batch) and no slots; an override's DET_ROTATE=1 where a group does not fit is refused."""
    grid = (key_blocks, heads_kv, batch)
    if not full_deterministic:
        return get_kernel("attention_bwd_sm90", None, file="attention_backward_sm90", defines=defines), grid, 0
    if int(defines["HEAD_DIM"]) == 64 and key_blocks > ROTATE_KEY_BLOCKS_64:
        plain = get_kernel("attention_bwd_sm90", None, file="attention_backward_sm90", defines=defines)
        if not int(plain.defines.get("DET_ROTATE", 0)):  # unless an override asks for the rotation
            return plain, grid, 0
    main = get_kernel("attention_bwd_sm90", None, file="attention_backward_sm90",
                      defines={**defines, **DET_ROTATE_DEFINES[int(defines["HEAD_DIM"])]})
    if not int(main.defines.get("DET_ROTATE", 0)):  # an override's chain: the plan's defines
        return get_kernel("attention_bwd_sm90", None, file="attention_backward_sm90", defines=defines), grid, 0
    smem = max(sm90_smem(int(defines["HEAD_DIM"])), defines_smem(int(defines["HEAD_DIM"]), main.defines))
    resident = main.launcher(stream=stream, grid=1, block=THREADS, smem=smem).max_active_clusters()
    slots = persistent_slots(key_blocks, batch * heads_kv, resident)
    if slots:
        return main, (slots * key_blocks, 1, 1), slots
    main = get_kernel("attention_bwd_sm90", None, file="attention_backward_sm90", defines=defines)
    if int(main.defines.get("DET_ROTATE", 0)):
        raise TmaflowError(f"attention_backward: DET_ROTATE=1 (an override) needs a (batch, kv head)'s {key_blocks} "
                           f"key blocks resident at once; the GPU holds {resident} CTAs")
    return main, grid, 0


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
        main, grid, self.slots = _main_kernel(main_defines(d, causal, deterministic, bool(fp16)),
                                              deterministic and not causal, -(-skv // KEYS), hkv, b, stream)
        smem = max(sm90_smem(d), defines_smem(d, main.defines))
        step = int(main.defines["BLOCK_M"])  # the plan's, or an override's (extra_defines)
        self.shape = (b, hq, sq, d, hkv, skv)
        self.seq_pad = padded_rows(sq, max(step, step_rows(d)))
        self.rows_pad = b * hq * self.seq_pad
        self.chain_count = b * hq * (self.seq_pad // step) if deterministic else 0
        # DQ_TILE: the accumulator is a tile a (batch x head, query block), the shared buffer's image
        self.tiles = b * hq * (self.seq_pad // step) if int(main.defines.get("DQ_TILE", 0)) else 0
        self.accum_floats = (self.tiles * dq_buffer_bytes(d, step, bool(int(main.defines.get("DQ_PACK", 0)))) // 4
                             if self.tiles else b * hq * sq * d)

        def launcher(name, file, defs, **config):
            return get_kernel(name, None, defines=defs, file=file).launcher(stream=stream, **config)
        rows = b * hq * sq
        if self.tiles:  # a float4 a thread
            dq_kernel = main_launcher_of("attention_bwd_sm90_dq_tile", main.defines, stream,
                                         grid=min(_DQ_GRID, -(-self.accum_floats // 1024)), block=256)
        else:
            dq_kernel = launcher("attention_bwd_dq", "attention_backward", fp16,
                                 grid=min(_DQ_GRID, -(-rows * d // 512)), block=256)
        self.launches = [
            launcher("attention_bwd_sm90_prep", "attention_backward_sm90", defines,
                     grid=-(-self.rows_pad // _PREP_ROWS), block=32 * _PREP_ROWS),
            main.launcher(stream=stream, grid=grid, block=THREADS, smem=smem, cooperative=bool(self.slots)),
            dq_kernel,
        ]
        qspec = TensorMapSpec.tiled(dt, (b * hq, sq, d), (1, step, 64), swizzle="128B")
        kspec = TensorMapSpec.tiled(dt, (b * hkv, skv, d), (1, KEYS, d // 2), swizzle=f"{d}B")
        self.tq, self.tdo = MapTemplate(qspec), MapTemplate(qspec)
        self.tk, self.tv = MapTemplate(kspec), MapTemplate(kspec)

    def args(self, Q, K, V, O, G, L, DQ, DK, DV, scale: float, workspace) -> tuple:
        """(prep, main, dq) arguments and the fp32 workspace they point into: dQ's accumulator,
        LSE (log2), Delta, then the chain counters; ``workspace(n)`` allocates n floats."""
        b, hq, sq, d, hkv, skv = self.shape
        rows = b * hq * sq
        ws = workspace(self.accum_floats + 2 * self.rows_pad + self.chain_count)
        accum = ws.ptr
        lse2 = accum + 4 * self.accum_floats
        delta = lse2 + 4 * self.rows_pad
        chain = delta + 4 * self.rows_pad
        q3, k3 = (b * hq, sq, d), (b * hkv, skv, d)
        maps = (self.tq.bind(Q._as(q3, Q.strides[1:])), self.tk.bind(K._as(k3, K.strides[1:])),
                self.tv.bind(V._as(k3, V.strides[1:])), self.tdo.bind(G._as(q3, G.strides[1:])))
        tile_vec4 = self.accum_floats // 4 if self.tiles else 0
        dq_args = (accum, DQ, self.tiles, sq, self.seq_pad, scale) if self.tiles else (accum, DQ, rows * d // 2, scale)
        return ((O, G, L, lse2, delta, accum, chain, self.rows_pad, sq, self.seq_pad, self.chain_count, tile_vec4),
                (*maps, lse2, delta, accum, chain, DK, DV, sq, skv, self.seq_pad, hq, hq // hkv, scale,
                 scale * math.log2(math.e), b),
                dq_args, ws)


def varlen_tiles_per_head(total_q: int, batch: int, rows: int) -> int:
    """DQ_TILE's tiles a head over packed sequences (the kernel's varlen_tiles_per_head):
    sequence b's blocks of ``rows`` start at tile (cu_q[b] + b rows) // rows, past sequence
    b - 1's last whatever the lengths; all of them below (total_q + batch rows) // rows (+ 1)."""
    return (total_q + batch * rows) // rows + 1


def varlen_dq_accum(total_q: int, heads: int, batch: int, head_dim: int, defines: dict) -> tuple[int, int]:
    """(tiles, fp32 floats) of the varlen dQ accumulator of a kernel built with ``defines``:
    DQ_TILE heads x varlen_tiles_per_head tiles of the shared dQ buffer's bytes, else no tiles
    and a row (token x heads + head) of head_dim floats each."""
    if not int(defines.get("DQ_TILE", 0)):
        return 0, total_q * heads * head_dim
    step = int(defines.get("BLOCK_M", ROWS))
    tiles = heads * varlen_tiles_per_head(total_q, batch, step)
    return tiles, tiles * dq_buffer_bytes(head_dim, step, bool(int(defines.get("DQ_PACK", 0)))) // 4


def varlen_key_blocks(total_k: int, batch: int) -> int:
    """KEYS-key blocks there can be at most over packed sequences, whatever the lengths (the
    varlen grid): ceil(len / KEYS) summed is at most (tokens + batch (KEYS - 1)) / KEYS."""
    return max(1, (total_k + batch * (KEYS - 1)) // KEYS)


# Varlen LSE / Delta padding rows after each sequence (the kernel's kSeqPad): the widest step's,
# so the prep serves a main kernel of either step.
SEQ_PAD = 2 * ROWS


def varlen_lse_stride(total_q: int, batch: int) -> int:
    """Floats a head in the varlen LSE / Delta rows: sequence b's start at round_up(cu_q[b], 4)
    + b (SEQ_PAD + 4) (the kernel's lse_row0; 16-byte aligned for the bulk copies) with its
    SEQ_PAD padding rows fits before sequence b + 1's, all of them in total_q + batch (SEQ_PAD
    + 4) rows; a multiple of 4 so every head starts aligned."""
    return -(-(total_q + batch * (SEQ_PAD + 4)) // 4) * 4


class Sm90VarlenPlan:
    """``attention_backward_sm90.cu`` built with VARLEN over packed (tokens, heads, head dim)
    tensors: prep (Delta and LSE into per-sequence padded rows, zeroed accumulator, counters and
    dK / dV outside every sequence), the main kernel (a CTA a key block of a sequence, the grid
    sized for any lengths; the dense plan's defines, main_defines), dQ to the output dtype."""

    def __init__(self, Q, K, batch: int, causal: bool, deterministic: bool, stream):
        tq, hq, d = Q.shape
        tk, hkv = K.shape[:2]
        dt = Q.dtype.name
        fp16 = {"FP16": 1} if dt == "float16" else {}
        defines = {"HEAD_DIM": d, "DETERMINISTIC": int(deterministic), "VARLEN": 1, **fp16}
        main = get_kernel("attention_bwd_sm90", None, file="attention_backward_sm90",
                          defines=main_defines(d, causal, deterministic, bool(fp16), varlen=True))
        step = int(main.defines["BLOCK_M"])  # the plan's, or an override's (extra_defines)
        # DQ_HEAD_MAJOR (an override's): the accumulator a head's rows together, dQ written by
        # the file's own conversion kernel
        self.head_major = bool(int(main.defines.get("DQ_HEAD_MAJOR", 0)))
        if self.head_major:
            defines["DQ_HEAD_MAJOR"] = 1
        self.shape = (tq, hq, d, tk, hkv, batch)
        self.lse_stride = varlen_lse_stride(tq, batch)
        self.chain_count = tq * hq if deterministic else 0  # a counter a query block's first packed row
        # DQ_TILE: the accumulator is a head's tiles after another's, each the shared buffer's image
        self.tiles, self.accum_floats = varlen_dq_accum(tq, hq, batch, d, main.defines)

        def launcher(name, file, defs, **config):
            return get_kernel(name, None, defines=defs, file=file).launcher(stream=stream, **config)
        rows = tq * hq
        if self.tiles:  # a warp a token
            dq_kernel = main_launcher_of("attention_bwd_sm90_varlen_dq_tile", main.defines, stream,
                                         grid=min(4 * _DQ_GRID, -(-tq // 8)), block=256)
        elif self.head_major:
            dq_kernel = launcher("attention_bwd_sm90_varlen_dq", "attention_backward_sm90", defines,
                                 grid=min(_DQ_GRID, -(-rows * d // 1024)), block=256)
        else:
            dq_kernel = launcher("attention_bwd_dq", "attention_backward", fp16,
                                 grid=min(_DQ_GRID, -(-rows * d // 512)), block=256)
        prep_threads = max(32 * rows, batch * hq * SEQ_PAD, self.chain_count)  # dK, dV: a grid stride
        self.launches = [
            launcher("attention_bwd_sm90_varlen_prep", "attention_backward_sm90", defines,
                     grid=max(1, -(-prep_threads // (32 * _PREP_ROWS))), block=32 * _PREP_ROWS),
            main.launcher(stream=stream, grid=(varlen_key_blocks(tk, batch), hkv, 1), block=THREADS,
                          smem=max(sm90_smem(d), defines_smem(d, main.defines))),
            dq_kernel,
        ]
        qspec = TensorMapSpec.tiled(dt, (tq, hq, d), (step, 1, 64), swizzle="128B")
        kspec = TensorMapSpec.tiled(dt, (tk, hkv, d), (KEYS, 1, d // 2), swizzle=f"{d}B")
        self.tq, self.tdo = MapTemplate(qspec), MapTemplate(qspec)
        self.tk, self.tv = MapTemplate(kspec), MapTemplate(kspec)

    def args(self, Q, K, V, O, G, L, DQ, DK, DV, CQ, CK, scale: float, workspace) -> tuple:
        """(prep, main, dq) arguments and their fp32 workspace: dQ's accumulator, LSE (log2),
        Delta, the chain counters; ``workspace(n)`` allocates n floats."""
        tq, hq, d, tk, hkv, batch = self.shape
        rows = tq * hq
        lse_rows = hq * self.lse_stride
        ws = workspace(self.accum_floats + 2 * lse_rows + self.chain_count)
        accum = ws.ptr
        lse2 = accum + 4 * self.accum_floats
        delta = lse2 + 4 * lse_rows
        chain = delta + 4 * lse_rows
        maps = (self.tq.bind(Q), self.tk.bind(K), self.tv.bind(V), self.tdo.bind(G))
        return ((O, G, L, lse2, delta, accum, chain, DK, DV, CQ, CK, tq, tk, batch, hq, hkv, self.lse_stride,
                 self.chain_count, self.accum_floats // 4 if self.tiles else 0),
                (*maps, lse2, delta, accum, chain, DK, DV, CQ, CK, tq, tk, batch, self.lse_stride, hq, hq // hkv,
                 scale, scale * math.log2(math.e)),
                (accum, DQ, CQ, tq, batch, hq, scale) if self.tiles else
                (accum, DQ, tq, hq, scale) if self.head_major else (accum, DQ, rows * d // 2, scale), ws)
