// A pipeline over K tiles of (32 x 64) fp32, warp-specialised (warp 0 produces, warp 1
// consumes) or UNIFIED (every thread consumes; thread 0 also produces, as cuda::pipeline's
// unified form), optionally multicast across a cluster. Bugs can be planted through defines
// for the watchdog tests. With none it is correct: out[b, t] are partial sums of all tiles.
#include <tmaflow.cuh>
#include "tmaflow_layout.cuh"
using namespace tmaflow;
namespace L = tmaflow_layout;

template <typename P>
TMAFLOW_DEVICE void produce(const P& pipe, L::Smem& S, const CUtensorMap* in, uint32_t rank,
                            typename P::Cursor& c, int k) {
#if defined(BUG_PARITY)
  // waits for the phase that has not happened yet instead of the one that has
  mbarrier::wait(pipe.empty + c.stage, c.phase, debug::Site{"p.empty", int32_t(c.stage), 0});
#elif defined(BUG_REUSE)
  // refills the stage without waiting for its consumers to release it
#else
  pipe.producer_acquire(c);
#endif
#if defined(BUG_DOUBLE_TX)
  mbarrier::arrive_expect_tx(pipe.barrier(c), 2 * L::p::tx_bytes);
#elif defined(BUG_SHORT_TX)
  mbarrier::arrive_expect_tx(pipe.barrier(c), L::p::tx_bytes / 2);
#else
  pipe.producer_commit(c);
#endif
  if (L::p::tile0_leader(rank)) {
    uint16_t mask = L::p::tile0_mask(rank);
#if defined(BUG_MASK)
    mask &= ~uint16_t(1u << (L::p::cluster_x - 1));  // the last CTA never receives data
#endif
    if (L::p::cluster_x > 1)
      tma::load_multicast(S.p_tile0(c.stage), in, pipe.barrier(c), mask, 0, k * 32);
    else
      tma::load(S.p_tile0(c.stage), in, pipe.barrier(c), 0, k * 32);
  }
  c.advance();
}

extern "C" __global__ void __launch_bounds__(64)
planted(const __grid_constant__ CUtensorMap in, float* out, int k_tiles) {
  extern __shared__ __align__(1024) uint8_t smem[];
  L::Smem S(smem);
  auto pipe = S.p();
  using Cursor = decltype(pipe)::Cursor;
  constexpr int stages = L::p::stages;
  const uint32_t rank = cluster::rank();
  const int t = threadIdx.x;
  if (t == 0) pipe.init();
  Cursor early;
#if defined(BUG_EARLY_MULTICAST)
  // multicasts tile 0 before the cluster sync that publishes the peers' barrier init
  if (t == 0) produce(pipe, S, &in, rank, early, 0);
  constexpr int first_k = 1;
#else
  constexpr int first_k = 0;
#endif
  cluster::sync();
  float acc = 0.f;
#if defined(UNIFIED)
  Cursor prod, cons;
  if (t == 0)
    for (int k = 0; k < stages && k < k_tiles; ++k) produce(pipe, S, &in, rank, prod, k);
  for (int k = 0; k < k_tiles; ++k, cons.advance()) {
    pipe.consumer_wait(cons);
    const float* tile = static_cast<const float*>(S.p_tile0(cons.stage));
    for (int j = t; j < 32 * 64; j += 64) acc += tile[j];
#if defined(BUG_MISSING_ARRIVE)
    if (k < 1 || t != 5)
#endif
    pipe.consumer_release(cons);
#if defined(BUG_NO_COMMIT)
    if (k == 0) continue;
#endif
    if (t == 0 && k + stages < k_tiles) produce(pipe, S, &in, rank, prod, k + stages);
  }
  out[blockIdx.x * 64 + t] = acc;
#else
  if (t < 32) {
    if (t == 0) {
      Cursor c = early;
      for (int k = first_k; k < k_tiles; ++k) {
#if defined(BUG_NO_COMMIT)
        if (k == 1) break;  // the producer stops committing
#endif
        produce(pipe, S, &in, rank, c, k);
      }
    }
    out[blockIdx.x * 64 + t] = 0.f;
  } else {
    Cursor c;
    for (int k = 0; k < k_tiles; ++k, c.advance()) {
      pipe.consumer_wait(c);
      const float* tile = static_cast<const float*>(S.p_tile0(c.stage));
      for (int j = t - 32; j < 32 * 64; j += 32) acc += tile[j];
      __syncwarp();
#if defined(BUG_MISSING_ARRIVE)
      if (k < 1)
#endif
      if (t == 32) pipe.consumer_release(c);
    }
    out[blockIdx.x * 64 + t] = acc;
  }
#endif
#if !defined(BUG_NO_FINAL_SYNC)
  cluster::sync();  // no CTA leaves while a multicast may still target it
#endif
}

// A store through a wild address for the fault tests: out + offset lies far outside any
// allocation, so the kernel faults with CUDA_ERROR_ILLEGAL_ADDRESS and the context dies (the
// tests run it in a subprocess). offset 0 stores 1.0 into out[0..blockDim.x).
extern "C" __global__ void wild_store(float* out, unsigned long long offset) {
  out[offset + threadIdx.x] = 1.f;
}
