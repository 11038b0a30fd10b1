// mbarrier: 8-byte shared objects tracking arrivals and transaction bytes per phase.
#pragma once
namespace tmaflow { namespace mbarrier {
// mbarrier.init.shared::cta.b64 — arrival count in [1, 2^20-1]. Follow with a fence
// (fence::mbarrier_init for cluster use, fence::proxy_async_shared_cta for TMA in the CTA).
TMAFLOW_DEVICE void init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_u32(bar)), "r"(arrivals) : "memory");
}
// mbarrier.inval.shared::cta.b64 — required before re-initialising or reusing the memory.
TMAFLOW_DEVICE void inval(uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" :: "r"(smem_u32(bar)) : "memory");
}
// mbarrier.arrive.shared::cta.b64 — one arrival; returns the phase token.
TMAFLOW_DEVICE uint64_t arrive(uint64_t* bar) {
  TMAFLOW_ASYNC_GUARD_RET(0);
  uint64_t state;
  asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];" : "=l"(state) : "r"(smem_u32(bar)) : "memory");
  TMAFLOW_TRACE_EVENT(kArrive, -1, TMAFLOW_TRACE_BAR(bar), __popc(__activemask()));  // arrivals
  return state;
}
// mbarrier.arrive.expect_tx — add `bytes` to the expected transactions, then arrive once.
TMAFLOW_DEVICE void arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem_u32(bar)), "r"(bytes) : "memory");
  TMAFLOW_TRACE_EVENT(kArriveExpectTx, -1, TMAFLOW_TRACE_BAR(bar), bytes);
}
// mbarrier.expect_tx — add expected bytes without arriving.
TMAFLOW_DEVICE void expect_tx(uint64_t* bar, uint32_t bytes) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" :: "r"(smem_u32(bar)), "r"(bytes) : "memory");
  TMAFLOW_TRACE_EVENT(kExpectTx, -1, TMAFLOW_TRACE_BAR(bar), bytes);
}
// mbarrier.arrive.shared::cluster — arrive on the barrier at the same offset in CTA
// `cta_rank` of the cluster (remote CTAs may only arrive / expect / complete). CTA-scope
// release: enough to hand a buffer back that this thread only read; a cluster-scope
// release (arrive_cluster_release) costs a cluster fence per arrival.
TMAFLOW_DEVICE void arrive_cluster(uint64_t* bar, uint32_t cta_rank) {
  TMAFLOW_ASYNC_GUARD();
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(bar)), "r"(cta_rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
  TMAFLOW_TRACE_EVENT(kArriveRemote, -1, TMAFLOW_TRACE_BAR(bar), cta_rank | (__popc(__activemask()) << 16));
}
// mbarrier.arrive.release.cluster.shared::cluster — also publishes this thread's writes to
// the remote CTA (pair with wait_cluster there).
TMAFLOW_DEVICE void arrive_cluster_release(uint64_t* bar, uint32_t cta_rank) {
  TMAFLOW_ASYNC_GUARD();
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(bar)), "r"(cta_rank));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
  TMAFLOW_TRACE_EVENT(kArriveRemote, -1, TMAFLOW_TRACE_BAR(bar), cta_rank | (__popc(__activemask()) << 16));
}
// mbarrier.try_wait.parity — true once the phase with this parity completed. Returns false
// after a hardware time limit; callers loop.
TMAFLOW_DEVICE bool try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
  return done != 0;
}
// mbarrier.try_wait.parity.acquire.cluster — also acquires remote CTAs' releases.
TMAFLOW_DEVICE bool try_wait_cluster(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
  return done != 0;
}

// Wait until the phase of `parity` completes (Cluster: also acquire remote CTAs' releases).
// Debug builds bound the wait (watchdog); release builds compile to the bare try_wait loop.
// The trailing arguments only feed the watchdog's report.
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
TMAFLOW_DEVICE void wait(uint64_t* bar, uint32_t parity, debug::Site site = {nullptr, -1, 0},
                         uint32_t line = TMAFLOW_CALLER_LINE, const char* file = TMAFLOW_CALLER_FILE) {
  wait_on<false>(bar, parity, site, line, file);
}
TMAFLOW_DEVICE void wait_cluster(uint64_t* bar, uint32_t parity, debug::Site site = {nullptr, -1, 0},
                                 uint32_t line = TMAFLOW_CALLER_LINE, const char* file = TMAFLOW_CALLER_FILE) {
  wait_on<true>(bar, parity, site, line, file);
}

// A barrier plus the parity of the phase its user waits for next.
struct Phase {
  uint64_t* bar;
  uint32_t parity;
  TMAFLOW_DEVICE void wait(debug::Site site = {nullptr, -1, 0}, uint32_t line = TMAFLOW_CALLER_LINE,
                           const char* file = TMAFLOW_CALLER_FILE) {
    mbarrier::wait(bar, parity, site, line, file);
    parity ^= 1u;
  }
};
}}  // namespace tmaflow::mbarrier
