// Works under NVRTC (no system headers): fixed-width ints and CUtensorMap.
#pragma once
#include <cuda/std/cstdint>
#include <cuda.h>  // tmaflow's shim under NVRTC: CUtensorMap

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900)
#error "tmaflow device code needs sm_90 or newer (TMA, mbarrier try_wait, clusters)"
#endif

// `__device__ __forceinline__`: every library function is inlined into its caller (no call
// after setmaxnreg, no ABI cost). Use it for your own device helpers too.
#define TMAFLOW_DEVICE __device__ __forceinline__

// The caller's file:line as default arguments (for the watchdog's report). Older NVRTCs
// (12.6) lack the builtins; the report then says so instead of naming a line.
#if defined(__has_builtin)
#if __has_builtin(__builtin_LINE) && __has_builtin(__builtin_FILE)
// Defined when NVRTC has __builtin_LINE / __builtin_FILE (NVRTC 12.6 lacks them).
#define TMAFLOW_HAS_SOURCE_LOCATION 1
#endif
#endif
#if defined(TMAFLOW_HAS_SOURCE_LOCATION)
// Default argument of every waiting function: the line of the kernel's call, not the header's.
#define TMAFLOW_CALLER_LINE __builtin_LINE()
// Default argument of every waiting function: the file of the kernel's call.
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

// 32-bit shared-window address of a generic pointer into shared memory (what every PTX
// operand in .shared takes).
// ptx: cvta.to.shared.u64 (from __cvta_generic_to_shared), truncated to 32 bits
// who: any thread
// order: none (an address computation)
TMAFLOW_DEVICE uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// Persistent grids deal items blockIdx.x, blockIdx.x + gridDim.x, ...: how many of `total`
// items this block gets.
// ptx: none (integer arithmetic on %ctaid.x and %nctaid.x)
// who: any thread (the same value in every thread of the block)
// order: none
TMAFLOW_DEVICE int persistent_count(int total) {
  return int(blockIdx.x) < total ? (total - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x) : 0;
}
}  // namespace tmaflow
