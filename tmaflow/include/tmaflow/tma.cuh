// Tensor TMA (cp.async.bulk.tensor): tile loads, multicast, stores, reductions, prefetch.
// Overloaded by coordinate count (rank 1-5); coordinates are innermost-first.
#pragma once
namespace tmaflow { namespace tma {

#define TMAFLOW_COORDS_1 "{%c0}"
#define TMAFLOW_TMA_RANKS(X) \
  X(1, "{%3}", (int c0), "r"(c0)) \
  X(2, "{%3, %4}", (int c0, int c1), "r"(c0), "r"(c1)) \
  X(3, "{%3, %4, %5}", (int c0, int c1, int c2), "r"(c0), "r"(c1), "r"(c2)) \
  X(4, "{%3, %4, %5, %6}", (int c0, int c1, int c2, int c3), "r"(c0), "r"(c1), "r"(c2), "r"(c3)) \
  X(5, "{%3, %4, %5, %6, %7}", (int c0, int c1, int c2, int c3, int c4), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4))

// Strips the parentheses of a macro argument (the rank tables' parameter lists).
#define TMAFLOW_UNPAREN(...) __VA_ARGS__

// Load the box at coordinates c0.. (innermost first) of `map` into `dst` (128 B aligned,
// 1024 B for a 128B swizzle), completing its bytes on `bar`. Boxes that reach past the tensor
// are filled with zeros (or NaN, as the map says) and still count their full box bytes.
// ptx: cp.async.bulk.tensor.Nd.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// who: one thread (each call is one copy)
// order: asynchronous (async proxy): announce the bytes on `bar` in the same phase
// (Pipeline::producer_commit or arrive_expect_tx), and read `dst` only after waiting on `bar`.
// The barrier's init must be fenced (fence::proxy_async_shared_cta) first.
#define TMAFLOW_LOAD(N, COORDS, PARAMS, ...) \
  TMAFLOW_DEVICE void load(void* dst, const CUtensorMap* map, uint64_t* bar, TMAFLOW_UNPAREN PARAMS) { \
    TMAFLOW_ASYNC_GUARD(); \
    asm volatile("cp.async.bulk.tensor." #N "d.shared::cluster.global.tile.mbarrier::complete_tx::bytes" \
                 " [%0], [%1, " COORDS "], [%2];" \
                 :: "r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), __VA_ARGS__ : "memory"); \
    TMAFLOW_TRACE_COPY(kTmaLoad, TMAFLOW_TRACE_BAR(bar), 0, map); }
TMAFLOW_TMA_RANKS(TMAFLOW_LOAD)
#undef TMAFLOW_LOAD

#define TMAFLOW_TMA_RANKS_MC(X) \
  X(1, "{%4}", (int c0), "r"(c0)) \
  X(2, "{%4, %5}", (int c0, int c1), "r"(c0), "r"(c1)) \
  X(3, "{%4, %5, %6}", (int c0, int c1, int c2), "r"(c0), "r"(c1), "r"(c2)) \
  X(4, "{%4, %5, %6, %7}", (int c0, int c1, int c2, int c3), "r"(c0), "r"(c1), "r"(c2), "r"(c3)) \
  X(5, "{%4, %5, %6, %7, %8}", (int c0, int c1, int c2, int c3, int c4), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4))

// Load one box into every CTA whose rank bit is set in `cta_mask`: the data and its
// complete_tx land at the same shared-memory offsets (`dst`, `bar`) in each of them.
// ptx: cp.async.bulk.tensor.Nd.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster
// who: one thread of one CTA of the group (the tile's leader: `L::<pipe>::tile0_leader(rank)`)
// order: every receiving CTA announces the bytes on its own barrier and must have released
// the stage (the leader's empty barrier collects the whole group's releases); the receivers'
// barriers must be initialised and published (fence::mbarrier_init + cluster::sync) first,
// and no receiver may exit while a multicast can still target it (cluster::sync at the end).
#define TMAFLOW_LOAD_MC(N, COORDS, PARAMS, ...) \
  TMAFLOW_DEVICE void load_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, uint16_t cta_mask, TMAFLOW_UNPAREN PARAMS) { \
    TMAFLOW_ASYNC_GUARD(); \
    asm volatile("cp.async.bulk.tensor." #N "d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster" \
                 " [%0], [%1, " COORDS "], [%2], %3;" \
                 :: "r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "h"(cta_mask), __VA_ARGS__ : "memory"); \
    TMAFLOW_TRACE_COPY(kTmaLoadMulticast, TMAFLOW_TRACE_BAR(bar), cta_mask, map); }
TMAFLOW_TMA_RANKS_MC(TMAFLOW_LOAD_MC)
#undef TMAFLOW_LOAD_MC

// tma::load with an L2 eviction policy (make_policy_evict_first / _last).
// ptx: cp.async.bulk.tensor.Nd.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint
// who: one thread
// order: as tma::load.
#define TMAFLOW_LOAD_HINT(N, COORDS, PARAMS, ...) \
  TMAFLOW_DEVICE void load_hint(void* dst, const CUtensorMap* map, uint64_t* bar, uint64_t policy, TMAFLOW_UNPAREN PARAMS) { \
    TMAFLOW_ASYNC_GUARD(); \
    asm volatile("cp.async.bulk.tensor." #N "d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint" \
                 " [%0], [%1, " COORDS "], [%2], %3;" \
                 :: "r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "l"(policy), __VA_ARGS__ : "memory"); \
    TMAFLOW_TRACE_COPY(kTmaLoad, TMAFLOW_TRACE_BAR(bar), 0, map); }
#define TMAFLOW_TMA_RANKS_HINT(X) \
  X(1, "{%4}", (int c0), "r"(c0)) \
  X(2, "{%4, %5}", (int c0, int c1), "r"(c0), "r"(c1)) \
  X(3, "{%4, %5, %6}", (int c0, int c1, int c2), "r"(c0), "r"(c1), "r"(c2)) \
  X(4, "{%4, %5, %6, %7}", (int c0, int c1, int c2, int c3), "r"(c0), "r"(c1), "r"(c2), "r"(c3)) \
  X(5, "{%4, %5, %6, %7, %8}", (int c0, int c1, int c2, int c3, int c4), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4))
TMAFLOW_TMA_RANKS_HINT(TMAFLOW_LOAD_HINT)
#undef TMAFLOW_LOAD_HINT

// An L2 policy for load_hint / store_hint: evict these lines first (data streamed once).
// ptx: createpolicy.fractional.L2::evict_first.b64 (fraction 1.0)
// who: any thread (the value may be passed around)
// order: none
TMAFLOW_DEVICE uint64_t make_policy_evict_first() {
  uint64_t p; asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p)); return p;
}
// ditto: evict these lines last (data read again soon).
// ptx: createpolicy.fractional.L2::evict_last.b64 (fraction 1.0)
TMAFLOW_DEVICE uint64_t make_policy_evict_last() {
  uint64_t p; asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p)); return p;
}

#define TMAFLOW_TMA_RANKS_ST_HINT(X) \
  X(1, "{%3}", (int c0), "r"(c0)) \
  X(2, "{%3, %4}", (int c0, int c1), "r"(c0), "r"(c1)) \
  X(3, "{%3, %4, %5}", (int c0, int c1, int c2), "r"(c0), "r"(c1), "r"(c2)) \
  X(4, "{%3, %4, %5, %6}", (int c0, int c1, int c2, int c3), "r"(c0), "r"(c1), "r"(c2), "r"(c3)) \
  X(5, "{%3, %4, %5, %6, %7}", (int c0, int c1, int c2, int c3, int c4), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4))
// tma::store with an L2 eviction policy.
// ptx: cp.async.bulk.tensor.Nd.global.shared::cta.tile.bulk_group.L2::cache_hint
// who: one thread
// order: as tma::store.
#define TMAFLOW_STORE_HINT(N, COORDS, PARAMS, ...) \
  TMAFLOW_DEVICE void store_hint(const CUtensorMap* map, const void* src, uint64_t policy, TMAFLOW_UNPAREN PARAMS) { \
    TMAFLOW_ASYNC_GUARD(); \
    asm volatile("cp.async.bulk.tensor." #N "d.global.shared::cta.tile.bulk_group.L2::cache_hint [%0, " COORDS "], [%1], %2;" \
                 :: "l"(map), "r"(smem_u32(src)), "l"(policy), __VA_ARGS__ : "memory"); \
    TMAFLOW_TRACE_COPY(kTmaStore, TMAFLOW_TRACE_BAR(src), 0, map); }
TMAFLOW_TMA_RANKS_ST_HINT(TMAFLOW_STORE_HINT)
#undef TMAFLOW_STORE_HINT

#define TMAFLOW_TMA_RANKS_ST(X) \
  X(1, "{%2}", (int c0), "r"(c0)) \
  X(2, "{%2, %3}", (int c0, int c1), "r"(c0), "r"(c1)) \
  X(3, "{%2, %3, %4}", (int c0, int c1, int c2), "r"(c0), "r"(c1), "r"(c2)) \
  X(4, "{%2, %3, %4, %5}", (int c0, int c1, int c2, int c3), "r"(c0), "r"(c1), "r"(c2), "r"(c3)) \
  X(5, "{%2, %3, %4, %5, %6}", (int c0, int c1, int c2, int c3, int c4), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4))

// Store the box from `src` to coordinates c0.. of `map`; out-of-bounds elements are not
// written, except that the innermost dim is clipped at 16-byte granularity (a row of 20 B gets
// 32 B: TensorMapSpec.store_spill_bytes). Coordinates must be non-negative.
// ptx: cp.async.bulk.tensor.Nd.global.shared::cta.tile.bulk_group
// who: one thread (each call is one copy, in that thread's bulk group)
// order: each thread that wrote `src` needs fence::proxy_async_shared_cta() and then a CTA
// barrier before it (generic writes -> async proxy). Then commit_group(); wait_group_read<N>()
// before `src` is overwritten, wait_group<N>() before the kernel's writes must be visible.
#define TMAFLOW_STORE(N, COORDS, PARAMS, ...) \
  TMAFLOW_DEVICE void store(const CUtensorMap* map, const void* src, TMAFLOW_UNPAREN PARAMS) { \
    TMAFLOW_ASYNC_GUARD(); \
    asm volatile("cp.async.bulk.tensor." #N "d.global.shared::cta.tile.bulk_group [%0, " COORDS "], [%1];" \
                 :: "l"(map), "r"(smem_u32(src)), __VA_ARGS__ : "memory"); \
    TMAFLOW_TRACE_COPY(kTmaStore, TMAFLOW_TRACE_BAR(src), 0, map); }
TMAFLOW_TMA_RANKS_ST(TMAFLOW_STORE)
#undef TMAFLOW_STORE

#define TMAFLOW_REDUCE(N, COORDS, PARAMS, ...) \
  TMAFLOW_REDUCE_OP(add, N, COORDS, PARAMS, __VA_ARGS__) TMAFLOW_REDUCE_OP(min, N, COORDS, PARAMS, __VA_ARGS__) \
  TMAFLOW_REDUCE_OP(max, N, COORDS, PARAMS, __VA_ARGS__) TMAFLOW_REDUCE_OP(inc, N, COORDS, PARAMS, __VA_ARGS__) \
  TMAFLOW_REDUCE_OP(dec, N, COORDS, PARAMS, __VA_ARGS__) TMAFLOW_REDUCE_OP(and, N, COORDS, PARAMS, __VA_ARGS__) \
  TMAFLOW_REDUCE_OP(or, N, COORDS, PARAMS, __VA_ARGS__) TMAFLOW_REDUCE_OP(xor, N, COORDS, PARAMS, __VA_ARGS__)
// Element-wise global = op(global, smem) over the box at c0.. of `map` (element type from the
// map); op is add, min, max, inc, dec, and, or or xor. Atomic per element.
// ptx: cp.reduce.async.bulk.tensor.Nd.global.shared::cta.<op>.tile.bulk_group
// who: one thread
// order: as tma::store (fence + CTA barrier before, bulk groups after).
#define TMAFLOW_REDUCE_OP(OP, N, COORDS, PARAMS, ...) \
  TMAFLOW_DEVICE void reduce_##OP(const CUtensorMap* map, const void* src, TMAFLOW_UNPAREN PARAMS) { \
    TMAFLOW_ASYNC_GUARD(); \
    asm volatile("cp.reduce.async.bulk.tensor." #N "d.global.shared::cta." #OP ".tile.bulk_group [%0, " COORDS "], [%1];" \
                 :: "l"(map), "r"(smem_u32(src)), __VA_ARGS__ : "memory"); \
    TMAFLOW_TRACE_COPY(kTmaReduce, TMAFLOW_TRACE_BAR(src), 0, map); }
TMAFLOW_TMA_RANKS_ST(TMAFLOW_REDUCE)
#undef TMAFLOW_REDUCE
#undef TMAFLOW_REDUCE_OP

#define TMAFLOW_TMA_RANKS_PF(X) \
  X(1, "{%1}", (int c0), "r"(c0)) \
  X(2, "{%1, %2}", (int c0, int c1), "r"(c0), "r"(c1)) \
  X(3, "{%1, %2, %3}", (int c0, int c1, int c2), "r"(c0), "r"(c1), "r"(c2)) \
  X(4, "{%1, %2, %3, %4}", (int c0, int c1, int c2, int c3), "r"(c0), "r"(c1), "r"(c2), "r"(c3)) \
  X(5, "{%1, %2, %3, %4, %5}", (int c0, int c1, int c2, int c3, int c4), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4))
// Warm L2 with the box at c0.. of `map` (nothing lands in shared memory; no barrier).
// ptx: cp.async.bulk.prefetch.tensor.Nd.L2.global.tile
// who: one thread
// order: none (a hint).
#define TMAFLOW_PREFETCH(N, COORDS, PARAMS, ...) \
  TMAFLOW_DEVICE void prefetch(const CUtensorMap* map, TMAFLOW_UNPAREN PARAMS) { \
    TMAFLOW_ASYNC_GUARD(); \
    asm volatile("cp.async.bulk.prefetch.tensor." #N "d.L2.global.tile [%0, " COORDS "];" \
                 :: "l"(map), __VA_ARGS__ : "memory"); }
TMAFLOW_TMA_RANKS_PF(TMAFLOW_PREFETCH)
#undef TMAFLOW_PREFETCH

// Fetch the tensor map (the descriptor itself) ahead of the first copy through it.
// ptx: prefetch.tensormap
// who: one thread, early in the kernel
// order: none (a hint).
TMAFLOW_DEVICE void prefetch_descriptor(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" :: "l"(map) : "memory");
}
// Close the bulk async-group of this thread's stores and reductions issued since the last one.
// ptx: cp.async.bulk.commit_group
// who: the thread that issued the stores
// order: groups are per thread: only the issuing thread can wait for them.
TMAFLOW_DEVICE void commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Wait until at most N of this thread's bulk groups are pending: their writes to global
// memory are complete (visible to later kernels; before the kernel ends, wait_group<0>).
// ptx: cp.async.bulk.wait_group N
// who: the thread that committed the groups
// order: completes the stores' writes; a smem source is reusable after it too.
template <int N = 0> TMAFLOW_DEVICE void wait_group() {
  TMAFLOW_TRACE_BEGIN(kStoreWait);
  asm volatile("cp.async.bulk.wait_group %0;" :: "n"(N) : "memory");
  TMAFLOW_TRACE_SPAN(kStoreWait, -1, 0, N, 0);
}
// Wait until the sources of all but N of this thread's groups were read: their shared memory
// may be overwritten (the global writes may still be in flight).
// ptx: cp.async.bulk.wait_group.read N
// who: the thread that committed the groups
// order: then a CTA barrier (or a barrier arrival) before other threads overwrite the source.
template <int N = 0> TMAFLOW_DEVICE void wait_group_read() {
  TMAFLOW_TRACE_BEGIN(kStoreWaitRead);
  asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(N) : "memory");
  TMAFLOW_TRACE_SPAN(kStoreWaitRead, -1, 0, N, 0);
}

#undef TMAFLOW_TMA_RANKS
#undef TMAFLOW_TMA_RANKS_MC
#undef TMAFLOW_TMA_RANKS_HINT
#undef TMAFLOW_TMA_RANKS_ST
#undef TMAFLOW_TMA_RANKS_ST_HINT
#undef TMAFLOW_TMA_RANKS_PF
#undef TMAFLOW_COORDS_1
}}  // namespace tmaflow::tma
