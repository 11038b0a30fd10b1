// Warp-level helpers (tmaflow::warp) and named CTA barriers (tmaflow::named_barrier).
#pragma once
namespace tmaflow { namespace warp {
// True in exactly one lane of the warp (the leader of the full mask).
// ptx: elect.sync with membermask 0xffffffff
// who: all 32 lanes of a warp, converged
// order: none
TMAFLOW_DEVICE bool elect_one() {
  uint32_t pred = 0;
  asm volatile("{\n .reg .b32 rx;\n .reg .pred px;\n elect.sync rx|px, %1;\n selp.u32 %0, 1, 0, px;\n}\n"
               : "=r"(pred) : "r"(0xffffffffu));
  return pred != 0;
}
// Raise this warpgroup's register limit to N (sm_90a): consumer warpgroups take the registers
// the producer gives up. Needs a register cap at entry (__launch_bounds__(threads, 1)).
// ptx: setmaxnreg.inc.sync.aligned.u32 N
// who: a warpgroup (all 128 threads, warpgroup-uniform control flow)
// order: blocks until enough registers were released by setmaxnreg_dec.
template <uint32_t N> TMAFLOW_DEVICE void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(N));
}
// Lower this warpgroup's register limit to N, releasing registers to the pool (producers).
// ptx: setmaxnreg.dec.sync.aligned.u32 N
// who: a warpgroup (all 128 threads, warpgroup-uniform control flow)
// order: none
template <uint32_t N> TMAFLOW_DEVICE void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(N));
}
// This thread's lane (threadIdx.x % 32; 1-D blocks).
// ptx: none (and.b32 on %tid.x)
// who: any thread
// order: none
TMAFLOW_DEVICE uint32_t lane() { return threadIdx.x & 31; }
// This warp's index in the block (1-D blocks), broadcast from lane 0 so the compiler knows it
// is warp-uniform (role dispatch on it stays uniform).
// ptx: shfl.sync.idx.b32
// who: all 32 lanes of a warp, converged
// order: none
TMAFLOW_DEVICE uint32_t warp_index() { return __shfl_sync(0xffffffffu, threadIdx.x / 32, 0); }
// Max over the 4 lanes of a quad (lanes 4r .. 4r + 3): the lanes that hold one row of an
// mma.m16n8 (or wgmma) accumulator fragment, so a row's reduction across the fragment.
// ptx: shfl.sync.bfly.b32 (x2), max.f32
// who: all 32 lanes of a warp, converged
// order: none
TMAFLOW_DEVICE float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
// ditto: the sum over the quad.
// ptx: shfl.sync.bfly.b32 (x2), add.f32
TMAFLOW_DEVICE float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
// Inclusive prefix sum over the warp: lane l gets x of lanes 0 .. l (Hillis-Steele, 5 steps).
// ptx: shfl.sync.up.b32 (x5), add.s32
// who: all 32 lanes of a warp, converged
// order: none
TMAFLOW_DEVICE int inclusive_sum(int x) {
  const uint32_t l = threadIdx.x & 31;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, x, d);
    if (l >= uint32_t(d)) x += y;
  }
  return x;
}
}  // namespace warp
namespace named_barrier {
// Barrier `id` (1-15; 0 is __syncthreads) among `threads` threads (a multiple of 32), e.g.
// one warpgroup without stalling the others.
// ptx: bar.sync id, threads
// who: every thread of the participating warps (warp-uniform)
// order: CTA-scope memory ordering among the participants, like __syncthreads.
TMAFLOW_DEVICE void sync(uint32_t id, uint32_t threads) {
  TMAFLOW_TRACE_BEGIN(kNamedBarrier);
  asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
  TMAFLOW_TRACE_SPAN(kNamedBarrier, -1, 0, id, 0);
}
// The same barrier, returning whether `pred` held in any of the participating threads.
// ptx: bar.red.or.pred
// who: every thread of the participating warps
// order: as sync.
TMAFLOW_DEVICE bool sync_or(uint32_t id, uint32_t threads, bool pred) {
  uint32_t any;
  asm volatile("{\n .reg .pred q, p;\n setp.ne.u32 q, %1, 0;\n bar.red.or.pred p, %2, %3, q;\n"
               " selp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(any) : "r"(uint32_t(pred)), "r"(id), "r"(threads) : "memory");
  return any != 0;
}
// Count this warp's arrival at barrier `id` without waiting: the other side of a sync()
// (producer/consumer hand-offs between warpgroups).
// ptx: bar.arrive id, threads
// who: every thread of the arriving warps
// order: release: the arriving threads' writes are visible to the threads that sync.
TMAFLOW_DEVICE void arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(threads) : "memory");
}
}}  // namespace tmaflow::named_barrier
