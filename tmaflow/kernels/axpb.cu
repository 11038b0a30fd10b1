// tmaflow-native example kernels. Shared-memory layouts come from tf.SharedLayout
// (tmaflow_layout.cuh), so no kernel spells a byte count, an arrival count or an offset.
#include <tmaflow.cuh>
using namespace tmaflow;

// Seed 002's pattern: LDGSTS (cp.async 16 B) double buffering, out = a * in + b, beside its
// TMA twin (1-D bulk copies completing on an mbarrier).
#ifndef CHUNK
#define CHUNK 4096
#endif
extern "C" __global__ void __launch_bounds__(256)
axpb_ldgsts(const float* in, float* out, float a, float b, long long n) {
  __shared__ __align__(128) float buf[2][CHUNK];
  const long long chunks = n / CHUNK;
  long long i = blockIdx.x;
  auto fetch = [&](long long chunk, int slot) {
    for (int e = threadIdx.x * 4; e < CHUNK; e += blockDim.x * 4)
      cp_async::copy16(&buf[slot][e], in + chunk * CHUNK + e);
    cp_async::commit();
  };
  if (i < chunks) fetch(i, 0);
  for (int slot = 0; i < chunks; i += gridDim.x, slot ^= 1) {
    if (i + gridDim.x < chunks) { fetch(i + gridDim.x, slot ^ 1); cp_async::wait<1>(); }
    else cp_async::wait<0>();
    __syncthreads();
    for (int e = threadIdx.x * 4; e < CHUNK; e += blockDim.x * 4) {
      float4 v = *reinterpret_cast<float4*>(&buf[slot][e]);
      v.x = a * v.x + b; v.y = a * v.y + b; v.z = a * v.z + b; v.w = a * v.w + b;
      *reinterpret_cast<float4*>(out + i * CHUNK + e) = v;
    }
    __syncthreads();
  }
}

extern "C" __global__ void __launch_bounds__(256)
axpb_tma(const float* in, float* out, float a, float b, long long n) {
  __shared__ __align__(128) float buf[2][CHUNK];
  __shared__ uint64_t bars[2];
  const long long chunks = n / CHUNK;
  long long i = blockIdx.x;
  if (threadIdx.x == 0) {
    mbarrier::init(&bars[0], 1);
    mbarrier::init(&bars[1], 1);
    fence::proxy_async_shared_cta();
  }
  __syncthreads();
  auto fetch = [&](long long chunk, int slot) {
    if (threadIdx.x == 0) {
      mbarrier::arrive_expect_tx(&bars[slot], CHUNK * 4);
      bulk::load(buf[slot], in + chunk * CHUNK, CHUNK * 4, &bars[slot]);
    }
  };
  if (i < chunks) fetch(i, 0);
  uint32_t phase[2] = {0, 0};
  for (int slot = 0; i < chunks; i += gridDim.x, slot ^= 1) {
    if (i + gridDim.x < chunks) fetch(i + gridDim.x, slot ^ 1);
    mbarrier::wait(&bars[slot], phase[slot]);
    phase[slot] ^= 1;
    for (int e = threadIdx.x * 4; e < CHUNK; e += blockDim.x * 4) {
      float4 v = *reinterpret_cast<float4*>(&buf[slot][e]);
      v.x = a * v.x + b; v.y = a * v.y + b; v.z = a * v.z + b; v.w = a * v.w + b;
      *reinterpret_cast<float4*>(out + i * CHUNK + e) = v;
    }
    __syncthreads();  // the slot is refilled next iteration
  }
}
