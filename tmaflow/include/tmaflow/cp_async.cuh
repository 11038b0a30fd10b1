// LDGSTS (cp.async, sm_80+): per-thread 4/8/16-byte global -> smem copies in commit groups.
#pragma once
namespace tmaflow { namespace cp_async {
// Copy 4 bytes global -> shared, asynchronously, through L1 (the thread's current group).
// ptx: cp.async.ca.shared.global [dst], [src], 4
// who: any thread (each copies its own elements)
// order: complete after commit() + wait<N>() by the same thread, then a CTA barrier before
// other threads read them; or cp_async::arrive_on(bar) and a wait on the barrier.
TMAFLOW_DEVICE void copy4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(smem_u32(dst)), "l"(src) : "memory");
}
// ditto: 8 bytes.
// ptx: cp.async.ca.shared.global [dst], [src], 8
TMAFLOW_DEVICE void copy8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" :: "r"(smem_u32(dst)), "l"(src) : "memory");
}
// ditto: 4 bytes, or 4 zero bytes when !valid (a source size of 0 reads nothing: an
// out-of-range element lands as zero).
// ptx: cp.async.ca.shared.global [dst], [src], 4, src-size
TMAFLOW_DEVICE void copy4_or_zero(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
               :: "r"(smem_u32(dst)), "l"(src), "r"(valid ? 4u : 0u) : "memory");
}
// ditto: 16 bytes, bypassing L1.
// ptx: cp.async.cg.shared.global [dst], [src], 16
TMAFLOW_DEVICE void copy16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(smem_u32(dst)), "l"(src) : "memory");
}
// Close this thread's group of cp.async copies issued since the last commit.
// ptx: cp.async.commit_group
// who: every thread that issued copies
// order: groups are per thread.
TMAFLOW_DEVICE void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Wait until at most N of this thread's groups are pending: the older groups' data is in
// shared memory, visible to this thread.
// ptx: cp.async.wait_group N
// who: every thread that committed groups
// order: other threads see the data after a CTA barrier (__syncthreads / named_barrier).
template <int N = 0> TMAFLOW_DEVICE void wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }
// Wait for all of this thread's cp.async copies (committed or not).
// ptx: cp.async.wait_all
// who: every thread that issued copies
// order: as wait<0>.
TMAFLOW_DEVICE void wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// The barrier gets this thread's arrival when all its prior cp.async copies land (.noinc: the
// arrival is one of the barrier's planned arrivals, e.g. tf.Pipeline producers=).
// ptx: cp.async.mbarrier.arrive.noinc.shared::cta.b64
// who: every thread whose copies fill part of the stage
// order: the waiter on the barrier then sees the copies (acquire on its wait).
TMAFLOW_DEVICE void arrive_on(uint64_t* bar) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(smem_u32(bar)) : "memory");
}
}}  // namespace tmaflow::cp_async
