// Attention forward the pre-Hopper way, kept beside attention.cu for comparison: seed 002's
// flash-attention schedule (cp.async double buffering, mma.sync, everything synchronous to the
// warp). docs/attention.md says what attention.cu changes.
//
// A CTA of 4 warps owns 64 query rows of one (batch, head); each warp owns 16 and keeps its Q
// fragments in registers for the whole kernel. Key/value blocks of 64 are visited from the last
// to the first, as in the seed: Q and K of the last block are copied first, then per block
//   wait for K_j, start copying V_j, S = Q K_j^T (mma.sync m16n8k16), online softmax;
//   wait for V_j, start copying K_(j-1), O += P V_j (P straight from the S registers).
// So one buffer each for K and V: a K copy overlaps the P V of the block before, a V copy the
// S and softmax of its own block. Shared tiles are rows of D bf16 with their 16-byte chunks
// XOR-swizzled by the row (chunk c of row r at c ^ (r % 8)), so ldmatrix reads are free of
// bank conflicts. Rows past a sequence are zero-filled by the copies; such keys are masked.
//   CAUSAL: key j is seen by query i when j <= i (top-left aligned).
#include <cuda_bf16.h>
#include <tmaflow.cuh>
using namespace tmaflow;

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef CAUSAL
#define CAUSAL 0
#endif
constexpr int D = HEAD_DIM, BM = 64, BN = 64, kThreads = 128;
constexpr int kChunks = D / 8;  // 16-byte chunks a row
static_assert(D == 64 || D == 128, "HEAD_DIM is 64 or 128");

TMAFLOW_DEVICE uint32_t swizzled(int row, int chunk) {  // byte offset of a chunk in a tile
  return uint32_t(row * D * 2 + ((chunk ^ (row % 8)) * 16));
}

// rows x D tile from global rows row0.. of a (rows_total, D) matrix; rows past rows_total are
// zero-filled (cp.async with 0 source bytes).
template <int kRows>
TMAFLOW_DEVICE void copy_tile(uint8_t* tile, const __nv_bfloat16* src, int row0, int rows_total) {
  static_assert(kRows * kChunks % kThreads == 0, "whole chunks a thread");
#pragma unroll
  for (int it = 0; it < kRows * kChunks / kThreads; ++it) {
    const int i = it * kThreads + threadIdx.x, r = i / kChunks, c = i % kChunks;
    const bool in = row0 + r < rows_total;
    const __nv_bfloat16* from = src + size_t(in ? row0 + r : 0) * D + c * 8;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(smem_u32(tile + swizzled(r, c))), "l"(from), "r"(in ? 16 : 0) : "memory");
  }
}

extern "C" __global__ void __launch_bounds__(kThreads, 1)
attention_cp_async(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                   __nv_bfloat16* out, int seq_q, int seq_kv, int heads, int group, float scale_log2) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* sq = smem;
  uint8_t* sk = sq + BM * D * 2;
  uint8_t* sv = sk + BN * D * 2;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int m0 = blockIdx.x * BM, bh = blockIdx.y;
  const int kvh = (bh / heads) * (heads / group) + (bh % heads) / group;
  const __nv_bfloat16* qh = q + size_t(bh) * seq_q * D;
  const __nv_bfloat16* kh = k + size_t(kvh) * seq_kv * D;
  const __nv_bfloat16* vh = v + size_t(kvh) * seq_kv * D;
  int blocks = (seq_kv + BN - 1) / BN;
#if CAUSAL
  blocks = min(blocks, (min(m0 + BM, seq_q) - 1) / BN + 1);
#endif
  const float neg_inf = __int_as_float(0xff800000u);

  copy_tile<BM>(sq, qh, m0, seq_q);
  copy_tile<BN>(sk, kh, (blocks - 1) * BN, seq_kv);
  cp_async::commit();

  uint32_t qf[D / 16][4];  // this warp's 16 Q rows as A fragments, one a 16-column k-step
  float o[D / 8][4] = {};
  float m_run[2] = {neg_inf, neg_inf}, l_run[2] = {0.f, 0.f};  // rows lane / 4 and + 8, log2 domain
  const int row0 = m0 + warp * 16 + lane / 4;
  for (int j = blocks - 1; j >= 0; --j) {
    cp_async::wait<0>();
    __syncthreads();  // K_j (and Q) landed for every thread; every warp is done with V_(j+1)
    copy_tile<BN>(sv, vh, j * BN, seq_kv);
    cp_async::commit();
    if (j == blocks - 1) {
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks)  // x4: rows 0-7 / 8-15 of chunks 2 ks and 2 ks + 1
        warp::ldmatrix_x4(qf[ks], sq + swizzled(warp * 16 + (lane / 8 % 2) * 8 + lane % 8, 2 * ks + lane / 16));
    }
    float s[BN / 8][4] = {};
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {  // keys 16 np .. 16 np + 15: two n-tiles
        uint32_t b[4];
        warp::ldmatrix_x4(b, sk + swizzled(16 * np + (lane / 16) * 8 + lane % 8, 2 * ks + lane / 8 % 2));
        warp::mma_16816(s[2 * np], qf[ks], b[0], b[1]);
        warp::mma_16816(s[2 * np + 1], qf[ks], b[2], b[3]);
      }
    // Online softmax of block j: s[n][0..1] are row lane / 4, s[n][2..3] row lane / 4 + 8,
    // at keys j BN + 8 n + 2 (lane % 4) + {0, 1}.
#pragma unroll
    for (int n = 0; n < BN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = j * BN + 8 * n + 2 * (lane % 4) + (e & 1);
        bool masked = key >= seq_kv;
#if CAUSAL
        masked = masked || key > row0 + 8 * (e >> 1);
#endif
        s[n][e] = masked ? neg_inf : s[n][e] * scale_log2;
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = neg_inf;
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
      const float m_new = fmaxf(m_run[h], warp::quad_max(mx));
      const float base = m_new == neg_inf ? 0.f : m_new;
      const float alpha = exp2f(m_run[h] - base);
      m_run[h] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) {
        s[n][2 * h] = exp2f(s[n][2 * h] - base);
        s[n][2 * h + 1] = exp2f(s[n][2 * h + 1] - base);
        sum += s[n][2 * h] + s[n][2 * h + 1];
      }
      l_run[h] = l_run[h] * alpha + sum;
#pragma unroll
      for (int d = 0; d < D / 8; ++d) o[d][2 * h] *= alpha, o[d][2 * h + 1] *= alpha;
    }
    cp_async::wait<0>();
    __syncthreads();  // V_j landed; every warp is done reading K_j
    if (j > 0) {
      copy_tile<BN>(sk, kh, (j - 1) * BN, seq_kv);
      cp_async::commit();
    }
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {  // 16 keys a k-step: P's A fragment from two S tiles
      const uint32_t a[4] = {wgmma::bf16x2(s[2 * kk][0], s[2 * kk][1]),
                             wgmma::bf16x2(s[2 * kk][2], s[2 * kk][3]),
                             wgmma::bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             wgmma::bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {  // head-dim columns 16 dp ..: two n-tiles, V transposed
        uint32_t b[4];
        warp::ldmatrix_x4_trans(b, sv + swizzled(16 * kk + (lane / 8 % 2) * 8 + lane % 8, 2 * dp + lane / 16));
        warp::mma_16816(o[2 * dp], a, b[0], b[1]);
        warp::mma_16816(o[2 * dp + 1], a, b[2], b[3]);
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + 8 * h;
    const float l = warp::quad_sum(l_run[h]);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    if (row < seq_q) {
      __nv_bfloat16* dst = out + (size_t(bh) * seq_q + row) * D + 2 * (lane % 4);
#pragma unroll
      for (int d = 0; d < D / 8; ++d)
        *reinterpret_cast<uint32_t*>(dst + 8 * d) = wgmma::bf16x2(o[d][2 * h] * inv, o[d][2 * h + 1] * inv);
    }
  }
}
