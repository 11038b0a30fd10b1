#pragma once
namespace tmaflow { namespace warp {
// elect.sync — true in exactly one active lane of the warp.
TMAFLOW_DEVICE bool elect_one() {
  uint32_t pred = 0;
  asm volatile("{\n .reg .b32 rx;\n .reg .pred px;\n elect.sync rx|px, %1;\n selp.u32 %0, 1, 0, px;\n}\n"
               : "=r"(pred) : "r"(0xffffffffu));
  return pred != 0;
}
// setmaxnreg.inc / .dec (sm_90a): rebalance registers between warpgroups. Needs a register
// cap at entry (__launch_bounds__(threads, 1)) and warpgroup-uniform control flow.
template <uint32_t N> TMAFLOW_DEVICE void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(N));
}
template <uint32_t N> TMAFLOW_DEVICE void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(N));
}
TMAFLOW_DEVICE uint32_t lane() { return threadIdx.x & 31; }
TMAFLOW_DEVICE uint32_t warp_index() { return __shfl_sync(0xffffffffu, threadIdx.x / 32, 0); }
// Max / sum over the 4 lanes of a quad (lanes 4r .. 4r + 3): the lanes that hold one row of an
// mma.m16n8 (or wgmma) accumulator fragment, so a row's reduction across the fragment.
TMAFLOW_DEVICE float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
TMAFLOW_DEVICE float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
}  // namespace warp
namespace named_barrier {
// bar.sync id, threads — barrier `id` (1-15; 0 is __syncthreads) among `threads` threads
// (a multiple of 32), e.g. one warpgroup without stalling the others.
TMAFLOW_DEVICE void sync(uint32_t id, uint32_t threads) {
  TMAFLOW_TRACE_BEGIN(kNamedBarrier);
  asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
  TMAFLOW_TRACE_SPAN(kNamedBarrier, -1, 0, id, 0);
}
// bar.red.or.pred — the same barrier, returning whether `pred` held in any of the threads.
TMAFLOW_DEVICE bool sync_or(uint32_t id, uint32_t threads, bool pred) {
  uint32_t any;
  asm volatile("{\n .reg .pred q, p;\n setp.ne.u32 q, %1, 0;\n bar.red.or.pred p, %2, %3, q;\n"
               " selp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(any) : "r"(uint32_t(pred)), "r"(id), "r"(threads) : "memory");
  return any != 0;
}
// bar.arrive id, threads — count this warp's arrival at barrier `id` without waiting: the
// other side of a sync() (producer/consumer hand-offs between warpgroups).
TMAFLOW_DEVICE void arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(threads) : "memory");
}
}}  // namespace tmaflow::named_barrier
