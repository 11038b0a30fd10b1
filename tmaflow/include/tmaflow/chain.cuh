// Chains across the CTAs of one grid: deterministic sums add in a fixed order, each CTA waiting
// until a counter reaches its rank, adding, and moving the counter on; and the walk that finds a
// CTA's block of rows over packed sequences (varlen kernels, lengths read on the device).
#pragma once
namespace tmaflow { namespace chain {
// The counter's value, acquiring the writes the CTAs that moved it on released before.
// ptx: ld.acquire.gpu.global.u32
// who: any thread
// order: acquire at GPU scope: later reads see the sums ordered before the add_release it read.
TMAFLOW_DEVICE uint32_t load_acquire(const uint32_t* at) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(at) : "memory");
  return v;
}
// Move the counter on by one after a release fence: the CTA's sums (ordered before this thread
// by a barrier) first.
// ptx: fence.acq_rel.gpu + red.relaxed.gpu.global.add.u32
// who: one thread
// order: release at GPU scope; pairs with load_acquire.
TMAFLOW_DEVICE void add_release(uint32_t* at) {
  asm volatile("fence.acq_rel.gpu;\n\tred.relaxed.gpu.global.add.u32 [%0], 1;" :: "l"(at) : "memory");
}
// x clamped into [lo, hi].
// ptx: min.s32, max.s32
// who: any thread
// order: none
TMAFLOW_DEVICE int clamp_to(int x, int lo, int hi) { return min(max(x, lo), hi); }
// Block t of kRows rows over packed sequences (sequence b: rows cu[b] .. cu[b + 1] - 1, so
// ceil(len / kRows) blocks, numbered sequence after sequence): its sequence and its block in it,
// false past the last block. The warp walks cu, 32 sequences a step (a warp prefix sum of block
// counts). Offsets are clamped into [0, total], so bad device values give wrong rows, never
// accesses outside them.
// ptx: ld.global.nc, shfl.sync, vote.ballot.sync (warp::inclusive_sum)
// who: all 32 lanes of a warp, converged (each gets the answer)
// order: none (cu is read-only for the kernel)
template <int kRows>
TMAFLOW_DEVICE bool find_block(const int* cu, int total, int batch, int t, int& seq, int& block) {
  const int lane = threadIdx.x % 32;
  int before = 0;
  for (int first = 0; first < batch; first += 32) {
    const int b = first + lane;
    int len = 0;
    if (b < batch) {
      const int r0 = clamp_to(__ldg(cu + b), 0, total);
      len = clamp_to(__ldg(cu + b + 1), r0, total) - r0;
    }
    const int n = (len + kRows - 1) / kRows, upto = warp::inclusive_sum(n);
    const unsigned past = __ballot_sync(0xffffffffu, before + upto > t);
    if (past != 0) {
      const int l = __ffs(past) - 1;
      seq = first + l;
      block = t - before - __shfl_sync(0xffffffffu, upto - n, l);
      return true;
    }
    before += __shfl_sync(0xffffffffu, upto, 31);
  }
  return false;
}
}}  // namespace tmaflow::chain
