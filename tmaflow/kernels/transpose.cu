// tmaflow-native example kernels. Shared-memory layouts come from tf.SharedLayout
// (tmaflow_layout.cuh), so no kernel spells a byte count, an arrival count or an offset.
#include <tmaflow.cuh>
#include "tmaflow_layout.cuh"
using namespace tmaflow;
namespace L = tmaflow_layout;

// Transpose through 128B-swizzled smem: a (128 x 32) fp32 input box is read column-wise
// (the swizzle makes it conflict-free) into four (32 x 32) output boxes, stored by TMA.
TMAFLOW_DEVICE uint32_t swz128(uint32_t off) { return off ^ (((off >> 7) & 7u) << 4); }

extern "C" __global__ void __launch_bounds__(256, 1)
transpose(const __grid_constant__ CUtensorMap in, const __grid_constant__ CUtensorMap out,
          int tiles_x, int tiles_y) {
  extern __shared__ __align__(1024) uint8_t smem[];
  L::Smem S(smem);
  auto pipe = S.tin();
  constexpr int stages = L::tin::stages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
  const int total = tiles_x * tiles_y;
  const int count = persistent_count(total);
  auto origin = [&](int i, int& c0, int& r0) {
    int t = blockIdx.x + i * gridDim.x;
    c0 = (t % tiles_x) * 32;
    r0 = (t / tiles_x) * 128;
  };
  auto issue_load = [&](int i) {
    int c0, r0, s = i % stages;
    origin(i, c0, r0);
    pipe.producer_commit({uint32_t(s), 0});
    tma::load(S.tin_tile0(s), &in, pipe.full + s, c0, r0);
  };
  if (threadIdx.x == 0) {
    pipe.init();
    for (int i = 0; i < stages && i < count; ++i) issue_load(i);
  }
  __syncthreads();
  for (int i = 0; i < count; ++i) {
    int s = i % stages, ob = i % 2, c0, r0;
    origin(i, c0, r0);
    mbarrier::wait(pipe.full + s, (i / stages) & 1, debug::Site{"tin.full", s, L::tin::tx_bytes});
    if (threadIdx.x == 0) tma::wait_group_read<1>();  // output buffer `ob` was read by its store
    __syncthreads();
    const uint8_t* tin = static_cast<const uint8_t*>(S.tin_tile0(s));
    uint8_t* tout = static_cast<uint8_t*>(S.tout()) + ob * 16384;
    for (int j = warp; j < 128; j += nwarps) {
      int r = (j % 16) * 8 + lane % 8, c = (j / 16) * 4 + lane / 8;
      float v = *reinterpret_cast<const float*>(tin + swz128(r * 128 + c * 4));
      uint8_t* box = tout + (r / 32) * 4096;
      *reinterpret_cast<float*>(box + swz128(c * 128 + (r % 32) * 4)) = v;
    }
    fence::proxy_async_shared_cta();
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int k = 0; k < 4; ++k) tma::store(&out, tout + k * 4096, r0 + 32 * k, c0);
      tma::commit_group();
      if (i + stages < count) issue_load(i + stages);  // every thread is past stage s
    }
  }
  if (threadIdx.x == 0) tma::wait_group<0>();
}

