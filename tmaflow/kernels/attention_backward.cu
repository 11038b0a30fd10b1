// Attention backward (FlashAttention-2's algorithm): dQ, dK and dV of O = softmax(scale Q K^T) V
// from Q, K, V, O, dO and the forward's log-sum-exp, bf16 (FP16: fp16) in and out, fp32 sums.
//
// attention_bwd_prep: Delta = rowsum(dO * O) per query row; zeroes the fp32 dQ accumulator and
//   (DETERMINISTIC) the chain counters.
// attention_bwd: a CTA is one (block of BN keys, kv head and slice of DS head-dim columns,
//   batch). Its K and V rows stay in shared memory; it loops over the query heads of its kv head
//   (grouped-query attention: their dK and dV sum) and over blocks of BM query rows: per block it
//   recomputes S^T = K Q^T and P^T = exp(scale S^T - LSE), then dV += P^T dO, dP^T = V dO^T,
//   dS^T = P^T (dP^T - Delta), dK += dS^T Q, and dQ += dS K into the fp32 accumulator (atomics;
//   DETERMINISTIC: in key-block order, each CTA waiting on a counter per query block).
//   Warp w owns keys 16 w .. 16 w + 15 of the block for S, dP, dV and dK (mma.sync m16n8k16,
//   the key block as the A operand), and query rows 16 w .. 16 w + 15 for dQ (dS goes through
//   shared memory). Head dims over 128 take two or more slices: each CTA recomputes S and dP
//   over the whole head dim and keeps dV, dK and dQ columns of its slice only.
// attention_bwd_dq: dQ = scale x the accumulator, in the output dtype.
//   CAUSAL: key j is seen by query i when j <= i (top-left aligned, as the forward and torch's
//   is_causal); key blocks skip the query blocks that see none of their keys.
//   HEAD_DIM (Q, K, dQ, dK) and HEAD_DIM_V (V, O, dO, dV) are multiples of 16 up to 256; a
//   slice owns columns d0 .. d0 + DS - 1 of every gradient that has them (S and dP always span
//   the whole head dims).
//   VARLEN: packed sequences (attention_varlen's layout): q (tokens, heads, HEAD_DIM), k and v
//   (tokens, kv heads, ...), lse (heads, tokens), sequence b's tokens cu_q[b] .. cu_q[b+1]
//   (cu_k for keys), read on the device. Key blocks are numbered over the sequences (a CTA
//   each, found by a walk over cu_k, 32 sequences a step); the grid is sized for any lengths,
//   CTAs past the last block leave. Key rows outside every sequence get zero dK and dV (prep).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <tmaflow.cuh>
using namespace tmaflow;

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
#define FP16 0  // 1: fp16 inputs and gradients instead of bf16
#endif
#ifndef DETERMINISTIC
#define DETERMINISTIC 0
#endif
constexpr int DQK = HEAD_DIM, DV = HEAD_DIM_V, DMAX = DQK > DV ? DQK : DV;
constexpr int BM = 64, BN = 64, kWarps = 4, kThreads = 32 * kWarps;
// Head-dim columns of dQ, dK, dV a CTA owns: the fewest slices of at most 128, as even as
// multiples of 16 allow (192: two of 96, so the dK and dV sums stay in registers).
constexpr int kSlices = (DMAX + 127) / 128, DS = ((DMAX + kSlices - 1) / kSlices + 15) / 16 * 16;
constexpr int kRowQK = DQK + 8, kRowV = DV + 8; // padded Q, K / V, dO rows (elements): ldmatrix's
constexpr int kRowS = BM + 8;                   // 8 rows fall in 8 different bank groups
static_assert(DQK % 16 == 0 && DQK >= 16 && DQK <= 256 && DV % 16 == 0 && DV >= 16 && DV <= 256,
              "HEAD_DIM and HEAD_DIM_V are multiples of 16 from 16 to 256");

#if FP16
using elem_t = __half;
TMAFLOW_DEVICE uint32_t pack2(float lo, float hi) { return wgmma::f16x2(lo, hi); }
TMAFLOW_DEVICE void mma_step(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { warp::mma_16816_f16(d, a, b0, b1); }
TMAFLOW_DEVICE float2 to_float2(uint32_t x) { return __half22float2(*reinterpret_cast<__half2*>(&x)); }
#else
using elem_t = __nv_bfloat16;
TMAFLOW_DEVICE uint32_t pack2(float lo, float hi) { return wgmma::bf16x2(lo, hi); }
TMAFLOW_DEVICE void mma_step(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { warp::mma_16816(d, a, b0, b1); }
TMAFLOW_DEVICE float2 to_float2(uint32_t x) { return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&x)); }
#endif

using chain::add_release;
using chain::clamp_to;
using chain::load_acquire;

extern "C" __global__ void __launch_bounds__(256)
attention_bwd_prep(const elem_t* out, const elem_t* dout, float* delta, float* dq_accum,
                   uint32_t* chain, int rows, int chain_count
#if VARLEN
                   , elem_t* dk, elem_t* dv, const int* cu_k, int batch, int total_k, int heads_kv
#endif
                   ) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * 8 + threadIdx.x / 32;  // a warp a query row
  const int tid = blockIdx.x * blockDim.x + threadIdx.x;
  if (DETERMINISTIC && tid < chain_count) chain[tid] = 0;
#if VARLEN
  {  // key rows before cu_k[0] and from cu_k[batch] on: no CTA of the main kernel writes them
    const int lo = clamp_to(__ldg(cu_k), 0, total_k), hi = clamp_to(__ldg(cu_k + batch), lo, total_k);
    const size_t before = size_t(lo) * heads_kv, inside = size_t(hi - lo) * heads_kv;
    const size_t outside = size_t(total_k) * heads_kv - inside;
    for (size_t i = row; i < outside; i += size_t(gridDim.x) * 8) {
      const size_t r = i < before ? i : i + inside;
      for (int c = lane; c < DQK / 2; c += 32) reinterpret_cast<uint32_t*>(dk + r * DQK)[c] = 0;
      for (int c = lane; c < DV / 2; c += 32) reinterpret_cast<uint32_t*>(dv + r * DV)[c] = 0;
    }
  }
#endif
  if (row >= rows) return;
  const uint32_t* o = reinterpret_cast<const uint32_t*>(out + size_t(row) * DV);
  const uint32_t* g = reinterpret_cast<const uint32_t*>(dout + size_t(row) * DV);
  float sum = 0.f;
  for (int c = lane; c < DV / 2; c += 32) {
    const float2 a = to_float2(o[c]), b = to_float2(g[c]);
    sum = fmaf(a.x, b.x, fmaf(a.y, b.y, sum));
  }
  for (int c = lane; c < DQK; c += 32) dq_accum[size_t(row) * DQK + c] = 0.f;
#pragma unroll
  for (int step = 16; step > 0; step /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, step);
  if (lane == 0) delta[row] = sum;
}

extern "C" __global__ void __launch_bounds__(256)
attention_bwd_dq(const float* dq_accum, elem_t* dq, size_t pairs, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < pairs; i += size_t(gridDim.x) * blockDim.x) {
    const float2 a = reinterpret_cast<const float2*>(dq_accum)[i];
    reinterpret_cast<uint32_t*>(dq)[i] = pack2(a.x * scale, a.y * scale);
  }
}

// `rows` rows of D elements, `step` elements apart from `src`, into padded shared rows, rows
// past `valid` zero.
template <int D>
TMAFLOW_DEVICE void load_rows(elem_t* dst, const elem_t* src, size_t step, int rows, int valid) {
  constexpr int kChunks = D / 8;  // 16-byte pieces a row
  for (int c = threadIdx.x; c < rows * kChunks; c += kThreads) {
    const int r = c / kChunks, piece = c % kChunks;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (r < valid) x = *reinterpret_cast<const uint4*>(src + r * step + 8 * piece);
    *reinterpret_cast<uint4*>(dst + r * (D + 8) + 8 * piece) = x;
  }
}

// acc (16 x BM, the warp's 16 rows of `a_tile` against BM rows of `b_tile`) = A B^T over the
// whole head dim D: S^T = K Q^T, dP^T = V dO^T. Both tiles are row-major, rows of D + 8.
template <int D>
TMAFLOW_DEVICE void rows_times_rows(float (&acc)[BM / 8][4], const elem_t* a_tile, const elem_t* b_tile) {
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
#pragma unroll
  for (int n = 0; n < BM / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;
#pragma unroll
  for (int kd = 0; kd < D / 16; ++kd) {
    uint32_t a[4];  // matrices: rows 0-7 / 8-15 by columns 0-7 / 8-15
    warp::ldmatrix_x4(a, a_tile + (16 * w + lane % 8 + 8 * ((lane / 8) % 2)) * (D + 8) + 16 * kd + 8 * (lane / 16));
#pragma unroll
    for (int np = 0; np < BM / 16; ++np) {
      uint32_t b[4];  // B^T rows (n) 0-7 by k 0-7, 8-15; n 8-15 by k 0-7, 8-15
      warp::ldmatrix_x4(b, b_tile + (16 * np + lane % 8 + 8 * (lane / 16)) * (D + 8) + 16 * kd + 8 * ((lane / 8) % 2));
      mma_step(acc[2 * np], a, b[0], b[1]);
      mma_step(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// acc (16 x DS) += A B, A the warp's 16 x BM fragment in registers (an fp32 accumulator, as
// 16-bit A fragments: dV += P^T dO, dK += dS^T Q), B the columns d0 .. d0 + DS - 1 of BM
// row-major rows of D + 8 (k x n storage: transposed ldmatrix). Columns past D are skipped.
template <int D>
TMAFLOW_DEVICE void regs_times_rows(float (&acc)[DS / 8][4], const float (&x)[BM / 8][4], const elem_t* b_tile, int d0) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < BM / 16; ++kk) {
    const uint32_t a[4] = {pack2(x[2 * kk][0], x[2 * kk][1]), pack2(x[2 * kk][2], x[2 * kk][3]),
                           pack2(x[2 * kk + 1][0], x[2 * kk + 1][1]), pack2(x[2 * kk + 1][2], x[2 * kk + 1][3])};
#pragma unroll
    for (int np = 0; np < DS / 16; ++np) {
      if (d0 + 16 * np >= D) break;
      uint32_t b[4];  // k 0-7 / 8-15 by n 0-7; k 0-7 / 8-15 by n 8-15
      warp::ldmatrix_x4_trans(b, b_tile + (16 * kk + lane % 8 + 8 * ((lane / 8) % 2)) * (D + 8) + d0 + 16 * np + 8 * (lane / 16));
      mma_step(acc[2 * np], a, b[0], b[1]);
      mma_step(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

extern "C" __global__ void __launch_bounds__(kThreads)
attention_bwd(const elem_t* q, const elem_t* k, const elem_t* v, const elem_t* dout, const float* lse,
              const float* delta, float* dq_accum, uint32_t* chain, elem_t* dk, elem_t* dv,
#if VARLEN
              const int* cu_q, const int* cu_k, int total_q, int total_k, int batch,
#else
              int seq_q, int seq_kv,
#endif
              int heads, int group, float scale, float scale_log2) {
  extern __shared__ __align__(128) uint8_t smem[];
  elem_t* sK = reinterpret_cast<elem_t*>(smem);
  elem_t* sV = sK + BN * kRowQK;
  elem_t* sQ = sV + BN * kRowV;
  elem_t* sdO = sQ + BM * kRowQK;
  elem_t* sdS = sdO + BM * kRowV;  // dS^T: BN keys by BM queries
  float* sLse = reinterpret_cast<float*>(sdS + BN * kRowS);  // log2 domain; +inf past the rows
  float* sDelta = sLse + BM;
  const int kvh = blockIdx.y / kSlices, slice = blockIdx.y % kSlices;
  const int d0 = slice * DS, heads_kv = heads / group;
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  // Row r of a query block is row first + r * q_step of q, dout, Delta and the accumulator (the
  // log-sum-exp's: lse_first + r); key r of the block is row kv_first + r * kv_step of k, v, dk, dv.
#if VARLEN
  __shared__ int sBlock[2];
  if (threadIdx.x < 32) {
    int seq = -1, block = 0;
    if (!chain::find_block<BN>(cu_k, total_k, batch, blockIdx.x, seq, block)) seq = -1;
    if (lane == 0) sBlock[0] = seq, sBlock[1] = block;
  }
  __syncthreads();
  if (sBlock[0] < 0) return;  // past the last key block (the grid is sized for any lengths)
  const int b = sBlock[0], j = sBlock[1];
  const int q_start = clamp_to(__ldg(cu_q + b), 0, total_q);
  const int seq_q = clamp_to(__ldg(cu_q + b + 1), q_start, total_q) - q_start;
  const int k_start = clamp_to(__ldg(cu_k + b), 0, total_k);
  const int seq_kv = clamp_to(__ldg(cu_k + b + 1), k_start, total_k) - k_start;
  const size_t q_step = heads, kv_step = heads_kv;
#else
  const int b = blockIdx.z, j = blockIdx.x;
  constexpr size_t q_step = 1, kv_step = 1;
#endif
  const int q_blocks = (seq_q + BM - 1) / BM;
  const int key0 = j * BN, keys = min(BN, seq_kv - key0);
#if VARLEN
  const size_t kv_first = size_t(k_start + key0) * heads_kv + kvh;
#else
  const size_t kv_first = (size_t(b) * heads_kv + kvh) * seq_kv + key0;
#endif
  // The epilogue's row base and key count, parked in shared memory over the loops (registers
  // there are all taken: ptxas would spill them to the stack).
  __shared__ size_t sKeyRows[2];
  if (threadIdx.x == 0) sKeyRows[0] = kv_first, sKeyRows[1] = keys;
  load_rows<DQK>(sK, k + kv_first * DQK, kv_step * DQK, BN, keys);
  load_rows<DV>(sV, v + kv_first * DV, kv_step * DV, BN, keys);
  float dk_acc[DS / 8][4] = {}, dv_acc[DS / 8][4] = {};
  const int i_first = CAUSAL ? key0 / BM : 0;  // the first query block with a row >= key0
  for (int g = 0; g < group; ++g) {
    const int h = kvh * group + g;
    for (int i = i_first; i < q_blocks; ++i) {
      const int m0 = i * BM, rows = min(BM, seq_q - m0);
#if VARLEN
      const size_t first = size_t(q_start + m0) * heads + h, lse_first = size_t(h) * total_q + q_start + m0;
#else
      const size_t first = (size_t(b) * heads + h) * seq_q + m0, lse_first = first;
#endif
      __syncthreads();  // the previous block's tiles are read
      load_rows<DQK>(sQ, q + first * DQK, q_step * DQK, BM, rows);
      load_rows<DV>(sdO, dout + first * DV, q_step * DV, BM, rows);
      if (threadIdx.x < BM) {
        const bool in = int(threadIdx.x) < rows;
        sLse[threadIdx.x] = in ? lse[lse_first + threadIdx.x] * 1.44269504089f : __int_as_float(0x7f800000);
        sDelta[threadIdx.x] = in ? delta[first + threadIdx.x * q_step] : 0.f;
      }
      __syncthreads();
      float s[BM / 8][4], dp[BM / 8][4];
      rows_times_rows<DQK>(s, sK, sQ);
      rows_times_rows<DV>(dp, sV, sdO);
      // Fragment element e of n-tile n: key 16 w + lane / 4 (+ 8 for e >= 2), query 8 n +
      // 2 (lane % 4) (+ 1 for odd e). s becomes P^T, dp becomes dS^T.
#pragma unroll
      for (int n = 0; n < BM / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + 16 * w + lane / 4 + 8 * (e >> 1), col = 8 * n + 2 * (lane % 4) + (e & 1);
          bool masked = key >= seq_kv;
#if CAUSAL
          masked = masked || key > m0 + col;
#endif
          const float p = masked ? 0.f : math::exp2_approx(fmaf(s[n][e], scale_log2, -sLse[col]));
          s[n][e] = p;
          dp[n][e] = p * (dp[n][e] - sDelta[col]);
        }
      regs_times_rows<DV>(dv_acc, s, sdO, d0);
      regs_times_rows<DQK>(dk_acc, dp, sQ, d0);
#pragma unroll
      for (int n = 0; n < BM / 8; ++n) {
        elem_t* at = sdS + (16 * w + lane / 4) * kRowS + 8 * n + 2 * (lane % 4);
        *reinterpret_cast<uint32_t*>(at) = pack2(dp[n][0], dp[n][1]);
        *reinterpret_cast<uint32_t*>(at + 8 * kRowS) = pack2(dp[n][2], dp[n][3]);
      }
      __syncthreads();
      // dQ rows 16 w .. 16 w + 15 of the block, columns d0 .. d0 + DS - 1: dS (A: rows are
      // dS^T's columns, a transposed ldmatrix) times K (k x n storage: transposed ldmatrix).
      float dq[DS / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t a[4];  // dS^T rows (keys) 0-7 / 8-15 by columns (queries) 0-7 / 8-15, transposed
        warp::ldmatrix_x4_trans(a, sdS + (16 * kk + lane % 8 + 8 * (lane / 16)) * kRowS + 16 * w + 8 * ((lane / 8) % 2));
#pragma unroll
        for (int np = 0; np < DS / 16; ++np) {
          if (d0 + 16 * np >= DQK) break;
          uint32_t bk[4];
          warp::ldmatrix_x4_trans(bk, sK + (16 * kk + lane % 8 + 8 * ((lane / 8) % 2)) * kRowQK + d0 + 16 * np + 8 * (lane / 16));
          mma_step(dq[2 * np], a, bk[0], bk[1]);
          mma_step(dq[2 * np + 1], a, bk[2], bk[3]);
        }
      }
#if DETERMINISTIC
      // Key block j adds its part of this query block after blocks 0 .. j - 1 (exactly those
      // add before it, causal or not); they started earlier (blocks are scheduled in index order;
      // varlen: a sequence's key blocks are consecutive CTAs). A counter a (query block, slice).
#if VARLEN
      uint32_t* counter = chain + first * kSlices + slice;
#else
      uint32_t* counter = chain + (size_t(b * heads + h) * q_blocks + i) * kSlices + slice;
#endif
      if (threadIdx.x == 0)
        while (load_acquire(counter) != uint32_t(j)) {
        }
      __syncthreads();
#endif
#pragma unroll
      for (int n = 0; n < DS / 8; ++n)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int row = 16 * w + lane / 4 + 8 * hh, c = d0 + 8 * n + 2 * (lane % 4);
          if (row >= rows || c >= DQK) continue;
          float* at = dq_accum + (first + row * q_step) * DQK + c;
#if DETERMINISTIC
          const float2 old = __ldcg(reinterpret_cast<const float2*>(at));
          __stcg(reinterpret_cast<float2*>(at), make_float2(old.x + dq[n][2 * hh], old.y + dq[n][2 * hh + 1]));
#else
          atomicAdd(at, dq[n][2 * hh]);
          atomicAdd(at + 1, dq[n][2 * hh + 1]);
#endif
        }
#if DETERMINISTIC
      __syncthreads();
      if (threadIdx.x == 0) add_release(counter);
#endif
    }
  }
  // dK (scaled: S = scale Q K^T) and dV rows of the block's keys, this slice's columns.
  __syncthreads();  // sKeyRows written (the loops may have run no block)
  const size_t rows_from = *static_cast<volatile size_t*>(sKeyRows);
  const int key_count = int(*static_cast<volatile size_t*>(sKeyRows + 1));
#pragma unroll
  for (int n = 0; n < DS / 8; ++n)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int key = 16 * w + lane / 4 + 8 * hh, c = d0 + 8 * n + 2 * (lane % 4);
      if (key >= key_count) continue;
      const size_t row = rows_from + key * kv_step;
      if (c < DQK)
        *reinterpret_cast<uint32_t*>(dk + row * DQK + c) = pack2(dk_acc[n][2 * hh] * scale, dk_acc[n][2 * hh + 1] * scale);
      if (c < DV) *reinterpret_cast<uint32_t*>(dv + row * DV + c) = pack2(dv_acc[n][2 * hh], dv_acc[n][2 * hh + 1]);
    }
}
