// A two-tile pipeline (warp-specialised producer/consumer) with bugs that can be planted
// through defines, for the watchdog tests. With no define it is correct: out = in.
#include <tmaflow.cuh>
#include "tmaflow_layout.cuh"
using namespace tmaflow;
namespace L = tmaflow_layout;

extern "C" __global__ void __launch_bounds__(64)
planted(const __grid_constant__ CUtensorMap in, float* out, int k_tiles) {
  extern __shared__ __align__(1024) uint8_t smem[];
  L::Smem S(smem);
  auto pipe = S.p();
  const uint32_t rank = cluster::rank();
  if (threadIdx.x == 0) pipe.init();
  cluster::sync();
  if (threadIdx.x < 32) {
    if (threadIdx.x == 0) {
      decltype(pipe)::Cursor c;
      for (int k = 0; k < k_tiles; ++k, c.advance()) {
#if defined(BUG_PARITY)
        // waits for the phase that has not happened yet instead of the one that has
        mbarrier::wait(pipe.empty + c.stage, c.phase, debug::Site{"p.empty", int32_t(c.stage), 0});
#else
        pipe.producer_acquire(c);
#endif
#if defined(BUG_NO_COMMIT)
        if (k == 1) break;  // the producer stops committing
#endif
#if defined(BUG_DOUBLE_TX)
        mbarrier::arrive_expect_tx(pipe.barrier(c), 2 * L::p::tx_bytes);
#else
        pipe.producer_commit(c);
#endif
        if (L::p::tile0_leader(rank)) {
          uint16_t mask = L::p::tile0_mask(rank);
#if defined(BUG_MASK)
          mask &= ~uint16_t(1u << (L::p::cluster_x - 1));  // the last CTA never receives data
#endif
          if (L::p::cluster_x > 1)
            tma::load_multicast(S.p_tile0(c.stage), &in, pipe.barrier(c), mask, 0, k * 32);
          else
            tma::load(S.p_tile0(c.stage), &in, pipe.barrier(c), 0, k * 32);
        }
      }
    }
  } else {
    decltype(pipe)::Cursor c;
    const int t = threadIdx.x - 32;
    float acc = 0.f;
    for (int k = 0; k < k_tiles; ++k, c.advance()) {
      pipe.consumer_wait(c);
      const float* tile = static_cast<const float*>(S.p_tile0(c.stage));
      for (int j = t; j < 32 * 64; j += 32) acc += tile[j];
      __syncwarp();
#if defined(BUG_MISSING_ARRIVE)
      if (k < 1)
#endif
      if (t == 0) pipe.consumer_release(c);
    }
    float total = acc;
    for (int o = 16; o; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    if (t == 0) out[blockIdx.x] = total;
  }
  cluster::sync();
}
