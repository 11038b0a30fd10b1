// 1-D bulk copies (cp.async.bulk, no tensor map): sizes and addresses multiples of 16 B.
#pragma once
namespace tmaflow { namespace bulk {
// Copy `bytes` from global `src` to shared `dst`, completing them on `bar`.
// ptx: cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes
// who: one thread
// order: as tma::load: announce the bytes on `bar` in the same phase, wait on `bar` to read.
TMAFLOW_DEVICE void load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}
// bulk::load into every CTA of `cta_mask` (same offsets, complete_tx on each one's `bar`).
// ptx: cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster
// who: one thread of one CTA of the group
// order: as tma::load_multicast.
TMAFLOW_DEVICE void load_multicast(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint16_t cta_mask) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;"
               :: "r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)), "h"(cta_mask) : "memory");
}
// Copy `bytes` from shared `src` to global `dst`.
// ptx: cp.async.bulk.global.shared::cta.bulk_group
// who: one thread
// order: as tma::store: fence::proxy_async_shared_cta + CTA barrier before, then
// tma::commit_group / wait_group_read / wait_group.
TMAFLOW_DEVICE void store(void* dst, const void* src, uint32_t bytes) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
               :: "l"(dst), "r"(smem_u32(src)), "r"(bytes) : "memory");
}
// global += smem, per float32 element, `bytes` of them (atomic per element).
// ptx: cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32
// who: one thread
// order: as bulk::store.
TMAFLOW_DEVICE void reduce_add(float* dst, const float* src, uint32_t bytes) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
               :: "l"(dst), "r"(smem_u32(src)), "r"(bytes) : "memory");
}
// ditto: for uint32 elements.
// ptx: cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u32
TMAFLOW_DEVICE void reduce_add(uint32_t* dst, const uint32_t* src, uint32_t bytes) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u32 [%0], [%1], %2;"
               :: "l"(dst), "r"(smem_u32(src)), "r"(bytes) : "memory");
}
// ditto: for int32 elements.
// ptx: cp.reduce.async.bulk.global.shared::cta.bulk_group.add.s32
TMAFLOW_DEVICE void reduce_add(int32_t* dst, const int32_t* src, uint32_t bytes) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.s32 [%0], [%1], %2;"
               :: "l"(dst), "r"(smem_u32(src)), "r"(bytes) : "memory");
}
// Copy `bytes` from this CTA's shared memory to another CTA of the cluster, completing them
// on that CTA's barrier (`dst_cluster` and `bar_cluster` are cluster::map_shared addresses).
// ptx: cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes
// who: one thread
// order: the writes to `src` need fence::proxy_async_shared_cta + a CTA barrier first; the
// receiver announces the bytes on its barrier and waits on it.
TMAFLOW_DEVICE void copy_to_cluster(uint32_t dst_cluster, const void* src, uint32_t bytes, uint32_t bar_cluster) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(dst_cluster), "r"(smem_u32(src)), "r"(bytes), "r"(bar_cluster) : "memory");
}
}}  // namespace tmaflow::bulk
