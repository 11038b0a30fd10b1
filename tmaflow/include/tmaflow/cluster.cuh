// Thread-block clusters: ranks, the cluster barrier, distributed shared memory.
#pragma once
namespace tmaflow { namespace cluster {
// This CTA's rank in its cluster (x fastest): the bit numbers of multicast and release masks.
// ptx: mov.u32 %cluster_ctarank
// who: any thread
// order: none
TMAFLOW_DEVICE uint32_t rank() { uint32_t r; asm volatile("mov.u32 %0, %cluster_ctarank;" : "=r"(r)); return r; }
// CTAs per cluster (1 without one).
// ptx: mov.u32 %cluster_nctarank
// who: any thread
// order: none
TMAFLOW_DEVICE uint32_t size() { uint32_t r; asm volatile("mov.u32 %0, %cluster_nctarank;" : "=r"(r)); return r; }
// This CTA's (x, y, z) position in its cluster.
// ptx: mov.u32 %cluster_ctaid.{x,y,z}
// who: any thread
// order: none
TMAFLOW_DEVICE dim3 cta_id() {
  uint32_t x, y, z;
  asm volatile("mov.u32 %0, %cluster_ctaid.x;" : "=r"(x));
  asm volatile("mov.u32 %0, %cluster_ctaid.y;" : "=r"(y));
  asm volatile("mov.u32 %0, %cluster_ctaid.z;" : "=r"(z));
  return dim3(x, y, z);
}
// The cluster's shape in CTAs.
// ptx: mov.u32 %cluster_nctaid.{x,y,z}
// who: any thread
// order: none
TMAFLOW_DEVICE dim3 dims() {
  uint32_t x, y, z;
  asm volatile("mov.u32 %0, %cluster_nctaid.x;" : "=r"(x));
  asm volatile("mov.u32 %0, %cluster_nctaid.y;" : "=r"(y));
  asm volatile("mov.u32 %0, %cluster_nctaid.z;" : "=r"(z));
  return dim3(x, y, z);
}
// This cluster's (x, y, z) position in the grid of clusters.
// ptx: mov.u32 %clusterid.{x,y,z}
// who: any thread
// order: none
TMAFLOW_DEVICE dim3 cluster_id() {
  uint32_t x, y, z;
  asm volatile("mov.u32 %0, %clusterid.x;" : "=r"(x));
  asm volatile("mov.u32 %0, %clusterid.y;" : "=r"(y));
  asm volatile("mov.u32 %0, %clusterid.z;" : "=r"(z));
  return dim3(x, y, z);
}
// Arrive on the cluster barrier (split form of sync(): do other work, then wait()).
// ptx: barrier.cluster.arrive.release.aligned
// who: every thread of every CTA of the cluster, once per phase (.aligned: warp-uniform)
// order: release at cluster scope: this thread's writes are visible to every thread of the
// cluster after its wait().
TMAFLOW_DEVICE void arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
// Arrive on the cluster barrier without ordering memory.
// ptx: barrier.cluster.arrive.relaxed.aligned
// who: every thread of every CTA of the cluster, once per phase
// order: none (pair with fences where data must be published).
TMAFLOW_DEVICE void arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
// Wait until every thread of the cluster arrived in this phase.
// ptx: barrier.cluster.wait.acquire.aligned
// who: every thread that arrived
// order: acquire at cluster scope.
TMAFLOW_DEVICE void wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
// arrive() + wait(): the cluster-wide __syncthreads. After Pipeline::init (so peers' barriers
// exist before a multicast or remote arrival reaches them) and before a CTA exits while
// multicasts or DSMEM accesses may still target it. Without a cluster, a CTA barrier.
// ptx: barrier.cluster.arrive.release.aligned + barrier.cluster.wait.acquire.aligned
// who: every thread of every CTA of the cluster
// order: release + acquire at cluster scope.
TMAFLOW_DEVICE void sync() {
  TMAFLOW_TRACE_BEGIN(kClusterSync);
  arrive();
  wait();
  TMAFLOW_TRACE_SPAN(kClusterSync, -1, 0, 0, 0);
}
// sync() after Pipeline::init where nothing but the barriers' initialisation must be seen by
// the peers: init's fence.mbarrier_init.release.cluster publishes the inits, so the arrival is
// relaxed (the release form is a MEMBAR.ALL.GPU before it: 4-6% of a 10 us GEMM on an H100).
// Traced as sync() (the flight recorder checks no multicast precedes it).
// ptx: barrier.cluster.arrive.relaxed.aligned + barrier.cluster.wait.acquire.aligned
// who: every thread of every CTA of the cluster, after fence.mbarrier_init
// order: the inits before every peer's wait; no other memory ordering.
TMAFLOW_DEVICE void sync_after_init() {
  TMAFLOW_TRACE_BEGIN(kClusterSync);
  arrive_relaxed();
  wait();
  TMAFLOW_TRACE_SPAN(kClusterSync, -1, 0, 0, 0);
}
// The shared::cluster address of `ptr`'s twin (same offset) in CTA `cta_rank`.
// ptx: mapa.shared::cluster.u32
// who: any thread
// order: none (an address computation)
TMAFLOW_DEVICE uint32_t map_shared(const void* ptr, uint32_t cta_rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_u32(ptr)), "r"(cta_rank));
  return r;
}
// A generic pointer to `ptr`'s twin in CTA `cta_rank`: plain loads and stores reach it (DSMEM).
// ptx: mapa.u64
// who: any thread
// order: none itself; the twin's CTA must be running (cluster::sync before the first access
// and before either CTA exits).
template <typename T> TMAFLOW_DEVICE T* map(T* ptr, uint32_t cta_rank) {
  uint64_t r;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(r) : "l"(ptr), "r"(cta_rank));
  return reinterpret_cast<T*>(r);
}
// Load 4 bytes of distributed shared memory by cluster address (map_shared).
// ptx: ld.shared::cluster.u32
// who: any thread
// order: weak; synchronise with the writer (cluster::sync, or a barrier released at cluster scope).
TMAFLOW_DEVICE uint32_t load_u32(uint32_t cluster_addr) {
  uint32_t v; asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(cluster_addr) : "memory"); return v;
}
// ditto: store 4 bytes.
// ptx: st.shared::cluster.u32
TMAFLOW_DEVICE void store_u32(uint32_t cluster_addr, uint32_t v) {
  asm volatile("st.shared::cluster.u32 [%0], %1;" :: "r"(cluster_addr), "r"(v) : "memory");
}
// Store 4 bytes into a remote CTA's shared memory and complete them on its mbarrier (both
// cluster addresses, from map_shared).
// ptx: st.async.shared::cluster.mbarrier::complete_tx::bytes.u32
// who: any thread
// order: the receiver announces the bytes (expect_tx) and waits on its barrier to read them.
TMAFLOW_DEVICE void store_async_u32(uint32_t cluster_addr, uint32_t v, uint32_t bar_cluster) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [%0], %1, [%2];"
               :: "r"(cluster_addr), "r"(v), "r"(bar_cluster) : "memory");
}
// ditto: 16 bytes.
// ptx: st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32
TMAFLOW_DEVICE void store_async_v4(uint32_t cluster_addr, uint4 v, uint32_t bar_cluster) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];"
               :: "r"(cluster_addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar_cluster) : "memory");
}
}}  // namespace tmaflow::cluster
