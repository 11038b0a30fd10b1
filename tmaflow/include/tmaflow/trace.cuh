// Flight recorder for trace builds: the library's own wrappers record events stamped with
// %globaltimer into a ring per warp in device memory, which the host reads after the launch
// (tmaflow/debug/trace.py). TMAFLOW_TRACE=1 (Kernel(trace=True) / "stage"): the waits on pipeline
// stages that had to wait (one shorter than kWaitedCycles is not recorded: a phase already
// complete costs one try_wait and two clock reads), the bytes each stage announces (arrive +
// expect_tx), cluster syncs, PDL waits and marks. TMAFLOW_TRACE=2 ("all"): every wait,
// arrival, TMA load / store / reduce, store wait, wgmma commit / wait and named barrier. Other
// builds compile none of this.
#pragma once
namespace tmaflow { namespace trace {
// The kinds of recorded events. Mirrors tmaflow/debug/trace.py (KINDS, EVENT).
enum Kind : uint16_t {
  kWait = 1, kWaitCluster, kArrive, kArriveExpectTx, kExpectTx, kArriveRemote,
  kTmaLoad, kTmaLoadMulticast, kTmaStore, kTmaReduce, kStoreWait, kStoreWaitRead,
  kWgmmaCommit, kWgmmaWait, kNamedBarrier, kClusterSync, kGriddepWait, kMark,
  kTensormapPublish, kTensormapAcquire, kSignalWait, kSignalPut,
};
// One recorded event, 32 bytes, as the host reads it from a ring.
struct Event {           // 32 bytes
  uint64_t t0;           // %globaltimer (ns) when the operation began
  uint32_t dur;          // ns it took (waits); 0 for an instant
  uint16_t kind;
  int16_t stage;         // pipeline stage (-1: none)
  uint32_t bar;          // barrier: byte offset into dynamic smem; bit 31 set: static smem address
  uint32_t value;        // parity (+0x100 timed out, +0x200 gave up) of waits, bytes of expect_tx, lanes that
                         // arrived (arrive; remote: target rank | lanes << 16), CTA mask, mark id
  uint32_t line;         // source line (waits); low 32 bits of the map (TMA copies); else 0
  uint32_t sm;           // %smid
};
// Where the rings are: set by the host before a traced launch.
struct State {
  Event* events;         // rings x 2^capacity_log2 events, zeroed by the host before the launch
  uint32_t capacity_log2;
  uint32_t rings;        // blocks x warps per block
};
}}  // namespace tmaflow::trace

#if defined(TMAFLOW_TRACE) && TMAFLOW_TRACE
// 0: no recorder, 1: stage events (trace=True), 2: every event (trace="all").
#define TMAFLOW_TRACE_LEVEL TMAFLOW_TRACE
extern "C" {
// The rings of a traced launch (constant memory, written by the host).
__constant__ tmaflow::trace::State tmaflow_trace_state;
}
// One write cursor per warp of the CTA, advanced by the recording lane alone (no atomic: two
// diverged halves of a warp recording at once may share a slot). Never initialised: a ring is
// written modulo its size from wherever the cursor starts, and the host orders events by time.
__shared__ uint32_t tmaflow_trace_cursor[32];
extern __shared__ uint8_t tmaflow_trace_dynamic_smem[];  // aliases the kernel's dynamic smem
namespace tmaflow { namespace trace {
// Whether this build records events of `kind` (decided at compile time).
// ptx: none (constexpr)
// who: any thread
// order: none
__host__ __device__ constexpr bool traced(uint32_t kind) {
  return TMAFLOW_TRACE_LEVEL >= 2 || kind == kWait || kind == kWaitCluster ||
         kind == kArriveExpectTx || kind == kClusterSync || kind == kGriddepWait || kind == kMark ||
         kind == kTensormapPublish || kind == kTensormapAcquire || kind == kSignalWait ||
         kind == kSignalPut;
}
// A stage-level wait is recorded once it took this many SM cycles (well above what a try_wait
// on a completed phase takes).
constexpr long long kWaitedCycles = 200;
// The event clock: %globaltimer in ns.
// ptx: mov.u64 %globaltimer
// who: any thread
// order: none
TMAFLOW_DEVICE uint64_t now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// A barrier's name for the host: its byte offset into dynamic smem, or (bit 31) a static address.
// ptx: cvta.to.shared
// who: any thread
// order: none
TMAFLOW_DEVICE uint32_t where(uint32_t smem_addr) {
  uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(tmaflow_trace_dynamic_smem));
  return smem_addr >= base ? smem_addr - base : (smem_addr | 0x80000000u);
}
// Recorded by the lowest active lane of the warp, once per warp-wide call; the lanes meet
// again before returning (wgmma and bar instructions after it need the warp converged).
// Inlined: a call after setmaxnreg cannot be register-allocated (ptxas C7600).
// ptx: activemask, ld.const, mov %globaltimer / %smid, st.global.v4 (x2), bar.warp.sync
// who: the lanes of a warp that make the call (the lowest active lane writes)
// order: the event's first half (t0) is stored last: the host treats t0 == 0 as empty.
__device__ __forceinline__ void record(uint16_t kind, int32_t stage, uint32_t bar, uint32_t value,
                                       uint64_t t0, uint32_t line) {
  const uint32_t active = __activemask();
  const State st = tmaflow_trace_state;
  if ((threadIdx.x & 31u) == static_cast<uint32_t>(__ffs(active) - 1) && st.events != nullptr) {
    const uint32_t threads = blockDim.x * blockDim.y * blockDim.z;
    const uint32_t tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const uint32_t block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const uint32_t warp = tid / 32u, ring = block * ((threads + 31u) / 32u) + warp;
    if (ring < st.rings) {
      const uint32_t cursor = tmaflow_trace_cursor[warp];
      tmaflow_trace_cursor[warp] = cursor + 1u;
      const uint32_t slot = cursor & ((1u << st.capacity_log2) - 1u);
      const uint64_t t1 = now();
      uint32_t sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      uint4* e = reinterpret_cast<uint4*>(st.events + (static_cast<uint64_t>(ring) << st.capacity_log2) + slot);
      const uint64_t start = t0 ? t0 : t1;
      e[1] = make_uint4(bar, value, line, sm);
      // t0 (the first half) last: the host treats t0 == 0 as an empty slot
      e[0] = make_uint4(static_cast<uint32_t>(start), static_cast<uint32_t>(start >> 32),
                        static_cast<uint32_t>(t1 - start),
                        uint32_t(kind) | (uint32_t(static_cast<uint16_t>(stage)) << 16));
    }
  }
  __syncwarp(active);
}
// A user marker: shows as an instant named "mark <id>" in the trace (nothing in untraced builds).
// ptx: as record (trace builds); none otherwise
// who: any thread; one event per calling warp
// order: none
TMAFLOW_DEVICE void mark(uint32_t id) { record(kMark, -1, 0, id, 0, 0); }
}}  // namespace tmaflow::trace
// The start time of a span (0 when this build does not trace `kind`).
#define TMAFLOW_TRACE_BEGIN(kind) \
  const uint64_t tmaflow_trace_t0_ = ::tmaflow::trace::traced(::tmaflow::trace::kind) ? ::tmaflow::trace::now() : 0
// Record an event lasting from TMAFLOW_TRACE_BEGIN until now.
#define TMAFLOW_TRACE_SPAN(kind, stage, bar, value, line) do { \
  if (::tmaflow::trace::traced(::tmaflow::trace::kind)) \
    ::tmaflow::trace::record(::tmaflow::trace::kind, (stage), (bar), (value), tmaflow_trace_t0_, (line)); \
  } while (0)
// Record an instant event.
#define TMAFLOW_TRACE_EVENT(kind, stage, bar, value) do { \
  if (::tmaflow::trace::traced(::tmaflow::trace::kind)) \
    ::tmaflow::trace::record(::tmaflow::trace::kind, (stage), (bar), (value), 0, 0); \
  } while (0)
// A TMA copy through `map`: its low 32 bits go where a wait keeps its line.
#define TMAFLOW_TRACE_COPY(kind, bar, value, map) do { \
  if (::tmaflow::trace::traced(::tmaflow::trace::kind)) \
    ::tmaflow::trace::record(::tmaflow::trace::kind, -1, (bar), (value), 0, \
                             static_cast<uint32_t>(reinterpret_cast<uint64_t>(map))); \
  } while (0)
// The barrier field of an event for the shared-memory pointer `ptr`.
#define TMAFLOW_TRACE_BAR(ptr) ::tmaflow::trace::where(smem_u32(ptr))
#else
namespace tmaflow { namespace trace {
TMAFLOW_DEVICE void mark(uint32_t) {}
}}  // namespace tmaflow::trace
#define TMAFLOW_TRACE_LEVEL 0
#define TMAFLOW_TRACE_BEGIN(kind) do {} while (0)
#define TMAFLOW_TRACE_SPAN(kind, stage, bar, value, line) do {} while (0)
#define TMAFLOW_TRACE_EVENT(kind, stage, bar, value) do {} while (0)
#define TMAFLOW_TRACE_BAR(ptr) 0u
#define TMAFLOW_TRACE_COPY(kind, bar, value, map) do {} while (0)
#endif
