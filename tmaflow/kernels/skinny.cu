// Skinny GEMM (bf16 or fp8), M <= 128 ("nt": C = A * B^T, A is M x K activations, B is N x K weights,
// both K-contiguous), with the operands swapped as cuBLAS does for decode shapes: a consumer
// warpgroup computes D = B_tile * A^T, a 64 x MP tile of C^T, with wgmma m64nMPk16. The MMA's
// 64 rows are filled by N and the activations' few rows are its N (MP: M rounded up to 8, 16,
// 32, 64 or 128), so no MMA work and no shared memory go to padding M up to 64 or 128.
//
// A CTA owns CONSUMERS x 64 rows of B over one range of K: the grid is (N tiles, K splits).
// Warp 0 issues the TMA loads (CONSUMERS 64 x 64 boxes of B and one MP x 64 box of A a stage);
// the consumer warpgroups each own 64 rows. With CLUSTER 2, neighbouring N tiles of one split
// form a cluster and the first multicasts A's box to both (A is read once per pair from L2).
// With several splits each stores its fp32 partial, and the last to finish a tile (a per-tile
// counter) sums every split's partial in split order (the result does not depend on which
// finished last) and writes C. M in chunks (grid z, the host's SkinnyConfig.m_rows): CTA z
// computes rows z * MP .. z * MP + MP - 1 of C (any M, in more CTAs of fewer rows). With
// M_HALVES 2 the two CTAs of a cluster compute two neighbouring MP-row chunks on the same rows
// of B: each loads its own rows of A and half of every 64-row box of B, which it multicasts to
// both (cuBLAS's fp8 M = 128 scheme: 64-row halves, B read once per pair from L2). A chunk past
// M loads zeros and stores nothing. C is written with plain stores, clipped at M and N.
// FP8: A and B are e4m3 (k-blocks of 128, 128-byte rows as bf16's 64), C = scale * A * B^T; the
// tensor cores' partial sums are added into fp32 registers every PROMOTE k-blocks (gemm.cu).
// BLOCK_SCALES (DeepSeek's, scale_a M-major): every k-block is promoted with its scales. The TMA
// loads A's MP row scales of the k-block with its stage (map tsa over (KB, M)); they scale the
// columns of C^T. SCALES_ROW_MAJOR: scale_a row-major, map tsa over (M, KB); a TMA box's rows
// are at least 16 bytes, so each stage loads 4 k-blocks' scales of its MP rows (k-blocks
// kb & ~3 to (kb & ~3) + 3, an MP x 4 box) and uses column kb % 4. SCALE_RING: that box is
// loaded once a group of 4 k-blocks (a split's first group may be partial), into a ring of its
// own (pipeline sc: skinny_plan's default for row-major scale_a, SkinnyConfig(scale_ring=False)
// keeps the per-stage box), waited for at the group's first k-block and released after its
// last; the stages carry only A and B. B's 128 x 128 blocks give each consumer warpgroup's 64
// rows one scale a k-block, read from global memory (scales_b, (N / 128, KB) row-major) before
// the k-loop (SCALES_B_AHEAD).
#include <cuda_bf16.h>
#include <tmaflow.cuh>
#include "tmaflow_layout.cuh"
using namespace tmaflow;
namespace L = tmaflow_layout;

#ifndef MP
#define MP 16
#endif
#ifndef CONSUMERS
#define CONSUMERS 2
#endif
#ifndef CLUSTER
#define CLUSTER 1
#endif
#ifndef FP8
#define FP8 0
#endif
#ifndef PROMOTE
#define PROMOTE 0  // fp8: k-blocks the tensor cores sum before fp32 registers do (0: never)
#endif
#ifndef BLOCK_SCALES
#define BLOCK_SCALES 0
#endif
#ifndef SCALES_ROW_MAJOR
#define SCALES_ROW_MAJOR 0  // block scales: scale_a (M, KB) row-major (else M-major, (KB, M))
#endif
#ifndef SCALE_RING
#define SCALE_RING 0  // row-major scale_a: each 4 k-blocks' box loaded once, into the ring sc
#endif
constexpr int kScaleCols = SCALES_ROW_MAJOR ? 4 : 1;  // k-blocks of scales a stage's box holds, per row of A
#ifndef M_HALVES
#define M_HALVES 1  // 2: a cluster of two CTAs on neighbouring MP-row chunks of M, sharing B by multicast
#endif
#ifndef GROUPED
#define GROUPED 0  // 1: M-grouped (MoE) decode, persistent over (group, chunk of MP rows, N tile) items
#endif
// 1: the k-blocks' descriptors from a warpgroup index the compiler knows is warp-uniform (a
// shuffle): uniform registers, no per-wgmma R2UR (as gemm.cu's UNIFORM_DESC; H200, session 17
// call 4, the three skinny rows timed both ways: within +-3%).
#ifndef UNIFORM_DESC
#define UNIFORM_DESC 1
#endif
#ifndef BLOCK_SCALE_SETS
#define BLOCK_SCALE_SETS 1  // block scales: accumulator sets a warpgroup alternates (2: see below)
#endif
// Block scales: B's scales of the split's first 128 k-blocks in registers before the k-loop,
// handed out by shuffles (0: each k-block's own load, under one k-block's wgmmas). H200, session
// 32, 60 rounds at seven decode shapes over 0, geometric means cold / back to back: row-major
// scale_a 1.026 / 1.009, M-major 1.020 / 1.010 (the rows below cuBLAS cold gained most:
// 16x8192x8192 1.029 / 1.031, 64x7168x16384 1.017 / 1.041; the worst, 1x4096x4096 back to
// back, 0.978 at 3.6x _scaled_mm).
#ifndef SCALES_B_AHEAD
#define SCALES_B_AHEAD 1
#endif
#ifndef PROMOTE_SETS
#define PROMOTE_SETS 1  // per-tensor fp8: 2 promotes every k-block, alternating two accumulator sets (below)
#endif
constexpr int BK = FP8 ? 128 : 64;  // elements of a k-block: 128-byte rows either way
constexpr int kAcc = MP / 2;         // fp32 accumulators per thread: 64 x MP / 128
constexpr int kRows = 64 * CONSUMERS;   // rows of B (columns of C) per CTA
[[maybe_unused]] constexpr int kConsumerThreads = 128 * CONSUMERS;  // unused by the grouped kernel
static_assert(L::wx::w_boxes == CONSUMERS * M_HALVES && L::wx::x_bytes == MP * 128,
              "plan does not match MP / CONSUMERS / M_HALVES");
static_assert(M_HALVES == 1 || (M_HALVES == 2 && CLUSTER == 2 && !BLOCK_SCALES && !GROUPED),
              "M halves: in clusters of two, per-tensor scales");
static_assert(!PROMOTE || FP8, "promotion is for fp8");
static_assert(!BLOCK_SCALES || (FP8 && PROMOTE == 1), "block scales: fp8, promoted every k-block");
static_assert(!SCALES_ROW_MAJOR || BLOCK_SCALES, "row-major scale_a: block scales");
static_assert(!SCALE_RING || SCALES_ROW_MAJOR, "the scale ring holds row-major scale_a's boxes");
static_assert(BLOCK_SCALE_SETS == 1 || BLOCK_SCALE_SETS == 2, "one or two accumulator sets");
static_assert(PROMOTE_SETS == 1 || (PROMOTE_SETS == 2 && PROMOTE == 1 && !BLOCK_SCALES),
              "two promotion sets: per-tensor fp8, promoted every k-block");
static_assert(!GROUPED || (!FP8 && CLUSTER == 1), "grouped: bf16, unclustered");

TMAFLOW_DEVICE void mma(float (&acc)[kAcc], uint64_t dw, uint64_t dx, uint32_t scale_d) {
#if FP8 && MP == 8
  wgmma::mma_m64n8k32_e4m3(acc, dw, dx, scale_d);
#elif FP8 && MP == 16
  wgmma::mma_m64n16k32_e4m3(acc, dw, dx, scale_d);
#elif FP8 && MP == 32
  wgmma::mma_m64n32k32_e4m3(acc, dw, dx, scale_d);
#elif FP8 && MP == 64
  wgmma::mma_m64n64k32_e4m3(acc, dw, dx, scale_d);
#elif FP8 && MP == 128
  wgmma::mma_m64n128k32_e4m3(acc, dw, dx, scale_d);
#elif FP8
#error "MP is 8, 16, 32, 64 or 128"
#elif MP == 8
  wgmma::mma_m64n8k16_bf16(acc, dw, dx, scale_d);
#elif MP == 16
  wgmma::mma_m64n16k16_bf16(acc, dw, dx, scale_d);
#elif MP == 32
  wgmma::mma_m64n32k16_bf16(acc, dw, dx, scale_d);
#elif MP == 48
  wgmma::mma_k16_bf16(acc, dw, dx, scale_d);  // m64n48k16 (M in chunks of 48 rows)
#elif MP == 64
  wgmma::mma_m64n64k16_bf16(acc, dw, dx, scale_d);
#elif MP == 128
  wgmma::mma_m64n128k16_bf16(acc, dw, dx, scale_d);
#else
#error "MP is 8, 16, 32, 48 (bf16), 64 or 128"
#endif
}

// Wait for stage c and issue its k-block's wgmmas on acc (the first k-step overwrites acc unless
// `keep`), committed as one group.
template <class Pipe, class Cursor>
TMAFLOW_DEVICE void issue_k_block(const L::Smem& S, Pipe& pipe, const Cursor& c, int cw, float (&acc)[kAcc],
                                  uint32_t keep) {
  pipe.consumer_wait(c);
  // M halves: a warpgroup's 64 rows are M_HALVES boxes back to back (one 64-row box in the swizzle)
  const uint64_t dw = wgmma::desc_k_major_sw128(S.wx_w(c.stage, cw * M_HALVES));
  const uint64_t dx = wgmma::desc_k_major_sw128(S.wx_x(c.stage));
  wgmma::fence_operands(acc);
  wgmma::fence();
#pragma unroll
  for (int k = 0; k < 4; ++k) mma(acc, dw + 2 * k, dx + 2 * k, k > 0 || keep);  // 32 B a k-step
  wgmma::commit_group();
}

// The consumer warpgroups: MMAs over k-blocks [kb0, kb1), then (with splits) the fp32 partial
// and, in the tile's last split, the sum of all partials; C written clipped at M and N.
template <class Pipe>
TMAFLOW_DEVICE void consume(const L::Smem& S, Pipe& pipe, __nv_bfloat16* C, int ldc, float* partial,
                            uint32_t* counters, int M, int N, int tile, int row0, int split, int splits,
                            int kb0, int kb1, float scale, const float* scales_b, int k_blocks) {
  using Cursor = typename Pipe::Cursor;
  const int t = threadIdx.x - 128, cw = t / 128, wq = (t % 128) / 32, lane = t % 32;
  const int cwd = UNIFORM_DESC ? __shfl_sync(0xffffffffu, cw, 0) : cw;  // for the descriptors
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
  Cursor c, prev;
#if PROMOTE
  float total[kAcc];  // the fp32 sum of the promoted k-blocks
#pragma unroll
  for (int i = 0; i < kAcc; ++i) total[i] = 0.f;
#endif
  uint32_t acc_live = 1;  // 0 after a promotion: the next wgmma overwrites acc
#if BLOCK_SCALES || PROMOTE_SETS == 2
#if BLOCK_SCALES
  // This warpgroup's 64 rows of B lie in one 128-row scale block (tiles are 64 or 128 rows).
  const float* const b_scales = scales_b + size_t(min(tile * kRows + cw * 64, N - 1) / 128) * k_blocks;
  const int mc = 2 * (lane % 4);  // this thread's columns of C^T: mc + 8 j and mc + 8 j + 1
#if SCALES_B_AHEAD
  // B's scales of k-blocks kb0 .. kb0 + 127, lane l holding kb0 + l + 32 i, read before the first
  // stage lands (one round of loads, where a k-block's own load waited on a cold L2 each sector)
  float ahead[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) ahead[i] = kb0 + lane + 32 * i < kb1 ? __ldg(b_scales + kb0 + lane + 32 * i) : 0.f;
  auto scale_b = [&](int kb) {  // called by every lane of the warp alike
    const int j = kb - kb0;
    if (j >= 128) return __ldg(b_scales + kb);
    const float v = j < 32 ? ahead[0] : j < 64 ? ahead[1] : j < 96 ? ahead[2] : ahead[3];
    return __shfl_sync(0xffffffffu, v, j % 32);
  };
#else
  auto scale_b = [&](int kb) { return __ldg(b_scales + kb); };
#endif
#endif
#if SCALE_RING
  auto rings = S.sc();
  decltype(rings)::Cursor ring;  // the slot of the current group of 4 k-blocks
#endif
  // After the wait for its wgmmas: add the k-block in d (with block scales, scaled) to total;
  // release its stage. Called in k-block order (both loops below).
  auto retire = [&](float (&d)[kAcc], [[maybe_unused]] float sb, const Cursor& at, [[maybe_unused]] int kb) {
    wgmma::fence_operands(d);
#if !BLOCK_SCALES
#pragma unroll
    for (int i = 0; i < kAcc; ++i) total[i] += d[i];
#else
#if SCALE_RING
    if (kb == kb0 || kb % kScaleCols == 0) rings.consumer_wait(ring);  // a group's first k-block
    const float* sa = static_cast<const float*>(S.sc_s(ring.stage));
#else
    const float* sa = static_cast<const float*>(S.wx_s(at.stage));
#endif
#pragma unroll
    for (int j = 0; j < MP / 8; ++j) {  // A's scales of columns mc + 8 j, mc + 8 j + 1, times B's
#if SCALES_ROW_MAJOR
      const float* row = sa + (8 * j + mc) * kScaleCols + kb % kScaleCols;
      const float s0 = row[0] * sb, s1 = row[kScaleCols] * sb;
#else
      const float2 a = *reinterpret_cast<const float2*>(sa + 8 * j + mc);
      const float s0 = a.x * sb, s1 = a.y * sb;
#endif
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // rows n0 and n0 + 8
        total[4 * j + 2 * h] += d[4 * j + 2 * h] * s0;
        total[4 * j + 2 * h + 1] += d[4 * j + 2 * h + 1] * s1;
      }
    }
#endif
    __syncwarp();
    if (lane == 0) pipe.consumer_release(at);  // one arrival per consumer warp
#if SCALE_RING
    if (kb % kScaleCols == kScaleCols - 1 || kb == kb1 - 1) {  // the group's last k-block: its slot
      if (lane == 0) rings.consumer_release(ring);
      ring.advance();
    }
#endif
  };
#if BLOCK_SCALE_SETS == 2 || PROMOTE_SETS == 2
  // k-block j of the split runs on acc (j even) or acc2 (j odd): while one set is promoted, the
  // next k-block's wgmmas already run on the other (gemm.cu's block scales do the same). (Groups
  // of several k-blocks a set, looped at run time, made ptxas serialize the wgmmas.)
  float acc2[kAcc];
  float sb_a, sb_b;  // B's scale of each set's k-block
  Cursor at_a, at_b;  // each set's stage
  int kb_a = kb0, kb_b = kb0;  // each set's k-block
  // Issue k-block kb on d from the next stage; read its B scale while the wgmmas run.
  auto issue = [&](float (&d)[kAcc], [[maybe_unused]] int kb, float& sb, Cursor& at) {
    issue_k_block(S, pipe, c, cwd, d, 0);
#if BLOCK_SCALES
    sb = scale_b(kb);
#else
    sb = 1.f;
#endif
    at = c;
    c.advance();
  };
  const int n = kb1 - kb0;
  issue(acc, kb_a = kb0, sb_a, at_a);
  for (int j = 1; j + 1 < n; j += 2) {
    issue(acc2, kb_b = kb0 + j, sb_b, at_b);
    wgmma::wait_group<1>();
    retire(acc, sb_a, at_a, kb_a);
    issue(acc, kb_a = kb0 + j + 1, sb_a, at_a);
    wgmma::wait_group<1>();
    retire(acc2, sb_b, at_b, kb_b);
  }
  if (n % 2 == 0) {
    issue(acc2, kb_b = kb1 - 1, sb_b, at_b);
    wgmma::wait_group<1>();
    retire(acc, sb_a, at_a, kb_a);
    wgmma::wait_group<0>();
    retire(acc2, sb_b, at_b, kb_b);
  } else {
    wgmma::wait_group<0>();
    retire(acc, sb_a, at_a, kb_a);
  }
#else
  for (int kb = kb0; kb < kb1; ++kb) {
    issue_k_block(S, pipe, c, cwd, acc, 0);  // each k-block starts from zero
    const float sb = scale_b(kb);  // read while the wgmmas run
    wgmma::wait_group<0>();
    retire(acc, sb, c, kb);
    c.advance();
  }
#endif
  acc_live = 0;
#else
  for (int kb = kb0; kb < kb1; ++kb) {
    issue_k_block(S, pipe, c, cwd, acc, acc_live);
    acc_live = 1;
    wgmma::wait_group<1>();  // keep this k-block's group in flight; the previous one is done
    wgmma::fence_operands(acc);
    if (kb > kb0 && lane == 0) pipe.consumer_release(prev);  // one arrival per consumer warp
    prev = c;
    c.advance();
#if PROMOTE
    if ((kb - kb0) % PROMOTE == PROMOTE - 1) {  // promote; the next k-block restarts acc
      wgmma::wait_group<0>();
      wgmma::fence_operands(acc);
#pragma unroll
      for (int i = 0; i < kAcc; ++i) total[i] += acc[i];
      acc_live = 0;
    }
#endif
  }
  wgmma::wait_group<0>();
  wgmma::fence_operands(acc);
  if (kb1 > kb0 && lane == 0) pipe.consumer_release(prev);
#endif  // BLOCK_SCALES
#if PROMOTE
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = total[i] + (acc_live ? acc[i] : 0.f);
#endif

  // The fragment (as mma.m16n8): rows n0 and n0 + 8 of C^T, columns m0 + 8 j and m0 + 8 j + 1.
  // This CTA's columns of C^T are rows row0 .. row0 + MP - 1 of C (M in chunks).
  const int n0 = tile * kRows + cw * 64 + wq * 16 + lane / 4, m0 = 2 * (lane % 4) + row0;
  if (splits > 1) {
    const int kCols = MP * M_HALVES * gridDim.z;  // partial[split][n][m]: every chunk's columns
    const size_t plane = size_t(N) * kCols;
    const int slot = blockIdx.z * gridDim.x + blockIdx.x;  // each chunk of each tile counts its own splits
#pragma unroll
    for (int j = 0; j < MP / 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (n0 + 8 * h < N)
          *reinterpret_cast<float2*>(partial + split * plane + size_t(n0 + 8 * h) * kCols + 8 * j + m0) =
              make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
    __threadfence();                                    // this thread's partial is visible GPU-wide ...
    named_barrier::sync(1, kConsumerThreads);           // ... for every consumer thread, before the count
    bool last = false;
    if (t == 0) last = atomicAdd(counters + slot, 1u) == uint32_t(splits - 1);
    if (!named_barrier::sync_or(1, kConsumerThreads, last)) return;
    __threadfence();
    if (t == 0) counters[slot] = 0;  // every split has counted: ready for the next launch
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
    for (int s = 0; s < splits; ++s) {
#pragma unroll
      for (int j = 0; j < MP / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          if (n0 + 8 * h < N) {
            const float2 v = __ldcg(reinterpret_cast<const float2*>(
                partial + s * plane + size_t(n0 + 8 * h) * kCols + 8 * j + m0));
            acc[4 * j + 2 * h] += v.x;
            acc[4 * j + 2 * h + 1] += v.y;
          }
    }
  }
#if FP8
  const float f = scale;  // the operands' scales, applied once to the fp32 sum
#else
  constexpr float f = 1.f;
#endif
#pragma unroll
  for (int j = 0; j < MP / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int m = 8 * j + m0 + e, n = n0 + 8 * h;
        if (m < M && n < N) C[size_t(m) * ldc + n] = __float2bfloat16_rn(f * acc[4 * j + 2 * h + e]);
      }
}

#if !GROUPED
extern "C" __global__ void __launch_bounds__(128 * (CONSUMERS + 1), 1)
gemm_skinny_bf16(const __grid_constant__ CUtensorMap tx, const __grid_constant__ CUtensorMap tw,
                 __nv_bfloat16* C, int ldc, float* partial, uint32_t* counters, int M, int N, int K,
                 int splits, float scale, const float* scales_b
#if BLOCK_SCALES
                 , const __grid_constant__ CUtensorMap tsa  // A's scales: (KB, M), or (M, KB) row-major
#endif
                 ) {
  extern __shared__ __align__(1024) uint8_t smem[];
  L::Smem S(smem);
  auto pipe = S.wx();
  using Cursor = decltype(pipe)::Cursor;
#if M_HALVES == 2
  const int tile = blockIdx.x / 2, half = blockIdx.x % 2;  // the cluster rank is the chunk of the pair
#else
  const int tile = blockIdx.x, half = 0;
#endif
  const int row0 = (int(blockIdx.z) * M_HALVES + half) * MP;  // this CTA's first row of A and C
  const int split = blockIdx.y;
  const int k_blocks = (K + BK - 1) / BK, per = (k_blocks + splits - 1) / splits;
  const int kb0 = split * per, kb1 = min(k_blocks, kb0 + per);
  if (threadIdx.x == 0) {
    tma::prefetch_descriptor(&tx);
    tma::prefetch_descriptor(&tw);
#if BLOCK_SCALES
    tma::prefetch_descriptor(&tsa);
#endif
    pipe.init();
#if SCALE_RING
    S.sc().init();
#endif
  }
  griddep::wait();  // under PDL: A, B and the split-K state of the previous kernel are visible
  griddep::launch_dependents();
#if CLUSTER == 1
  __syncthreads();  // the barriers exist for every thread
#else
  cluster::sync();  // every CTA's barriers exist before any multicast signals them
#endif

  if (threadIdx.x < 128) {
    if (threadIdx.x == 0) {
      Cursor c;
#if SCALE_RING
      auto rings = S.sc();
      decltype(rings)::Cursor ring;
#endif
      for (int kb = kb0; kb < kb1; ++kb, c.advance()) {
#if SCALE_RING
        // a group's first k-block: MP rows x its 4 k-blocks of tsa into the next slot, before
        // the stage (the ring's depth lets this run `stages` k-blocks ahead unblocked)
        if (kb == kb0 || kb % kScaleCols == 0) {
          rings.producer_acquire(ring);
          rings.producer_commit(ring);
          tma::load(S.sc_s(ring.stage), &tsa, rings.barrier(ring), kb & ~(kScaleCols - 1), row0);
          ring.advance();
        }
#endif
        pipe.producer_acquire(c);
        pipe.producer_commit(c);
#if M_HALVES == 2
        // this CTA's 32-row slice of each 64-row box, to both CTAs; its own MP rows of A
#pragma unroll
        for (int box = half; box < 2 * CONSUMERS; box += 2)
          tma::load_multicast(S.wx_w(c.stage, box), &tw, pipe.barrier(c), L::wx::w_mask(half), kb * BK,
                              tile * kRows + box * 32);
        tma::load(S.wx_x(c.stage), &tx, pipe.barrier(c), kb * BK, row0);
#else
#pragma unroll
        for (int box = 0; box < CONSUMERS; ++box)
          tma::load(S.wx_w(c.stage, box), &tw, pipe.barrier(c), kb * BK, tile * kRows + box * 64);
#endif
#if BLOCK_SCALES && !SCALE_RING
#if SCALES_ROW_MAJOR
        // MP rows x k-blocks kb & ~3 .. (kb & ~3) + 3 of tsa (zeros past M and KB)
        tma::load(S.wx_s(c.stage), &tsa, pipe.barrier(c), kb & ~(kScaleCols - 1), row0);
#else
        tma::load(S.wx_s(c.stage), &tsa, pipe.barrier(c), row0, kb);  // row kb of tsa: MP scales (zeros past M)
#endif
#endif
#if M_HALVES == 2
#elif CLUSTER == 1
        tma::load(S.wx_x(c.stage), &tx, pipe.barrier(c), kb * BK, row0);
#else
        const uint32_t rank = cluster::rank();
        if (L::wx::x_leader(rank))
          tma::load_multicast(S.wx_x(c.stage), &tx, pipe.barrier(c), L::wx::x_mask(rank), kb * BK, row0);
#endif
      }
    }
  } else {
    consume(S, pipe, C, ldc, partial, counters, M, N, tile, row0, split, splits, kb0, kb1, scale, scales_b,
            k_blocks);
  }
#if CLUSTER > 1
  cluster::sync();  // no CTA leaves while its partner may still multicast into it
#endif
}
#endif  // !GROUPED

#if GROUPED
// Grouped (MoE) decode: rows offsets[g] .. offsets[g + 1] of C = those rows of A times B[g]^T, B
// the experts one after another ((G x N) x K, map tw). Work items are (group g, chunk of MP of its
// rows, tile of kRows columns of C), numbered group by group, then tile by tile, chunk fastest:
// the CTAs working on one tile's chunks run at the same time, so a hot expert's tile comes from
// DRAM once and its other chunks read it from L2 while it is there (tile fastest, round 1's order,
// re-read it an expert's worth of tiles later, mostly from DRAM again). A group of at most MP rows
// is one chunk; a larger one takes several (correct for any sizes, the host's MP only decides the
// speed). Every CTA reads the offsets on the device (graph replays see new sizes), walks the items
// persistently and skips empty groups without loading anything. A chunk's A rows come in boxes of
// 8 (map tx8) up to its last row, a whole chunk in one MP-row box (map tx): a wide MP costs a small
// group only MMA work, whose columns are independent, so the rows of A left from an earlier chunk
// (or past the group's end) only make columns that are never stored.
#ifndef TILE_FASTEST
#define TILE_FASTEST 0  // 1: round 1's items (tile fastest, A in whole MP-row boxes), kept to compare
#endif
struct GroupedItems {
  const int* offsets;
  int tiles, work;  // N tiles a chunk; items of all groups
  int w, step, g, base;  // the next item; its group and that group's first item
  TMAFLOW_DEVICE bool next(int& group, int& row0, int& rows, int& tile) {
    if (w >= work) return false;
    int chunks;
    for (;;) {  // items come group by group; w only grows, so neither does g
      chunks = (offsets[g + 1] - offsets[g] + MP - 1) / MP;
      if (w < base + chunks * tiles) break;
      base += chunks * tiles;
      ++g;
    }
    const int r = w - base;
#if TILE_FASTEST
    const int chunk = r / tiles;
    tile = r - chunk * tiles;
#else
    tile = r / chunks;
    const int chunk = r - tile * chunks;
#endif
    group = g;
    row0 = offsets[g] + chunk * MP;
    rows = min(MP, offsets[g + 1] - row0);
    w += step;
    return true;
  }
};

extern "C" __global__ void __launch_bounds__(128 * (CONSUMERS + 1), 1)
gemm_skinny_bf16(const __grid_constant__ CUtensorMap tx, const __grid_constant__ CUtensorMap tx8,
                 const __grid_constant__ CUtensorMap tw, __nv_bfloat16* C, int ldc, int N, int K,
                 const int* offsets, int groups) {
  extern __shared__ __align__(1024) uint8_t smem[];
  L::Smem S(smem);
  auto pipe = S.wx();
  using Cursor = decltype(pipe)::Cursor;
  const int tiles = (N + kRows - 1) / kRows, k_blocks = (K + BK - 1) / BK;
  if (threadIdx.x == 0) {
    tma::prefetch_descriptor(&tx);
    tma::prefetch_descriptor(&tx8);
    tma::prefetch_descriptor(&tw);
    pipe.init();
  }
  griddep::wait();  // under PDL: A, B and the offsets of the previous kernel are visible
  griddep::launch_dependents();
  // Every warp counts the items of all groups, its lanes reading the offsets side by side.
  int work = 0;
  for (int g = threadIdx.x % 32; g < groups; g += 32) work += (offsets[g + 1] - offsets[g] + MP - 1) / MP * tiles;
  work = __reduce_add_sync(0xffffffffu, work);
  __syncthreads();  // the barriers exist for every thread
  GroupedItems items{offsets, tiles, work, int(blockIdx.x), int(gridDim.x), 0, 0};
  int g, row0, rows, tile;
  if (threadIdx.x < 128) {
    if (threadIdx.x == 0) {
      constexpr uint32_t kBox8 = 8 * BK * 2;  // bytes of an 8-row box of A (the 128B swizzle's atom)
      static_assert(L::wx::x_bytes == MP / 8 * kBox8, "an MP-row box of A is MP / 8 boxes of 8 rows");
      Cursor c;
      while (items.next(g, row0, rows, tile)) {
        const int boxes8 = TILE_FASTEST ? MP / 8 : (rows + 7) / 8;  // a whole chunk: one MP-row box
        const uint32_t bytes = L::wx::w_bytes + boxes8 * kBox8;
        for (int kb = 0; kb < k_blocks; ++kb, c.advance()) {
          pipe.producer_acquire(c);
          mbarrier::arrive_expect_tx(pipe.barrier(c), bytes);  // producer_commit, for this chunk's bytes
#pragma unroll
          for (int box = 0; box < CONSUMERS; ++box)  // rows past the expert's N: computed, not stored
            tma::load(S.wx_w(c.stage, box), &tw, pipe.barrier(c), kb * BK, g * N + tile * kRows + box * 64);
          if (boxes8 == MP / 8) {
            tma::load(S.wx_x(c.stage), &tx, pipe.barrier(c), kb * BK, row0);
          } else {  // 8-row boxes at 1024-byte steps land as the MP-row box would (the swizzle is by address)
            for (int i = 0; i < boxes8; ++i)
              tma::load(static_cast<uint8_t*>(S.wx_x(c.stage)) + i * kBox8, &tx8, pipe.barrier(c), kb * BK,
                        row0 + 8 * i);
          }
        }
      }
    }
    return;
  }
  const int t = threadIdx.x - 128, cw = t / 128, wq = (t % 128) / 32, lane = t % 32;
  const int cwd = UNIFORM_DESC ? __shfl_sync(0xffffffffu, cw, 0) : cw;  // for the descriptors
  Cursor c, prev;
  while (items.next(g, row0, rows, tile)) {
    float acc[kAcc];
    for (int kb = 0; kb < k_blocks; ++kb) {
      issue_k_block(S, pipe, c, cwd, acc, kb > 0);  // k-block 0 overwrites acc
      wgmma::wait_group<1>();  // keep this k-block's group in flight; the previous one is done
      wgmma::fence_operands(acc);
      if (kb > 0 && lane == 0) pipe.consumer_release(prev);  // one arrival per consumer warp
      prev = c;
      c.advance();
    }
    wgmma::wait_group<0>();
    wgmma::fence_operands(acc);
    if (lane == 0) pipe.consumer_release(prev);
    // The fragment (as mma.m16n8): rows n0 and n0 + 8 of C^T, columns m0 + 8 j and m0 + 8 j + 1.
    const int n0 = tile * kRows + cw * 64 + wq * 16 + lane / 4, m0 = 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < MP / 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int m = 8 * j + m0 + e, n = n0 + 8 * h;
          if (m < rows && n < N) C[size_t(row0 + m) * ldc + n] = __float2bfloat16_rn(acc[4 * j + 2 * h + e]);
        }
  }
}
#endif  // GROUPED
