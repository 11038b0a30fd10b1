// Watchdog for debug builds (-DTMAFLOW_DEBUG=1): a bounded barrier wait records who hung
// into pinned host memory, raises a device-wide abort flag and returns, so the kernel ends
// and the host raises DeadlockError. Release builds compile none of this.
#pragma once
namespace tmaflow { namespace debug {
// One timed-out wait as the host reads it (mirrors tmaflow/debug/watchdog.py): block, thread,
// cluster rank, barrier offset, stage, parity, bytes, source line and names; for a cross-GPU
// signal wait (rank >= 0) the rank, the peer, the signal's index, the value expected and seen.
struct Record {  // mirrors tmaflow/debug/watchdog.py
  uint32_t magic, block[3], thread, cluster_rank, smem_offset;
  int32_t stage;
  uint32_t parity, tx_bytes, line, waited_us;
  int32_t rank, peer;  // -1: a barrier wait
  uint32_t signal, expected, seen;
  char name[32];
  char file[48];
};
// The device-wide watchdog state: the abort flag every bounded wait polls, and the slots of
// the host's records.
struct WatchdogState {
  volatile uint32_t abort;
  uint32_t slots;
  Record* records;  // pinned, device-mapped host memory set by the host at module load
};
// Written last into a Record: the host reads only records that carry it.
constexpr uint32_t kMagic = 0x7F10D0C4u;
// Records a launch can report (the first timeouts; later ones are dropped).
constexpr uint32_t kSlots = 64;
// What the host will print about a wait: the barrier's name, its stage (-1: none) and the
// bytes planned for it. Pipeline and Barrier fill it in; mbarrier::wait takes one.
struct Site {  // what the host will print about a wait
  const char* name;
  int32_t stage;
  uint32_t tx_bytes;
};
// What the host will print about a cross-GPU signal wait: the waiting rank, the peer that
// should have signalled and the signal's index in the pad. signal::wait takes one.
struct SignalSite {  // what the host will print about a signal wait
  int32_t rank;
  int32_t peer;
  uint32_t signal;
};
}}  // namespace tmaflow::debug

#if defined(TMAFLOW_DEBUG) && TMAFLOW_DEBUG
// After a watchdog timeout no new asynchronous copy or remote arrival is issued: one that
// landed in a CTA that already left would fault the context.
// Arrivals are suppressed too: arriving on a barrier whose phase never completed over-arrives
// it, which traps.
#define TMAFLOW_ASYNC_GUARD() do { if (tmaflow_watchdog_state.abort) return; } while (0)
// TMAFLOW_ASYNC_GUARD for functions that return `v`.
#define TMAFLOW_ASYNC_GUARD_RET(v) do { if (tmaflow_watchdog_state.abort) return (v); } while (0)
#ifndef TMAFLOW_WATCHDOG_NS
// The watchdog's bound on one wait, in ns (Kernel(watchdog_seconds=) / TMAFLOW_WATCHDOG_S).
#define TMAFLOW_WATCHDOG_NS 1000000000ull
#endif
extern "C" {
// The watchdog state of a debug build; the host sets it at module load.
__device__ tmaflow::debug::WatchdogState tmaflow_watchdog_state;
}
namespace tmaflow { namespace debug {
// Nanoseconds of the global timer (ticks may be a microsecond apart).
// ptx: mov.u64 %globaltimer
// who: any thread
// order: none
TMAFLOW_DEVICE uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
// Copy the tail of `src` (at most n - 1 chars) into `dst`, zero-filled to n bytes.
// ptx: none (byte loads and stores)
// who: the reporting thread
// order: none
TMAFLOW_DEVICE void copy_str(char* dst, const char* src, int n) {
  int i = 0;
  if (src) {
    int len = 0;
    while (src[len]) ++len;
    int start = len > n - 1 ? len - (n - 1) : 0;  // keep the tail of long paths
    for (; i < n - 1 && src[start + i]; ++i) dst[i] = src[start + i];
  }
  for (; i < n; ++i) dst[i] = 0;
}
// Claim the next free record slot and raise the abort flag; nullptr when the slots ran out.
// ptx: atom.global.add.u32, st.volatile
// who: the thread whose wait timed out
// order: the abort flag is raised before the slot is claimed.
TMAFLOW_DEVICE volatile Record* claim() {
  tmaflow_watchdog_state.abort = 1;
  uint32_t slot = atomicAdd(&tmaflow_watchdog_state.slots, 1u);
  Record* rec = tmaflow_watchdog_state.records;
  return rec == nullptr || slot >= kSlots ? nullptr : rec + slot;
}
// Fill in where the timed-out thread is, how long it waited and the call's file:line, then
// publish the record (magic last).
// ptx: mov.u32 %cluster_ctarank, st.volatile, membar.sys
// who: the thread whose wait timed out
// order: the record's fields are fenced (system scope) before its magic, then fenced again.
TMAFLOW_DEVICE void publish(volatile Record* r, uint32_t line, const char* file, uint64_t waited_ns) {
  uint32_t rank;
  asm volatile("mov.u32 %0, %cluster_ctarank;" : "=r"(rank));
  r->block[0] = blockIdx.x; r->block[1] = blockIdx.y; r->block[2] = blockIdx.z;
  r->thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  r->cluster_rank = rank;
  r->line = line;
  r->waited_us = static_cast<uint32_t>(waited_ns / 1000);
  copy_str(const_cast<char*>(r->file), file, 48);
  __threadfence_system();
  r->magic = kMagic;
  __threadfence_system();
}
// Record a timed-out barrier wait into the next free slot of pinned host memory and raise the
// abort flag. Inlined: ptxas cannot allocate registers for a call made after setmaxnreg (C7600).
// ptx: as claim and publish
// who: the thread whose wait timed out
// order: as publish.
__device__ __forceinline__ void report(uint32_t bar_addr, uint32_t parity, Site site, uint32_t line,
                                    const char* file, uint64_t waited_ns) {
  volatile Record* r = claim();
  if (r == nullptr) return;
  r->smem_offset = bar_addr;
  r->stage = site.stage;
  r->parity = parity;
  r->tx_bytes = site.tx_bytes;
  r->rank = -1; r->peer = -1;
  copy_str(const_cast<char*>(r->name), site.name, 32);
  publish(r, line, file, waited_ns);
}
// Record a timed-out cross-GPU signal wait: rank, peer, signal index, the value it waited
// for and the value it last saw.
// ptx: as claim and publish
// who: the thread whose signal wait timed out
// order: as publish.
__device__ __forceinline__ void report_signal(SignalSite site, uint32_t expected, uint32_t seen,
                                           uint32_t line, const char* file, uint64_t waited_ns) {
  volatile Record* r = claim();
  if (r == nullptr) return;
  r->stage = -1;
  r->rank = site.rank; r->peer = site.peer;
  r->signal = site.signal; r->expected = expected; r->seen = seen;
  copy_str(const_cast<char*>(r->name), "signal", 32);
  publish(r, line, file, waited_ns);
}
}}  // namespace tmaflow::debug
#else
#define TMAFLOW_ASYNC_GUARD() do {} while (0)
#define TMAFLOW_ASYNC_GUARD_RET(v) do {} while (0)
#endif
