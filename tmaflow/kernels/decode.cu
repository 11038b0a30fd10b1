// Decode attention over a paged KV cache (flash-decoding): 1-8 new query tokens per request,
// bf16 (FP16: fp16) in and out, fp32 softmax and sums.
//
// A CTA is one (split, kv head, request): the new tokens x query heads sharing the kv head
// (GQA packing: up to 16 rows, token-major, zero-padded to the 16 rows of an mma.sync) against
// a contiguous range of the
// request's key tiles (kKeys keys each). Warp kWarps loads K and V tiles with TMA through a
// multi-stage pipeline: a 3-D map over the cache viewed as (pages x page_size, heads_kv,
// head_dim), one box (kBoxKeys keys, 64 dims) per page piece and 64 columns, the page taken
// from the block table. Consumer warp w takes keys 16 w .. 16 w + 15 of every tile and keeps
// its own online softmax (m, l, O) over them; the CTA merges its warps through shared memory.
// One split: the CTA writes the output. Several: each writes its normalised O (fp32) and
// log-sum-exp (log2 domain) to the workspace, and the last CTA of a (request, kv head), found by
// an atomic counter it then resets, merges them: bulk copies bring every split's partials into
// the free stages at once, and the sum runs over the splits in order (deterministic).
// PERSISTENT (one split only): a grid of at most the CTAs that fit at once, each walking the
// (request, kv head) items blockIdx.x, + gridDim.x, ...: the producer runs on into the next
// item's tiles while the consumers finish one (no SM sits idle between a CTA's last copy and the
// next CTA's first), and the warps merge in their own buffer, not in stage 0.
// CLUSTER_MERGE (2-16 splits): the splits of a (kv head, request) are one cluster; each keeps its
// normalised O and log-sum-exp in shared memory, and after a cluster barrier every CTA merges
// its share of the output columns, reading the splits' O through distributed shared memory:
// no workspace write, no atomic counter and no L2 round trip for the partials (two round trips
// off a short call's critical path). The sums run over the splits in order, as the counter's
// merge does: the two give equal bits. All five warps (the producer's too) meet at both
// cluster barriers.
// SLICE_MERGE (counter path, every CTA of the grid resident at once: decode_entry checks it and
// launches the grid cooperative): no last CTA reads every split. Each split publishes its
// partials and counts, waits until all splits of its (request, kv head) have counted, then
// merges its own share of the output's columns (every split's piece of them, one L2 round
// trip): same weights, sums and order as the counter's merge, equal bits. With HEAD_GROUP the
// share is of the four heads' columns.
// HEAD_GROUP (head dims a multiple of 64, heads_kv a multiple of 4): a CTA is one (split, four
// kv heads, request), consumer warp w the whole key range of kv head 4 g + w (no warps' merge).
// A stage is 16 keys of the four heads: one copy of a 4-D box (4 heads, column blocks, 16 rows,
// 64), 16 runs of 1 KB where one kv head's boxes are 256 B at a 2 KB stride (a page's row is
// every kv head's). Q's fragments live in registers, loaded once from global memory. Several
// splits: the last CTA of the group merges its four heads at once (their slots are one run),
// or (SLICE_MERGE) every split its share of them.
// MERGE_KERNEL (counter path, one kv head a CTA): no count and no last CTA. Each split publishes
// its partials and leaves; attention_decode_merge, launched next with PDL (its CTAs resident
// and waiting on this grid's completion meanwhile), merges them, a thread a 4-column group of
// the output: the same weights, sums and order as the counter's merge, equal bits.
// PDL (a launch with programmatic dependent launch): the CTA sets up its barriers and fetches
// its descriptors while the kernel before it finishes, then waits for that kernel's completion
// before reading lengths, tables, caches or q.
// WARP_SLICES (not PERSISTENT): the warps' merge writes every warp's O at once, a slice each,
// and each thread sums its elements' slices, in two barriers instead of a turn a warp (same bits).
// Trace builds mark the critical path (tools/peers/decode_timeline.py): 1 entry, 2 the producer
// has the block table, 3 Q in shared memory, 4 the tiles read, 9 every warp at the warps' merge,
// 10 the warps' O in their slices (WARP_SLICES), 7 the warps merged, 11 the partials stored, 8
// the split counted (partials published), 5 the splits' merge begins, 12 the splits' pieces in
// shared memory (SLICE_MERGE), 6 the output written.
// Lengths are read on the device (a captured graph serves any lengths), clamped to
// [0, max_pages x PAGE_SIZE]; they count the new tokens, whose keys are the last q_len: new token
// i sees keys up to len - q_len + i (causal). A row that sees no key (length 0) gets zeros.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <tmaflow.cuh>
#include "tmaflow_layout.cuh"
using namespace tmaflow;
namespace L = tmaflow_layout;

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef PAGE_SIZE
#define PAGE_SIZE 16
#endif
#ifndef FP16
#define FP16 0  // 1: fp16 q, caches and out instead of bf16
#endif
#ifndef MAX_SPLITS
#define MAX_SPLITS 64
#endif
#ifndef PERSISTENT
#define PERSISTENT 0
#endif
#ifndef CLUSTER_MERGE
#define CLUSTER_MERGE 0
#endif
#ifndef SLICE_MERGE
#define SLICE_MERGE 0
#endif
#ifndef WIDE_BOX
#define WIDE_BOX 0  // 1: a 4-D map (kv head, column block, row, 64): one box a page piece, every column block
#endif
#ifndef HEAD_GROUP
#define HEAD_GROUP 0  // 1: four kv heads a CTA, a consumer warp each
#endif
#ifndef WARP_SLICES
#define WARP_SLICES 0  // 1: the warps' merge from a slice of O a warp, in two barriers (not PERSISTENT)
#endif
#ifndef PDL
#define PDL 0  // 1: launched with PDL: the set-up, then griddep::wait before any global memory access
#endif
#ifndef MERGE_KERNEL
#define MERGE_KERNEL 0  // 1: several splits publish their partials and leave; attention_decode_merge merges
#endif
#ifndef EVICT_FIRST
#define EVICT_FIRST 0  // 1: K and V pass through L2 at evict-first priority (read once a step)
#endif
constexpr int D = HEAD_DIM, kKeys = 64, kWarps = 4, kConsumers = 32 * kWarps;
// Columns a K or V tile holds: whole 64-column boxes (128B swizzle). TMA fills the columns past
// D with zeros, which the math never reads (k-steps and output blocks stop at D).
constexpr int kTileCols = (D + 63) / 64 * 64;
// HEAD_GROUP: a stage's kKeys rows are 16 keys of kHeads kv heads (head-major), so its tile is
// WIDE_BOX's with a "piece" per head.
constexpr int kHeads = HEAD_GROUP ? kWarps : 1;                 // kv heads a CTA
constexpr int kStepKeys = kKeys / kHeads;                       // keys of a kv head a stage
constexpr int kBoxKeys = HEAD_GROUP ? kStepKeys : PAGE_SIZE < kKeys ? PAGE_SIZE : kKeys;  // one page, or a tile's part of one
constexpr int kPieces = kKeys / kBoxKeys;                       // page pieces (HEAD_GROUP: heads) a tile
constexpr bool kWideTile = WIDE_BOX || HEAD_GROUP;             // pieces of every column block, piece-major
static_assert(!HEAD_GROUP || (PAGE_SIZE % kStepKeys == 0 && !CLUSTER_MERGE && !WIDE_BOX),
              "HEAD_GROUP: 16-key steps within a page, the counter or the slice merge");
constexpr int kRows = 16;                                       // query rows of the mma: q_len x group
constexpr int kQStride = D * 2 + 16;  // padded Q rows: ldmatrix's 8 rows fall in 8 bank groups
static_assert(D % 16 == 0 && D >= 32 && D <= 256, "HEAD_DIM is a multiple of 16 from 32 to 256");
constexpr int kStatsFloats = (2 * kWarps + 2) * kRows;
// Element (row, col) of O in shared memory (the warps' merge): rows of D floats, each row's
// 8-float groups permuted (the group index xor the row's low bits) so that the 8 rows a warp's
// float2 stores cover at once (lane / 4) fill the 32 banks; unpermuted, all 8 fell on the same
// 8 banks (8-way conflicts in a short call's tail). The xor stays within a 32-float block (16
// where D is not a multiple of 32): a row's columns stay its own, and 4-float groups whole.
// WARP_SLICES builds only: the warp-at-a-turn merge (persistent plans) keeps plain rows, where
// per-column addresses cost the registers a persistent CTA has not (it spilled).
constexpr int kOSwizzle = !WARP_SLICES ? 0 : D % 32 == 0 ? 3 : 1;
TMAFLOW_DEVICE int o_at(int row, int col) { return row * D + (col ^ ((row & kOSwizzle) << 3)); }
TMAFLOW_DEVICE int o_at(int i) { return o_at(i / D, i % D); }  // element i (row i / D)
#if !PERSISTENT  // persistent: decode_plan sizes the "warps" buffer to kRows x (D + kStatsFloats / kRows) floats
static_assert(L::kv::k_bytes >= kRows * D * 4 && L::kv::v_bytes >= 4 * (kStatsFloats + kRows),
              "the warps' merge (O and statistics) fits stage 0");
#endif
// WARP_SLICES: the four warps' O side by side in the K tiles, the statistics still in stage 0's V tile.
static_assert(!WARP_SLICES || (!PERSISTENT && !HEAD_GROUP && L::kv::stages * L::kv::k_stride >= kWarps * kRows * D * 4 &&
                               L::kv::v_bytes >= 4 * (kStatsFloats + kRows + kWarps * kRows)),
              "WARP_SLICES: the warps' O fit the K tiles (a persistent CTA's merge has a buffer of one)");
// The splits' merge: the K and V tiles of every stage (contiguous: decode_plan checks it) hold
// the log-sum-exps (kRows slots a split) and as many splits' O as fit.
constexpr uint32_t kMergeBytes = L::kv::stages * (L::kv::k_stride + L::kv::v_stride);
constexpr uint32_t kLseBytes = MAX_SPLITS * kRows * 4;
static_assert(kMergeBytes >= kHeads * kLseBytes + kRows * D * 4,
              "the merge holds every log-sum-exp (of every head of a group) and a split");
constexpr int kMaxCluster = 16;  // CTAs of a cluster merge (16: a non-portable cluster)
static_assert(!CLUSTER_MERGE || !PERSISTENT, "a persistent CTA walks whole requests: nothing to merge");
static_assert(!SLICE_MERGE || (!PERSISTENT && !CLUSTER_MERGE), "the slice merge is the counter path's");
static_assert(!MERGE_KERNEL || (!PERSISTENT && !CLUSTER_MERGE && !SLICE_MERGE && !HEAD_GROUP),
              "MERGE_KERNEL replaces the counter's merge of one kv head's splits");
static_assert(kMergeBytes >= kHeads * kLseBytes + (kHeads * kRows * D / 4 + MAX_SPLITS) * 16,
              "the slice merge's log-sum-exps and pieces fit");
constexpr int kBoxBytes = kWideTile ? kBoxKeys * kTileCols * 2 : kBoxKeys * 128;
static_assert(L::kv::k_bytes == kKeys * kTileCols * 2 && L::kv::k_box_stride == kHeads * kBoxBytes,
              "plan does not match HEAD_DIM, PAGE_SIZE, WIDE_BOX and HEAD_GROUP");
static_assert(!kWideTile || D % 64 == 0, "a wide box spans whole 64-column blocks");

#if FP16
using elem_t = __half;
TMAFLOW_DEVICE uint32_t pack2(float lo, float hi) { return wgmma::f16x2(lo, hi); }
TMAFLOW_DEVICE void mma_step(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { warp::mma_16816_f16(d, a, b0, b1); }
TMAFLOW_DEVICE elem_t to_elem(float x) { return __float2half_rn(x); }
#else
using elem_t = __nv_bfloat16;
TMAFLOW_DEVICE uint32_t pack2(float lo, float hi) { return wgmma::bf16x2(lo, hi); }
TMAFLOW_DEVICE void mma_step(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { warp::mma_16816(d, a, b0, b1); }
TMAFLOW_DEVICE elem_t to_elem(float x) { return __float2bfloat16_rn(x); }
#endif

TMAFLOW_DEVICE float neg_inf() { return __int_as_float(0xff800000u); }

// acc += w * v, one fused multiply-add a lane: both merges round alike.
TMAFLOW_DEVICE void add_weighted(float4& acc, float w, float4 v) {
  acc.x = fmaf(w, v.x, acc.x), acc.y = fmaf(w, v.y, acc.y), acc.z = fmaf(w, v.z, acc.z), acc.w = fmaf(w, v.w, acc.w);
}

// One more split counted: releases the CTA's partials (bar.sync orders them before it) and
// acquires the earlier splits'. Returns the count before.
// ptx: atom.acq_rel.gpu.global.add.u32
TMAFLOW_DEVICE uint32_t count_split(uint32_t* at) {
  uint32_t before;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(at) : "memory");
  return before;
}

// Chunk `chunk` (8 elements) of key `key` in a K or V tile: 64-column blocks of kKeys rows of
// 128 B, each 128B-swizzled by TMA (16-byte chunk c of row r at c ^ (r % 8)). WIDE_BOX: the
// tile is its page pieces' boxes, each the column blocks of kBoxKeys rows (a multiple of 8: the
// swizzle's row is the key's); HEAD_GROUP the same, key 16 w + k being head w's key k.
TMAFLOW_DEVICE uint8_t* tile_at(void* tile, int key, int chunk) {
#if WIDE_BOX || HEAD_GROUP
  return static_cast<uint8_t*>(tile) + (key / kBoxKeys) * kBoxBytes + (chunk / 8) * (kBoxKeys * 128) +
         (key % kBoxKeys) * 128 + (((chunk % 8) ^ (key % 8)) << 4);
#else
  return static_cast<uint8_t*>(tile) + (chunk / 8) * (kKeys * 128) + key * 128 + (((chunk % 8) ^ (key % 8)) << 4);
#endif
}

// Shared statistics (floats): warp maxima and sums per row, the CTA's per row.
struct Stats {
  float* base;
  TMAFLOW_DEVICE float& warp_max(int w, int row) { return base[w * kRows + row]; }
  TMAFLOW_DEVICE float& warp_sum(int w, int row) { return base[(kWarps + w) * kRows + row]; }
  TMAFLOW_DEVICE float& row_max(int row) { return base[2 * kWarps * kRows + row]; }
  TMAFLOW_DEVICE float& row_sum(int row) { return base[(2 * kWarps + 1) * kRows + row]; }
};

// ptx: prefetch.global.L2
TMAFLOW_DEVICE void prefetch_l2(const void* at) { asm volatile("prefetch.global.L2 [%0];" :: "l"(at)); }

// This split's first tile, and past its last, of n keys.
TMAFLOW_DEVICE int2 split_tiles(int n, int split, int splits) {
  const int tiles = (n + kStepKeys - 1) / kStepKeys, per_split = (tiles + splits - 1) / splits;
  const int begin = min(split * per_split, tiles);
  return make_int2(begin, min(begin + per_split, tiles));
}

#if CLUSTER_MERGE
// 16 and 4 bytes of another CTA's shared memory (a map_shared address). Volatile: the compiler
// keeps a run of them together, ahead of their uses (each is a trip through the cluster).
// ptx: ld.shared::cluster.v4.f32, ld.shared::cluster.f32
TMAFLOW_DEVICE float4 load_cluster(uint32_t at) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(at) : "memory");
  return v;
}
TMAFLOW_DEVICE float load_cluster_f32(uint32_t at) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(at) : "memory");
  return v;
}

// The splits' merge in a cluster (consumer warps; the producer warp meets the two cluster
// barriers on its own): O (kRows x D, summed over the warps) and the statistics of this CTA's
// warps' merge in stage 0. Weights, sums and their order as in the counter's merge.
template <class RowOffset>
TMAFLOW_DEVICE void cluster_merge(Stats st, float* so, elem_t* out, int rows, int splits, int split,
                                  RowOffset row_offset) {
  float* lse = st.base + kStatsFloats;  // kRows: this split's log-sum-exps (log2 domain)
  for (int i = threadIdx.x; i < rows * D; i += kConsumers) {
    const float l = st.row_sum(i / D);
    so[o_at(i)] = l > 0.f ? so[o_at(i)] / l : 0.f;
  }
  if (threadIdx.x < rows) {
    const float l = st.row_sum(threadIdx.x);
    lse[threadIdx.x] = l > 0.f ? st.row_max(threadIdx.x) + __log2f(l) : neg_inf();
  }
  cluster::sync();  // every split's O and log-sum-exps are written
  trace::mark(5);
  // This CTA's share of the output's 4-column groups. A thread reads the splits' O and its
  // row's log-sum-exps side by side (one trip through the cluster) and weighs them itself.
  const int columns = rows * D / 4, share = (columns + splits - 1) / splits;
  const int end = min(columns, (split + 1) * share);
  for (int i = split * share + threadIdx.x; i < end; i += kConsumers) {
    const int r = i / (D / 4);
    float4 v[kMaxCluster];
    float w[kMaxCluster];
#pragma unroll
    for (int s = 0; s < kMaxCluster; ++s)
      if (s < splits) v[s] = load_cluster(cluster::map_shared(so + o_at(r, 4 * (i % (D / 4))), s)), w[s] = load_cluster_f32(cluster::map_shared(lse + r, s));
    float m = neg_inf(), total = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxCluster; ++s)
      if (s < splits) m = fmaxf(m, w[s]);
#pragma unroll
    for (int s = 0; s < kMaxCluster; ++s)
      if (s < splits) w[s] = m == neg_inf() ? 0.f : math::exp2_approx(w[s] - m), total += w[s];
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int s = 0; s < kMaxCluster; ++s)
      if (s < splits) add_weighted(acc, w[s], v[s]);
    const float inv = total > 0.f ? 1.f / total : 0.f;
    *reinterpret_cast<uint2*>(out + row_offset(r) + (i % (D / 4)) * 4) =
        make_uint2(pack2(acc.x * inv, acc.y * inv), pack2(acc.z * inv, acc.w * inv));
  }
  trace::mark(6);
  cluster::sync();  // no CTA leaves while another reads its shared memory
}
#endif

#if SLICE_MERGE
// ptx: ld.acquire.gpu.global.u32
TMAFLOW_DEVICE uint32_t load_acquire(const uint32_t* at) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(at) : "memory");
  return v;
}

// The splits' merge, each split its share of the output's 4-column groups (consumer warps;
// this CTA's partials are in the workspace, the named barrier after them passed). The counter
// goes 0 .. splits - 1 as the splits arrive, on to 2 splits - 1 as they leave (each after it
// saw every arrival): the last to leave sets it back to 0 for the next launch. HEAD_GROUP: the
// columns are the group's kHeads heads' one after another (head h's split s is slot
// h x splits + s from `first`, as in merge_splits).
template <class RowOffset>
TMAFLOW_DEVICE void slice_merge(L::Smem& S, const float* part, const float* part_lse, uint32_t* counter,
                                size_t first, elem_t* out, int rows, int splits, int split, RowOffset row_offset) {
  if (threadIdx.x == 0) {
    const bool last = count_split(counter) == uint32_t(splits - 1);
    trace::mark(8);
    if (!last)
      while (load_acquire(counter) < uint32_t(splits)) {}
  }
  named_barrier::sync(1, kConsumers);  // thread 0's acquire is the CTA's
  trace::mark(5);
  float* lse = static_cast<float*>(S.kv_k(0));                                    // [slot][kRows]
  float4* pieces = reinterpret_cast<float4*>(lse + kHeads * MAX_SPLITS * kRows);  // [split][n]
  const int head_columns = rows * D / 4, columns = kHeads * head_columns, share = (columns + splits - 1) / splits;
  const int c0 = min(columns, split * share), n = min(columns, c0 + share) - c0;
  const int lse_count = kHeads * splits * rows;
  // The pieces and log-sum-exps, kBatch of each a thread in flight before any is stored: one L2
  // round trip at 32 splits (.cg: other SMs wrote them).
  constexpr int kBatch = 4;
  for (int i0 = threadIdx.x; i0 < max(splits * n, lse_count); i0 += kBatch * kConsumers) {
    float4 v[kBatch];
    float x[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = i0 + k * kConsumers;
      if (i < splits * n) {
        const int column = c0 + i % n, h = column / head_columns;
        v[k] = __ldcg(reinterpret_cast<const float4*>(part + (first + h * splits + i / n) * rows * D) +
                      column % head_columns);
      }
      if (i < lse_count) x[k] = __ldcg(part_lse + (first + i / rows) * kRows + i % rows);
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = i0 + k * kConsumers;
      if (i < splits * n) pieces[i] = v[k];
      if (i < lse_count) lse[(i / rows) * kRows + i % rows] = x[k];
    }
  }
  named_barrier::sync(1, kConsumers);
  trace::mark(12);
  for (int j = threadIdx.x; j < n; j += kConsumers) {
    const int i = c0 + j, h = i / head_columns, c = i % head_columns, r = c / (D / 4);
    const float* head_lse = lse + h * splits * kRows;
    float m = neg_inf(), total = 0.f;
    // Unrolled: a few splits' shared-memory loads in flight at once, not one a trip (the max
    // is exact in any order; the sums below keep theirs).
#pragma unroll 8
    for (int s = 0; s < splits; ++s) m = fmaxf(m, head_lse[s * kRows + r]);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
    for (int s = 0; s < splits; ++s) {
      const float w = m == neg_inf() ? 0.f : math::exp2_approx(head_lse[s * kRows + r] - m);
      total += w;
      add_weighted(acc, w, pieces[s * n + j]);
    }
    const float inv = total > 0.f ? 1.f / total : 0.f;
    *reinterpret_cast<uint2*>(out + row_offset(h, r) + (c % (D / 4)) * 4) =
        make_uint2(pack2(acc.x * inv, acc.y * inv), pack2(acc.z * inv, acc.w * inv));
  }
  trace::mark(6);
  // Leaving after the output (off the critical path); the same address orders the reset after the count.
  if (threadIdx.x == 0 && atomicAdd(counter, 1u) == uint32_t(2 * splits - 1)) atomicExch(counter, 0u);
}
#endif

// The splits' merge of kHeads kv heads (HEAD_GROUP: the group's, merged at once) by the CTA
// that counted last (consumer warps). Their slots follow each other: head h's split s is slot
// h x splits + s from `first`.
template <class RowOffset>
TMAFLOW_DEVICE void merge_splits(L::Smem& S, const float* part, const float* part_lse, size_t first, elem_t* out,
                                 int rows, int splits, RowOffset row_offset) {
  // The merge reads what other SMs wrote (in L2) by bulk copies into the free stages, a round
  // in flight at once: every log-sum-exp and as many slots' O as fit, then the next slots
  // (a loop of loads waits an L2 round trip per few splits, and the GPU is idle meanwhile).
  constexpr int kHeadRows = kHeads * kRows;
  float* lse = reinterpret_cast<float*>(S.kv_k(0));  // [slot][kRows], then weights in place
  float* parts = lse + kHeads * MAX_SPLITS * kRows;   // [slot of the round][row][D]
  float* row_stat = static_cast<float*>(S.q());       // [head][kRows] maxima, then [head][kRows] 1 / sums
  const int slots = kHeads * splits, columns = rows * D / 4;  // columns: a head's 4-column groups
  const uint32_t split_bytes = rows * D * 4;
  const int per_round = (kMergeBytes - kHeads * kLseBytes) / split_bytes;
  const auto merged = S.merged();
  uint64_t* bar = merged.bar;
  mbarrier::Phase phase{bar, 0};
  auto fetch = [&](int j0, int n, bool with_lse) {  // slots j0 .. j0 + n - 1, by one thread
    fence::proxy_async_global();  // partials acquired through the count, read by the async proxy
    mbarrier::arrive_expect_tx(bar, n * split_bytes + (with_lse ? slots * kRows * 4 : 0));
    if (with_lse) bulk::load(lse, part_lse + first * kRows, slots * kRows * 4, bar);
    bulk::load(parts, part + (first + j0) * rows * D, n * split_bytes, bar);
  };
  // This CTA's own writes before the copies: stage 0's (the warps' merge) and its partials.
  fence::proxy_async_shared_cta();
  fence::proxy_async_global();
  named_barrier::sync(1, kConsumers);
  if (threadIdx.x == 0) fetch(0, min(per_round, slots), true);
  phase.wait(debug::Site{merged.name, -1, 0});
  // Weights 2^(lse - row max) over a head's splits, normalised: a row no split saw gets zeros.
  const int h0 = threadIdx.x / kRows, r0 = threadIdx.x % kRows;  // (head, row) of the first kHeadRows threads
  if (threadIdx.x < kHeadRows && r0 < rows) {
    float m = neg_inf();
    for (int s = 0; s < splits; ++s) m = fmaxf(m, lse[(h0 * splits + s) * kRows + r0]);
    row_stat[threadIdx.x] = m;
  }
  named_barrier::sync(1, kConsumers);
  for (int i = threadIdx.x; i < slots * kRows; i += kConsumers) {
    const float m = row_stat[i / kRows / splits * kRows + i % kRows];
    if (i % kRows < rows) lse[i] = m == neg_inf() ? 0.f : math::exp2_approx(lse[i] - m);
  }
  named_barrier::sync(1, kConsumers);
  if (threadIdx.x < kHeadRows && r0 < rows) {
    float total = 0.f;
    for (int s = 0; s < splits; ++s) total += lse[(h0 * splits + s) * kRows + r0];
    row_stat[kHeadRows + threadIdx.x] = total > 0.f ? 1.f / total : 0.f;
  }
  named_barrier::sync(1, kConsumers);
  // Four columns of O a thread a column group, a head's splits summed in order.
  constexpr int kGroups = (kHeadRows * D / 4 + kConsumers - 1) / kConsumers;
  float4 acc[kGroups];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) acc[g] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int j0 = 0; j0 < slots; j0 += per_round) {
    const int n = min(per_round, slots - j0);
    if (j0 > 0) {  // the next round's copies overwrite this one's: every thread is done with it
      fence::proxy_async_shared_cta();
      named_barrier::sync(1, kConsumers);
      if (threadIdx.x == 0) fetch(j0, n, false);
      phase.wait(debug::Site{merged.name, -1, 0});
    }
    const float4* x = reinterpret_cast<const float4*>(parts);
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const int i = threadIdx.x + g * kConsumers, h = i / columns, c = i % columns;
      if (i < kHeads * columns) {
        const int r = c / (D / 4), j_end = min(j0 + n, (h + 1) * splits);
        for (int j = max(j0, h * splits); j < j_end; ++j) {
          const float w = lse[j * kRows + r];
          const float4 v = x[(j - j0) * columns + c];
          add_weighted(acc[g], w, v);
        }
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int i = threadIdx.x + g * kConsumers, h = i / columns, c = i % columns;
    if (i < kHeads * columns) {
      const int r = c / (D / 4);
      const float inv = row_stat[kHeadRows + h * kRows + r];
      *reinterpret_cast<uint2*>(out + row_offset(h, r) + (c % (D / 4)) * 4) =
          make_uint2(pack2(acc[g].x * inv, acc[g].y * inv), pack2(acc[g].z * inv, acc[g].w * inv));
    }
  }
  trace::mark(6);
}

// One (split, kv head, request) of the grid, or (persistent) one item of a CTA's walk; the
// caller loaded the request's length and (producer warp) its guessed block-table window.
template <class Cursor>
TMAFLOW_DEVICE void decode_item(L::Smem& S, Cursor& c, const CUtensorMap& tk, const CUtensorMap& tv,
                                const elem_t* q, elem_t* out, const int* table, float* part, float* part_lse,
                                uint32_t* counters, int heads_kv, int group, int q_len, int max_pages,
                                float scale_log2, int split, int splits, int kvh, int b, int given_len,
                                int guess, int guess_cur, int guess_next) {
  auto kv = S.kv();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows = q_len * group, heads_q = heads_kv * group;
  const int full = max_pages * PAGE_SIZE;
  const int len = min(max(given_len, 0), full);
  const int2 range = split_tiles(len, split, splits);
  const int t_begin = range.x, t_end = range.y;

  if (warp == kWarps) {
    // The block table, 32 entries at a time, one a lane (the next 32 already on their way):
    // lane 0 issues the copies, the warp shuffles it the page of each piece.
    const int pages = (len + PAGE_SIZE - 1) / PAGE_SIZE;
    auto entry = [&](int i) { return i < pages ? table[i] : 0; };
    int window = t_begin * kStepKeys / PAGE_SIZE;
    // Entries past `pages` are never used (the pieces stop at the length).
    int cur = guess_cur, next = guess_next;
    if (window != guess) cur = entry(window + lane), next = entry(window + 32 + lane);
    trace::mark(2);
#if EVICT_FIRST
    const uint64_t policy = tma::make_policy_evict_first();
#endif
    for (int t = t_begin; t < t_end; ++t, c.advance()) {
      // The last tile loads only the pieces holding keys: the block table may end there.
      // HEAD_GROUP: one piece, the four heads' 16 keys (a step holds at least one key).
      const int pieces = HEAD_GROUP ? 1 : min(kPieces, (len - t * kKeys + kBoxKeys - 1) / kBoxKeys);
      if (lane == 0) {
        kv.producer_acquire(c);
        mbarrier::arrive_expect_tx(kv.barrier(c), 2u * pieces * kHeads * kBoxKeys * kTileCols * 2);
      }
      for (int piece = 0; piece < pieces; ++piece) {
        const int key = t * kStepKeys + piece * kBoxKeys, index = key / PAGE_SIZE;
        while (index >= window + 32) {
          window += 32;
          cur = next;
          next = entry(window + 32 + lane);
        }
        const int page = __shfl_sync(0xffffffffu, cur, index - window);
        if (lane == 0) {
          const int row = page * PAGE_SIZE + key % PAGE_SIZE;
#if WIDE_BOX || HEAD_GROUP  // HEAD_GROUP: kvh is the group's first head, the box its four
#if EVICT_FIRST
          tma::load_hint(S.kv_k(c.stage, piece), &tk, kv.barrier(c), policy, 0, row, 0, kvh);
          tma::load_hint(S.kv_v(c.stage, piece), &tv, kv.barrier(c), policy, 0, row, 0, kvh);
#else
          tma::load(S.kv_k(c.stage, piece), &tk, kv.barrier(c), 0, row, 0, kvh);
          tma::load(S.kv_v(c.stage, piece), &tv, kv.barrier(c), 0, row, 0, kvh);
#endif
#else
#pragma unroll
          for (int box = 0; box < kTileCols / 64; ++box) {
#if EVICT_FIRST
            tma::load_hint(S.kv_k(c.stage, box * kPieces + piece), &tk, kv.barrier(c), policy, box * 64, kvh, row);
            tma::load_hint(S.kv_v(c.stage, box * kPieces + piece), &tv, kv.barrier(c), policy, box * 64, kvh, row);
#else
            tma::load(S.kv_k(c.stage, box * kPieces + piece), &tk, kv.barrier(c), box * 64, kvh, row);
            tma::load(S.kv_v(c.stage, box * kPieces + piece), &tv, kv.barrier(c), box * 64, kvh, row);
#endif
          }
#endif
        }
      }
    }
#if CLUSTER_MERGE
    if (splits > 1) cluster::sync(), cluster::sync();  // the consumers' two: the merge reads this CTA
#endif
    return;
  }

  // Row r of kv head `head` is new token r / group's query head head x group + r % group (of q
  // and out); HEAD_GROUP: warp w's head is kvh + w.
  auto row_offset_of = [&](int head, int r) {
    return ((size_t(b) * q_len + r / group) * heads_q + head * group + r % group) * D;
  };
  auto row_offset = [&](int r) { return row_offset_of(kvh, r); };
#if HEAD_GROUP
  // This warp's Q rows as the mma's A fragments (rows lane / 4 and + 8, 2 columns a register,
  // columns + 8 in the upper two), zero past the last: read once, from global memory.
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = lane / 4 + 8 * (j & 1), col = 16 * ks + 2 * (lane % 4) + 8 * (j >> 1);
      qa[ks][j] = r < rows ? *reinterpret_cast<const uint32_t*>(q + row_offset_of(kvh + warp, r) + col) : 0u;
    }
#else
  // Q rows, zero past the last.
  uint8_t* sq = static_cast<uint8_t*>(S.q());
#if PERSISTENT
  named_barrier::sync(1, kConsumers);  // every consumer is past the last item's Q and merge
#endif
  for (int i = threadIdx.x; i < kRows * D / 8; i += kConsumers) {
    const int r = i / (D / 8), c = i % (D / 8);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < rows) v = *reinterpret_cast<const uint4*>(q + row_offset(r) + c * 8);
    *reinterpret_cast<uint4*>(sq + r * kQStride + c * 16) = v;
  }
  named_barrier::sync(1, kConsumers);
#endif
  trace::mark(3);

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_run[2] = {neg_inf(), neg_inf()}, l_run[2] = {0.f, 0.f};  // rows lane / 4 and + 8
  // Keys this thread's rows see past the last one every row sees: new token i sees q_len-1-i fewer.
  int hidden[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) hidden[h] = lane / 4 + 8 * h < rows ? q_len - 1 - (lane / 4 + 8 * h) / group : 0;
  for (int t = t_begin; t < t_end; ++t, c.advance()) {
    const int k0 = t * kStepKeys + (HEAD_GROUP ? 0 : 16 * warp), valid = len - k0;  // this warp's keys that exist
    kv.consumer_wait(c);
    if (valid > 0) {
      void* sk = S.kv_k(c.stage);
      void* sv = S.kv_v(c.stage);
      if (valid < 16) {
        // V rows past the sequence hold whatever the page (or an older tile) had: 0 x NaN is NaN
        // in the mma, so they become zeros. The next TMA writes over them (async proxy): fence.
        for (int i = lane; i < 16 * D / 8; i += 32)
          if (i / (D / 8) >= valid) *reinterpret_cast<uint4*>(tile_at(sv, 16 * warp + i / (D / 8), i % (D / 8))) = make_uint4(0, 0, 0, 0);
        fence::proxy_async_shared_cta();
        __syncwarp();
      }
      float s[2][4] = {};
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t a[4], bk[4];
#if HEAD_GROUP
        a[0] = qa[ks][0], a[1] = qa[ks][1], a[2] = qa[ks][2], a[3] = qa[ks][3];
#else
        warp::ldmatrix_x4(a, sq + (lane % 16) * kQStride + (2 * ks + lane / 16) * 16);
#endif
        warp::ldmatrix_x4(bk, tile_at(sk, 16 * warp + (lane / 16) * 8 + lane % 8, 2 * ks + lane / 8 % 2));
        mma_step(s[0], a, bk[0], bk[1]);
        mma_step(s[1], a, bk[2], bk[3]);
      }
      if (valid < 16 + q_len - 1) {  // keys past the length, or past a new token (causal)
#pragma unroll
        for (int nb = 0; nb < 2; ++nb)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (8 * nb + 2 * (lane % 4) + (e & 1) >= valid - hidden[e >> 1]) s[nb][e] = neg_inf();
      }
      // Online softmax. A row whose keys here are all masked (an earlier new token's) keeps
      // m = -inf: it shifts by 0 instead, so its p are 0, not NaN.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float mx = warp::quad_max(fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1])));
        const float m_new = fmaxf(m_run[h], mx * scale_log2);
        const float base = m_new == neg_inf() ? 0.f : m_new;
        const float alpha = math::exp2_approx(m_run[h] - base);
        m_run[h] = m_new;
        l_run[h] *= alpha;
#pragma unroll
        for (int nb = 0; nb < 2; ++nb)
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) {
            s[nb][e] = math::exp2_approx(fmaf(s[nb][e], scale_log2, -base));
            l_run[h] += s[nb][e];
          }
#pragma unroll
        for (int n = 0; n < D / 8; ++n) o[n][2 * h] *= alpha, o[n][2 * h + 1] *= alpha;
      }
      // P as the A fragment (keys 0-7 and 8-15 are the two score blocks), V by ldmatrix.trans.
      const uint32_t a[4] = {pack2(s[0][0], s[0][1]), pack2(s[0][2], s[0][3]),
                             pack2(s[1][0], s[1][1]), pack2(s[1][2], s[1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t bv[4];
        warp::ldmatrix_x4_trans(bv, tile_at(sv, 16 * warp + (lane / 8 % 2) * 8 + lane % 8, 2 * dp + lane / 16));
        mma_step(o[2 * dp], a, bv[0], bv[1]);
        mma_step(o[2 * dp + 1], a, bv[2], bv[3]);
      }
    }
    kv.consumer_release_warp(c);
  }

  trace::mark(4);
#if HEAD_GROUP
  // A warp holds its head's whole softmax: O / l straight from the registers, to the output or
  // (several splits) to the workspace with the log-sum-exps.
  const size_t first_w = (size_t(b) * heads_kv + kvh + warp) * splits;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = warp::quad_sum(l_run[h]), inv = l > 0.f ? 1.f / l : 0.f;
    const int row = lane / 4 + 8 * h;
    if (row >= rows) continue;
    if (splits == 1) {
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
        *reinterpret_cast<uint32_t*>(out + row_offset_of(kvh + warp, row) + 8 * n + 2 * (lane % 4)) =
            pack2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
    } else {
      float* at = part + ((first_w + split) * rows + row) * D + 2 * (lane % 4);
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
        *reinterpret_cast<float2*>(at + 8 * n) = make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
      if (lane % 4 == 0) part_lse[(first_w + split) * kRows + row] = l > 0.f ? m_run[h] + __log2f(l) : neg_inf();
    }
  }
  trace::mark(7);
  if (splits == 1) {
    trace::mark(6);
    return;
  }
#else
  // Merge the warps: maxima and sums first, then O summed warp by warp (a fixed order). Every
  // tile is read (and no copy is left in flight), so stage 0 holds the merge: O in its K tile,
  // the statistics in its V tile; persistent, the producer is filling the stages with the next
  // item's tiles, and the merge has its own buffer.
  named_barrier::sync(1, kConsumers);
  trace::mark(9);
#if PERSISTENT
  float* so = static_cast<float*>(S.warps());  // kRows x D (o_at), then the statistics
  Stats st{so + kRows * D};
#else
  Stats st{static_cast<float*>(S.kv_v(0))};
  float* so = static_cast<float*>(S.kv_k(0));  // kRows x D (o_at)
#endif
  const int row0 = lane / 4;
#if WARP_SLICES
  float* warp_weight = st.base + kStatsFloats + kRows;  // [warp][row], past the cluster merge's log-sum-exps
#endif
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] = warp::quad_sum(l_run[h]);
    if (lane % 4 == 0) st.warp_max(warp, row0 + 8 * h) = m_run[h], st.warp_sum(warp, row0 + 8 * h) = l_run[h];
  }
  named_barrier::sync(1, kConsumers);
  if (threadIdx.x < kRows) {
    float m = neg_inf(), l = 0.f;
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, st.warp_max(w, threadIdx.x));
    for (int w = 0; w < kWarps; ++w)
      if (st.warp_max(w, threadIdx.x) != neg_inf()) l += st.warp_sum(w, threadIdx.x) * math::exp2_approx(st.warp_max(w, threadIdx.x) - m);
    st.row_max(threadIdx.x) = m;
    st.row_sum(threadIdx.x) = l;
#if WARP_SLICES
    for (int w = 0; w < kWarps; ++w)  // each row's weights once, read by every thread of the sums
      warp_weight[w * kRows + threadIdx.x] = st.warp_max(w, threadIdx.x) == neg_inf() ? 0.f :
          math::exp2_approx(st.warp_max(w, threadIdx.x) - m);
#endif
  }
  // O = sum over the warps, in order, of O_w x 2^(m_w - m): the first a product, then fused
  // multiply-adds (written out: both ways below give equal bits).
#if WARP_SLICES
  // Every warp's O in a slice of its own at once (warp w's after the others', rows x D), then
  // each thread sums its elements' four: two barriers, where a turn a warp takes four.
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<float2*>(so + warp * kRows * D + o_at(row0 + 8 * h, 8 * n + 2 * (lane % 4))) =
          make_float2(o[n][2 * h], o[n][2 * h + 1]);
  named_barrier::sync(1, kConsumers);
  trace::mark(10);
  for (int i = threadIdx.x; i < rows * D; i += kConsumers) {
    const int row = i / D, at = o_at(i);
    float acc = so[at] * warp_weight[row];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) acc = fmaf(so[w * kRows * D + at], warp_weight[w * kRows + row], acc);
    so[at] = acc;  // slice 0, where the turns leave the sum: each thread reads back only its own elements
  }
#else
  named_barrier::sync(1, kConsumers);
  for (int turn = 0; turn < kWarps; ++turn) {
    if (warp == turn) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + 8 * h;
        const float w = m_run[h] == neg_inf() ? 0.f : math::exp2_approx(m_run[h] - st.row_max(row));
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          float2* at = reinterpret_cast<float2*>(so + o_at(row, 8 * n + 2 * (lane % 4)));
          *at = turn == 0 ? make_float2(o[n][2 * h] * w, o[n][2 * h + 1] * w)
                          : make_float2(fmaf(o[n][2 * h], w, at->x), fmaf(o[n][2 * h + 1], w, at->y));
        }
      }
    }
    named_barrier::sync(1, kConsumers);
  }
#endif

  auto normalised = [&](int i) {  // element i (row i / D) of this CTA's O / l; zeros without keys
    const float l = st.row_sum(i / D);
    return l > 0.f ? so[o_at(i)] / l : 0.f;
  };
  trace::mark(7);
  if (splits == 1) {
    for (int i = threadIdx.x; i < rows * D; i += kConsumers) out[row_offset(i / D) + i % D] = to_elem(normalised(i));
    trace::mark(6);
    return;
  }
#if CLUSTER_MERGE
  cluster_merge(st, so, out, rows, splits, split, row_offset);
  return;
#endif
  const size_t first = (size_t(b) * heads_kv + kvh) * splits;  // this (request, kv head)'s slots
  for (int i = threadIdx.x; i < rows * D; i += kConsumers) part[(first + split) * rows * D + i] = normalised(i);
  if (threadIdx.x < rows) {
    const float l = st.row_sum(threadIdx.x);
    part_lse[(first + split) * kRows + threadIdx.x] = l > 0.f ? st.row_max(threadIdx.x) + __log2f(l) : neg_inf();
  }
  trace::mark(11);
#endif
#if MERGE_KERNEL
  trace::mark(8);
  return;  // attention_decode_merge reads the partials once this grid has completed
#endif
  // Publish the partials, then count: the CTA that makes the count `splits` merges. Only
  // thread 0 reads the other splits' partials (by bulk copies): its acquire is the CTA's.
  named_barrier::sync(1, kConsumers);
#if SLICE_MERGE
  slice_merge(S, part, part_lse, counters + b * heads_kv + kvh, (size_t(b) * heads_kv + kvh) * splits, out, rows,
              splits, split, [&](int h, int r) { return row_offset_of(kvh + h, r); });
  return;
#endif
  bool last = false;
  if (threadIdx.x == 0) last = count_split(counters + b * heads_kv + kvh) == uint32_t(splits - 1);
  const bool merges = named_barrier::sync_or(1, kConsumers, last);
  trace::mark(8);
  if (!merges) return;
  trace::mark(5);
  if (threadIdx.x == 0) counters[b * heads_kv + kvh] = 0u;  // every split has counted
  merge_splits(S, part, part_lse, (size_t(b) * heads_kv + kvh) * splits, out, rows, splits,
               [&](int h, int r) { return row_offset_of(kvh + h, r); });
}

extern "C" __global__ void __launch_bounds__(kConsumers + 32)
attention_decode(const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv,
                 const elem_t* q, elem_t* out, const int* block_table, const int* seq_lens,
                 float* part, float* part_lse, uint32_t* counters, int heads_kv, int group,
                 int q_len, int max_pages, float scale_log2, int batch) {
  extern __shared__ __align__(1024) uint8_t smem[];
  trace::mark(1);
  L::Smem S(smem);
  auto kv = S.kv();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // An item's length, and the producer's block-table window if the request fills the table
  // (the common case), loaded together: one DRAM trip before the first copy instead of two.
  auto load_item = [&](int split, int splits, int b, int4& got) {  // (length, guess, window)
    const int* table = block_table + size_t(b) * max_pages;
    got.x = seq_lens[b];
    got.y = split_tiles(max_pages * PAGE_SIZE, split, splits).x * kStepKeys / PAGE_SIZE;
    got.z = got.w = 0;
    if (warp == kWarps) {
      if (got.y + lane < max_pages) got.z = table[got.y + lane];
      if (got.y + 32 + lane < max_pages) got.w = table[got.y + 32 + lane];
    }
  };
  auto set_up = [&] {  // touches no global memory: the descriptors are parameters
    if (threadIdx.x == 0) {
#if MERGE_KERNEL || PDL
      griddep::launch_dependents();  // the next kernel's CTAs may take their places now (its wait waits on this grid)
#endif
      tma::prefetch_descriptor(&tk);
      tma::prefetch_descriptor(&tv);
      S.merged().init();
      kv.init();  // its fences cover the merge barrier's init too
    }
  };
#if PDL
  set_up();  // while the kernel before this one finishes
  griddep::wait();  // its writes (lengths, tables, caches, q) visible from here on
#endif
  const int groups = heads_kv / kHeads;  // CTAs (or items) a request and split
#if PERSISTENT
  const int split = 0, splits = 1;
  int item = blockIdx.x;
  int4 got;
  if (item < groups * batch) load_item(split, splits, item / groups, got);
#else
  const int split = blockIdx.x, splits = gridDim.x, kvh = blockIdx.y * kHeads, b = blockIdx.z;
  int4 got;
  load_item(split, splits, b, got);  // on its way while the barriers are set up
#endif
#if !PDL
  set_up();
#endif
  __syncthreads();
  decltype(kv)::Cursor c;  // the pipeline's position: one walk over every item's tiles
#if PERSISTENT
  for (; item < groups * batch; item += gridDim.x) {
    const int kvh = item % groups * kHeads, b = item / groups;  // a request's kv heads side by side
    const int4 now = got;
    const int next = item + gridDim.x;
    if (next < groups * batch) {
      load_item(split, splits, next / groups, got);
      // The next item's Q rows into L2: its consumers start on them while its tiles arrive.
      const int lines = (D * 2 + 127) / 128, next_b = next / groups, next_kvh = next % groups * kHeads;
      const int item_rows = group * kHeads;  // a new token's query heads of the item's kv heads
      for (int i = threadIdx.x; i < q_len * item_rows * lines && threadIdx.x < kConsumers; i += kConsumers) {
        const int r = i / lines;
        prefetch_l2(q + ((size_t(next_b) * q_len + r / item_rows) * heads_kv * group + next_kvh * group) * D +
                    (r % item_rows) * D + (i % lines) * 64);
      }
    }
    decode_item(S, c, tk, tv, q, out, block_table + size_t(b) * max_pages, part, part_lse, counters, heads_kv,
                group, q_len, max_pages, scale_log2, split, splits, kvh, b, now.x, now.y, now.z, now.w);
  }
#else
  decode_item(S, c, tk, tv, q, out, block_table + size_t(b) * max_pages, part, part_lse, counters, heads_kv,
              group, q_len, max_pages, scale_log2, split, splits, kvh, b, got.x, got.y, got.z, got.w);
#endif
}

#if MERGE_KERNEL
// The splits' merge of MERGE_KERNEL plans (grid: a kv head's 4-column groups of output / the
// block, kv heads, requests): a thread one 4-column group. Launched with PDL after
// attention_decode, it waits for that grid's completion (its partials visible), then has its
// first kMergeBatch splits' pieces and every log-sum-exp in flight at once: one L2 round trip
// up to 32 splits.
constexpr int kMergeBatch = 32;
extern "C" __global__ void __launch_bounds__(128)
attention_decode_merge(const float* part, const float* part_lse, elem_t* out, int heads_kv, int group, int q_len,
                       int splits) {
  __shared__ float lse[MAX_SPLITS * kRows];  // [split][row]
  const int kvh = blockIdx.y, b = blockIdx.z, rows = q_len * group, columns = rows * D / 4;
  const int i = blockIdx.x * blockDim.x + threadIdx.x, r = i / (D / 4);
  const bool active = i < columns;
  const size_t first = (size_t(b) * heads_kv + kvh) * splits;  // this (request, kv head)'s slots
  const float4* piece = reinterpret_cast<const float4*>(part + first * rows * D) + i;  // split s: + s x columns
  griddep::wait();
  trace::mark(5);
  float m = neg_inf(), total = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = 0; s0 < splits; s0 += kMergeBatch) {  // (one copy of the unrolled batch: a cold call fetches its code)
    float4 v[kMergeBatch];
#pragma unroll
    for (int k = 0; k < kMergeBatch; ++k)
      if (active && s0 + k < splits) v[k] = __ldcg(piece + size_t(s0 + k) * columns);
    if (s0 == 0) {  // every log-sum-exp, in flight with the first pieces
      for (int j = threadIdx.x; j < splits * kRows; j += blockDim.x) lse[j] = __ldcg(part_lse + first * kRows + j);
      __syncthreads();
      for (int s = 0; s < splits; ++s) m = fmaxf(m, lse[s * kRows + r]);
    }
    if (!active) continue;
#pragma unroll
    for (int k = 0; k < kMergeBatch; ++k)
      if (s0 + k < splits) {
        const float w = m == neg_inf() ? 0.f : math::exp2_approx(lse[(s0 + k) * kRows + r] - m);
        total += w;
        add_weighted(acc, w, v[k]);
      }
  }
  if (!active) return;
  const float inv = total > 0.f ? 1.f / total : 0.f;
  const int heads_q = heads_kv * group;
  const size_t at = ((size_t(b) * q_len + r / group) * heads_q + kvh * group + r % group) * D + (i % (D / 4)) * 4;
  *reinterpret_cast<uint2*>(out + at) = make_uint2(pack2(acc.x * inv, acc.y * inv), pack2(acc.z * inv, acc.w * inv));
  trace::mark(6);
}
#endif
