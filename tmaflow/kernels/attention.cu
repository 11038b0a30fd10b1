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
//   CAUSAL: key j is seen by query i when j <= i (top-left aligned, as torch's is_causal);
//   key tiles past a work tile's last row are skipped.
//   Grouped-query attention: query head h reads key/value head h / group.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <tmaflow.cuh>
#include "tmaflow_layout.cuh"
using namespace tmaflow;
namespace L = tmaflow_layout;

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef CAUSAL
#define CAUSAL 0
#endif
#ifndef FP16
#define FP16 0  // 1: fp16 Q, K, V and O instead of bf16
#endif
constexpr int D = HEAD_DIM, kBoxes = D / 64;
// Keys a tile: 64 at head dim 256 (its O takes 128 registers a thread); 176 at head dim 128
// without a causal mask (fewer, longer softmax steps, as FlashAttention-3 chooses), else 128.
constexpr int BM = 128, BN = D == 256 ? 64 : D == 128 && !CAUSAL ? 176 : 128;
constexpr int kS = BN / 2;  // S accumulators per thread: 64 x BN / 128
constexpr int kO = D / 2;   // O accumulators per thread: 64 x D / 128
constexpr uint32_t kBoxBytes = BN * 128;  // a (1, BN, 64) K or V box: BN rows of 128 B
constexpr uint32_t kProducerRegs = 40, kConsumerRegs = 232;
static_assert(D == 64 || D == 128 || D == 256, "HEAD_DIM is 64, 128 or 256");
static_assert(L::kp::k_boxes == kBoxes && L::kp::k_bytes == BN * D * 2, "plan does not match HEAD_DIM");

#if FP16
using elem_t = __half;
#define TF_MMA(shape) wgmma::mma_##shape##_f16
#define TF_MMA_RS(shape) wgmma::mma_##shape##_f16_rs
TMAFLOW_DEVICE uint32_t pack2(float lo, float hi) { return wgmma::f16x2(lo, hi); }
#else
using elem_t = __nv_bfloat16;
#define TF_MMA(shape) wgmma::mma_##shape##_bf16
#define TF_MMA_RS(shape) wgmma::mma_##shape##_bf16_rs
TMAFLOW_DEVICE uint32_t pack2(float lo, float hi) { return wgmma::bf16x2(lo, hi); }
#endif

TMAFLOW_DEVICE void mma_pv(float (&o)[kO], const uint32_t (&a)[4], uint64_t dv) {
#if HEAD_DIM == 64
  TF_MMA_RS(m64n64k16)<1>(o, a, dv, 1);
#elif HEAD_DIM == 128
  TF_MMA_RS(m64n128k16)<1>(o, a, dv, 1);
#else
  TF_MMA_RS(m64n256k16)<1>(o, a, dv, 1);
#endif
}

template <int N>  // N = kS: BN / 2 accumulators
TMAFLOW_DEVICE void mma_qk(float (&s)[N], uint64_t dq, uint64_t dk, uint32_t scale_d) {
  if constexpr (N == 32) TF_MMA(m64n64k16)<0>(s, dq, dk, scale_d);
  else if constexpr (N == 88) TF_MMA(m64n176k16)<0>(s, dq, dk, scale_d);
  else TF_MMA(m64n128k16)<0>(s, dq, dk, scale_d);
}

TMAFLOW_DEVICE float neg_inf() { return __int_as_float(0xff800000u); }

// Key tiles a CTA whose first query row is m0 reads.
TMAFLOW_DEVICE int key_tiles(int m0, int seq_q, int seq_kv) {
  int tiles = (seq_kv + BN - 1) / BN;
#if CAUSAL
  tiles = min(tiles, (min(m0 + BM, seq_q) - 1) / BN + 1);
#endif
  return tiles;
}

extern "C" __global__ void __launch_bounds__(384, 1)
attention_fwd(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
              const __grid_constant__ CUtensorMap tv, elem_t* out, float* lse, int seq_q,
              int seq_kv, int batch_heads, int heads, int group, float scale_log2) {
  extern __shared__ __align__(1024) uint8_t smem[];
  L::Smem S(smem);
  auto qp = S.qp();
  auto kp = S.kp();
  auto vp = S.vp();
  using QCursor = decltype(qp)::Cursor;
  using KCursor = decltype(kp)::Cursor;
  using VCursor = decltype(vp)::Cursor;
  const int wg = threadIdx.x / 128, lane = threadIdx.x % 32;
  const int m_blocks = (seq_q + BM - 1) / BM, work = m_blocks * batch_heads;
  // Work tile t: query rows from m0, (batch x heads) row bh, key/value head kvh.
  // Causal tiles of later rows read more keys: they go first (blocks start in index order), so
  // the short ones fill the tail.
  auto coords = [&](int t, int& m0, int& bh, int& kvh) {
    m0 = (CAUSAL ? m_blocks - 1 - t % m_blocks : t % m_blocks) * BM;
    bh = t / m_blocks;
    kvh = (bh / heads) * (heads / group) + (bh % heads) / group;
  };
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
  __syncthreads();

  if (wg == 0) {
    warp::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) {
      // In the order the consumers need them: Q and K_0, then K_j ahead of V_(j-1) (S_j and
      // P V_(j-1) are issued together).
      QCursor cq;
      KCursor ck;
      VCursor cv;
      auto load_k = [&](int j, int kvh) {
        kp.producer_acquire(ck);
        kp.producer_commit(ck);
#pragma unroll
        for (int box = 0; box < kBoxes; ++box)
          tma::load(S.kp_k(ck.stage, box), &tk, kp.barrier(ck), box * 64, j * BN, kvh);
        ck.advance();
      };
      auto load_v = [&](int j, int kvh) {
        vp.producer_acquire(cv);
        vp.producer_commit(cv);
#pragma unroll
        for (int box = 0; box < kBoxes; ++box)
          tma::load(S.vp_v(cv.stage, box), &tv, vp.barrier(cv), box * 64, j * BN, kvh);
        cv.advance();
      };
      for (int t = blockIdx.x; t < work; t += gridDim.x, cq.advance()) {
        int m0, bh, kvh;
        coords(t, m0, bh, kvh);
        qp.producer_acquire(cq);
        qp.producer_commit(cq);
#pragma unroll
        for (int box = 0; box < kBoxes; ++box)
          tma::load(S.qp_q(cq.stage, box), &tq, qp.barrier(cq), box * 64, m0, bh);
        const int tiles = key_tiles(m0, seq_q, seq_kv);
        load_k(0, kvh);
        for (int j = 1; j < tiles; ++j) {
          load_k(j, kvh);
          load_v(j - 1, kvh);
        }
        load_v(tiles - 1, kvh);
      }
    }
    return;
  }
  warp::setmaxnreg_inc<kConsumerRegs>();
  const int cw = wg - 1, wq = (threadIdx.x % 128) / 32;
  const int col = 2 * (lane % 4);  // this thread's columns: col and col + 1 in every 8-column chunk
  int m0, bh, kvh, row0;           // row0: this thread's rows are row0 and row0 + 8
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
  auto issue_s = [&]() {
    wgmma::fence_operands(s);
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {  // 16 head-dim columns a step: 32 B into a 128 B box row
      const int box = ks / 4;
      const uint64_t dq =
          wgmma::desc_k_major_sw128(static_cast<uint8_t*>(S.qp_q(cq.stage, box)) + cw * 64 * 128);
      const uint64_t dk = wgmma::desc_k_major_sw128(S.kp_k(ck.stage, box));
      mma_qk(s, dq + 2 * (ks % 4), dk + 2 * (ks % 4), ks > 0);
    }
    wgmma::commit_group();
  };
  auto issue_pv = [&]() {  // O = alpha O + P V
    // Once the row maxima settle, alpha is exactly 1 (2^0): a warp skips the multiplies then.
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int i = 0; i < kO; ++i) o[i] *= alpha[(i >> 1) & 1];
    }
    const uint64_t dv = wgmma::desc_mn_major_sw128(S.vp_v(cv.stage, 0), kBoxBytes);
    wgmma::fence_operands(o);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)  // 16 keys of 128 B rows a step
      mma_pv(o, p[kk], dv + kk * (2048 >> 4));
    wgmma::commit_group();
  };
  // Online softmax of key tile j in place (s becomes P in fp32), alpha the rescale of older sums.
  auto softmax = [&](int j) {
    // Masks cost a compare and a select per score: only tiles that reach past the sequence or
    // (causal) past this warpgroup's first row need them (a warp-uniform test).
    bool need_mask = (j + 1) * BN > seq_kv;
#if CAUSAL
    need_mask = need_mask || (j + 1) * BN - 1 > m0 + cw * 64;
#endif
    if (need_mask) {
#pragma unroll
      for (int jj = 0; jj < BN / 8; ++jj)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = j * BN + 8 * jj + col + (e & 1);
          bool masked = key >= seq_kv;
#if CAUSAL
          masked = masked || key > row0 + 8 * (e >> 1);
#endif
          if (masked) s[4 * jj + e] = neg_inf();
        }
    }
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
  // O / l of the finished work tile, clipped at the sequence; the log-sum-exp (natural log of
  // sum exp(scale * s)).
  auto store = [&]() {
    const int bh_row = bh * seq_q;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 8 * h;
      const float l = warp::quad_sum(l_run[h]);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      if (row < seq_q) {
        elem_t* dst = out + size_t(bh_row + row) * D + col;
#pragma unroll
        for (int jj = 0; jj < D / 8; ++jj)
          *reinterpret_cast<uint32_t*>(dst + 8 * jj) = pack2(o[4 * jj + 2 * h] * inv, o[4 * jj + 2 * h + 1] * inv);
        if (lse != nullptr && lane % 4 == 0)
          lse[bh_row + row] = l > 0.f ? (m_run[h] + log2f(l)) * 0.69314718056f : neg_inf();
      }
    }
  };
  auto begin_work = [&](int t) {  // a work tile's coordinates and fresh sums
    coords(t, m0, bh, kvh);
    row0 = m0 + cw * 64 + wq * 16 + lane / 4;
    for (int h = 0; h < 2; ++h) m_run[h] = neg_inf(), l_run[h] = 0.f;
#pragma unroll
    for (int i = 0; i < kO; ++i) o[i] = 0.f;
    return key_tiles(m0, seq_q, seq_kv);
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
  auto scores_done = [&](int j, int tiles) {
    wgmma::fence_operands(s);
    if (lane == 0) {
      kp.consumer_release(ck);
      if (j == tiles - 1) qp.consumer_release(cq);
    }
    ck.advance();
  };
  // Tile j+1's K and tile j's V are waited for right after tile j's GEMMs are issued, while
  // the thread would wait for S_j anyway: an mbarrier wait at the top of a tile sat on the
  // critical path (4-10% at every head dim), though the loads had landed long before.
  auto wait_ahead = [&](int j, int tiles) {
    if (j + 1 < tiles) {
      KCursor next = ck;
      next.advance();
      kp.consumer_wait(next);
    }
    VCursor next_v = cv;
    if (j > 0) next_v.advance();
    vp.consumer_wait(next_v);
  };
  if (cw == 1) named_barrier::arrive(1, 256);
  for (int t = blockIdx.x; t < work; t += gridDim.x, cq.advance()) {
    const int tiles = begin_work(t);
    qp.consumer_wait(cq);
    kp.consumer_wait(ck);
    turn_begin();
    issue_s();
    turn_end(false);
    wait_ahead(0, tiles);
    wgmma::wait_group<0>();
    scores_done(0, tiles);
    softmax(0);
    convert();
    for (int j = 1; j < tiles; ++j) {
      turn_begin();
      issue_s();
      issue_pv();
      turn_end(false);
      wait_ahead(j, tiles);
      wgmma::wait_group<1>();  // S_j is done; P V_(j-1) may still run
      scores_done(j, tiles);
      softmax(j);
      wgmma::wait_group<0>();
      wgmma::fence_operands(o);
      if (lane == 0) vp.consumer_release(cv);
      cv.advance();
      convert();
    }
    const bool last = t + gridDim.x >= work;
    turn_begin();
    issue_pv();
    turn_end(last);
    wgmma::wait_group<0>();
    wgmma::fence_operands(o);
    if (lane == 0) vp.consumer_release(cv);
    cv.advance();
    store();
  }
}
