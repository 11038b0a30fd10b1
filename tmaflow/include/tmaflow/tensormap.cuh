// Device-side tensor maps (sm_90a): copy a map into shared memory, patch its fields, publish
// it to a 128-byte slot in global memory, and acquire the slot before a TMA copy uses it
// (DeepGEMM / CuTe grouped GEMMs do this per group). The smem copy must be 128-B aligned; a
// global slot 64-B aligned (tf.DescriptorWorkspace plans 128-B slots).
#pragma once
namespace tmaflow { namespace tensormap {
// One warp copies a 128-byte map (a __grid_constant__ parameter or a global slot) to smem,
// four bytes a lane.
// ptx: ld (param or global) + st.shared.u32 per lane, bar.warp.sync
// who: all 32 lanes of a warp, converged
// order: __syncwarp at the end: the copy is visible to the warp's replace_* calls.
TMAFLOW_DEVICE void load_warp(CUtensorMap* smem_map, const CUtensorMap* src) {
  const uint32_t lane = threadIdx.x & 31u;
  reinterpret_cast<uint32_t*>(smem_map)[lane] = reinterpret_cast<const uint32_t*>(src)[lane];
  __syncwarp();
}
// Patch the tensor's base address of the map in smem (16-B aligned; 128-B with interleave).
// ptx: tensormap.replace.tile.global_address.shared::cta.b1024.b64
// who: one thread (the patches of one map by one thread, or __syncwarp between lanes)
// order: __syncwarp before publish_warp.
TMAFLOW_DEVICE void replace_address(CUtensorMap* smem_map, const void* address) {
  asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;"
               :: "r"(smem_u32(smem_map)), "l"(reinterpret_cast<uint64_t>(address)) : "memory");
}
// Patch the extent of dimension Ord (0 = innermost), in elements.
// ptx: tensormap.replace.tile.global_dim.shared::cta.b1024.b32
// who: one thread
// order: __syncwarp before publish_warp.
template <int Ord> TMAFLOW_DEVICE void replace_dim(CUtensorMap* smem_map, uint32_t extent) {
  asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], %1, %2;"
               :: "r"(smem_u32(smem_map)), "n"(Ord), "r"(extent) : "memory");
}
// Patch the stride in bytes of dimension Ord + 1 (a multiple of 16; the innermost dimension
// has none).
// ptx: tensormap.replace.tile.global_stride.shared::cta.b1024.b64
// who: one thread
// order: __syncwarp before publish_warp.
template <int Ord> TMAFLOW_DEVICE void replace_stride(CUtensorMap* smem_map, uint64_t bytes) {
  asm volatile("tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [%0], %1, %2;"
               :: "r"(smem_u32(smem_map)), "n"(Ord), "l"(bytes) : "memory");
}
// Patch the box extent of dimension Ord.
// ptx: tensormap.replace.tile.box_dim.shared::cta.b1024.b32
// who: one thread
// order: __syncwarp before publish_warp.
template <int Ord> TMAFLOW_DEVICE void replace_box(CUtensorMap* smem_map, uint32_t extent) {
  asm volatile("tensormap.replace.tile.box_dim.shared::cta.b1024.b32 [%0], %1, %2;"
               :: "r"(smem_u32(smem_map)), "n"(Ord), "r"(extent) : "memory");
}
// Patch the element stride (traversal step) of dimension Ord.
// ptx: tensormap.replace.tile.element_stride.shared::cta.b1024.b32
// who: one thread
// order: __syncwarp before publish_warp.
template <int Ord> TMAFLOW_DEVICE void replace_element_stride(CUtensorMap* smem_map, uint32_t step) {
  asm volatile("tensormap.replace.tile.element_stride.shared::cta.b1024.b32 [%0], %1, %2;"
               :: "r"(smem_u32(smem_map)), "n"(Ord), "r"(step) : "memory");
}
// A whole warp copies the patched map to its global slot and releases it to the tensor-map
// proxy.
// ptx: tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned
// who: all 32 lanes of a warp, converged
// order: the patches must be visible to the warp first (__syncwarp after them); readers
// acquire the slot with tensormap::acquire.
TMAFLOW_DEVICE void publish_warp(CUtensorMap* slot, const CUtensorMap* smem_map) {
  asm volatile("tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned"
               " [%0], [%1], 128;" :: "l"(slot), "r"(smem_u32(smem_map)) : "memory");
  TMAFLOW_TRACE_EVENT(kTensormapPublish, -1, 0, static_cast<uint32_t>(reinterpret_cast<uint64_t>(slot)));
}
// Acquire a slot before the first TMA copy through it that was published after this kernel
// (or this grid) started; once per slot and publication.
// ptx: fence.proxy.tensormap::generic.acquire.gpu [slot], 128
// who: the thread that issues the copies
// order: pairs with publish_warp's release.gpu.
TMAFLOW_DEVICE void acquire(const CUtensorMap* slot) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" :: "l"(slot) : "memory");
  TMAFLOW_TRACE_EVENT(kTensormapAcquire, -1, 0, static_cast<uint32_t>(reinterpret_cast<uint64_t>(slot)));
}
}}  // namespace tmaflow::tensormap
