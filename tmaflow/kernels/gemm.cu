// bf16 GEMM, C = A * B^T ("nt": A is M x K, B is N x K, both K-major), fp32 accumulation,
// bf16 out. Written with tmaflow's Pipeline, SharedLayout, multicast and wgmma wrappers.
// STATUS: compiles to HGMMA + multicast TMA with no spills; NOT YET RUN ON A GPU.
//
// Warpgroup 0 produces (one thread issues TMA), warpgroups 1-2 consume (wgmma m64n128k16,
// 64 rows each). A cluster of two CTAs works on two M tiles of the same N tile: the B tile
// is loaded once by the cluster's leader and multicast to both. Tiles are dealt to clusters
// persistently in a grouped order for L2 reuse. The epilogue goes through shared memory and
// a TMA store; out-of-bounds rows/columns are zero-filled on load and clipped on store.
#include <cuda_bf16.h>
#include <tmaflow.cuh>
#include "tmaflow_layout.cuh"
using namespace tmaflow;
namespace L = tmaflow_layout;

#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 64
#endif
#ifndef GROUP_M
#define GROUP_M 8
#endif
static_assert(BM == 128 && BN == 128 && BK == 64, "the wgmma tiling below assumes 128 x 128 x 64");

// Work item w -> (pair of M tiles, N tile), grouped GROUP_M pairs at a time for L2 reuse.
TMAFLOW_DEVICE void tile_of(int w, int pairs_m, int tiles_n, int& pm, int& tn) {
  const int per_group = GROUP_M * tiles_n;
  const int first = (w / per_group) * GROUP_M;
  const int size = min(pairs_m - first, GROUP_M);
  pm = first + (w % per_group) % size;
  tn = (w % per_group) / size;
}

TMAFLOW_DEVICE void consumers_sync() {  // named barrier 1: the two consumer warpgroups
  asm volatile("bar.sync 1, 256;" ::: "memory");
}

extern "C" __global__ void __launch_bounds__(384, 1)
gemm_nt(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
        const __grid_constant__ CUtensorMap tc, int M, int N, int K) {
  extern __shared__ __align__(1024) uint8_t smem[];
  L::Smem S(smem);
  auto pipe = S.ab();
  using Cursor = decltype(pipe)::Cursor;
  const int wg = threadIdx.x / 128, lane = threadIdx.x % 32;
  const uint32_t rank = cluster::rank();  // which M tile of the pair
  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN, k_blocks = (K + BK - 1) / BK;
  const int pairs_m = (tiles_m + 1) / 2, work = pairs_m * tiles_n;
  const int first = blockIdx.x / 2, step = gridDim.x / 2;
  if (threadIdx.x == 0) {
    tma::prefetch_descriptor(&ta);
    tma::prefetch_descriptor(&tb);
    tma::prefetch_descriptor(&tc);
    pipe.init();
  }
  cluster::sync();  // both CTAs' barriers exist before any multicast signals them

  if (wg == 0) {
    warp::setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      Cursor c;
      for (int w = first; w < work; w += step) {
        int pm, tn;
        tile_of(w, pairs_m, tiles_n, pm, tn);
        const int tm = 2 * pm + int(rank);
        for (int kb = 0; kb < k_blocks; ++kb, c.advance()) {
          pipe.producer_acquire(c);
          pipe.producer_commit(c);
          tma::load(S.ab_a(c.stage), &ta, pipe.barrier(c), kb * BK, tm * BM);
          if (L::ab::b_leader(rank))
            tma::load_multicast(S.ab_b(c.stage), &tb, pipe.barrier(c), L::ab::b_mask(rank), kb * BK, tn * BN);
        }
      }
    }
  } else {
    warp::setmaxnreg_inc<232>();
    const int cw = wg - 1;                      // this warpgroup's 64 rows of the tile
    const int wq = (threadIdx.x % 128) / 32;    // warp within the warpgroup: 16 rows each
    Cursor c;
    for (int w = first; w < work; w += step) {
      int pm, tn;
      tile_of(w, pairs_m, tiles_n, pm, tn);
      const int tm = 2 * pm + int(rank);
      float acc[64];
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = 0.f;
      for (int kb = 0; kb < k_blocks; ++kb, c.advance()) {
        pipe.consumer_wait(c);
        const uint64_t da = wgmma::desc_k_major_sw128(static_cast<uint8_t*>(S.ab_a(c.stage)) + cw * 64 * 128);
        const uint64_t db = wgmma::desc_k_major_sw128(S.ab_b(c.stage));
        wgmma::fence_operands(acc);
        wgmma::fence();
#pragma unroll
        for (int k = 0; k < BK / 16; ++k)  // 16 bf16 = 32 B per k-step: +2 in descriptor units
          wgmma::mma_m64n128k16_bf16(acc, da + 2 * k, db + 2 * k, 1);
        wgmma::commit_group();
        wgmma::wait_group<0>();
        wgmma::fence_operands(acc);
        if (lane == 0) pipe.consumer_release(c);  // one arrival per consumer warp and CTA
      }
      // Epilogue: registers -> bf16 tile in smem -> TMA store (clipped at the edges).
      if (threadIdx.x == 128) tma::wait_group_read<0>();  // the last store has read the tile
      consumers_sync();
      uint32_t* ctile = static_cast<uint32_t*>(S.c());
      const int row0 = cw * 64 + wq * 16 + lane / 4;
#pragma unroll
      for (int j = 0; j < 16; ++j) {  // 8-column blocks; fragment as mma.m16n8 per block
        const int col = 8 * j + 2 * (lane % 4);
        __nv_bfloat162 lo = __floats2bfloat162_rn(acc[4 * j + 0], acc[4 * j + 1]);
        __nv_bfloat162 hi = __floats2bfloat162_rn(acc[4 * j + 2], acc[4 * j + 3]);
        ctile[(row0 * BN + col) / 2] = *reinterpret_cast<uint32_t*>(&lo);
        ctile[((row0 + 8) * BN + col) / 2] = *reinterpret_cast<uint32_t*>(&hi);
      }
      fence::proxy_async_shared_cta();
      consumers_sync();
      if (threadIdx.x == 128) {
        tma::store(&tc, S.c(), tn * BN, tm * BM);
        tma::commit_group();
      }
    }
    if (threadIdx.x == 128) tma::wait_group<0>();
  }
  cluster::sync();  // no CTA leaves while its partner may still multicast into it
}
