// Attention forward, O = softmax(scale * Q K^T) V, bf16 (FP16: fp16) in and out, fp32 softmax
// and sums, written with tmaflow's Pipeline, TMA and wgmma wrappers (the FlashAttention
// algorithm on Hopper's asynchronous units).
//
// A work tile is 128 query rows of one (batch, head): warpgroup 0 issues TMA (Q, then K and V
// tiles of BN keys, each through its own multi-stage pipeline), warpgroups 1 and 2 each own 64
// query rows. CTAs stride over the work tiles (a grid of one CTA an SM makes the kernel
// persistent: the next tile's Q and K load while this one's last P V and stores run; released
// Q is the signal).
// Per key tile a consumer computes S = Q K^T with wgmma (Q and K 128B-swizzled in shared memory,
// K-major), updates the running row maxima and sums in registers, rescales its O accumulators,
// and adds P V with wgmma taking P straight from registers (the S accumulator fragment,
// converted to 16 bits, is the A fragment) and V from shared memory (N-major: head dim
// contiguous). S_j and P V_(j-1) are issued together so the softmax of tile j runs while the
// tensor cores finish tile j-1, and the two warpgroups take turns issuing (FlashAttention-3's
// ping-pong). Maps are 3-D (batch x heads, sequence, head dim), so loads past a head's
// sequence read zeros, never the next head's rows; such keys are masked to -inf.
//   VARLEN: packed sequences (flash_attn_varlen_func's layout): q (tokens, heads, HEAD_DIM), k
//   and v (tokens, kv heads, ...), sequence b's tokens cu_q[b] .. cu_q[b+1] (cu_k for keys),
//   read on the device. Maps are (tokens, heads, head dim), so a tile near a sequence's end
//   loads the next sequence's rows: its keys are masked like keys past the end, its query rows
//   are never stored. Work tiles are numbered over the non-empty sequences (each warp finds
//   its tile's sequence by a walk over cu_q, 32 sequences a step).
//   HEAD_DIM (Q and K) and HEAD_DIM_V (V and O) are multiples of 16 from 32 to 256. A box is
//   one swizzle span wide: 64 columns (128B swizzle) when the head dim is a multiple of 64, else
//   32 (64B) or 16 (32B), so no column of shared memory is padding; BLOCK_N keys a tile.
//   CAUSAL: key j is seen by query i when j <= i (top-left aligned, as torch's is_causal);
//   key tiles past a work tile's last row are skipped.
//   PAIRED (causal): CTAs persist over pairs of row blocks of one head, i and m - 1 - i
//   (m blocks), whose key tiles add up to m + 1 whatever i: equal units, so a stride over them
//   balances as the non-causal tiles do, and a CTA's next Q and K load under its last P V
//   (VARLEN: the units of one sequence are equal, a stride crosses sequences of other m).
//   Without it a causal CTA runs one tile (the block scheduler balances, every tile pays its
//   loads' latency).
//   One Q buffer (dense, head dims over 64 or so): its next Q loads only after this tile's last
//   S, and the next tile's first S waits for it. L2_PREFETCH: once a tile's first K and V are
//   issued, the CTA's next tile's Q, K_0 and V_0 are prefetched into L2 (a hint: cold runs).
//   Q_SPLIT: a Q buffer is two stages of 64 rows, one a consumer warpgroup, each released after
//   its own last S: the first warpgroup's next Q loads half a step earlier.
//   STORE16: O stored 16 B a lane (two quad shuffles a chunk pair put 8 columns of one row in a
//   lane: whole 32 B sectors, a quarter of the stores) where out is 16-byte aligned; else a
//   4-byte word a column pair.
//   Grouped-query attention: query head h reads key/value head h / group.
//   DYNAMIC_TILES (VARLEN; the plans' 2): CTAs take their work from a counter instead of a
//   stride (FlashAttention-3's scheduler): CTA c's first tile (PAIRED: unit) is c, every later
//   one atomicAdd(tile_counter, 1) + gridDim.x, taken by the producer warp's lane 0 while the
//   CTA's last V tile is still to load (DYNAMIC_TILES=2: as its current tile's loads begin, a
//   tile ahead, as FlashAttention-3). The producer tells the consumers through shared memory
//   past the layout (struct Sched): each Q stage's work tile, and with a tile's last V stage
//   whether another follows. tile_counter[1] counts the CTAs done; the last resets both, so the
//   counter (attention_varlen_entry: the stream's split-K workspace, or a captured launch's own
//   pair from tile_counters) is zero between launches.
//   WINDOWS (VARLEN, not PAIRED; the plans' for short sequences): a work tile is 128 packed
//   query rows whatever their sequences (Tiles::find), its keys those of every sequence it
//   touches, and each row masks the keys outside its own sequence (row_bounds: a row's key
//   bounds come from a search over cu_q by shuffles, while the first S runs). Sequences shorter
//   than a tile share one instead of taking one each, mostly masked.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <tmaflow.cuh>
#include "tmaflow_layout.cuh"
using namespace tmaflow;
namespace L = tmaflow_layout;

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef HEAD_DIM_V
#define HEAD_DIM_V HEAD_DIM
#endif
#ifndef CAUSAL
#define CAUSAL 0
#endif
#ifndef VARLEN
#define VARLEN 0
#endif
#ifndef FP16
#define FP16 0  // 1: fp16 Q, K, V and O instead of bf16
#endif
#ifndef PAIRED
#define PAIRED 0
#endif
static_assert(!PAIRED || CAUSAL, "PAIRED is a schedule of causal tiles");
#ifndef L2_PREFETCH
#define L2_PREFETCH 0  // 1 (dense): the next work tile's Q, K_0 and V_0 prefetched into L2
#endif
#ifndef Q_STAGES
#define Q_STAGES 1  // Q buffers (attention_plan: 2 where shared memory has room for a second)
#endif
#ifndef STORE16
#define STORE16 0  // 1: O stored 16 B a lane (quad shuffles) where out is 16-byte aligned
#endif
#ifndef Q_SPLIT
#define Q_SPLIT 0  // 1: each Q buffer is two pipeline stages of 64 rows, one a consumer warpgroup
#endif
static_assert(!L2_PREFETCH || !VARLEN, "L2_PREFETCH is a schedule of dense tiles");
#ifndef DYNAMIC_TILES
#define DYNAMIC_TILES 0  // 1 or 2 (VARLEN): tiles taken from a counter, not a stride (2: a tile ahead)
#endif
static_assert(!DYNAMIC_TILES || VARLEN, "DYNAMIC_TILES is a schedule of packed sequences");
static_assert(DYNAMIC_TILES >= 0 && DYNAMIC_TILES <= 2, "DYNAMIC_TILES is 0, 1 or 2");
#ifndef WINDOWS
#define WINDOWS 0  // 1 (VARLEN): work tiles are windows of BM packed query rows, whatever their sequences
#endif
static_assert(!WINDOWS || VARLEN && !PAIRED, "WINDOWS is a schedule of packed sequences, not paired");
// Keys a tile (attention_entry.keys_per_tile): 64 at head dim 256 (its O takes 128 registers a
// thread); 176 at head dim 128 without a causal mask (fewer, longer softmax steps, as
// FlashAttention-3 chooses), else 128; other head dims by register and shared-memory sums.
#ifndef BLOCK_N
#define BLOCK_N (HEAD_DIM == 256 ? 64 : HEAD_DIM == 128 && !CAUSAL ? 176 : 128)
#endif
constexpr int DQK = HEAD_DIM, DV = HEAD_DIM_V, BM = 128, BN = BLOCK_N;
// A box's row: the widest swizzle span (128, 64 or 32 B) that divides the head dim's bytes.
constexpr int kSpanQK = DQK % 64 == 0 ? 128 : DQK % 32 == 0 ? 64 : 32;
constexpr int kSpanV = DV % 64 == 0 ? 128 : DV % 32 == 0 ? 64 : 32;
constexpr int kColsQK = kSpanQK / 2, kColsV = kSpanV / 2;  // head-dim columns a box
constexpr int kBoxesQK = DQK / kColsQK, kBoxesV = DV / kColsV;
constexpr int kS = BN / 2;  // S accumulators per thread: 64 x BN / 128
constexpr int kO = DV / 2;  // O accumulators per thread: 64 x DV / 128
constexpr uint32_t kProducerRegs = 40, kConsumerRegs = 232;
static_assert(DQK % 16 == 0 && DV % 16 == 0 && DQK >= 32 && DV >= 32 && DQK <= 256 && DV <= 256,
              "HEAD_DIM and HEAD_DIM_V are multiples of 16 from 32 to 256");
static_assert(BN % 16 == 0 && BN >= 16 && BN <= 256, "BLOCK_N is a multiple of 16 up to 256");
static_assert(L::qp::q_boxes == kBoxesQK && L::kp::k_boxes == kBoxesQK && L::vp::v_boxes == kBoxesV &&
              L::kp::k_bytes == BN * DQK * 2 && L::vp::v_bytes == BN * DV * 2,
              "plan does not match HEAD_DIM, HEAD_DIM_V and BLOCK_N");
constexpr int kQRows = Q_SPLIT ? 64 : BM;  // query rows a Q stage
static_assert(L::qp::stages == Q_STAGES * (Q_SPLIT ? 2 : 1) && L::qp::q_bytes == kQRows * DQK * 2,
              "plan does not match Q_STAGES and Q_SPLIT");

#if FP16
using elem_t = __half;
#define TF_MMA wgmma::mma_k16_f16
#define TF_MMA_RS wgmma::mma_k16_rs_f16
TMAFLOW_DEVICE uint32_t pack2(float lo, float hi) { return wgmma::f16x2(lo, hi); }
#else
using elem_t = __nv_bfloat16;
#define TF_MMA wgmma::mma_k16_bf16
#define TF_MMA_RS wgmma::mma_k16_rs_bf16
TMAFLOW_DEVICE uint32_t pack2(float lo, float hi) { return wgmma::bf16x2(lo, hi); }
#endif

TMAFLOW_DEVICE float neg_inf() { return __int_as_float(0xff800000u); }

// A work tile: query rows m0 .. m0 + BM - 1 of one (sequence, head), the sequence's lengths,
// and where its rows sit in the tensor maps (Tiles::out_row: in out and lse).
struct Tile {
  int m0, len_q, len_k;
  int q_head, kv_head;  // the maps' head coordinate: dense, the (batch x heads) row; varlen, the head
  int q_base, k_base;   // varlen: the sequence's first token in q and in k / v (dense: 0)
#if WINDOWS
  int seq;  // the sequence holding the window's first row (its consumers' search starts there)
#endif
};

#if DYNAMIC_TILES
// What the producer tells the consumers, in shared memory past the layout (the launch asks for
// kSchedBytes more): the work tile whose rows each Q stage holds, and, with a work tile's last V
// stage, whether the CTA has another. Written by the producer between its acquire and its
// commit of the stage, read by the consumers after their wait on it: the commit
// (mbarrier.arrive.expect_tx, release at CTA scope by default) orders the write before the
// phase completes, and the wait (mbarrier.try_wait, acquire) makes it visible, as it does the
// TMA's bytes. The producer writes a stage's slot again only after acquiring the stage back,
// that is after every consumer warp released it. Each warp's lane 0 reads the slot and hands
// it to the other lanes (sched_read): the read precedes, in the same thread, the arrive that
// releases the stage (compute-sanitizer's racecheck orders a read before another thread's
// write only through the reading thread's own arrive; lanes reading and lane 0 releasing after
// __syncwarp is ordered by the memory model but reported as a race).
struct Sched {
  Tile q[L::qp::stages];    // the work tile of each Q stage (both halves' with Q_SPLIT)
  int more[L::vp::stages];  // with a work tile's last V stage: 1 if the CTA runs another tile
#if WINDOWS && DYNAMIC_TILES == 2
  Tile ahead;  // the producer's own: the tile ahead waits here, not in its 40 registers
#endif
};
constexpr int kSchedBytes = WINDOWS ? 192 : 128;  // attention_varlen_entry.sched_bytes
static_assert(sizeof(Sched) <= kSchedBytes && L::total_bytes % 16 == 0, "Sched past the layout");

// ``slot`` as lane 0 of the warp reads it, in every lane.
TMAFLOW_DEVICE int sched_read(const int& slot) {
  int v = 0;
  if (threadIdx.x % 32 == 0) v = slot;
  return __shfl_sync(0xffffffffu, v, 0);
}
TMAFLOW_DEVICE Tile sched_read(const Tile& slot) {
  return Tile{sched_read(slot.m0),     sched_read(slot.len_q),  sched_read(slot.len_k), sched_read(slot.q_head),
              sched_read(slot.kv_head), sched_read(slot.q_base), sched_read(slot.k_base)
#if WINDOWS
              , sched_read(slot.seq)
#endif
  };
}

// A CTA done (the producer's issuing lane, after its last take, or thread 0 of a CTA with no
// tile): tile_counter[1] counts them, and the grid's last resets both counters. Each CTA's
// takes from tile_counter[0] precede its count in program order and the fence releases them;
// the last CTA's atomic reads the count every other CTA's fenced increment wrote, and its fence
// acquires them, so every take happened before the reset (no take follows a CTA's count). The
// next launch on the stream starts after this grid (under PDL: griddep::wait() comes first), so
// it finds zeros.
TMAFLOW_DEVICE void tiles_done(unsigned* tile_counter) {
  __threadfence();
  if (atomicAdd(tile_counter + 1, 1u) == gridDim.x - 1) {
    __threadfence();
    tile_counter[0] = 0;
    tile_counter[1] = 0;
  }
}
#endif

// Key tiles a work tile reads (at least one: a varlen sequence without keys reads one tile, all
// masked, and stores zeros).
TMAFLOW_DEVICE int key_tiles(const Tile& w) {
  int tiles = (w.len_k + BN - 1) / BN;
#if CAUSAL && !WINDOWS  // (a window's key range ends at its last row's own keys)
  tiles = min(tiles, (min(w.m0 + BM, w.len_q) - 1) / BN + 1);
#endif
  return VARLEN ? max(tiles, 1) : tiles;
}

// A box of `map` rows row .. on head `head`: maps are (batch x heads, seq, head dim), or with
// VARLEN (tokens, heads, head dim); coordinates innermost first.
TMAFLOW_DEVICE void load_box(void* dst, const CUtensorMap* map, uint64_t* bar, int col, int row, int head) {
#if VARLEN
  tma::load(dst, map, bar, col, head, row);
#else
  tma::load(dst, map, bar, col, row, head);
#endif
}

#if VARLEN
// Work tiles of packed sequences: sequence b has ceil(len_q / BM) row blocks a head, numbered
// head by head (causal: later blocks first, as dense tiles), sequence after sequence; a tile
// number past the last says so. Each warp walks cu_q from where its last tile was (tile numbers
// only grow), a warp prefix sum of tile counts a step: 32 sequences a step, 128 in a CTA's first
// walk (skip_to). Offsets are clamped into the tensors, so bad device values give wrong rows,
// never stores outside out. PAIRED: a sequence's slots of a head are 2 ceil(m / 2) for its m
// row blocks, slot 2 u + 0 or 1 unit u's later or earlier block, as dense PAIRED tiles; CTAs
// stride over units (an odd m's middle unit has one tile: its second slot is skipped).
struct Tiles {
  const int* cu_q;
  const int* cu_k;
  int total_q, total_k, batch, heads, group;
  int first = 0, before = 0;  // the walk: sequences from `first` on hold tiles from `before` on
#if WINDOWS
  // Windows: tile t is rows u BM .. u BM + BM - 1 of the packed queries (u = t / heads), of head
  // t % heads, whatever sequences they belong to; its keys run from the first row's sequence's
  // first key to the last row's sequence's last (causal: the last row's own last), and each row
  // masks the keys outside its own sequence (the consumers' row_bounds). Windows number the
  // tokens, not the sequences: a sequence shorter than a tile shares one with its neighbours
  // instead of taking one of its own, and the tile count is known without a walk.
  TMAFLOW_DEVICE int windows() const { return (total_q + BM - 1) / BM; }
  TMAFLOW_DEVICE long long bound() const { return (long long)heads * windows(); }
  // Lane l's sequence base + l: its first query and first key (past the batch: none), clamped
  // into the tensors.
  TMAFLOW_DEVICE void starts(int base, int& qs, int& ks) const {
    const int b = base + threadIdx.x % 32;
    qs = 0x7fffffff, ks = 0;
    if (b <= batch) {
      qs = min(max(__ldg(cu_q + b), 0), total_q);
      ks = min(max(__ldg(cu_k + b), 0), total_k);
    }
  }
  // The sequence holding packed query row x: the last b with cu_q[b] <= x (-1 before the first
  // sequence, batch at or past the last one's end), the warp walking on from `first` 32
  // sequences a round of loads (a CTA's windows only grow); qs holds the round that found it
  // (lane l: sequence first + l's first query), where `first` stays.
  TMAFLOW_DEVICE int seq_of(int x, int& qs) {
    for (;; first += 32) {
      const int b = first + threadIdx.x % 32;
      qs = b <= batch ? min(max(__ldg(cu_q + b), 0), total_q) : 0x7fffffff;
      const unsigned past = __ballot_sync(0xffffffffu, qs > x);
      if (past != 0) return first + __ffs(past) - 2;
    }
  }
  TMAFLOW_DEVICE bool skip_to(int t) {
    if (t >= bound()) return false;
    int qs;
    first = max(seq_of(t / heads * BM, qs), 0);
    return true;
  }
  TMAFLOW_DEVICE bool find(int t, Tile& w) {
    if (t >= bound()) return false;
    w.q_base = t / heads * BM;
    w.m0 = 0;
    w.len_q = min(BM, total_q - w.q_base);
    // One round of loads finds the window's first and last rows' sequences where it spans
    // fewer than 31 (else the last row's walk goes on), a second reads their keys' bounds.
    const int last = w.q_base + w.len_q - 1;
    int qs;
    const int s0 = seq_of(w.q_base, qs), walked = first;
    const unsigned past = __ballot_sync(0xffffffffu, qs > last);
    const int s1 = past != 0 ? walked + __ffs(past) - 2 : seq_of(last, qs);
    // rows outside every sequence (before the first, past the last) have no keys of their own
    const int b0 = min(max(s0, 0), batch - 1), b1 = min(max(s1, 0), batch - 1);
    w.k_base = min(max(__ldg(cu_k + b0), 0), total_k);
    int end = min(max(__ldg(cu_k + b1 + 1), w.k_base), total_k);
#if CAUSAL
    end = min(end, min(max(__ldg(cu_k + b1), 0), total_k) + last - min(max(__ldg(cu_q + b1), 0), total_q) + 1);
#endif
    w.len_k = max(end - w.k_base, 0);
    w.seq = b0;
    w.q_head = t % heads;
    w.kv_head = w.q_head / group;
    // The walk stays at the first row's sequence: the CTA's next tile may be this window's
    // next head (a take from the counter), whose first row is this one.
    first = max(s0, 0);
    return true;
  }
#else
  // A CTA's first walk, before the producer gives up registers: to the sequences holding tile
  // t, 128 sequences (4 a lane) a round of loads; false when t is past the last tile.
  TMAFLOW_DEVICE bool skip_to(int t) {
    const int lane = threadIdx.x % 32;
    while (first < batch) {
      const int b0 = first + 4 * lane;
      int start[5], mine = 0;  // the first tokens of sequences b0 .. b0 + 4; their tiles
#pragma unroll
      for (int i = 0; i < 5; ++i) start[i] = b0 + i <= batch ? min(max(__ldg(cu_q + b0 + i), 0), total_q) : 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        start[i + 1] = max(start[i + 1], start[i]);  // as find's clamps
        mine += b0 + i < batch ? slots(start[i + 1] - start[i]) : 0;
      }
      const int upto = warp::inclusive_sum(mine);
      const unsigned past = __ballot_sync(0xffffffffu, before + upto > t);
      if (past != 0) {
        const int l = __ffs(past) - 1;
        before += __shfl_sync(0xffffffffu, upto - mine, l);
        first += 4 * l;
        return true;
      }
      before += __shfl_sync(0xffffffffu, upto, 31);
      first += 128;
    }
    return false;
  }
  // Tile numbers of a sequence of `len` queries: its row blocks (PAIRED: rounded up to pairs)
  // of every head.
  TMAFLOW_DEVICE int slots(int len) const {
    const int blocks = (len + BM - 1) / BM;
    return (PAIRED ? (blocks + 1) / 2 * 2 : blocks) * heads;
  }
  // Tile numbers there can be at most, whatever the lengths (attention_varlen_entry sizes the
  // grid by the blocks): a CTA's last tile needs no walk to the end of the batch to know it is.
  TMAFLOW_DEVICE long long bound() const {
    return heads * ((total_q + batch * (BM - 1LL)) / BM + (PAIRED ? batch : 0));
  }
  TMAFLOW_DEVICE bool find(int t, Tile& w) {
    const int lane = threadIdx.x % 32;
    if (t >= bound()) return false;
    while (first < batch) {
      const int b = first + lane;
      int q0 = 0, len = 0;
      if (b < batch) {
        q0 = min(max(__ldg(cu_q + b), 0), total_q);
        len = min(max(__ldg(cu_q + b + 1), q0), total_q) - q0;
      }
      const int blocks = (len + BM - 1) / BM, n = slots(len);
      const int upto = warp::inclusive_sum(n);  // tiles of sequences first .. b
      const unsigned past = __ballot_sync(0xffffffffu, before + upto > t);
      if (past != 0) {
        const int l = __ffs(past) - 1, seq = first + l;
        const int mb = __shfl_sync(0xffffffffu, blocks, l);
        const int local = t - before - __shfl_sync(0xffffffffu, upto - n, l);
#if PAIRED
        const int units = (mb + 1) / 2, p = (local >> 1) % units, h = (local >> 1) / units;
        w.m0 = (local & 1 ? p : mb - 1 - p) * BM;
#else
        const int i = local % mb, h = local / mb;
        w.m0 = (CAUSAL ? mb - 1 - i : i) * BM;
#endif
        w.q_base = __shfl_sync(0xffffffffu, q0, l);
        w.len_q = __shfl_sync(0xffffffffu, len, l);
        w.k_base = min(max(__ldg(cu_k + seq), 0), total_k);
        w.len_k = min(max(__ldg(cu_k + seq + 1), w.k_base), total_k) - w.k_base;
        w.q_head = h;
        w.kv_head = h / group;
        return true;
      }
      before += __shfl_sync(0xffffffffu, upto, 31);
      first += 32;
    }
    return false;
  }
#endif
#if PAIRED
  TMAFLOW_DEVICE int first_tile() const { return 2 * blockIdx.x; }
  // After tile t (w): its unit's earlier block, unless t is that or the middle block of an odd
  // count; else the CTA's next unit.
  TMAFLOW_DEVICE int next_tile(int t, const Tile& w) const {
    return t % 2 == 0 && 2 * (w.m0 / BM) + 1 != (w.len_q + BM - 1) / BM ? t + 1 : 2 * ((t >> 1) + gridDim.x);
  }
#else
  TMAFLOW_DEVICE int first_tile() const { return blockIdx.x; }
  TMAFLOW_DEVICE int next_tile(int t, const Tile&) const { return t + gridDim.x; }
#endif
#if DYNAMIC_TILES
  // The CTA's tile after t (w) with a counter: PAIRED, the unit's earlier block as next_tile;
  // else the next unit (tile) atomicAdd(counter, 1) + gridDim.x, taken by lane 0 for the warp
  // (capped where twice it stays an int: a number past bound() is no tile). A CTA's numbers
  // only grow (each take returns more than the last, and more than blockIdx.x), as find needs.
  TMAFLOW_DEVICE int take_tile(int t, const Tile& w, unsigned* counter) const {
#if PAIRED
    if (t % 2 == 0 && 2 * (w.m0 / BM) + 1 != (w.len_q + BM - 1) / BM) return t + 1;
#endif
    unsigned got = 0;
    if (threadIdx.x % 32 == 0) got = atomicAdd(counter, 1u);
    const int u = int(min(__shfl_sync(0xffffffffu, got, 0) + gridDim.x, 0x3fffffffu));
    return PAIRED ? 2 * u : u;
  }
#endif
  // Rows of out (of DV elements) and of lse ((heads, tokens)) of query row `row`.
  TMAFLOW_DEVICE size_t out_row(const Tile& w, int row) const { return size_t(w.q_base + row) * heads + w.q_head; }
  TMAFLOW_DEVICE int lse_row(const Tile& w, int row) const { return w.q_head * total_q + w.q_base + row; }
};
#else
// Work tile t of batch x heads x row blocks: query rows from m0 of (batch x heads) row bh.
// Causal tiles of later rows read more keys: they go first (blocks start in index order), so
// the short ones fill the tail. PAIRED: t = 2 u + 0 or 1, unit u's later or earlier row block
// (units pair blocks p and m - 1 - p of one head; work counts both halves of every unit; an odd
// m's middle unit has one tile, its second half is skipped).
struct Tiles {
  int seq_q, seq_kv, heads, group, m_blocks, work;
  TMAFLOW_DEVICE bool find(int t, Tile& w) const {  // false past the last tile
    if (t >= work) return false;
#if PAIRED
    const int units = (m_blocks + 1) / 2, u = t >> 1, p = u % units;
    w.m0 = (t & 1 ? p : m_blocks - 1 - p) * BM;
    const int bh = u / units;
#else
    w.m0 = (CAUSAL ? m_blocks - 1 - t % m_blocks : t % m_blocks) * BM;
    const int bh = t / m_blocks;
#endif
    w.q_head = bh;
    w.kv_head = (bh / heads) * (heads / group) + (bh % heads) / group;
    w.len_q = seq_q, w.len_k = seq_kv;
    w.q_base = w.k_base = 0;
    return true;
  }
#if PAIRED
  TMAFLOW_DEVICE int first_tile() const { return 2 * blockIdx.x; }
  TMAFLOW_DEVICE int next_tile(int t) const {
    const int units = (m_blocks + 1) / 2, p = (t >> 1) % units;
    return t % 2 == 0 && 2 * p + 1 != m_blocks ? t + 1 : 2 * ((t >> 1) + gridDim.x);
  }
#else
  TMAFLOW_DEVICE int first_tile() const { return blockIdx.x; }
  TMAFLOW_DEVICE int next_tile(int t) const { return t + gridDim.x; }
#endif
  TMAFLOW_DEVICE int next_tile(int t, const Tile&) const { return next_tile(t); }
  TMAFLOW_DEVICE bool last(int t) const { return next_tile(t) >= work; }
  TMAFLOW_DEVICE size_t out_row(const Tile& w, int row) const { return w.q_head * seq_q + row; }
  TMAFLOW_DEVICE int lse_row(const Tile& w, int row) const { return w.q_head * seq_q + row; }
};
#endif

#if WINDOWS
// The keys of packed query row x in window w, relative to its first key: lo .. hi - 1 (lo > hi:
// a row outside every sequence, masked whole and never stored). From a round of sequence starts
// (Tiles::starts(base): lane l holds sequence base + l's), x's sequence is the last lane whose
// first query is at or before x (a binary search over the lanes by shuffles); false when the
// round cannot tell (x's sequence or the next one's start lies past it: another round, from
// base + 31). Every lane calls it (shuffles), each with its own row. Bounds are clamped into the
// window's keys (bad device values give wrong rows, never reads of other windows' keys).
TMAFLOW_DEVICE bool row_keys(const Tiles& tiles, const Tile& w, int base, int qs, int ks, int x, int& lo, int& hi) {
  int l = 0;  // lanes whose sequence starts at or before x (up to 31; lane 31's start tells 32)
#pragma unroll
  for (int step = 16; step > 0; step /= 2)
    if (__shfl_sync(0xffffffffu, qs, l + step - 1) <= x) l += step;
  const int at = max(l - 1, 0);
  const int k0 = __shfl_sync(0xffffffffu, ks, at), k1 = __shfl_sync(0xffffffffu, ks, at + 1);
  const int q0 = __shfl_sync(0xffffffffu, qs, at);
  if (__shfl_sync(0xffffffffu, qs, 31) <= x) return false;
  lo = 1, hi = 0;
  if (l == 0 || base + at >= tiles.batch) return true;  // before the first sequence, past the last
  int end = k1;
#if CAUSAL
  end = min(end, k0 + x - q0 + 1);
#endif
  lo = k0 - w.k_base;
  hi = min(max(end - w.k_base, lo), w.len_k);
  return true;
}
#endif

extern "C" __global__ void __launch_bounds__(384, 1)
attention_fwd(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
              const __grid_constant__ CUtensorMap tv, elem_t* out, float* lse,
#if VARLEN
              const int* cu_q, const int* cu_k, int total_q, int total_k, int batch,
#else
              int seq_q, int seq_kv, int batch_heads,
#endif
              int heads, int group, float scale_log2
#if VARLEN
              , unsigned* tile_counter  // DYNAMIC_TILES: two zeroed counters; else unused (null)
#endif
              ) {
  extern __shared__ __align__(1024) uint8_t smem[];
  L::Smem S(smem);
  auto qp = S.qp();
  auto kp = S.kp();
  auto vp = S.vp();
  using QCursor = decltype(qp)::Cursor;
  using KCursor = decltype(kp)::Cursor;
  using VCursor = decltype(vp)::Cursor;
  const int wg = threadIdx.x / 128, lane = threadIdx.x % 32;
#if DYNAMIC_TILES
  Sched& sched = *reinterpret_cast<Sched*>(smem + L::total_bytes);
#endif
#if VARLEN
  Tiles tiles{cu_q, cu_k, total_q, total_k, batch, heads, group};
#else
  const int m_blocks = (seq_q + BM - 1) / BM;
  Tiles tiles{seq_q, seq_kv, heads, group, m_blocks, (PAIRED ? (m_blocks + 1) / 2 * 2 : m_blocks) * batch_heads};
#endif
  if (threadIdx.x == 0) {
    tma::prefetch_descriptor(&tq);
    tma::prefetch_descriptor(&tk);
    tma::prefetch_descriptor(&tv);
    qp.init();
    kp.init();
    vp.init();
  }
  griddep::wait();
  griddep::launch_dependents();
#if VARLEN
  {  // the grid is a bound (tokens and batch) or the SM count: CTAs past the last tile leave at once
#if DYNAMIC_TILES
    if (!tiles.skip_to(tiles.first_tile())) {
      if (threadIdx.x == 0) tiles_done(tile_counter);
      return;
    }
#else
    if (!tiles.skip_to(tiles.first_tile())) return;
#endif
  }
#endif
  __syncthreads();

  if (wg == 0) {
    warp::setmaxnreg_dec<kProducerRegs>();
    // One thread issues; with VARLEN its whole warp walks the sequences beside it.
    if (VARLEN ? threadIdx.x < 32 : threadIdx.x == 0) {
      const bool issuer = !VARLEN || lane == 0;
      // In the order the consumers need them: Q and K_0, then K_j ahead of V_(j-1) (S_j and
      // P V_(j-1) are issued together).
      QCursor cq;
      KCursor ck;
      VCursor cv;
      Tile w;
#if DYNAMIC_TILES
      int more_next = 0;  // the CTA has a tile after w (known before w's last V tile loads)
#endif
      auto load_k = [&](int j) {
        kp.producer_acquire(ck);
        kp.producer_commit(ck);
#pragma unroll
        for (int box = 0; box < kBoxesQK; ++box)
          load_box(S.kp_k(ck.stage, box), &tk, kp.barrier(ck), box * kColsQK, w.k_base + j * BN, w.kv_head);
        ck.advance();
      };
      auto load_v = [&](int j) {
        vp.producer_acquire(cv);
#if DYNAMIC_TILES
        sched.more[cv.stage] = more_next;  // the consumers read it with a tile's last V stage only
#endif
        vp.producer_commit(cv);
#pragma unroll
        for (int box = 0; box < kBoxesV; ++box)
          load_box(S.vp_v(cv.stage, box), &tv, vp.barrier(cv), box * kColsV, w.k_base + j * BN, w.kv_head);
        cv.advance();
      };
      auto prefetch_next = [&](int t) {  // L2_PREFETCH: the next work tile's Q, K_0 and V_0 into L2
        (void)t;
#if L2_PREFETCH
        Tile next;
        if (!tiles.find(tiles.next_tile(t), next)) return;
#pragma unroll
        for (int r = 0; r < BM; r += kQRows)  // boxes of a Q stage's rows
#pragma unroll
          for (int box = 0; box < kBoxesQK; ++box) tma::prefetch(&tq, box * kColsQK, next.m0 + r, next.q_head);
#pragma unroll
        for (int box = 0; box < kBoxesQK; ++box) tma::prefetch(&tk, box * kColsQK, 0, next.kv_head);
        for (int box = 0; box < kBoxesV; ++box) tma::prefetch(&tv, box * kColsV, 0, next.kv_head);
#endif
      };
      auto load_q = [&](int half) {  // rows m0 + half * kQRows .. of the work tile
        qp.producer_acquire(cq);
#if DYNAMIC_TILES
        sched.q[cq.stage] = w;
#endif
        qp.producer_commit(cq);
#pragma unroll
        for (int box = 0; box < kBoxesQK; ++box)
          load_box(S.qp_q(cq.stage, box), &tq, qp.barrier(cq), box * kColsQK, w.q_base + w.m0 + half * kQRows,
                   w.q_head);
        cq.advance();
      };
#if DYNAMIC_TILES
      // DYNAMIC_TILES 1: the CTA's next tile is taken (and walked to by the whole warp) once
      // this one's loads but its last V tile are issued (the producer waits for free stages
      // there anyway, and the CTA still has a few key tiles to run); 2 (FlashAttention-3's
      // order): as this one's loads begin, a tile ahead, the take's and the walk's latency under
      // the wait for Q's stage (1 may delay a one-key-tile tile's V by them). Either way the
      // last V stage tells the consumers whether another tile follows, the next tile's Q stage
      // which it is.
      for (int t = tiles.first_tile(), more = tiles.find(t, w); more;) {
        const int n = key_tiles(w);
        Tile w_next;
        int t_next = 0;
        if (DYNAMIC_TILES == 2) {
          t_next = tiles.take_tile(t, w, tile_counter);
          more_next = tiles.find(t_next, w_next);
#if WINDOWS && DYNAMIC_TILES == 2  // (a window's Tile has one int more: two spill the producer)
          if (lane == 0) sched.ahead = w_next;
#endif
        }
        if (issuer) {
          load_q(0);
          load_k(0);
          if (Q_SPLIT) load_q(1);
          for (int j = 1; j < n; ++j) {
            load_k(j);
            load_v(j - 1);
          }
        }
        if (DYNAMIC_TILES == 1) {
          t_next = tiles.take_tile(t, w, tile_counter);
          more_next = tiles.find(t_next, w_next);
        }
        if (issuer) load_v(n - 1);
#if WINDOWS && DYNAMIC_TILES == 2
        w_next = sched_read(sched.ahead);
#endif
        t = t_next, w = w_next, more = more_next;
      }
      if (issuer) tiles_done(tile_counter);
#else
      for (int t = tiles.first_tile(); tiles.find(t, w); t = tiles.next_tile(t, w)) {
        if (issuer) {
          load_q(0);
          const int n = key_tiles(w);
          load_k(0);
          if (Q_SPLIT) load_q(1);
          for (int j = 1; j < n; ++j) {
            load_k(j);
            load_v(j - 1);
            if (j == 1) prefetch_next(t);
          }
          load_v(n - 1);
          if (n == 1) prefetch_next(t);
        }
      }
#endif
    }
    return;
  }
  warp::setmaxnreg_inc<kConsumerRegs>();
  const int cw = wg - 1, wq = (threadIdx.x % 128) / 32;
  const int col = 2 * (lane % 4);  // this thread's columns: col and col + 1 in every 8-column chunk
  Tile w;
  int row0;                        // this thread's rows are row0 and row0 + 8
  float o[kO];
  float m_run[2], l_run[2];        // log2 domain; l per thread
  QCursor cq;
  KCursor ck;
  VCursor cv;
  // Tile j's scores are computed while the tensor cores still run tile j-1's P V: per tile,
  // issue S_j, rescale O and issue P V_(j-1), wait for S_j only, run the softmax of S_j, then
  // wait for P V_(j-1) and convert P_j for the next round.
  float s[kS];
  uint32_t p[BN / 16][4];
  float alpha[2];
#if WINDOWS
  // The keys of this thread's rows (row0, row0 + 8) relative to the window's first key: lo ..
  // hi - 1; lo > hi for a row outside every sequence (masked whole, never stored).
  int key_lo[2], key_hi[2];
  // qs, ks: tiles.starts(w.seq), loaded before the tile's waits (their latency is under them).
  auto row_bounds = [&](int qs, int ks) {
    int todo = 3;
    for (int base = w.seq; __any_sync(0xffffffffu, todo != 0); base += 31) {
      if (base != w.seq) tiles.starts(base, qs, ks);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int lo, hi;
        if (row_keys(tiles, w, base, qs, ks, w.q_base + row0 + 8 * h, lo, hi) && (todo >> h & 1))
          todo &= ~(1 << h), key_lo[h] = lo, key_hi[h] = hi;
      }
    }
  };
  auto row_stored = [&](int h) { return row0 + 8 * h < w.len_q && key_lo[h] <= key_hi[h]; };
#else
  auto row_stored = [&](int h) { return row0 + 8 * h < w.len_q; };
#endif
  auto issue_s = [&]() {
    wgmma::fence_operands(s);
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < DQK / 16; ++ks) {  // 16 head-dim columns a step: 32 B into a box row
      constexpr int kSteps = kSpanQK / 32;   // k-steps a box row holds
      const int box = ks / kSteps;
      const uint64_t dq = wgmma::desc_k_major<kSpanQK>(static_cast<uint8_t*>(S.qp_q(cq.stage, box)) +
                                                       (Q_SPLIT ? 0 : cw * 64 * kSpanQK));
      const uint64_t dk = wgmma::desc_k_major<kSpanQK>(S.kp_k(ck.stage, box));
      TF_MMA<0>(s, dq + 2 * (ks % kSteps), dk + 2 * (ks % kSteps), ks > 0);
    }
    wgmma::commit_group();
  };
  auto issue_pv = [&]() {  // O = alpha O + P V
    // Once the row maxima settle, alpha is exactly 1 (2^0): a warp skips the multiplies then.
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int i = 0; i < kO; ++i) o[i] *= alpha[(i >> 1) & 1];
    }
    const uint64_t dv = wgmma::desc_mn_major<kSpanV>(S.vp_v(cv.stage, 0), L::vp::v_box_stride);
    wgmma::fence_operands(o);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)  // 16 keys of kSpanV-byte rows a step
      TF_MMA_RS<1>(o, p[kk], dv + kk * (16 * kSpanV >> 4), 1);
    wgmma::commit_group();
  };
  // Online softmax of key tile j in place (s becomes P in fp32), alpha the rescale of older sums.
  auto softmax = [&](int j) {
    // Masks cost a compare and a select per score: only tiles that reach past the sequence or
    // (causal) past this warpgroup's first row need them (a warp-uniform test).
#if WINDOWS
    // (a window's row masks the keys outside its own, key_lo[h] .. key_hi[h] - 1)
    bool need_mask = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) need_mask = need_mask || j * BN < key_lo[h] || (j + 1) * BN > key_hi[h];
    if (__any_sync(0xffffffffu, need_mask)) {
#pragma unroll
      for (int jj = 0; jj < BN / 8; ++jj)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = j * BN + 8 * jj + col + (e & 1);
          if (key < key_lo[e >> 1] || key >= key_hi[e >> 1]) s[4 * jj + e] = neg_inf();
        }
    }
#else
    bool need_mask = (j + 1) * BN > w.len_k;
#if CAUSAL
    need_mask = need_mask || (j + 1) * BN - 1 > w.m0 + cw * 64;
#endif
    if (need_mask) {
#pragma unroll
      for (int jj = 0; jj < BN / 8; ++jj)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = j * BN + 8 * jj + col + (e & 1);
          bool masked = key >= w.len_k;
#if CAUSAL
          masked = masked || key > row0 + 8 * (e >> 1);
#endif
          if (masked) s[4 * jj + e] = neg_inf();
        }
    }
#endif
    // Maxima of the raw scores (scale > 0 keeps the order); each score is then scaled and
    // shifted by one FMA inside 2^x.
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int i = 0; i < kS; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
    float base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(m_run[h], warp::quad_max(mx[h]) * scale_log2);
      base[h] = m_new == neg_inf() ? 0.f : m_new;  // a row with every key masked so far: p = 0
      alpha[h] = math::exp2_approx(m_run[h] - base[h]);
      m_run[h] = m_new;
      l_run[h] *= alpha[h];
    }
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      const int h = (i >> 1) & 1;
      s[i] = math::exp2_approx(fmaf(s[i], scale_log2, -base[h]));
      l_run[h] += s[i];
    }
  };
  auto convert = [&]() {  // P as 16-bit A fragments: columns 16 kk .. 16 kk + 15 are k-step kk
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) p[kk][r] = pack2(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
  };
  // O / l of the finished work tile, clipped at the sequence (query rows past it, another
  // sequence's with VARLEN, are never stored); the log-sum-exp (natural log of sum exp(scale *
  // s)).
  auto store = [&]() {
#if STORE16
    if ((reinterpret_cast<size_t>(out) & 15) == 0) {  // else (out only 4-byte aligned) a word a column pair
      float inv[2];
      for (int h = 0; h < 2; ++h) {
        const float l = warp::quad_sum(l_run[h]);
        inv[h] = l > 0.f ? 1.f / l : 0.f;
        if (row_stored(h) && lse != nullptr && lane % 4 == 0)
          lse[tiles.lse_row(w, row0 + 8 * h)] = l > 0.f ? (m_run[h] + log2f(l)) * 0.69314718056f : neg_inf();
      }
      // Two quad exchanges turn each chunk pair (16 columns of rows row0 and row0 + 8, a word
      // of each a lane) into 16 B of one row a lane: lane c keeps row row0 + 8 (c & 1) and,
      // of the pair, chunk c >> 1.
      const int hr = lane & 1, a = (lane >> 1) & 1, row = row0 + 8 * hr;
#if WINDOWS
      const bool stored = hr ? row_stored(1) : row_stored(0);
#else
      const bool stored = row < w.len_q;
#endif
      elem_t* dst = out + tiles.out_row(w, min(row, w.len_q - 1)) * DV + 8 * a;
#pragma unroll
      for (int g = 0; g < DV / 16; ++g) {
        uint32_t u[2][2];  // chunk 2g + i of row hr: columns 4a .. 4a + 3 of it, two words
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int jj = 2 * g + i;
          const uint32_t w0 = pack2(o[4 * jj] * inv[0], o[4 * jj + 1] * inv[0]);
          const uint32_t w1 = pack2(o[4 * jj + 2] * inv[1], o[4 * jj + 3] * inv[1]);
          const uint32_t got = __shfl_xor_sync(0xffffffffu, hr ? w0 : w1, 1);
          u[i][0] = hr ? got : w0;
          u[i][1] = hr ? w1 : got;
        }
        const uint32_t lo = __shfl_xor_sync(0xffffffffu, a ? u[0][0] : u[1][0], 2);
        const uint32_t hi = __shfl_xor_sync(0xffffffffu, a ? u[0][1] : u[1][1], 2);
        const uint4 v = a ? make_uint4(lo, hi, u[1][0], u[1][1]) : make_uint4(u[0][0], u[0][1], lo, hi);
        if (stored) *reinterpret_cast<uint4*>(dst + 16 * g) = v;
      }
      return;
    }
#endif
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 8 * h;
      const float l = warp::quad_sum(l_run[h]);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      if (row_stored(h)) {
        elem_t* dst = out + tiles.out_row(w, row) * DV + col;
#pragma unroll
        for (int jj = 0; jj < DV / 8; ++jj)
          *reinterpret_cast<uint32_t*>(dst + 8 * jj) = pack2(o[4 * jj + 2 * h] * inv, o[4 * jj + 2 * h + 1] * inv);
        if (lse != nullptr && lane % 4 == 0)
          lse[tiles.lse_row(w, row)] = l > 0.f ? (m_run[h] + log2f(l)) * 0.69314718056f : neg_inf();
      }
    }
  };


  auto begin_work = [&]() {  // this thread's rows and fresh sums
    row0 = w.m0 + cw * 64 + wq * 16 + lane / 4;
    for (int h = 0; h < 2; ++h) m_run[h] = neg_inf(), l_run[h] = 0.f;
#pragma unroll
    for (int i = 0; i < kO; ++i) o[i] = 0.f;
    return key_tiles(w);
  };
  // Turns (FlashAttention-3's ping-pong): the two consumer warpgroups take turns issuing their
  // GEMMs, so one's softmax runs while the other's GEMMs keep the tensor cores busy. Warpgroup
  // 0 waits at barrier 1, warpgroup 1 at barrier 2; each ends a turn by arriving at the
  // other's (warpgroup 1 lets warpgroup 0 go first, and skips its very last arrival).
  auto turn_begin = [&]() { named_barrier::sync(1 + cw, 256); };
  auto turn_end = [&](bool last) {
    if (!(last && cw == 1)) named_barrier::arrive(2 - cw, 256);
  };
  // Q goes back to the producer once the work tile's last S is done, K_j once S_j is.
  auto scores_done = [&](int j, int n) {
    wgmma::fence_operands(s);
    if (lane == 0) {
      kp.consumer_release(ck);
      if (j == n - 1) qp.consumer_release(cq);
    }
    ck.advance();
  };
  // Tile j+1's K and tile j's V are waited for right after tile j's GEMMs are issued, while
  // the thread would wait for S_j anyway: an mbarrier wait at the top of a tile sat on the
  // critical path (4-10% at every head dim), though the loads had landed long before.
  auto wait_ahead = [&](int j, int n) {
    if (j + 1 < n) {
      KCursor next = ck;
      next.advance();
      kp.consumer_wait(next);
    }
    VCursor next_v = cv;
    if (j > 0) next_v.advance();
    vp.consumer_wait(next_v);
  };
  if (cw == 1) named_barrier::arrive(1, 256);
  if (Q_SPLIT && cw == 1) cq.advance();  // its half of each Q buffer is the second stage
#if DYNAMIC_TILES
  // The work tile comes with its Q stage (read after the wait by lane 0, which releases the
  // stage), whether another follows with its last V stage.
  for (int more = 1; more; cq.advance()) {
    qp.consumer_wait(cq);
    w = sched_read(sched.q[cq.stage]);
    const int n = begin_work();
#else
#if VARLEN
  // The walk that tells a tile is the CTA's last finds the next one: kept, not walked again.
  Tile w_next;
  int t_next;
  for (int t = tiles.first_tile(), more = tiles.find(t, w); more; t = t_next, cq.advance()) {
#else
  for (int t = tiles.first_tile(); tiles.find(t, w); t = tiles.next_tile(t), cq.advance()) {
#endif
    const int n = begin_work();
    qp.consumer_wait(cq);
#endif
#if WINDOWS
    int seq_q, seq_k;
    tiles.starts(w.seq, seq_q, seq_k);
#endif
    kp.consumer_wait(ck);
    turn_begin();
    issue_s();
    turn_end(false);
#if WINDOWS
    row_bounds(seq_q, seq_k);  // under S_0
#endif
    wait_ahead(0, n);
    wgmma::wait_group<0>();
    scores_done(0, n);
    softmax(0);
    convert();
    for (int j = 1; j < n; ++j) {
      turn_begin();
      issue_s();
      issue_pv();
      turn_end(false);
      wait_ahead(j, n);
      wgmma::wait_group<1>();  // S_j is done; P V_(j-1) may still run
      scores_done(j, n);
      softmax(j);
      wgmma::wait_group<0>();
      wgmma::fence_operands(o);
      if (lane == 0) vp.consumer_release(cv);
      cv.advance();
      convert();
    }
#if DYNAMIC_TILES
    // cv is V_(n-1)'s stage, waited for by wait_ahead (and written again only by the producer,
    // after acquiring the stage lane 0 releases below)
    more = sched_read(sched.more[cv.stage]);
    const bool last = !more;
#elif VARLEN
    t_next = tiles.next_tile(t, w);
    more = tiles.find(t_next, w_next);
    const bool last = !more;
#else
    const bool last = tiles.last(t);
#endif
    turn_begin();
    issue_pv();
    turn_end(last);
    wgmma::wait_group<0>();
    wgmma::fence_operands(o);
    if (lane == 0) vp.consumer_release(cv);
    cv.advance();
    store();
#if VARLEN && !DYNAMIC_TILES
    w = w_next;
#endif
    if (Q_SPLIT) cq.advance();  // past the other warpgroup's half
  }
}
