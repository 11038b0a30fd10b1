// The host-ordered halves of the collectives' signal protocol (tmaflow/distributed/protocol.py):
// one thread each, launched on a stream between the copies and GEMMs they order; and the
// reduce-scatter's sum of the ranks' partial products.
#include <cuda_bf16.h>
#include <tmaflow.cuh>
using namespace tmaflow;

// Set a signal in a peer's (or this GPU's) pad, after everything queued before it on the stream.
extern "C" __global__ void __launch_bounds__(32) signal_put(uint32_t* slot, uint32_t value) {
  if (threadIdx.x == 0) signal::put(slot, value);
}

// Wait until this GPU's pad slot equals `expected`, then reset it to 0 for the next call
// (graph replays repeat the same values). rank / peer / index name it in a DeadlockError.
extern "C" __global__ void __launch_bounds__(32)
signal_wait_reset(uint32_t* slot, uint32_t expected, int rank, int peer, uint32_t index) {
  if (threadIdx.x != 0) return;
  if (signal::wait_eq(slot, expected, {rank, peer, index}) == expected) signal::store_relaxed(slot, 0u);
}

// out = p0 + p1 + ... (the first `count` of up to 8 bf16 partials of n8 * 8 elements), summed in
// fp32 in that order from 0 (the same bits every call) and rounded once to bf16. A thread takes
// 8 elements (one 16-byte load a partial) at a time; the host checks 16-byte alignment.
extern "C" __global__ void __launch_bounds__(256)
sum_partials(uint4* out, const uint4* p0, const uint4* p1, const uint4* p2, const uint4* p3,
             const uint4* p4, const uint4* p5, const uint4* p6, const uint4* p7, uint32_t count,
             uint64_t n8) {
  const uint4* parts[8] = {p0, p1, p2, p3, p4, p5, p6, p7};
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += stride) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (j < int(count)) {
        const uint4 v = parts[j][i];
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[e]));
          acc[2 * e] += f.x;
          acc[2 * e + 1] += f.y;
        }
      }
    }
    uint32_t packed[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const __nv_bfloat162 b = __floats2bfloat162_rn(acc[2 * e], acc[2 * e + 1]);
      packed[e] = *reinterpret_cast<const uint32_t*>(&b);
    }
    out[i] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
}
