#pragma once
namespace tmaflow { namespace fence {
// fence.proxy.async.shared::cta — make generic-proxy smem writes (st.shared, mbarrier.init)
// visible to the async proxy (TMA) before a CTA barrier.
TMAFLOW_DEVICE void proxy_async_shared_cta() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// fence.proxy.async — all state spaces.
TMAFLOW_DEVICE void proxy_async() { asm volatile("fence.proxy.async;" ::: "memory"); }
// fence.mbarrier_init.release.cluster — publish mbarrier.init to the cluster (pair with a
// cluster barrier before another CTA signals the barrier).
TMAFLOW_DEVICE void mbarrier_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// fence.proxy.tensormap::generic.acquire.gpu — a tensor map modified in global memory.
TMAFLOW_DEVICE void tensormap_acquire(const void* map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" :: "l"(map) : "memory");
}
// fence.acq_rel.cluster
TMAFLOW_DEVICE void acq_rel_cluster() { asm volatile("fence.acq_rel.cluster;" ::: "memory"); }
}}  // namespace tmaflow::fence
