// Cross-GPU signals: 32-bit flags in a rank's signal pad (torch.distributed symmetric memory)
// that peers set over NVLink. A put releases at system scope what the putting thread (and
// the work ordered before it) wrote; a wait acquires it. Debug builds bound every wait: one
// that times out records the rank, the peer and the signal, and the host raises DeadlockError.
#pragma once
namespace tmaflow { namespace signal {
// Set the signal at `addr` (a pad slot of this or a peer GPU) to `value`, releasing this
// thread's earlier writes (and those ordered before them: earlier kernels and copies of the
// stream) to every GPU that acquires the signal.
// ptx: st.release.sys.global.u32
// who: one thread
// order: release at system scope; pairs with wait / load_acquire on the signal's GPU.
TMAFLOW_DEVICE void put(uint32_t* addr, uint32_t value) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" :: "l"(addr), "r"(value) : "memory");
  TMAFLOW_TRACE_EVENT(kSignalPut, -1, static_cast<uint32_t>(reinterpret_cast<uint64_t>(addr)), value);
}
// Add `value` to the signal at `addr` (counting arrivals of several peers), with release.
// ptx: red.release.sys.global.add.u32
// who: one thread per arrival
// order: release at system scope, as put.
TMAFLOW_DEVICE void add(uint32_t* addr, uint32_t value) {
  asm volatile("red.release.sys.global.add.u32 [%0], %1;" :: "l"(addr), "r"(value) : "memory");
}
// The signal's current value, acquiring what the putting GPU released before it.
// ptx: ld.acquire.sys.global.u32
// who: any thread
// order: acquire at system scope: later reads see the writes released by the put it read.
TMAFLOW_DEVICE uint32_t load_acquire(const uint32_t* addr) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(addr) : "memory");
  return v;
}
// Store `value` without ordering (resetting a consumed signal of this GPU's own pad).
// ptx: st.relaxed.sys.global.u32
// who: one thread
// order: relaxed at system scope: orders nothing else.
TMAFLOW_DEVICE void store_relaxed(uint32_t* addr, uint32_t value) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" :: "l"(addr), "r"(value) : "memory");
}
// Whether `seen` satisfies a wait for `expected`: equal (AtLeast false) or at least.
// ptx: none (a comparison)
// who: any thread
// order: none
template <bool AtLeast>
TMAFLOW_DEVICE bool reached(uint32_t seen, uint32_t expected) {
  return AtLeast ? seen >= expected : seen == expected;
}
// The loop behind wait_eq / wait_ge: spin on load_acquire with a nanosleep backoff (32 ns
// doubling to 1 µs) until the signal reaches `expected`. Debug builds bound it by the
// watchdog and report `site`; release builds spin until it does. Trace builds record it as a
// span (signal index, peer, value seen).
// ptx: ld.acquire.sys.global.u32 and nanosleep.u32 in a loop; debug builds add %globaltimer
// who: one thread (others wait for it at a CTA barrier)
// order: acquire at system scope on return; returns the value seen.
template <bool AtLeast>
TMAFLOW_DEVICE uint32_t wait_on(const uint32_t* addr, uint32_t expected, debug::SignalSite site,
                                uint32_t line, const char* file) {
  TMAFLOW_TRACE_BEGIN(kSignalWait);
#define TMAFLOW_SIGNAL_WAITED() \
  TMAFLOW_TRACE_SPAN(kSignalWait, -1, site.signal, (uint32_t(site.peer) << 16) | (seen & 0xFFFFu), line)
  uint32_t seen = load_acquire(addr);
  uint32_t backoff = 32;
#if defined(TMAFLOW_DEBUG) && TMAFLOW_DEBUG
  const uint64_t start = debug::globaltimer();
#else
  (void)site; (void)line; (void)file;
#endif
  while (!reached<AtLeast>(seen, expected)) {
    __nanosleep(backoff);
    backoff = backoff < 1024 ? backoff * 2 : backoff;
#if defined(TMAFLOW_DEBUG) && TMAFLOW_DEBUG
    const uint64_t waited = debug::globaltimer() - start;
    if (waited > TMAFLOW_WATCHDOG_NS || tmaflow_watchdog_state.abort) {
      if (waited > TMAFLOW_WATCHDOG_NS / 2) debug::report_signal(site, expected, seen, line, file, waited);
      TMAFLOW_SIGNAL_WAITED();
      return seen;
    }
#endif
    seen = load_acquire(addr);
  }
  TMAFLOW_SIGNAL_WAITED();
#undef TMAFLOW_SIGNAL_WAITED
  return seen;
}
// Block until the signal at `addr` equals `expected`; returns it. Debug builds raise a
// DeadlockError naming `site` (rank, peer, signal) after the watchdog's time.
// ptx: ld.acquire.sys.global.u32 in a loop with nanosleep
// who: one thread
// order: acquire at system scope on return (pairs with the peer's put).
TMAFLOW_DEVICE uint32_t wait_eq(const uint32_t* addr, uint32_t expected, debug::SignalSite site = {-1, -1, 0},
                                uint32_t line = TMAFLOW_CALLER_LINE, const char* file = TMAFLOW_CALLER_FILE) {
  return wait_on<false>(addr, expected, site, line, file);
}
// ditto: until the signal is at least `expected` (counters that only grow).
TMAFLOW_DEVICE uint32_t wait_ge(const uint32_t* addr, uint32_t expected, debug::SignalSite site = {-1, -1, 0},
                                uint32_t line = TMAFLOW_CALLER_LINE, const char* file = TMAFLOW_CALLER_FILE) {
  return wait_on<true>(addr, expected, site, line, file);
}
}}  // namespace tmaflow::signal
