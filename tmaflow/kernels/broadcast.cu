// tmaflow-native example kernels. Shared-memory layouts come from tf.SharedLayout
// (tmaflow_layout.cuh), so no kernel spells a byte count, an arrival count or an offset.
#include <tmaflow.cuh>
#include "tmaflow_layout.cuh"
using namespace tmaflow;
namespace L = tmaflow_layout;

// Multicast broadcast: out_b = x_b * sum_k w_k over the k_tiles tiles of CTA b's group (w_k: the
// 32-row blocks of a tile of WROWS rows, WROWS in {32, 64}). Groups of group_size CTAs read
// group_tiles tiles of their own, cyclically. Every CTA needs every w tile; with a cluster,
// the group's leader loads each w tile once and multicasts it to all CTAs of the cluster.
// Warp 0 produces (TMA), warps 1..4 consume; release masks and counts come from tf.Pipeline.
#ifndef WROWS
#define WROWS 32
#endif
#ifndef SPARSE
#define SPARSE 1  // consumers read 1 / SPARSE of each tile (element block j when j % SPARSE == k % SPARSE)
#endif
extern "C" __global__ void __launch_bounds__(160, 1)
broadcast_scale(const __grid_constant__ CUtensorMap x, const __grid_constant__ CUtensorMap w,
                float* out, int k_tiles, int group_size, int group_tiles) {
  extern __shared__ __align__(1024) uint8_t smem[];
  L::Smem S(smem);
  auto pipe = S.w();
  auto xbar = S.xbar();
  constexpr int stages = L::w::stages;
  const uint32_t rank = cluster::rank();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    pipe.init();
    xbar.init();
  }
  cluster::sync();  // every CTA's barriers exist before any multicast signals them
  if (warp == 0) {
    if (lane == 0) {
      xbar.arrive_expect_tx();
      tma::load(S.xtile(), &x, xbar.bar, 0, blockIdx.x * 32);
      decltype(pipe)::Cursor c;
      for (int k = 0; k < k_tiles; ++k, c.advance()) {
        pipe.producer_acquire(c);
        pipe.producer_commit(c);
        if (L::w::tile0_leader(rank)) {
          // CTAs of one group (a multiple of the cluster) read the same tiles.
          const int row = ((blockIdx.x / group_size) * group_tiles + k % group_tiles) * WROWS;
          if (L::w::cluster_x > 1)
            tma::load_multicast(S.w_tile0(c.stage), &w, pipe.barrier(c), L::w::tile0_mask(rank), 0, row);
          else
            tma::load(S.w_tile0(c.stage), &w, pipe.barrier(c), 0, row);
        }
      }
    }
  } else {
    constexpr int per = 32 * 256 / 128;  // elements of the 32-row output per consumer thread
    const int ct = threadIdx.x - 32;
    float acc[per];
#pragma unroll
    for (int j = 0; j < per; ++j) acc[j] = 0.f;
    decltype(pipe)::Cursor c;
    for (int k = 0; k < k_tiles; ++k, c.advance()) {
      pipe.consumer_wait(c);
      const float* wt = static_cast<const float*>(S.w_tile0(c.stage));
#pragma unroll
      for (int rb = 0; rb < WROWS / 32; ++rb)
#pragma unroll
        for (int j = 0; j < per; ++j)
          if (SPARSE == 1 || j % SPARSE == k % SPARSE) acc[j] += wt[rb * 32 * 256 + ct + 128 * j];
      __syncwarp();
      if (lane == 0) pipe.consumer_release(c);
    }
    xbar.wait(0);
    const float* xt = static_cast<const float*>(S.xtile());
    float* o = out + size_t(blockIdx.x) * 32 * 256;
#pragma unroll
    for (int j = 0; j < per; ++j) o[ct + 128 * j] = acc[j] * xt[ct + 128 * j];
  }
  cluster::sync();  // no CTA leaves while a multicast may still target its smem
}

