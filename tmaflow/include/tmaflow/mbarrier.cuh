// mbarrier: 8-byte shared objects tracking arrivals and transaction bytes per phase.
#pragma once
namespace tmaflow { namespace mbarrier {
// Initialise the barrier at `bar` (8 bytes of shared memory, 8-byte aligned): phase 0,
// `arrivals` pending arrivals per phase (1 to 2^20-1), a transaction count of 0.
// ptx: mbarrier.init.shared::cta.b64
// who: one thread, before any other thread or copy uses the barrier
// order: a generic-proxy write: follow with fence::proxy_async_shared_cta() (TMA in this CTA
// completes on it) or fence::mbarrier_init() (other CTAs of the cluster signal it), then a CTA
// barrier (__syncthreads) or cluster::sync() before anyone arrives, waits or copies.
TMAFLOW_DEVICE void init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_u32(bar)), "r"(arrivals) : "memory");
}
// Invalidate the barrier: required before re-initialising it or reusing its 8 bytes.
// ptx: mbarrier.inval.shared::cta.b64
// who: one thread
// order: after every arrival, wait and copy on the barrier (a CTA or cluster barrier first).
TMAFLOW_DEVICE void inval(uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" :: "r"(smem_u32(bar)) : "memory");
}
// One arrival on the current phase; returns the state token (tmaflow waits by parity instead).
// The phase completes when its pending arrivals reach zero and its transaction count is zero.
// ptx: mbarrier.arrive.shared::cta.b64
// who: any thread; every call is one arrival (32 lanes calling it are 32 arrivals)
// order: release at CTA scope: this thread's earlier shared-memory reads and writes happen
// before a waiter that sees the phase complete. Debug builds skip it after a watchdog timeout.
TMAFLOW_DEVICE uint64_t arrive(uint64_t* bar) {
  TMAFLOW_ASYNC_GUARD_RET(0);
  uint64_t state;
  asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];" : "=l"(state) : "r"(smem_u32(bar)) : "memory");
  TMAFLOW_TRACE_EVENT(kArrive, -1, TMAFLOW_TRACE_BAR(bar), __popc(__activemask()));  // arrivals
  return state;
}
// Add `bytes` to the phase's expected transaction count, then arrive once: the phase completes
// once the other arrivals happened and `bytes` landed (complete_tx of TMA and bulk copies).
// ptx: mbarrier.arrive.expect_tx.shared::cta.b64
// who: one thread per phase: the thread that announces the copies of that phase
// order: in the same phase as the copies it announces, before or after issuing them (the
// transaction count may go negative while the arrival is pending); tmaflow announces first.
TMAFLOW_DEVICE void arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem_u32(bar)), "r"(bytes) : "memory");
  TMAFLOW_TRACE_EVENT(kArriveExpectTx, -1, TMAFLOW_TRACE_BAR(bar), bytes);
}
// Add `bytes` to the expected transaction count without arriving (the arrival comes apart).
// ptx: mbarrier.expect_tx.relaxed.cta.shared::cta.b64
// who: one thread
// order: relaxed (orders nothing else); before the arrival that would complete the phase.
TMAFLOW_DEVICE void expect_tx(uint64_t* bar, uint32_t bytes) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" :: "r"(smem_u32(bar)), "r"(bytes) : "memory");
  TMAFLOW_TRACE_EVENT(kExpectTx, -1, TMAFLOW_TRACE_BAR(bar), bytes);
}
// Arrive on the barrier at the same offset in CTA `cta_rank` of the cluster (this CTA
// included). Remote CTAs may only arrive on, expect or complete a barrier, never wait on it.
// ptx: mapa.shared::cluster.u32 + mbarrier.arrive.shared::cluster.b64
// who: any thread; one arrival per call
// order: release at CTA scope: enough to hand back a buffer this thread only read; a
// cluster-scope release (arrive_cluster_release) costs a cluster fence per arrival. The remote
// barrier must be initialised and published first (fence::mbarrier_init + cluster::sync).
TMAFLOW_DEVICE void arrive_cluster(uint64_t* bar, uint32_t cta_rank) {
  TMAFLOW_ASYNC_GUARD();
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(bar)), "r"(cta_rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
  TMAFLOW_TRACE_EVENT(kArriveRemote, -1, TMAFLOW_TRACE_BAR(bar), cta_rank | (__popc(__activemask()) << 16));
}
// Arrive on the barrier of CTA `cta_rank`, publishing this thread's writes to that CTA.
// ptx: mapa.shared::cluster.u32 + mbarrier.arrive.release.cluster.shared::cluster.b64
// who: any thread; one arrival per call
// order: release at cluster scope: pair with wait_cluster (acquire.cluster) in the remote CTA.
TMAFLOW_DEVICE void arrive_cluster_release(uint64_t* bar, uint32_t cta_rank) {
  TMAFLOW_ASYNC_GUARD();
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(bar)), "r"(cta_rank));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
  TMAFLOW_TRACE_EVENT(kArriveRemote, -1, TMAFLOW_TRACE_BAR(bar), cta_rank | (__popc(__activemask()) << 16));
}
// True once the phase with this parity completed. A potentially blocking test: the thread
// sleeps until the phase completes or a hardware time limit passes (then false; callers loop).
// ptx: mbarrier.try_wait.parity.shared::cta.b64
// who: any thread of the barrier's CTA
// order: acquire at CTA scope when true: bytes completed on the phase by TMA (async proxy) and
// writes released by the phase's arrivals are visible to this thread's generic loads.
TMAFLOW_DEVICE bool try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
  return done != 0;
}
// try_wait, acquiring at cluster scope: also sees writes other CTAs released to this barrier.
// ptx: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64
// who: any thread of the barrier's CTA
// order: acquire at cluster scope (pairs with arrive_cluster_release).
TMAFLOW_DEVICE bool try_wait_cluster(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
  return done != 0;
}

// The loop behind wait / wait_cluster: until the phase of `parity` completes (Cluster: also
// acquire remote CTAs' releases). Debug builds bound it (watchdog); release builds compile to
// the bare try_wait loop. The trailing arguments only feed the watchdog's report.
// ptx: mbarrier.try_wait.parity.shared::cta.b64 (Cluster: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64)
// in a loop; debug builds add reads of %globaltimer
// who: any thread of the barrier's CTA
// order: as try_wait / try_wait_cluster.
template <bool Cluster>
TMAFLOW_DEVICE void wait_on(uint64_t* bar, uint32_t parity, debug::Site site, uint32_t line, const char* file) {
  auto done = [&] { return Cluster ? try_wait_cluster(bar, parity) : try_wait(bar, parity); };
  TMAFLOW_TRACE_BEGIN(kWait);  // before the first try: try_wait itself suspends the thread
#define TMAFLOW_WAITED() TMAFLOW_TRACE_SPAN(kWait + Cluster, site.stage, TMAFLOW_TRACE_BAR(bar), parity, line)
#if TMAFLOW_TRACE_LEVEL == 1
  // Stage traces record the waits that waited. A blocked try_wait sleeps until the phase
  // completes (up to a hardware time limit) and then succeeds, so whether the first try failed
  // says nothing; its duration does (the SM clock: %globaltimer may tick only every µs).
  const long long tmaflow_trace_clock_ = clock64();
  if (done()) {
    if (clock64() - tmaflow_trace_clock_ >= trace::kWaitedCycles) TMAFLOW_WAITED();
    return;
  }
#endif
#if defined(TMAFLOW_DEBUG) && TMAFLOW_DEBUG
  // after a timeout elsewhere, a wait "completes" whenever its parity happens to match: such
  // events are marked as given up (0x200), not as completed
#undef TMAFLOW_WAITED
#define TMAFLOW_WAITED() TMAFLOW_TRACE_SPAN(kWait + Cluster, site.stage, TMAFLOW_TRACE_BAR(bar), \
                                            parity | (tmaflow_watchdog_state.abort ? 0x200u : 0u), line)
  if (done()) { TMAFLOW_WAITED(); return; }
  uint64_t start = debug::globaltimer();
  for (uint32_t spin = 0;; ++spin) {
    if (done()) { TMAFLOW_WAITED(); return; }
    if ((spin & 63) == 0) {
      uint64_t waited = debug::globaltimer() - start;
      if (waited > TMAFLOW_WATCHDOG_NS || tmaflow_watchdog_state.abort) {
        // Stuck long enough to be part of the hang: say so, even if another wait tripped first.
        if (waited > TMAFLOW_WATCHDOG_NS / 2) debug::report(smem_u32(bar), parity, site, line, file, waited);
        // 0x100: this wait timed out; 0x200: it gave up because another one had
        TMAFLOW_TRACE_SPAN(kWait + Cluster, site.stage, TMAFLOW_TRACE_BAR(bar),
                           parity | (waited > TMAFLOW_WATCHDOG_NS / 2 ? 0x100u : 0x200u), line);
        return;
      }
    }
  }
#else
  (void)site; (void)line; (void)file;
  while (!done()) {}
  TMAFLOW_WAITED();
#endif
#undef TMAFLOW_WAITED
}
// Block until the phase with parity `parity` (phase number & 1) completes. Parity tells only
// adjacent phases apart: a waiter must never fall a whole phase behind. Debug builds raise a
// DeadlockError naming `site` after the watchdog's time; `line` / `file` default to the call's.
// ptx: mbarrier.try_wait.parity.shared::cta.b64 in a loop
// who: every thread that reads what the phase protects (each waits itself), or one thread
// followed by a CTA barrier
// order: acquire at CTA scope on return (see try_wait).
TMAFLOW_DEVICE void wait(uint64_t* bar, uint32_t parity, debug::Site site = {nullptr, -1, 0},
                         uint32_t line = TMAFLOW_CALLER_LINE, const char* file = TMAFLOW_CALLER_FILE) {
  wait_on<false>(bar, parity, site, line, file);
}
// wait, acquiring at cluster scope: for data other CTAs wrote and released with
// arrive_cluster_release.
// ptx: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 in a loop
// who: as wait
// order: acquire at cluster scope on return.
TMAFLOW_DEVICE void wait_cluster(uint64_t* bar, uint32_t parity, debug::Site site = {nullptr, -1, 0},
                                 uint32_t line = TMAFLOW_CALLER_LINE, const char* file = TMAFLOW_CALLER_FILE) {
  wait_on<true>(bar, parity, site, line, file);
}

// A barrier plus the parity of the phase its user waits for next: one barrier reused every
// iteration (`bar`, and `parity` starting at 0).
struct Phase {
  uint64_t* bar;
  uint32_t parity;
  // Wait for the phase of `parity`, then flip `parity` for the next one.
  // ptx: mbarrier.try_wait.parity.shared::cta.b64 in a loop
  // who: every waiting thread, each with its own Phase
  // order: as mbarrier::wait.
  TMAFLOW_DEVICE void wait(debug::Site site = {nullptr, -1, 0}, uint32_t line = TMAFLOW_CALLER_LINE,
                           const char* file = TMAFLOW_CALLER_FILE) {
    mbarrier::wait(bar, parity, site, line, file);
    parity ^= 1u;
  }
};
}}  // namespace tmaflow::mbarrier
