// Thread-block clusters: ranks, the cluster barrier, distributed shared memory.
#pragma once
namespace tmaflow { namespace cluster {
// %cluster_ctarank — this CTA's rank in its cluster (x fastest).
TMAFLOW_DEVICE uint32_t rank() { uint32_t r; asm volatile("mov.u32 %0, %cluster_ctarank;" : "=r"(r)); return r; }
// %cluster_nctarank — CTAs per cluster.
TMAFLOW_DEVICE uint32_t size() { uint32_t r; asm volatile("mov.u32 %0, %cluster_nctarank;" : "=r"(r)); return r; }
TMAFLOW_DEVICE dim3 cta_id() {
  uint32_t x, y, z;
  asm volatile("mov.u32 %0, %cluster_ctaid.x;" : "=r"(x));
  asm volatile("mov.u32 %0, %cluster_ctaid.y;" : "=r"(y));
  asm volatile("mov.u32 %0, %cluster_ctaid.z;" : "=r"(z));
  return dim3(x, y, z);
}
TMAFLOW_DEVICE dim3 dims() {
  uint32_t x, y, z;
  asm volatile("mov.u32 %0, %cluster_nctaid.x;" : "=r"(x));
  asm volatile("mov.u32 %0, %cluster_nctaid.y;" : "=r"(y));
  asm volatile("mov.u32 %0, %cluster_nctaid.z;" : "=r"(z));
  return dim3(x, y, z);
}
TMAFLOW_DEVICE dim3 cluster_id() {
  uint32_t x, y, z;
  asm volatile("mov.u32 %0, %clusterid.x;" : "=r"(x));
  asm volatile("mov.u32 %0, %clusterid.y;" : "=r"(y));
  asm volatile("mov.u32 %0, %clusterid.z;" : "=r"(z));
  return dim3(x, y, z);
}
// barrier.cluster.arrive.release.aligned — every thread of every CTA arrives once per phase.
TMAFLOW_DEVICE void arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
// barrier.cluster.arrive.relaxed.aligned — arrive without ordering memory.
TMAFLOW_DEVICE void arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
// barrier.cluster.wait.acquire.aligned
TMAFLOW_DEVICE void wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
TMAFLOW_DEVICE void sync() {
  TMAFLOW_TRACE_BEGIN(kClusterSync);
  arrive();
  wait();
  TMAFLOW_TRACE_SPAN(kClusterSync, -1, 0, 0, 0);
}
// mapa.shared::cluster.u32 — the cluster-window address of `ptr` in CTA `cta_rank`.
TMAFLOW_DEVICE uint32_t map_shared(const void* ptr, uint32_t cta_rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_u32(ptr)), "r"(cta_rank));
  return r;
}
// mapa.u64 — a generic pointer to `ptr`'s twin in CTA `cta_rank` (plain loads/stores work).
template <typename T> TMAFLOW_DEVICE T* map(T* ptr, uint32_t cta_rank) {
  uint64_t r;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(r) : "l"(ptr), "r"(cta_rank));
  return reinterpret_cast<T*>(r);
}
// ld.shared::cluster.u32 / st.shared::cluster.u32 — DSMEM access by cluster address.
TMAFLOW_DEVICE uint32_t load_u32(uint32_t cluster_addr) {
  uint32_t v; asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(cluster_addr) : "memory"); return v;
}
TMAFLOW_DEVICE void store_u32(uint32_t cluster_addr, uint32_t v) {
  asm volatile("st.shared::cluster.u32 [%0], %1;" :: "r"(cluster_addr), "r"(v) : "memory");
}
// st.async.shared::cluster.mbarrier::complete_tx::bytes — store into a remote CTA's smem and
// complete 4/8/16 bytes on its mbarrier (both cluster addresses).
TMAFLOW_DEVICE void store_async_u32(uint32_t cluster_addr, uint32_t v, uint32_t bar_cluster) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [%0], %1, [%2];"
               :: "r"(cluster_addr), "r"(v), "r"(bar_cluster) : "memory");
}
TMAFLOW_DEVICE void store_async_v4(uint32_t cluster_addr, uint4 v, uint32_t bar_cluster) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];"
               :: "r"(cluster_addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar_cluster) : "memory");
}
}}  // namespace tmaflow::cluster
