// Attention backward on Hopper's asynchronous units (FlashAttention-3's schedule) for head dims
// 64 and 128: dQ, dK and dV of O = softmax(scale Q K^T) V, bf16 (FP16: fp16) in and out.
//
// attention_bwd_sm90_prep: per query row (rows padded to whole steps a head), Delta = rowsum(dO * O)
//   and the log-sum-exp in the log2 domain (padding rows: 0, 0), the fp32 dQ accumulator and
//   (DETERMINISTIC) the chain counters zeroed.
// attention_bwd_sm90: a CTA is one (block of BN = 128 keys, kv head, batch). Warpgroup 0 issues
//   TMA: K and V once, then per block of BM = 64 (BLOCK_M) query rows (over the kv head's query heads,
//   grouped-query attention) Q, dO, LSE and Delta into a multi-stage ring. Consumer warpgroups
//   1 and 2 own keys 0-63 / 64-127 of the block. Per query block each computes
//     S^T = K Q^T and dP^T = V dO^T (wgmma, K / V rows and Q / dO 128B-swizzled, K-major),
//     P^T = 2^(S^T scale log2e - LSE), dS^T = P^T (dP^T - Delta) (fp32, in registers),
//     dV += P^T dO and dK += dS^T Q (wgmma with P^T / dS^T from registers, dO / Q N-major),
//   stores dS^T into shared memory, and after both warpgroups did, computes its half of the
//   head dim of dQ = dS K (dS^T and K both MN-major), stores it into shared memory, and a
//   producer warp adds it into the fp32 accumulator with bulk reductions (DETERMINISTIC: in a
//   fixed key-block order, waiting on a counter per query block; SPT: causal key blocks run
//   last first and chain in that order; DET_ROTATE: full attention's walks rotated, a
//   persistent cooperative grid). OVERLAP (head dim 64): step t - 1's dQ is issued
//   after step t's S and dP, so the softmax of step t runs while it is on the tensor cores
//   (head dim 128 has no registers left for the dQ accumulators then).
//   Maps are 3-D (batch x heads, seq, head dim): rows past a head's sequence load as zeros, so
//   padded query rows give dS = 0 and P dO = 0; keys past the sequence are masked.
//   CAUSAL: key j is seen by query i when j <= i (top-left aligned); a key block starts at
//   the first query block that sees one of its keys.
//   VARLEN: packed sequences (attention_varlen's layout): q, dO (tokens, heads, D), k, v
//   (tokens, kv heads, D), sequence b's tokens cu_q[b] .. cu_q[b+1] (cu_k for keys), read on
//   the device. Key blocks are numbered over the sequences, CTA x (of a grid sized for any
//   lengths) finds its (sequence, key block) by a walk over cu_k (every warp, 32 sequences a
//   step); CTAs past the last block leave. Maps are (tokens, heads, D), so boxes near a
//   sequence's end load the next sequence's rows: such keys are masked like keys past the
//   end, such query rows have LSE = +inf (prep: P = 0, so dS = 0 and P dO = 0) and their dQ
//   is never added. LSE and Delta: a head's rows of sequence b from lse_row0(b) (a multiple of
//   4 floats, for the bulk copies), followed by kSeqPad padding rows (so a step of any BM
//   crossing the end reads them); chain counters: one a (query block's first packed row,
//   head); SPT runs a sequence's key blocks last first.
// The fp32 dQ goes to the output dtype with attention_backward.cu's attention_bwd_dq (DQ_TILE's
// tiles: with attention_bwd_sm90_dq_tile, at the end of this file).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <tmaflow.cuh>
#include <tmaflow/wgmma_tn.cuh>
using namespace tmaflow;

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef CAUSAL
#define CAUSAL 0
#endif
#ifndef FP16
#define FP16 0
#endif
#ifndef DETERMINISTIC
#define DETERMINISTIC 0
#endif
// Query rows a step (BM): 64, or 128 at head dim 64 (FA3's tile there: S^T and dP^T are
// m64n128 wgmmas, whose B operand costs less shared-memory bandwidth a FLOP than n64's, and a
// step's barriers and waits are paid once for twice the work). At 128 each consumer
// warpgroup's dQ is its 64 query rows of the step by all head-dim columns.
#ifndef BLOCK_M
#define BLOCK_M 64
#endif
#ifndef STAGES
#define STAGES 2
#endif
// 1: step t's S and dP are issued before step t - 1's dQ (registers: head dim 64 only, whose dK
// and dV take half of 128's). Every step issues the same wgmmas (the first a dQ it never adds):
// a wgmma issued on one path of a branch makes ptxas serialize them all (C7515).
#ifndef OVERLAP
#define OVERLAP (HEAD_DIM == 64 && BLOCK_M == 64)
#endif
// 1 (CAUSAL and DETERMINISTIC by default; FA3's "shortest processing time first"): CTA x is
// key block gridDim.x - 1 - x, and a query block's adds chain from its last key block down to
// key block 0. Key block j reaches query block i (step i - 2j of its walk) two steps after
// key block j + 1 does, so its predecessor is two steps ahead; in key-block order (0: key
// block j, the CTA x = j, waits on j - 1) it is two steps behind and every step waits (round
// 1: 0.47x the default mode at 4k).
#ifndef SPT
#define SPT (CAUSAL && DETERMINISTIC)
#endif
// DETERMINISTIC, 1: each consumer warp waits for the chain before its dQ adds (the wait issued
// while its dQ wgmma runs) and releases it after its adds (the release fence, which waits for
// the adds to land, deferred until the next step's S and dP are issued); 0: one thread of
// the CTA waits and releases between two barriers of both consumer warpgroups.
// 1 (where OVERLAP is 0): FA3's order, dV, dQ, dK, each its own group, so the dQ adds (or
// stores) run while dK is on the tensor cores; 0: dV and dK, then dQ, all waited for before
// the adds. (Issuing step t + 1's S and dP behind dK too, waited for in the next iteration,
// makes ptxas serialize the wgmmas: C7514.)
#ifndef DQ_EARLY
#define DQ_EARLY 1
#endif
// 1 (DQ_EARLY): dV is issued as soon as P^T is in registers, before dP is waited for, so
// dS^T's arithmetic and its stores into shared memory run while dV is on the tensor cores.
#ifndef DV_FIRST
#define DV_FIRST 0
#endif
// 1: each CTA starts its walk over the query blocks at a different one (block_of); only full
// attention, not DETERMINISTIC (the chains' order) or VARLEN, the others ignore it.
#ifndef ROTATE
#define ROTATE 0
#endif
// 1 (DETERMINISTIC full attention, dense; the others ignore it): a persistent grid of slots x N
// CTAs (N key blocks a (batch, kv head) group, gridDim.x = slots N), launched cooperative so
// that all are resident at once: CTA (slot s, key block j) takes group w slots + s in wave w,
// so a group's N key blocks always run together. Key block j walks the query blocks rotated
// (from block j per_head / N, wrapping), and query block i's adds chain in the order its key
// blocks reach it: j0 (the last whose walk starts at or before i), j0 - 1, .., 0, N - 1, ..,
// j0 + 1, each about per_head / N steps behind the one before. That chain is a cycle over the
// key blocks: safe only because every CTA of a group is resident (the plan launches it only
// where N CTAs fit the GPU at once). 0: the chain from key block 0, every key block starting
// at query block 0 (key block n waits about n - 1 links).
#ifndef DET_ROTATE
#define DET_ROTATE 0
#endif
#define TF_PERSIST (DET_ROTATE && DETERMINISTIC && !CAUSAL && !VARLEN)
// DETERMINISTIC with DQ_BULK: the producer warps that add dQ, step t's by warp 1 + t % DQ_WARPS.
// A step's chain wait, bulk reduction, wait for its completion in global memory and release
// are one serial chain in the warp that issues it (a bulk group is waited for by its issuing
// thread only): 2 gives each warp two steps for it (each its own dQ buffer: DQ_BUFS 2).
#ifndef DQ_WARPS
#define DQ_WARPS 1
#endif
// Diagnostics of the DETERMINISTIC dQ warp (A/B only: sums in no fixed order, never a plan's):
// 1 no chain at all (no wait, no completion wait, no release: the schedule alone); 2 no chain
// wait (the completion wait and the release kept); 3 the release once the reduction is read,
// not complete (the chain wait kept).
#ifndef DET_DIAG
#define DET_DIAG 0
#endif
#ifndef WARP_CHAIN
#define WARP_CHAIN 1
#endif
// 1: the consumers store dQ (fp32) into shared memory and a producer warp adds it into the
// accumulator with bulk reductions (cp.reduce.async.bulk .add.f32, a row each; FA3's dQ), so
// the consumers issue no global atomics; DETERMINISTIC: that warp waits on and releases the
// chain. 0: each consumer thread adds its part with red.global.add.v2.f32.
#ifndef DQ_BULK
#define DQ_BULK 1
#endif
// 1 (DQ_BULK; FA3's dQ): the accumulator is tiles, one a (batch x head, query block), each a
// byte-for-byte image of the shared dQ buffer (its padding included), so the dQ warp adds a
// step's dQ with one bulk reduction instead of one a row; attention_bwd_sm90_dq_tile (VARLEN:
// attention_bwd_sm90_varlen_dq_tile) un-permutes them. 0: the accumulator is row-major (batch x
// heads x seq, D; VARLEN: token x heads + head).
#ifndef DQ_TILE
#define DQ_TILE 0
#endif
#ifndef VARLEN
#define VARLEN 0
#endif
static_assert(!DQ_TILE || DQ_BULK, "DQ_TILE: the bulk dQ path's (DQ_BULK)");
// VARLEN, 1: the fp32 dQ accumulator is head-major (head x tokens + token rows, a head's rows
// contiguous as the dense kernel's) and attention_bwd_sm90_varlen_dq writes dQ in (tokens,
// heads, D); 0: its rows are dQ's (token x heads + head, a step's rows heads x D x 4 bytes apart).
#ifndef DQ_HEAD_MAJOR
#define DQ_HEAD_MAJOR 0
#endif
static_assert(!(DQ_TILE && DQ_HEAD_MAJOR), "DQ_TILE and DQ_HEAD_MAJOR: two layouts of the varlen dQ accumulator");
constexpr int D = HEAD_DIM, BM = BLOCK_M, BN = 128;
static_assert(!DV_FIRST || (DQ_EARLY && !OVERLAP), "DV_FIRST is an order of the DQ_EARLY schedule");
constexpr bool kRotate = ROTATE && !(CAUSAL || DETERMINISTIC || VARLEN);
// VARLEN: the padding rows (LSE +inf, Delta 0) after each sequence's LSE / Delta rows, the widest
// step's (the prep and the main kernel agree whatever BM the main kernel is built with).
constexpr int kSeqPad = 128;
static_assert(!VARLEN || BM <= kSeqPad, "VARLEN: a step of at most kSeqPad rows (the LSE / Delta padding)");
constexpr int kConsumerWarps = 8;
static_assert(D == 64 || D == 128, "HEAD_DIM is 64 or 128");
static_assert(BM == 64 || (BM == 128 && D == 64), "BLOCK_M is 64, or 128 at head dim 64");
// A consumer warpgroup's dQ: rows kDQRow0 cw .. + 63 of the step, columns kDQCol0 cw .. +
// kDQCols - 1 (BM 64: all rows, its half of the columns; BM 128: its half of the rows).
constexpr int kDQCols = BM == 128 ? D : D / 2, kDQRow0 = BM == 128 ? 64 : 0, kDQCol0 = BM == 128 ? 0 : D / 2;
// K and V: two boxes of BN rows by D / 2 columns (a consumer's half of dQ's columns is one box,
// a whole swizzle span: 128 B at head dim 128, 64 B at 64). Q and dO: boxes of BM rows by 64
// columns (128B swizzle), D / 64 of them.
constexpr int kSpanKV = D;                       // bytes of a K / V box row
constexpr int kKVBox = BN * kSpanKV;             // bytes of a K / V box
constexpr int kKVBytes = 2 * kKVBox;
constexpr int kQBox = BM * 128, kQBoxes = D / 64;
constexpr int kQBytes = kQBoxes * kQBox;
constexpr int kDSBox = BN * 128;                 // dS^T: BN keys by 64 queries (128 B rows) a box
constexpr int kDSBytes = (BM / 64) * kDSBox;
// Shared memory (from a 1024-byte aligned base): K, V, STAGES x (Q, dO), two dS^T buffers,
// the dQ buffers (DQ_BULK), STAGES x (LSE, Delta), barriers (attention_backward_sm90.py's
// sm90_smem is the same sum).
constexpr int kOffV = kKVBytes, kOffQ = 2 * kKVBytes, kOffDO = kOffQ + STAGES * kQBytes;
// dQ (DQ_BULK): DQ_BUFS buffers of BM rows of D fp32 (two: step t's stores need not wait for
// step t - 1's reductions to be read; at head dim 128 they fit with STAGES 2). A warp's 8-byte
// stores go to 8 rows r (r % 8 = lane / 4); the rows' banks must differ so they take two
// wavefronts (the least for 256 B). DQ_PACK 0: each row padded by 16 B; 1: rows with r % 8 in
// {2 q, 2 q + 1} (a quarter of them) lie together, quarter q shifted by 32 q bytes (each
// 128-byte bank span then holds two rows' 32 B: two wavefronts, 96 B of padding a buffer, not
// 16 B a row). Rows stay contiguous and 16-byte aligned for the bulk reductions.
#ifndef DQ_BUFS
#define DQ_BUFS (HEAD_DIM == 64 && BLOCK_M == 64 ? 2 : 1)
#endif
#ifndef DQ_PACK
#define DQ_PACK 0
#endif
static_assert(DQ_BUFS == 1 || DQ_BUFS == 2, "DQ_BUFS is 1 or 2");
static_assert(DQ_WARPS == 1 || (DQ_WARPS == 2 && DQ_BULK && DQ_BUFS == 2),
              "DQ_WARPS: 1, or 2 with DQ_BULK and DQ_BUFS 2 (a buffer a warp)");
constexpr int kDQRow = DQ_PACK ? 4 * D : 4 * D + 16, kDQBufs = DQ_BUFS;
constexpr int kDQBuf = DQ_PACK ? BM * kDQRow + 96 : BM * kDQRow, kDQBytes = DQ_BULK ? kDQBufs * kDQBuf : 0;
// Byte offset of row r of a dQ buffer.
TMAFLOW_DEVICE int dq_row_offset(int r) {
  if (!DQ_PACK) return r * kDQRow;
  const int q = (r % 8) / 2;
  return (q * (BM / 4) + (r / 8) * 2 + r % 2) * kDQRow + 32 * q;
}
static_assert(kDQBuf % 16 == 0, "a dQ buffer is whole 16-byte pieces (bulk reductions, DQ_TILE's tiles)");
constexpr int kOffDS = kOffDO + STAGES * kQBytes, kOffDQ = kOffDS + 2 * kDSBytes, kOffRow = kOffDQ + kDQBytes;
constexpr int kOffBar = kOffRow + STAGES * 2 * BM * 4;
constexpr int kSmemBytes = kOffBar + (2 + 2 * STAGES + 2 * kDQBufs) * 8;
static_assert(kSmemBytes <= 227 * 1024, "STAGES do not fit shared memory");
constexpr uint32_t kStageTx = 2 * kQBytes + 2 * BM * 4;
// Registers a consumer thread after setmaxnreg (a multiple of 8). The CTA holds 168 a thread
// (__launch_bounds__(384, 1)) and setmaxnreg.inc only takes what a .dec released, so the
// producer keeps 168 - 2 (CONSUMER_REGS - 168): 232 / 40, or 240 / 24 (FA3's; DV_FIRST at
// head dim 128 needs 240).
#ifndef CONSUMER_REGS
#define CONSUMER_REGS 232
#endif
constexpr uint32_t kConsumerRegs = CONSUMER_REGS, kProducerRegs = 168 - 2 * (kConsumerRegs - 168);
static_assert(kConsumerRegs % 8 == 0 && kConsumerRegs <= 240, "CONSUMER_REGS: a multiple of 8, at most 240");

#if FP16
using elem_t = __half;
#define TF_MMA wgmma::mma_k16_f16
#define TF_MMA_RS wgmma::mma_k16_rs_f16
#define TF_MMA_TN wgmma::mma_k16_tn_f16
TMAFLOW_DEVICE uint32_t pack2(float lo, float hi) { return wgmma::f16x2(lo, hi); }
TMAFLOW_DEVICE float2 to_float2(uint32_t x) { return __half22float2(*reinterpret_cast<__half2*>(&x)); }
#else
using elem_t = __nv_bfloat16;
#define TF_MMA wgmma::mma_k16_bf16
#define TF_MMA_RS wgmma::mma_k16_rs_bf16
#define TF_MMA_TN wgmma::mma_k16_tn_bf16
TMAFLOW_DEVICE uint32_t pack2(float lo, float hi) { return wgmma::bf16x2(lo, hi); }
TMAFLOW_DEVICE float2 to_float2(uint32_t x) { return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&x)); }
#endif

using chain::add_release;
using chain::clamp_to;
using chain::load_acquire;

// A warp a padded row: rows_padded = batch x heads x seq_pad.
extern "C" __global__ void __launch_bounds__(256)
attention_bwd_sm90_prep(const elem_t* out, const elem_t* dout, const float* lse, float* lse2, float* delta,
                        float* dq_accum, uint32_t* chain, int rows_padded, int seq, int seq_pad, int chain_count,
                        size_t tile_vec4) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * 8 + threadIdx.x / 32;
  const int tid = blockIdx.x * blockDim.x + threadIdx.x;
  if (DETERMINISTIC && tid < chain_count) chain[tid] = 0;
  // A tiled accumulator (the main kernel's DQ_TILE: tile_vec4 float4s, padding included), all of it.
  for (size_t i = tid; i < tile_vec4; i += size_t(gridDim.x) * blockDim.x)
    reinterpret_cast<float4*>(dq_accum)[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (row >= rows_padded) return;
  const int bh = row / seq_pad, s = row % seq_pad;
  if (s >= seq) {
    if (lane == 0) lse2[row] = 0.f, delta[row] = 0.f;
    return;
  }
  const size_t r = size_t(bh) * seq + s;
  const uint32_t* o = reinterpret_cast<const uint32_t*>(out + r * D);
  const uint32_t* g = reinterpret_cast<const uint32_t*>(dout + r * D);
  float sum = 0.f;
  for (int c = lane; c < D / 2; c += 32) {
    const float2 a = to_float2(o[c]), b = to_float2(g[c]);
    sum = fmaf(a.x, b.x, fmaf(a.y, b.y, sum));
  }
  if (tile_vec4 == 0)
    for (int c = lane; c < D / 4; c += 32) reinterpret_cast<float4*>(dq_accum + r * D)[c] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int step = 16; step > 0; step /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, step);
  if (lane == 0) {
    delta[row] = sum;
    lse2[row] = lse[r] * 1.44269504089f;
  }
}

#if VARLEN
// Sequence b's first row in a head's LSE / Delta rows: 16-byte aligned (bulk copies) and at
// least len + kSeqPad rows before sequence b + 1's (b (kSeqPad + 4) covers the rounding).
TMAFLOW_DEVICE int lse_row0(int cu_q_b, int b) { return (cu_q_b + 3) / 4 * 4 + b * (kSeqPad + 4); }

// DQ_TILE (FA3's packed tiles): sequence b's query block i is tile (cu_q[b] + b BM) / BM + i of
// its head; sequence b + 1's first is past b's last whatever the lengths, and a head's
// (total_q + batch BM) / BM + 1 tiles hold them all (attention_backward_sm90.py's).
TMAFLOW_DEVICE int varlen_tile0(int cu_q_b, int b) { return (cu_q_b + b * BM) / BM; }
TMAFLOW_DEVICE int varlen_tiles_per_head(int total_q, int batch) { return (total_q + batch * BM) / BM + 1; }

// The last b <= batch with cu_q[b] <= token (cu_q clamped to 0 .. total_q), the whole warp
// asking; below 1024 sequences a 32-ary search (a load a lane and a ballot a level: one or two
// levels, no loop), else a binary search.
TMAFLOW_DEVICE int warp_sequence_of(const int* cu_q, int token, int total_q, int batch, int lane, bool ballot) {
  int lo = 0;
  if (ballot && batch < 1024) {
    auto level = [&](int base, int span) {  // the last b = base + span x lane (b <= batch) with cu_q[b] <= token
      const int b = base + span * lane;
      const bool le = b <= batch && clamp_to(__ldg(cu_q + min(b, batch)), 0, total_q) <= token;
      const uint32_t any = __ballot_sync(0xffffffffu, le);
      return any ? base + span * (31 - __clz(any)) : base;
    };
    lo = level(batch >= 32 ? level(0, 32) : 0, 1);
  } else {
    int hi = batch;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (clamp_to(__ldg(cu_q + mid), 0, total_q) <= token) lo = mid; else hi = mid - 1;
    }
  }
  return lo;
}

// 1: the varlen prep finds a row's sequence (below 1024 sequences) with a load a lane and a
// ballot a level, the row's O and dO loads in flight, and zeroes the padding and the dK / dV rows
// outside every sequence after its row; 0: those first, then a binary search over cu_q (about
// seven dependent loads before the O / dO loads, which nvcc places after the search's loop).
#ifndef PREP_LOADS_FIRST
#define PREP_LOADS_FIRST 1
#endif

// A warp a packed query row (token x heads + head): Delta and the LSE (log2) at the row's
// place in its sequence's padded rows, the fp32 dQ accumulator zeroed; a thread a padding row
// (kSeqPad past each sequence's end: LSE +inf, Delta 0); chain counters zeroed; dK and dV rows outside
// every sequence zeroed (no CTA of the main kernel stores them).
extern "C" __global__ void __launch_bounds__(256)
attention_bwd_sm90_varlen_prep(const elem_t* out, const elem_t* dout, const float* lse, float* lse2, float* delta,
                               float* dq_accum, uint32_t* chain, elem_t* dk, elem_t* dv, const int* cu_q,
                               const int* cu_k, int total_q, int total_k, int batch, int heads, int heads_kv,
                               int lse_stride, int chain_count, size_t tile_vec4) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * 8 + threadIdx.x / 32;
  const int tid = blockIdx.x * blockDim.x + threadIdx.x;
  const size_t threads = size_t(gridDim.x) * blockDim.x;
  if (DETERMINISTIC && tid < chain_count) chain[tid] = 0;
  // A tiled accumulator (the main kernel's DQ_TILE: tile_vec4 float4s, padding included), all of it.
  for (size_t i = tid; i < tile_vec4; i += threads)
    reinterpret_cast<float4*>(dq_accum)[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  auto zero_outside = [&] {  // key rows before cu_k[0] and from cu_k[batch] on
    const int lo = clamp_to(__ldg(cu_k), 0, total_k), hi = clamp_to(__ldg(cu_k + batch), lo, total_k);
    const size_t before = size_t(lo) * heads_kv, inside = size_t(hi - lo) * heads_kv;
    const size_t outside = size_t(total_k) * heads_kv - inside;
    for (size_t i = row; i < outside; i += threads / 32) {
      const size_t r = i < before ? i : i + inside;
      for (int c = lane; c < D / 2; c += 32) reinterpret_cast<uint32_t*>(dk + r * D)[c] = 0;
      for (int c = lane; c < D / 2; c += 32) reinterpret_cast<uint32_t*>(dv + r * D)[c] = 0;
    }
  };
  auto pad_rows = [&] {
    for (size_t p = tid; p < size_t(batch) * heads * kSeqPad; p += threads) {
      const int b = int(p / (heads * kSeqPad)), h = int(p / kSeqPad % heads);
      const int q0 = clamp_to(__ldg(cu_q + b), 0, total_q), len = clamp_to(__ldg(cu_q + b + 1), q0, total_q) - q0;
      const size_t at = size_t(h) * lse_stride + lse_row0(q0, b) + len + int(p % kSeqPad);
      lse2[at] = __int_as_float(0x7f800000), delta[at] = 0.f;
    }
  };
  auto query_row = [&] {
    if (row >= total_q * heads) return;
    const int token = row / heads, h = row % heads;
    // The row's O and dO (in bounds whatever cu_q holds), then its sequence: the last b with
    // cu_q[b] <= token, if token < cu_q[b + 1]. Below 1024 sequences a 32-ary search (a load a
    // lane and a ballot a level: one or two levels, no loop for nvcc to sink the loads past).
    uint32_t o[D / 64], g[D / 64];
#pragma unroll
    for (int c = 0; c < D / 64; ++c) {
      o[c] = __ldg(reinterpret_cast<const uint32_t*>(out + size_t(row) * D) + lane + 32 * c);
      g[c] = __ldg(reinterpret_cast<const uint32_t*>(dout + size_t(row) * D) + lane + 32 * c);
    }
    float* accum = dq_accum + (DQ_HEAD_MAJOR ? size_t(h) * total_q + token : size_t(row)) * D;
    if (tile_vec4 == 0)
      for (int c = lane; c < D / 4; c += 32) reinterpret_cast<float4*>(accum)[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    const int lo = warp_sequence_of(cu_q, token, total_q, batch, lane, PREP_LOADS_FIRST);
    const int q0 = clamp_to(__ldg(cu_q + lo), 0, total_q);
    const int q1 = lo < batch ? clamp_to(__ldg(cu_q + lo + 1), q0, total_q) : q0;
    if (lo >= batch || token < q0 || token >= q1) return;
    float sum = 0.f;
#pragma unroll
    for (int c = 0; c < D / 64; ++c) {
      const float2 a = to_float2(o[c]), b = to_float2(g[c]);
      sum = fmaf(a.x, b.x, fmaf(a.y, b.y, sum));
    }
#pragma unroll
    for (int step = 16; step > 0; step /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, step);
    if (lane == 0) {
      const size_t at = size_t(h) * lse_stride + lse_row0(q0, lo) + token - q0;
      delta[at] = sum;
      lse2[at] = lse[size_t(h) * total_q + token] * 1.44269504089f;
    }
  };
  if (PREP_LOADS_FIRST) {
    query_row();
    zero_outside();
    pad_rows();
  } else {
    zero_outside();
    pad_rows();
    query_row();
  }
}

// DQ_HEAD_MAJOR: dQ (token, head) = scale x accumulator row head x total_q + token, a thread 4
// columns (rows of D / 4 threads: both sides' rows whole and contiguous).
extern "C" __global__ void __launch_bounds__(256)
attention_bwd_sm90_varlen_dq(const float* dq_accum, elem_t* dq, int total_q, int heads, float scale) {
  const size_t quads = size_t(total_q) * heads * (D / 4);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < quads; i += size_t(gridDim.x) * blockDim.x) {
    const size_t row = i / (D / 4);
    const int c = int(i % (D / 4)), token = int(row / heads), h = int(row % heads);
    const float4 a = reinterpret_cast<const float4*>(dq_accum + (size_t(h) * total_q + token) * D)[c];
    reinterpret_cast<uint2*>(dq)[i] = make_uint2(pack2(a.x * scale, a.y * scale), pack2(a.z * scale, a.w * scale));
  }
}

#if DQ_TILE
// DQ_TILE: dQ (tokens, heads, D) = scale x the accumulator's tiles, a warp a token (its sequence
// found once, then its heads' rows, a lane 4 columns: whole 16-byte pieces of each tile row, the
// output row contiguous); a token outside every sequence gets zeros.
extern "C" __global__ void __launch_bounds__(256)
attention_bwd_sm90_varlen_dq_tile(const float* dq_accum, elem_t* dq, const int* cu_q, int total_q, int batch,
                                  int heads, float scale) {
  constexpr int kVec = D / 4;  // float4s a row
  const int lane = threadIdx.x % 32, warps = gridDim.x * (blockDim.x / 32);
  const size_t per_head = size_t(varlen_tiles_per_head(total_q, batch)) * kDQBuf;
  for (int token = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; token < total_q; token += warps) {
    const int b = warp_sequence_of(cu_q, token, total_q, batch, lane, true);
    const int q0 = clamp_to(__ldg(cu_q + b), 0, total_q);
    const int q1 = b < batch ? clamp_to(__ldg(cu_q + b + 1), q0, total_q) : q0;
    const bool inside = b < batch && token >= q0 && token < q1;
    const int m = inside ? token - q0 : 0;
    const uint8_t* tile = reinterpret_cast<const uint8_t*>(dq_accum) +
                          size_t(inside ? varlen_tile0(q0, b) + m / BM : 0) * kDQBuf + dq_row_offset(m % BM);
    for (int e = lane; e < heads * kVec; e += 32) {
      const int h = e / kVec, c = e % kVec;
      float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
      if (inside) a = *reinterpret_cast<const float4*>(tile + h * per_head + 16 * c);
      reinterpret_cast<uint2*>(dq + size_t(token) * heads * D)[e] =
          make_uint2(pack2(a.x * scale, a.y * scale), pack2(a.z * scale, a.w * scale));
    }
  }
}
#endif
#endif

extern "C" __global__ void __launch_bounds__(384, 1)
attention_bwd_sm90(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                   const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                   const float* lse2, const float* delta, float* dq_accum, uint32_t* chain, elem_t* dk, elem_t* dv,
#if VARLEN
                   const int* cu_q, const int* cu_k, int total_q, int total_k, int batch, int lse_stride,
#else
                   int seq_q, int seq_kv, int seq_pad,
#endif
                   int heads, int group, float scale, float scale_log2
#if !VARLEN
                   , int batch  // TF_PERSIST's groups: batch x heads / group (last: the others' offsets stay)
#endif
                   ) {
  extern __shared__ __align__(1024) uint8_t smem[];  // the 128B swizzle needs 1024-byte boxes
  uint64_t* kv_bar = reinterpret_cast<uint64_t*>(smem + kOffBar);
  uint64_t* full = kv_bar + 1;
  uint64_t* empty = full + STAGES;
  uint64_t* dq_full = empty + STAGES;        // DQ_BULK, a dQ buffer: the consumers' dQ is in
  uint64_t* dq_empty = dq_full + kDQBufs;    // ... and was read by the bulk reductions
  uint64_t* kv_empty = dq_empty + kDQBufs;   // TF_PERSIST: the consumers are done with an item's K and V
  float* sRow = reinterpret_cast<float*>(smem + kOffRow);  // stage s: LSE at 2 BM s, Delta after
#if VARLEN
  // Rows are (token, head): no batch index (b = 0); the sequence's rows start at q_start and
  // k_start, its LSE / Delta rows at lse_start, its key blocks are last_block + 1.
  int seq = -1, block = 0;
  if (!chain::find_block<BN>(cu_k, total_k, batch, blockIdx.x, seq, block)) return;  // past the last block
  const int q_start = clamp_to(__ldg(cu_q + seq), 0, total_q);
  const int seq_q = clamp_to(__ldg(cu_q + seq + 1), q_start, total_q) - q_start;
  const int k_start = clamp_to(__ldg(cu_k + seq), 0, total_k);
  const int seq_kv = clamp_to(__ldg(cu_k + seq + 1), k_start, total_k) - k_start;
  const int last_block = (seq_kv + BN - 1) / BN - 1, lse_start = lse_row0(q_start, seq);
  const int j = SPT ? last_block - block : block, kvh = blockIdx.y, b = 0;
#else
  int j = SPT ? gridDim.x - 1 - blockIdx.x : blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
#endif
  const int heads_kv = heads / group, q_blocks = (seq_q + BM - 1) / BM;
#if TF_PERSIST
  const int key_blocks = (seq_kv + BN - 1) / BN, slots = gridDim.x / key_blocks, slot = blockIdx.x / key_blocks;
  j = blockIdx.x % key_blocks;
#endif
  const int key0 = j * BN;
  const int i_first = CAUSAL ? key0 / BM : 0;  // the first query block with a row >= key0
  const int wg = threadIdx.x / 128, lane = threadIdx.x % 32;
  // The consumer's steps: the query blocks i_first .. q_blocks - 1 of each query head of the
  // kv head, in the producer's order.
  const int per_head = max(q_blocks - i_first, 0), steps = group * per_head;
  auto head_of = [&](int t) { return b * heads + kvh * group + t / per_head; };
  // ROTATE: key block j starts its walk at query block j q_blocks / gridDim.x and wraps around,
  // so the CTAs of a head (which start together and run in step) reduce into different dQ rows.
  // (TF_PERSIST: from query block j per_head / key_blocks.)
  constexpr bool kRotWalk = kRotate || TF_PERSIST;
#if TF_PERSIST
  const int rot = int(int64_t(j) * per_head / key_blocks);
#else
  const int rot = kRotate ? int(int64_t(j) * per_head / gridDim.x) : 0;
#endif
  auto block_of = [&](int t) { return i_first + (kRotWalk ? (t % per_head + rot) % per_head : t % per_head); };
  // The CTA's item n (its (batch, kv head) group: wave n's of its slot; false past the last).
  auto take_item = [&](int n) {
#if TF_PERSIST
    const int g = n * slots + slot;
    kvh = g % heads_kv, b = g / heads_kv;
    return g < batch * heads_kv;
#else
    return n == 0;
#endif
  };
  // DETERMINISTIC: the key blocks that add their part of query block i before this one: 0 ..
  // j - 1, or (SPT) j + 1 .. the last that sees query block i (a causal key block j' sees it
  // when BN j' <= BM i + BM - 1). Exactly those add to it, causal or not, and all started
  // earlier (CTAs are scheduled in index order).
#if VARLEN
  auto chain_rank = [&](int i) { return uint32_t(SPT ? min(last_block, (i * BM + BM - 1) / BN) - j : j); };
  // The accumulator row (DQ_HEAD_MAJOR's order) of query row m of head bh, and its block's counter.
  auto accum_row = [&](int bh, int m) {
    return DQ_HEAD_MAJOR ? size_t(bh) * total_q + q_start + m : size_t(q_start + m) * heads + bh;
  };
  auto counter_at = [&](int bh, int i) { return chain + accum_row(bh, i * BM); };
#else
  auto chain_rank = [&](int i) {
#if TF_PERSIST
    // (j0 - j) mod key_blocks, j0 the last key block with j0 per_head / key_blocks <= i (32-bit:
    // key_blocks is at most the CTAs the GPU holds)
    const int j0 = min(key_blocks - 1, ((i + 1) * key_blocks + per_head - 1) / per_head - 1);
    return uint32_t(j0 >= j ? j0 - j : j0 - j + key_blocks);
#else
    return uint32_t(SPT ? min(int(gridDim.x) - 1, (i * BM + BM - 1) / BN) - j : j);
#endif
  };
  auto accum_row = [&](int bh, int m) { return size_t(bh) * seq_q + m; };
  auto counter_at = [&](int bh, int i) { return chain + size_t(bh) * q_blocks + i; };
#endif
  if (threadIdx.x == 0) {
    tma::prefetch_descriptor(&tq);
    tma::prefetch_descriptor(&tk);
    tma::prefetch_descriptor(&tv);
    tma::prefetch_descriptor(&tdo);
    mbarrier::init(kv_bar, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbarrier::init(full + s, 1);
      mbarrier::init(empty + s, kConsumerWarps);  // a lane of each consumer warp
    }
    for (int u = 0; u < kDQBufs; ++u) {
      mbarrier::init(dq_full + u, kConsumerWarps);
      mbarrier::init(dq_empty + u, 1);
    }
    mbarrier::init(kv_empty, kConsumerWarps);
    fence::proxy_async_shared_cta();
  }
  __syncthreads();

  if (wg == 0) {
    warp::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) {
      uint32_t stage = 0, phase = 0;
      for (int item = 0; take_item(item); ++item) {
        const int kv_row = b * heads_kv + kvh;
        if (item > 0) mbarrier::wait(kv_empty, (item - 1) & 1);  // the last item's K and V are read
        mbarrier::arrive_expect_tx(kv_bar, 2 * kKVBytes);
        for (int box = 0; box < 2; ++box) {
#if VARLEN  // maps (tokens, heads, D): coordinates innermost first
          tma::load(smem + box * kKVBox, &tk, kv_bar, box * (D / 2), kv_row, k_start + key0);
          tma::load(smem + kOffV + box * kKVBox, &tv, kv_bar, box * (D / 2), kv_row, k_start + key0);
#else
          tma::load(smem + box * kKVBox, &tk, kv_bar, box * (D / 2), key0, kv_row);
          tma::load(smem + kOffV + box * kKVBox, &tv, kv_bar, box * (D / 2), key0, kv_row);
#endif
        }
        for (int g = 0; g < group; ++g) {
          const int bh = b * heads + kvh * group + g;
          for (int i0 = i_first; i0 < q_blocks; ++i0) {
            const int i = kRotWalk ? block_of(i0 - i_first) : i0;
            mbarrier::wait(empty + stage, phase ^ 1u);
            mbarrier::arrive_expect_tx(full + stage, kStageTx);
            for (int box = 0; box < kQBoxes; ++box) {
#if VARLEN
              tma::load(smem + kOffQ + stage * kQBytes + box * kQBox, &tq, full + stage, box * 64, bh, q_start + i * BM);
              tma::load(smem + kOffDO + stage * kQBytes + box * kQBox, &tdo, full + stage, box * 64, bh, q_start + i * BM);
#else
              tma::load(smem + kOffQ + stage * kQBytes + box * kQBox, &tq, full + stage, box * 64, i * BM, bh);
              tma::load(smem + kOffDO + stage * kQBytes + box * kQBox, &tdo, full + stage, box * 64, i * BM, bh);
#endif
            }
#if VARLEN
            const size_t row = size_t(bh) * lse_stride + lse_start + i * BM;
#else
            const size_t row = size_t(bh) * seq_pad + i * BM;
#endif
            bulk::load(sRow + 2 * BM * stage, lse2 + row, BM * 4, full + stage);
            bulk::load(sRow + 2 * BM * stage + BM, delta + row, BM * 4, full + stage);
            if (++stage == STAGES) stage = 0, phase ^= 1u;
          }
        }
      }
    }
#if DQ_BULK
    // The dQ warps (DQ_WARPS): step t's rows, a lane each, 2 rows a lane; warp 1 + t % DQ_WARPS
    // (t0: the steps of the CTA's items before this one, for the dQ buffers' phases)
    const int dq_warp = int(threadIdx.x / 32) - 1;
    if (dq_warp >= 0 && dq_warp < DQ_WARPS) {
      for (int item = 0, t0 = 0; take_item(item); ++item, t0 += steps)
      for (int t = 0; t < steps; ++t) {
        if (DQ_WARPS > 1 && (t0 + t) % DQ_WARPS != dq_warp) continue;
        const int bh = head_of(t), m0 = block_of(t) * BM, rows = min(BM, seq_q - m0), u = (t0 + t) % kDQBufs;
        mbarrier::wait(dq_full + u, ((t0 + t) / kDQBufs) & 1);
#if DETERMINISTIC
        // After chain_rank key blocks, each counting one once its adds are complete.
        uint32_t* counter = counter_at(bh, block_of(t));
        const uint32_t rank = chain_rank(block_of(t));
        if (lane == 0 && rank > 0 && DET_DIAG != 1 && DET_DIAG != 2)
          while (load_acquire(counter) < rank) {
          }
        __syncwarp();
        fence::proxy_async_global();  // the acquire before this warp's bulk reductions
#endif
#if DQ_TILE
        (void)rows;
        // The whole buffer: its tile is its image. VARLEN: rows past the sequence's end (the next
        // sequence's, LSE +inf: P = dS = 0) add zeros to rows of this sequence's tile no one reads.
#if VARLEN
        const size_t tile = size_t(bh) * varlen_tiles_per_head(total_q, batch) + varlen_tile0(q_start, seq) + block_of(t);
#else
        const size_t tile = size_t(bh) * (seq_pad / BM) + block_of(t);
#endif
        if (lane == 0)
          bulk::reduce_add(dq_accum + tile * (kDQBuf / 4), reinterpret_cast<const float*>(smem + kOffDQ + u * kDQBuf),
                           kDQBuf);
#else
        for (int r = lane; r < rows; r += 32)
#if VARLEN
          bulk::reduce_add(dq_accum + accum_row(bh, m0 + r) * D,
#else
          bulk::reduce_add(dq_accum + (size_t(bh) * seq_q + m0 + r) * D,
#endif
                           reinterpret_cast<const float*>(smem + kOffDQ + u * kDQBuf + dq_row_offset(r)), D * 4);
#endif
        tma::commit_group();
        tma::wait_group_read<0>();
        __syncwarp();
        if (lane == 0) mbarrier::arrive(dq_empty + u);
#if DETERMINISTIC && DET_DIAG != 1
        if (DET_DIAG != 3) tma::wait_group<0>();  // the reductions are done in global memory
        fence::proxy_async_global();
        __syncwarp();
        if (lane == 0) add_release(counter);
#endif
      }
      tma::wait_group<0>();
    }
#endif
    return;
  }
  warp::setmaxnreg_inc<kConsumerRegs>();
  const int cw = wg - 1, wq = (threadIdx.x % 128) / 32;
  const int col = 2 * (lane % 4);          // this thread's columns: col, col + 1 of each 8
  const int krow = 16 * wq + lane / 4;     // this thread's keys (of the warpgroup's 64): krow, krow + 8
  const int key_lo = key0 + 64 * cw;       // the warpgroup's first key
  float dk_acc[D / 2], dv_acc[D / 2];
  int t0 = 0;  // the steps of the CTA's items before this one (the dQ buffers' phases)
  const uint64_t desc_k = wgmma::desc_k_major<kSpanKV>(smem + cw * 64 * kSpanKV);
  const uint64_t desc_v = wgmma::desc_k_major<kSpanKV>(smem + kOffV + cw * 64 * kSpanKV);
  // dQ's B: K's box cw (this warpgroup's D / 2 columns), MN-major, all BN keys.
  // (BM 128: both boxes, all D columns.)
  const uint64_t desc_kt = wgmma::desc_mn_major<kSpanKV>(smem + (BM == 128 ? 0 : cw * kKVBox), kKVBox);
  struct Cursor {
    uint32_t stage = 0, phase = 0;
    TMAFLOW_DEVICE void advance() {
      if (++stage == STAGES) stage = 0, phase ^= 1u;
    }
  };
  float s[BM / 2], dp[BM / 2], dq[kDQCols / 2];
  uint32_t pa[BM / 16][4], dsa[BM / 16][4];
  // S^T = K Q^T and dP^T = V dO^T of stage c, each its own group (S is needed first).
  auto issue_s_dp = [&](Cursor c) {
    const uint8_t* sQ = smem + kOffQ + c.stage * kQBytes;
    const uint8_t* sdO = smem + kOffDO + c.stage * kQBytes;
    mbarrier::wait(full + c.stage, c.phase);
    wgmma::fence_operands(s);
    wgmma::fence_operands(dp);
    wgmma::fence();
    constexpr int kStepsKV = kSpanKV / 32, kStepsQ = 4;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {  // k-steps of 16 head-dim columns
      const uint64_t a = desc_k + ((ks / kStepsKV) * kKVBox >> 4) + 2 * (ks % kStepsKV);
      const uint64_t bq = wgmma::desc_k_major<128>(sQ + (ks / kStepsQ) * kQBox) + 2 * (ks % kStepsQ);
      TF_MMA<0>(s, a, bq, ks > 0);
    }
    wgmma::commit_group();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const uint64_t a = desc_v + ((ks / kStepsKV) * kKVBox >> 4) + 2 * (ks % kStepsKV);
      const uint64_t bo = wgmma::desc_k_major<128>(sdO + (ks / kStepsQ) * kQBox) + 2 * (ks % kStepsQ);
      TF_MMA<0>(dp, a, bo, ks > 0);
    }
    wgmma::commit_group();
  };
  // Element x of s / dp: key krow + 8 ((x >> 1) & 1), query m0 + 8 (x / 4) + col + (x & 1).
  auto probabilities = [&](Cursor c, int m0) {  // s becomes P^T
    wgmma::fence_operands(s);
    const float* sLse = sRow + 2 * BM * c.stage;
    bool need_mask = key_lo + 64 > seq_kv;
#if CAUSAL
    need_mask = need_mask || key_lo + 63 > m0;
#endif
#pragma unroll
    for (int x = 0; x < BM / 2; x += 2) {
      const float2 l = *reinterpret_cast<const float2*>(sLse + 8 * (x / 4) + col);
      s[x] = math::exp2_approx(fmaf(s[x], scale_log2, -l.x));
      s[x + 1] = math::exp2_approx(fmaf(s[x + 1], scale_log2, -l.y));
    }
    if (need_mask) {
#pragma unroll
      for (int x = 0; x < BM / 2; ++x) {
        const int key = key_lo + krow + 8 * ((x >> 1) & 1), query = m0 + 8 * (x / 4) + col + (x & 1);
        bool masked = key >= seq_kv;
#if CAUSAL
        masked = masked || key > query;
#endif
        if (masked) s[x] = 0.f;
      }
    }
  };
  auto score_grads = [&](Cursor c) {  // dp becomes dS^T = P^T (dP^T - Delta)
    wgmma::fence_operands(dp);
    const float* sDelta = sRow + 2 * BM * c.stage + BM;
#pragma unroll
    for (int x = 0; x < BM / 2; x += 2) {
      const float2 dl = *reinterpret_cast<const float2*>(sDelta + 8 * (x / 4) + col);
      dp[x] = s[x] * (dp[x] - dl.x);
      dp[x + 1] = s[x + 1] * (dp[x + 1] - dl.y);
    }
  };
  // dS^T into buffer `buf`: boxes of 64 queries, key rows of 128 B, 128B-swizzled (16-byte
  // chunk c of row r at c ^ (r % 8)), this warpgroup's 64 keys from row 64 cw; then P^T and dS^T as
  // 16-bit A fragments (queries 16 kk .. 16 kk + 15 are k-step kk).
  auto stage_ds = [&](uint32_t buf) {
    uint8_t* sdS = smem + kOffDS + buf * kDSBytes;
#pragma unroll
    for (int x = 0; x < BM / 2; x += 2) {
      const int r = 64 * cw + krow + 8 * ((x >> 1) & 1), c = (8 * (x / 4)) % 64 + col, box = x / 32;
      *reinterpret_cast<uint32_t*>(sdS + box * kDSBox + r * 128 + (((c / 8) ^ (r % 8)) * 16) + (c % 8) * 2) =
          pack2(dp[x], dp[x + 1]);
    }
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        if (!DV_FIRST) pa[kk][r] = pack2(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
        dsa[kk][r] = pack2(dp[8 * kk + 2 * r], dp[8 * kk + 2 * r + 1]);
      }
  };
  auto pack_p = [&] {  // DV_FIRST: P^T as 16-bit A fragments, before dS^T
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) pa[kk][r] = pack2(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
  };
  // dV += P^T dO, dK += dS^T Q: B is dO / Q N-major (head dim contiguous), a k-step of 16 query
  // rows is 16 x 128 B into the boxes.
  auto mma_dv = [&](Cursor c) {
    const uint64_t bo = wgmma::desc_mn_major<128>(smem + kOffDO + c.stage * kQBytes, kQBox);
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) TF_MMA_RS<1>(dv_acc, pa[kk], bo + kk * (16 * 128 >> 4), 1);
  };
  auto mma_dk = [&](Cursor c) {
    const uint64_t bq = wgmma::desc_mn_major<128>(smem + kOffQ + c.stage * kQBytes, kQBox);
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) TF_MMA_RS<1>(dk_acc, dsa[kk], bq + kk * (16 * 128 >> 4), 1);
  };
  auto issue_dkv = [&](Cursor c) {
    wgmma::fence_operands(dv_acc);
    wgmma::fence_operands(dk_acc);
    wgmma::fence();
    mma_dv(c);
    mma_dk(c);
    wgmma::commit_group();
  };
  // dQ (this warpgroup's rows and columns) = dS K once both warpgroups' dS^T are in: A = dS^T
  // rows (MN-major, k-steps of 16 keys = 16 x 128 B; BM 128: box cw), B = K (MN-major).
  auto issue_dq = [&](uint32_t buf) {
    fence::proxy_async_shared_cta();
    named_barrier::sync(1, 256);
    const uint64_t a = wgmma::desc_mn_major<128>(smem + kOffDS + buf * kDSBytes + (BM == 128 ? cw * kDSBox : 0), kDSBox);
    wgmma::fence_operands(dq);
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks)
      TF_MMA_TN(dq, a + ks * (16 * 128 >> 4), desc_kt + ks * (16 * kSpanKV >> 4), ks > 0);
    wgmma::commit_group();
  };
#if DETERMINISTIC && WARP_CHAIN && !DQ_BULK
  // After chain_rank key blocks, whose warps each count one once theirs are in.
  auto chain_of = [&](int t) { return counter_at(head_of(t), block_of(t)); };
  auto chain_wait = [&](int t) {
    const uint32_t rank = chain_rank(block_of(t));
    if (lane == 0 && rank > 0)
      while (load_acquire(chain_of(t)) < kConsumerWarps * rank) {
      }
    __syncwarp();
  };
  auto chain_release = [&](int t) {  // the warp's adds of step t are ordered before lane 0's
    __syncwarp();
    if (lane == 0) add_release(chain_of(t));
  };
#else
  auto chain_wait = [](int) {};
  auto chain_release = [](int) {};
#endif
#if DQ_BULK
  auto add_dq = [&](int t) {  // step t's dQ (waited for) into shared memory, for the dQ warp
    wgmma::fence_operands(dq);
    const int u = (t0 + t) % kDQBufs;
    mbarrier::wait(dq_empty + u, (((t0 + t) / kDQBufs) & 1) ^ 1u);  // step t - kDQBufs's was read
    // dq element x: row kDQRow0 cw + krow + 8 ((x >> 1) & 1), column kDQCol0 cw + 8 (x / 4) + col.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint8_t* at = smem + kOffDQ + u * kDQBuf + dq_row_offset(kDQRow0 * cw + krow + 8 * h) + 4 * (kDQCol0 * cw + col);
#pragma unroll
      for (int n = 0; n < kDQCols / 8; ++n)
        *reinterpret_cast<float2*>(at + 32 * n) = make_float2(dq[4 * n + 2 * h], dq[4 * n + 2 * h + 1]);
    }
    fence::proxy_async_shared_cta();
    __syncwarp();
    if (lane == 0) mbarrier::arrive(dq_full + u);
  };
#else
  auto add_dq = [&](int t) {  // step t's dQ (waited for) into the accumulator
    wgmma::fence_operands(dq);
    const int bh = head_of(t), i = block_of(t), m0 = i * BM;
#if DETERMINISTIC && !WARP_CHAIN
    uint32_t* counter = counter_at(bh, i);
    if (threadIdx.x == 128)
      while (load_acquire(counter) != chain_rank(i)) {
      }
    named_barrier::sync(2, 256);
#endif
    // dq element x: query m0 + kDQRow0 cw + krow + 8 ((x >> 1) & 1), column kDQCol0 cw + 8 (x / 4) + col.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + kDQRow0 * cw + krow + 8 * h;
      if (row < seq_q) {
        float* at = dq_accum + accum_row(bh, row) * D + kDQCol0 * cw + col;
#pragma unroll
        for (int n = 0; n < kDQCols / 8; ++n) red::add_v2(at + 8 * n, dq[4 * n + 2 * h], dq[4 * n + 2 * h + 1]);
      }
    }
#if DETERMINISTIC && !WARP_CHAIN
    named_barrier::sync(2, 256);
    if (threadIdx.x == 128) add_release(counter);
#endif
  };
#endif
  auto release = [&](Cursor c) {  // Q, dO, LSE and Delta of stage c are read
    if (lane == 0) mbarrier::arrive(empty + c.stage);
  };
  Cursor cur;
  for (int item = 0; take_item(item); ++item, t0 += steps) {
#pragma unroll
    for (int x = 0; x < D / 2; ++x) dk_acc[x] = 0.f, dv_acc[x] = 0.f;
    mbarrier::wait(kv_bar, item & 1);
#if OVERLAP
    // Step t - 1's dQ is issued after step t's S and dP (the tensor cores run them in order), so
    // step t's softmax runs while dQ_(t-1) is on the tensor cores.
    for (int t = 0; t < steps; ++t) {
      issue_s_dp(cur);
      issue_dq((t - 1) & 1);  // at t = 0 a dQ of no step (never added): every step is the same
      if (t > 1) chain_release(t - 2);
      wgmma::wait_group<1>();
      probabilities(cur, block_of(t) * BM);
      score_grads(cur);
      if (t > 0) chain_wait(t - 1);
      wgmma::wait_group<0>();
      if (t > 0) add_dq(t - 1);
      stage_ds(t & 1);
      issue_dkv(cur);
      wgmma::wait_group<0>();
      wgmma::fence_operands(dv_acc);
      wgmma::fence_operands(dk_acc);
      release(cur);
      cur.advance();
    }
    if (steps > 0) {
      issue_dq((steps - 1) & 1);
      if (steps > 1) chain_release(steps - 2);
      chain_wait(steps - 1);
      wgmma::wait_group<0>();
      add_dq(steps - 1);
      chain_release(steps - 1);
    }
#elif DQ_EARLY
    // dV, then dQ, then dK; dQ's stores or adds run while dK is on the tensor cores. DV_FIRST
    // issues dV before dP is waited for, so dS^T's arithmetic runs beside it.
    for (int t = 0; t < steps; ++t) {
      issue_s_dp(cur);
      if (t > 0) chain_release(t - 1);
      wgmma::wait_group<1>();
      probabilities(cur, block_of(t) * BM);
#if DV_FIRST
      pack_p();
      wgmma::fence_operands(dv_acc);
      wgmma::fence();
      mma_dv(cur);
      wgmma::commit_group();
      wgmma::wait_group<1>();  // dP (dV runs on)
      score_grads(cur);
      stage_ds(t & 1);
#else
      wgmma::wait_group<0>();
      score_grads(cur);
      stage_ds(t & 1);
      wgmma::fence_operands(dv_acc);
      wgmma::fence();
      mma_dv(cur);
      wgmma::commit_group();
#endif
      issue_dq(t & 1);
      wgmma::fence_operands(dk_acc);
      wgmma::fence();
      mma_dk(cur);
      wgmma::commit_group();
      chain_wait(t);
      wgmma::wait_group<1>();  // dV and dQ
      wgmma::fence_operands(dv_acc);
      add_dq(t);
      wgmma::wait_group<0>();  // dK: the stage is read
      wgmma::fence_operands(dk_acc);
      release(cur);
      cur.advance();
    }
    if (steps > 0) chain_release(steps - 1);
#else
    for (int t = 0; t < steps; ++t) {
      issue_s_dp(cur);
      if (t > 0) chain_release(t - 1);
      wgmma::wait_group<1>();
      probabilities(cur, block_of(t) * BM);
      wgmma::wait_group<0>();
      score_grads(cur);
      stage_ds(t & 1);
      issue_dkv(cur);
      issue_dq(t & 1);
      chain_wait(t);
      wgmma::wait_group<0>();
      wgmma::fence_operands(dv_acc);
      wgmma::fence_operands(dk_acc);
      release(cur);
      add_dq(t);
      cur.advance();
    }
    if (steps > 0) chain_release(steps - 1);
#endif
    wgmma::fence_operands(dv_acc);
    wgmma::fence_operands(dk_acc);
#if TF_PERSIST
    if (lane == 0) mbarrier::arrive(kv_empty);  // every wgmma of the item is done: K and V are read
#endif
    // dK (scaled: S = scale Q K^T) and dV rows of the warpgroup's keys.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = key_lo + krow + 8 * h;
      if (key >= seq_kv) continue;
#if VARLEN
      const size_t at = (size_t(k_start + key) * heads_kv + kvh) * D + col;
#else
      const size_t at = (size_t(b * heads_kv + kvh) * seq_kv + key) * D + col;
#endif
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        *reinterpret_cast<uint32_t*>(dk + at + 8 * n) =
            pack2(dk_acc[4 * n + 2 * h] * scale, dk_acc[4 * n + 2 * h + 1] * scale);
        *reinterpret_cast<uint32_t*>(dv + at + 8 * n) = pack2(dv_acc[4 * n + 2 * h], dv_acc[4 * n + 2 * h + 1]);
      }
    }
  }
}

#if !VARLEN
// DQ_TILE: dQ = scale x the accumulator's tiles (`tiles` = batch x heads x seq_pad / BM), in
// the output dtype (batch x heads x seq, D); a thread 4 columns of a row, a warp's reads whole
// 16-byte pieces of one or two rows; rows past seq (a last partial block's) are dropped.
extern "C" __global__ void __launch_bounds__(256)
attention_bwd_sm90_dq_tile(const float* dq_accum, elem_t* dq, int tiles, int seq, int seq_pad, float scale) {
  constexpr int kVec = D / 4;  // float4s a row
  const size_t total = size_t(tiles) * BM * kVec;
  for (size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x; e < total; e += size_t(gridDim.x) * blockDim.x) {
    const size_t tile = e / (BM * kVec);
    const int r = int(e / kVec % BM), c = int(e % kVec);
    const int bh = int(tile / (seq_pad / BM)), m = int(tile % (seq_pad / BM)) * BM + r;
    if (m >= seq) continue;
    const uint8_t* at = reinterpret_cast<const uint8_t*>(dq_accum) + tile * kDQBuf + dq_row_offset(r) + 16 * c;
    const float4 a = *reinterpret_cast<const float4*>(at);
    *reinterpret_cast<uint2*>(dq + (size_t(bh) * seq + m) * D + 4 * c) =
        make_uint2(pack2(a.x * scale, a.y * scale), pack2(a.z * scale, a.w * scale));
  }
}
#endif
