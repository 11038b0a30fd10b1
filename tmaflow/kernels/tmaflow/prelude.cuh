// Works under NVRTC (no system headers): fixed-width ints and CUtensorMap.
#pragma once
#include <cuda/std/cstdint>
#include <cuda.h>  // tmaflow's shim under NVRTC: CUtensorMap

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900)
#error "tmaflow device code needs sm_90 or newer (TMA, mbarrier try_wait, clusters)"
#endif

#define TMAFLOW_DEVICE __device__ __forceinline__

namespace tmaflow {
using cuda::std::int32_t;
using cuda::std::int64_t;
using cuda::std::uint16_t;
using cuda::std::uint32_t;
using cuda::std::uint64_t;
using cuda::std::uint8_t;

// 32-bit shared-window address of a generic pointer into shared memory.
TMAFLOW_DEVICE uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}
}  // namespace tmaflow
