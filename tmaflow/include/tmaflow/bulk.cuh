// 1-D bulk copies (cp.async.bulk, no tensor map): sizes and addresses multiples of 16 B.
#pragma once
namespace tmaflow { namespace bulk {
// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes — global -> smem.
TMAFLOW_DEVICE void load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}
// ... .multicast::cluster — to every CTA in `cta_mask`.
TMAFLOW_DEVICE void load_multicast(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint16_t cta_mask) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;"
               :: "r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)), "h"(cta_mask) : "memory");
}
// cp.async.bulk.global.shared::cta.bulk_group — smem -> global.
TMAFLOW_DEVICE void store(void* dst, const void* src, uint32_t bytes) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
               :: "l"(dst), "r"(smem_u32(src)), "r"(bytes) : "memory");
}
// cp.reduce.async.bulk.global.shared::cta.bulk_group.add — global += smem, per element.
TMAFLOW_DEVICE void reduce_add(float* dst, const float* src, uint32_t bytes) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
               :: "l"(dst), "r"(smem_u32(src)), "r"(bytes) : "memory");
}
TMAFLOW_DEVICE void reduce_add(uint32_t* dst, const uint32_t* src, uint32_t bytes) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u32 [%0], [%1], %2;"
               :: "l"(dst), "r"(smem_u32(src)), "r"(bytes) : "memory");
}
TMAFLOW_DEVICE void reduce_add(int32_t* dst, const int32_t* src, uint32_t bytes) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.s32 [%0], [%1], %2;"
               :: "l"(dst), "r"(smem_u32(src)), "r"(bytes) : "memory");
}
// cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes — smem -> smem of
// another CTA of the cluster (dst and bar are cluster addresses from cluster::map_shared).
TMAFLOW_DEVICE void copy_to_cluster(uint32_t dst_cluster, const void* src, uint32_t bytes, uint32_t bar_cluster) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(dst_cluster), "r"(smem_u32(src)), "r"(bytes), "r"(bar_cluster) : "memory");
}
}}  // namespace tmaflow::bulk
