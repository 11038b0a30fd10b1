// LDGSTS (cp.async, sm_80+): per-thread 4/8/16-byte global -> smem copies in commit groups.
#pragma once
namespace tmaflow { namespace cp_async {
// cp.async.ca.shared.global [dst], [src], 4 — through L1.
TMAFLOW_DEVICE void copy4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(smem_u32(dst)), "l"(src) : "memory");
}
TMAFLOW_DEVICE void copy8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" :: "r"(smem_u32(dst)), "l"(src) : "memory");
}
// cp.async.ca.shared.global [dst], [src], 4, src-size — 4 bytes, or 4 zero bytes when
// !valid (a source size of 0 reads nothing: an out-of-range element lands as zero).
TMAFLOW_DEVICE void copy4_or_zero(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
               :: "r"(smem_u32(dst)), "l"(src), "r"(valid ? 4u : 0u) : "memory");
}
// cp.async.cg.shared.global [dst], [src], 16 — 16-byte copies bypass L1.
TMAFLOW_DEVICE void copy16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(smem_u32(dst)), "l"(src) : "memory");
}
// cp.async.commit_group — close this thread's group of copies.
TMAFLOW_DEVICE void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// cp.async.wait_group N — at most N of this thread's groups still pending.
template <int N = 0> TMAFLOW_DEVICE void wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }
// cp.async.wait_all
TMAFLOW_DEVICE void wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// cp.async.mbarrier.arrive.noinc — the barrier gets this thread's arrival when its prior
// copies land (the arrival is counted in the barrier's expected count).
TMAFLOW_DEVICE void arrive_on(uint64_t* bar) {
  TMAFLOW_ASYNC_GUARD();
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(smem_u32(bar)) : "memory");
}
}}  // namespace tmaflow::cp_async
