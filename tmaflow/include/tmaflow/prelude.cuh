// Works under NVRTC (no system headers): fixed-width ints and CUtensorMap.
#pragma once
#include <cuda/std/cstdint>
#include <cuda.h>  // tmaflow's shim under NVRTC: CUtensorMap

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900)
#error "tmaflow device code needs sm_90 or newer (TMA, mbarrier try_wait, clusters)"
#endif

#define TMAFLOW_DEVICE __device__ __forceinline__

// The caller's file:line as default arguments (for the watchdog's report). Older NVRTCs
// (12.6) lack the builtins; the report then says so instead of naming a line.
#if defined(__has_builtin)
#if __has_builtin(__builtin_LINE) && __has_builtin(__builtin_FILE)
#define TMAFLOW_HAS_SOURCE_LOCATION 1
#endif
#endif
#if defined(TMAFLOW_HAS_SOURCE_LOCATION)
#define TMAFLOW_CALLER_LINE __builtin_LINE()
#define TMAFLOW_CALLER_FILE __builtin_FILE()
#else
#define TMAFLOW_CALLER_LINE 0u
#define TMAFLOW_CALLER_FILE "(file:line needs NVRTC with __builtin_LINE)"
#endif

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

// Persistent grids deal items blockIdx.x, blockIdx.x + gridDim.x, ...: how many of `total`
// items this block gets.
TMAFLOW_DEVICE int persistent_count(int total) {
  return int(blockIdx.x) < total ? (total - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x) : 0;
}
}  // namespace tmaflow
