// Fences: ordering between the generic proxy (ordinary loads and stores), the async proxy
// (TMA, bulk copies, wgmma operands) and the tensor-map proxy, and across the cluster.
#pragma once
namespace tmaflow { namespace fence {
// Make this thread's generic-proxy shared-memory writes (st.shared, mbarrier.init) visible
// to the async proxy (TMA, bulk copies, wgmma reading smem).
// ptx: fence.proxy.async.shared::cta
// who: every thread that wrote (each fences its own writes)
// order: then a CTA barrier (or barrier arrival), then the async operation reads.
TMAFLOW_DEVICE void proxy_async_shared_cta() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// ditto: for writes to every state space (global included).
// ptx: fence.proxy.async
TMAFLOW_DEVICE void proxy_async() { asm volatile("fence.proxy.async;" ::: "memory"); }
// ditto: for global memory only: between acquiring a peer's signal (generic proxy) and TMA
// loads of the data it guards, and between a TMA store's completion (cp.async.bulk.wait_group 0)
// and the put that announces it to a peer.
// ptx: fence.proxy.async.global
TMAFLOW_DEVICE void proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }
// Publish this thread's mbarrier.inits to the cluster.
// ptx: fence.mbarrier_init.release.cluster
// who: the thread that initialised the barriers
// order: then cluster::sync() before another CTA arrives on or multicasts to the barriers.
TMAFLOW_DEVICE void mbarrier_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// Acquire a 128-byte tensor map that was modified in global memory (same as tensormap::acquire).
// ptx: fence.proxy.tensormap::generic.acquire.gpu [map], 128
// who: the thread that issues copies through the map
// order: pairs with the writer's tensormap::publish_warp (release.gpu).
TMAFLOW_DEVICE void tensormap_acquire(const void* map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" :: "l"(map) : "memory");
}
// A full acquire-release fence at cluster scope.
// ptx: fence.acq_rel.cluster
// who: any thread
// order: orders this thread's memory operations before and after it, cluster-wide.
TMAFLOW_DEVICE void acq_rel_cluster() { asm volatile("fence.acq_rel.cluster;" ::: "memory"); }
// A full acquire-release fence at system scope: orders this thread's accesses to peer GPUs'
// memory and pinned host memory (signal::put and wait carry their own release and acquire).
// ptx: fence.acq_rel.sys
// who: any thread
// order: orders this thread's memory operations before and after it, system-wide.
TMAFLOW_DEVICE void acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
// A sequentially consistent fence at system scope (what __threadfence_system compiles to).
// ptx: fence.sc.sys
// who: any thread
// order: as acq_rel_sys, plus one total order of all sc fences.
TMAFLOW_DEVICE void sc_sys() { asm volatile("fence.sc.sys;" ::: "memory"); }
}}  // namespace tmaflow::fence
