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
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <tmaflow.cuh>
using namespace tmaflow;

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef CAUSAL
#define CAUSAL 0
#endif
#ifndef FP16
#define FP16 0  // 1: fp16 inputs and gradients instead of bf16
#endif
#ifndef DETERMINISTIC
#define DETERMINISTIC 0
#endif
constexpr int D = HEAD_DIM;
constexpr int BM = 64, BN = 64, kWarps = 4, kThreads = 32 * kWarps;
constexpr int DS = D <= 128 ? D : 128;          // head-dim columns of dQ, dK, dV a CTA owns
constexpr int kRow = D + 8;                     // padded Q, K, V, dO rows (elements): ldmatrix's
constexpr int kRowS = BM + 8;                   // 8 rows fall in 8 different bank groups
static_assert(D % 16 == 0 && D >= 16 && D <= 256, "HEAD_DIM is a multiple of 16 from 16 to 256");

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

// A chain counter read with acquire semantics at GPU scope (the partial sums it counts are seen).
// ptx: ld.acquire.gpu.global.u32
TMAFLOW_DEVICE uint32_t load_acquire(const uint32_t* at) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(at) : "memory");
  return v;
}

// The counter moved on after a release fence: the CTA's sums (ordered before by bar.sync) first.
// ptx: fence.acq_rel.gpu + red.relaxed.gpu.global.add.u32
TMAFLOW_DEVICE void add_release(uint32_t* at) {
  asm volatile("fence.acq_rel.gpu;\n\tred.relaxed.gpu.global.add.u32 [%0], 1;" :: "l"(at) : "memory");
}

extern "C" __global__ void __launch_bounds__(256)
attention_bwd_prep(const elem_t* out, const elem_t* dout, float* delta, float* dq_accum,
                   uint32_t* chain, int rows, int chain_count) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * 8 + threadIdx.x / 32;  // a warp a query row
  const int tid = blockIdx.x * blockDim.x + threadIdx.x;
  if (DETERMINISTIC && tid < chain_count) chain[tid] = 0;
  if (row >= rows) return;
  const uint32_t* o = reinterpret_cast<const uint32_t*>(out + size_t(row) * D);
  const uint32_t* g = reinterpret_cast<const uint32_t*>(dout + size_t(row) * D);
  float sum = 0.f;
  for (int c = lane; c < D / 2; c += 32) {
    const float2 a = to_float2(o[c]), b = to_float2(g[c]);
    sum = fmaf(a.x, b.x, fmaf(a.y, b.y, sum));
  }
  for (int c = lane; c < D; c += 32) dq_accum[size_t(row) * D + c] = 0.f;
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

// `rows` rows of D elements from `src` into padded shared rows, rows past `valid` zero.
TMAFLOW_DEVICE void load_rows(elem_t* dst, const elem_t* src, int rows, int valid) {
  constexpr int kChunks = D / 8;  // 16-byte pieces a row
  for (int c = threadIdx.x; c < rows * kChunks; c += kThreads) {
    const int r = c / kChunks, piece = c % kChunks;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (r < valid) x = *reinterpret_cast<const uint4*>(src + size_t(r) * D + 8 * piece);
    *reinterpret_cast<uint4*>(dst + r * kRow + 8 * piece) = x;
  }
}

// acc (16 x BM, the warp's 16 rows of `a_tile` against BM rows of `b_tile`) = A B^T over the
// whole head dim: S^T = K Q^T, dP^T = V dO^T. Both tiles are row-major with padded rows.
TMAFLOW_DEVICE void rows_times_rows(float (&acc)[BM / 8][4], const elem_t* a_tile, const elem_t* b_tile) {
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
#pragma unroll
  for (int n = 0; n < BM / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;
#pragma unroll
  for (int kd = 0; kd < D / 16; ++kd) {
    uint32_t a[4];  // matrices: rows 0-7 / 8-15 by columns 0-7 / 8-15
    warp::ldmatrix_x4(a, a_tile + (16 * w + lane % 8 + 8 * ((lane / 8) % 2)) * kRow + 16 * kd + 8 * (lane / 16));
#pragma unroll
    for (int np = 0; np < BM / 16; ++np) {
      uint32_t b[4];  // B^T rows (n) 0-7 by k 0-7, 8-15; n 8-15 by k 0-7, 8-15
      warp::ldmatrix_x4(b, b_tile + (16 * np + lane % 8 + 8 * (lane / 16)) * kRow + 16 * kd + 8 * ((lane / 8) % 2));
      mma_step(acc[2 * np], a, b[0], b[1]);
      mma_step(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// acc (16 x DS) += A B, A the warp's 16 x BM fragment in registers (an fp32 accumulator, as
// 16-bit A fragments: dV += P^T dO, dK += dS^T Q), B the columns d0 .. d0 + DS - 1 of BM
// row-major rows (k x n storage: transposed ldmatrix). Column pairs past D are skipped.
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
      warp::ldmatrix_x4_trans(b, b_tile + (16 * kk + lane % 8 + 8 * ((lane / 8) % 2)) * kRow + d0 + 16 * np + 8 * (lane / 16));
      mma_step(acc[2 * np], a, b[0], b[1]);
      mma_step(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

extern "C" __global__ void __launch_bounds__(kThreads)
attention_bwd(const elem_t* q, const elem_t* k, const elem_t* v, const elem_t* dout, const float* lse,
              const float* delta, float* dq_accum, uint32_t* chain, elem_t* dk, elem_t* dv, int seq_q,
              int seq_kv, int heads, int group, float scale, float scale_log2) {
  extern __shared__ __align__(128) uint8_t smem[];
  elem_t* sK = reinterpret_cast<elem_t*>(smem);
  elem_t* sV = sK + BN * kRow;
  elem_t* sQ = sV + BN * kRow;
  elem_t* sdO = sQ + BM * kRow;
  elem_t* sdS = sdO + BM * kRow;  // dS^T: BN keys by BM queries
  float* sLse = reinterpret_cast<float*>(sdS + BN * kRowS);  // log2 domain; +inf past seq_q
  float* sDelta = sLse + BM;
  constexpr int kSlices = (D + DS - 1) / DS;
  const int j = blockIdx.x, kvh = blockIdx.y / kSlices, slice = blockIdx.y % kSlices, b = blockIdx.z;
  const int d0 = slice * DS, heads_kv = heads / group, q_blocks = (seq_q + BM - 1) / BM;
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int key0 = j * BN, keys = min(BN, seq_kv - key0);
  const size_t kv_base = (size_t(b) * heads_kv + kvh) * seq_kv + key0;
  load_rows(sK, k + kv_base * D, BN, keys);
  load_rows(sV, v + kv_base * D, BN, keys);
  float dk_acc[DS / 8][4] = {}, dv_acc[DS / 8][4] = {};
  const int i_first = CAUSAL ? key0 / BM : 0;  // the first query block with a row >= key0
  for (int g = 0; g < group; ++g) {
    const int bh = b * heads + kvh * group + g;
    for (int i = i_first; i < q_blocks; ++i) {
      const int m0 = i * BM, rows = min(BM, seq_q - m0);
      const size_t q_base = size_t(bh) * seq_q + m0;
      __syncthreads();  // the previous block's tiles are read
      load_rows(sQ, q + q_base * D, BM, rows);
      load_rows(sdO, dout + q_base * D, BM, rows);
      if (threadIdx.x < BM) {
        const bool in = int(threadIdx.x) < rows;
        sLse[threadIdx.x] = in ? lse[q_base + threadIdx.x] * 1.44269504089f : __int_as_float(0x7f800000);
        sDelta[threadIdx.x] = in ? delta[q_base + threadIdx.x] : 0.f;
      }
      __syncthreads();
      float s[BM / 8][4], dp[BM / 8][4];
      rows_times_rows(s, sK, sQ);
      rows_times_rows(dp, sV, sdO);
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
      regs_times_rows(dv_acc, s, sdO, d0);
      regs_times_rows(dk_acc, dp, sQ, d0);
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
          if (d0 + 16 * np >= D) break;
          uint32_t bk[4];
          warp::ldmatrix_x4_trans(bk, sK + (16 * kk + lane % 8 + 8 * ((lane / 8) % 2)) * kRow + d0 + 16 * np + 8 * (lane / 16));
          mma_step(dq[2 * np], a, bk[0], bk[1]);
          mma_step(dq[2 * np + 1], a, bk[2], bk[3]);
        }
      }
#if DETERMINISTIC
      // Key block j adds its part of this query block after blocks 0 .. j - 1 (exactly those
      // add before it, causal or not); they started earlier (blocks are scheduled in index order).
      uint32_t* counter = chain + (size_t(bh) * q_blocks + i) * kSlices + slice;
      if (threadIdx.x == 0)
        while (load_acquire(counter) != uint32_t(j)) {
        }
      __syncthreads();
#endif
#pragma unroll
      for (int n = 0; n < DS / 8; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = 16 * w + lane / 4 + 8 * h, c = d0 + 8 * n + 2 * (lane % 4);
          if (row >= rows || c >= D) continue;
          float* at = dq_accum + (q_base + row) * D + c;
#if DETERMINISTIC
          const float2 old = __ldcg(reinterpret_cast<const float2*>(at));
          __stcg(reinterpret_cast<float2*>(at), make_float2(old.x + dq[n][2 * h], old.y + dq[n][2 * h + 1]));
#else
          atomicAdd(at, dq[n][2 * h]);
          atomicAdd(at + 1, dq[n][2 * h + 1]);
#endif
        }
#if DETERMINISTIC
      __syncthreads();
      if (threadIdx.x == 0) add_release(counter);
#endif
    }
  }
  // dK (scaled: S = scale Q K^T) and dV rows of the block's keys, this slice's columns.
#pragma unroll
  for (int n = 0; n < DS / 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = 16 * w + lane / 4 + 8 * h, c = d0 + 8 * n + 2 * (lane % 4);
      if (key >= keys || c >= D) continue;
      const size_t at = (kv_base + key) * D + c;
      *reinterpret_cast<uint32_t*>(dk + at) = pack2(dk_acc[n][2 * h] * scale, dk_acc[n][2 * h + 1] * scale);
      *reinterpret_cast<uint32_t*>(dv + at) = pack2(dv_acc[n][2 * h], dv_acc[n][2 * h + 1]);
    }
}
