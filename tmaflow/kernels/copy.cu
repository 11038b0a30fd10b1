// tmaflow-native example kernels. Shared-memory layouts come from tf.SharedLayout
// (tmaflow_layout.cuh), so no kernel spells a byte count, an arrival count or an offset.
#include <tmaflow.cuh>
#include "tmaflow_layout.cuh"
using namespace tmaflow;
namespace L = tmaflow_layout;

#ifndef BOX_X
#define BOX_X 256
#endif
#ifndef BOX_Y
#define BOX_Y 32
#endif

// Persistent multi-stage tile copy: TMA load -> TMA store from the same stage. One thread
// drives it; a stage is refilled once the store that read it has finished reading, with up
// to STORES stores left in flight (the rest of the stages hold loads).
#ifndef STORES
#define STORES 1
#endif
extern "C" __global__ void __launch_bounds__(32, 1)
tile_copy(const __grid_constant__ CUtensorMap src, const __grid_constant__ CUtensorMap dst,
          int tiles_x, int tiles_y) {
  extern __shared__ __align__(1024) uint8_t smem[];
  L::Smem S(smem);
  auto pipe = S.tiles();
  constexpr int stages = L::tiles::stages;
  if (threadIdx.x != 0) return;
  tma::prefetch_descriptor(&src);
  tma::prefetch_descriptor(&dst);
  pipe.init();
  griddep::wait();               // under PDL: the previous kernel's writes are visible
  griddep::launch_dependents();  // and the next one may start its prologue
#if defined(EVICT_FIRST)
  const uint64_t policy = tma::make_policy_evict_first();  // streamed once: don't keep it in L2
#endif
  const int total = tiles_x * tiles_y;
  const int count = persistent_count(total);
  auto issue_load = [&](int i) {
    int t = blockIdx.x + i * gridDim.x, s = i % stages;
    pipe.producer_commit({uint32_t(s), 0});
#if defined(EVICT_FIRST)
    tma::load_hint(S.tiles_tile0(s), &src, pipe.full + s, policy, (t % tiles_x) * BOX_X, (t / tiles_x) * BOX_Y);
#else
    tma::load(S.tiles_tile0(s), &src, pipe.full + s, (t % tiles_x) * BOX_X, (t / tiles_x) * BOX_Y);
#endif
  };
  for (int i = 0; i < stages && i < count; ++i) issue_load(i);
  for (int i = 0; i < count; ++i) {
    int t = blockIdx.x + i * gridDim.x, s = i % stages;
    mbarrier::wait(pipe.full + s, (i / stages) & 1, debug::Site{"tiles.full", s, L::tiles::tx_bytes});
#if defined(EVICT_FIRST)
    tma::store_hint(&dst, S.tiles_tile0(s), policy, (t % tiles_x) * BOX_X, (t / tiles_x) * BOX_Y);
#else
    tma::store(&dst, S.tiles_tile0(s), (t % tiles_x) * BOX_X, (t / tiles_x) * BOX_Y);
#endif
    tma::commit_group();
    if (i >= STORES && i - STORES + stages < count) {
      tma::wait_group_read<STORES>();  // the store of tile i - STORES has read its stage
      issue_load(i - STORES + stages);
    }
  }
  tma::wait_group<0>();
}

