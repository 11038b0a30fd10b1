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

// TMA reduce-add: block (tile, part) loads parts[part] at the tile and adds it into `out`
// with cp.reduce.async.bulk.tensor (global += smem), so out = out0 + sum(parts).
extern "C" __global__ void reduce_add(const __grid_constant__ CUtensorMap parts,
                                      const __grid_constant__ CUtensorMap out, int tiles_x) {
  extern __shared__ __align__(1024) uint8_t smem[];
  L::Smem S(smem);
  auto bar = S.loaded();
  if (threadIdx.x == 0) {
    bar.init();
    fence::proxy_async_shared_cta();
    int t = blockIdx.x, part = blockIdx.y;
    int x = (t % tiles_x) * BOX_X, y = (t / tiles_x) * BOX_Y;
    bar.arrive_expect_tx();
    tma::load(S.tile(), &parts, bar.bar, x, y, part);
    bar.wait(0);
    tma::reduce_add(&out, S.tile(), x, y);
    tma::commit_group();
    tma::wait_group<0>();
  }
}

