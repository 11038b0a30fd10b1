// Barrier and pipeline helpers over layouts planned in Python (tf.Barrier, tf.Pipeline).
// Byte counts, arrival counts and multicast masks come from the generated layout header,
// so kernels never spell them.
#pragma once
namespace tmaflow {

// A named mbarrier with the counts it was planned with (tf.Barrier): `S.<name>()` of the
// generated layout returns one; `name` is what a DeadlockError reports.
struct Barrier {
  uint64_t* bar;      // the mbarrier in shared memory
  uint32_t arrivals;  // arrivals per phase, as planned
  uint32_t tx_bytes;  // bytes announced per phase, as planned
  const char* name;
  // mbarrier::init with the planned arrival count (no fence: unlike Pipeline::init).
  // ptx: mbarrier.init.shared::cta.b64
  // who: one thread
  // order: then fence::proxy_async_shared_cta() (TMA completes on it) or fence::mbarrier_init()
  // (other CTAs signal it), and __syncthreads() / cluster::sync() before anyone uses it.
  TMAFLOW_DEVICE void init() const { mbarrier::init(bar, arrivals); }
  // One arrival (a barrier planned with arrivals = n takes n of them per phase).
  // ptx: mbarrier.arrive.shared::cta.b64
  // who: each arriving thread, once per phase
  // order: release at CTA scope (see mbarrier::arrive).
  TMAFLOW_DEVICE void arrive() const { mbarrier::arrive(bar); }
  // Announce the planned transaction bytes and arrive.
  // ptx: mbarrier.arrive.expect_tx.shared::cta.b64
  // who: the thread issuing the copies, once a phase
  // order: in the phase of the copies that complete on `bar` (tmaflow: before issuing them).
  TMAFLOW_DEVICE void arrive_expect_tx() const { mbarrier::arrive_expect_tx(bar, tx_bytes); }
  // Wait for the phase of `parity`; a hang names `name` and the planned bytes.
  // ptx: mbarrier.try_wait.parity.shared::cta.b64 in a loop
  // who: every thread that reads what the barrier protects
  // order: acquire at CTA scope on return: TMA bytes of the phase are visible.
  TMAFLOW_DEVICE void wait(uint32_t parity, uint32_t line = TMAFLOW_CALLER_LINE,
                           const char* file = TMAFLOW_CALLER_FILE) const {
    mbarrier::wait(bar, parity, debug::Site{name, -1, tx_bytes}, line, file);
  }
};

// Full/empty barrier pairs of an N-stage ring planned by tf.Pipeline: `S.<pipe>()` of the
// generated layout returns one with every count filled in. Producers commit (arrive + expect_tx)
// on full[s] and the TMA completes the bytes; consumers wait on full[s], then release on
// empty[s], which the producer acquires before refilling the stage. docs/pipelines.md has the
// state machine and the CUTLASS / cuda::pipeline equivalents.
template <int Stages>
struct Pipeline {
  uint64_t* full;           // Stages barriers: "the stage holds data"
  uint64_t* empty;          // Stages barriers: "the stage may be refilled"
  uint32_t tx_bytes;        // bytes landing in this CTA per stage (every tile, multicast included)
  uint32_t full_arrivals;   // tf.Pipeline producers
  uint32_t empty_arrivals;  // consumers x consumer_lanes, plus consumers per other CTA releasing to this one
  uint32_t release_mask;    // CTAs (bit per cluster rank) a release must reach; 0: this CTA only
  uint32_t peer_mask;       // release_mask without this CTA: the others (0 without a cluster)
  const char* full_name;
  const char* empty_name;

  // Initialise every full barrier (full_arrivals) and empty barrier (empty_arrivals), then fence
  // for the async proxy and the cluster.
  // ptx: mbarrier.init.shared::cta.b64 (2 x Stages), fence.mbarrier_init.release.cluster,
  // fence.proxy.async.shared::cta
  // who: one thread
  // order: then __syncthreads() (one CTA) or cluster::sync() (multicast: other CTAs' copies and
  // releases reach these barriers) before any thread acquires, waits or issues a copy.
  TMAFLOW_DEVICE void init() const {
    for (int s = 0; s < Stages; ++s) {
      mbarrier::init(full + s, full_arrivals);
      mbarrier::init(empty + s, empty_arrivals);
    }
    fence::mbarrier_init();
    fence::proxy_async_shared_cta();
  }

  // One side's position in the ring: a stage and the parity of its current round. The producer
  // and each consumer keep their own, starting at {0, 0}, and advance once per stage used.
  struct Cursor {
    uint32_t stage = 0;
    uint32_t phase = 0;
    // The next stage; wrapping around to stage 0 flips `phase`.
    // ptx: none
    // who: every thread holding the cursor (the lanes of a warp each keep a copy in step)
    // order: none
    TMAFLOW_DEVICE void advance() {
      if (++stage == Stages) { stage = 0; phase ^= 1u; }
    }
  };

  // Producer: wait until the consumers released stage c.stage (empty barrier, parity
  // c.phase ^ 1, so the first round passes at once). It announces nothing: producer_commit
  // does (CUTLASS's producer_acquire does both).
  // ptx: mbarrier.try_wait.parity.shared::cta.b64 in a loop, on empty[c.stage]
  // who: the producer thread (or every lane of a producer warp, each waiting)
  // order: acquire at CTA scope: the consumers' reads of the stage, released by their
  // arrivals, happen before the copies issued after it.
  TMAFLOW_DEVICE void producer_acquire(const Cursor& c, uint32_t line = TMAFLOW_CALLER_LINE,
                                       const char* file = TMAFLOW_CALLER_FILE) const {
    mbarrier::wait(empty + c.stage, c.phase ^ 1u, debug::Site{empty_name, int32_t(c.stage), 0}, line, file);
  }
  // The full barrier of c.stage: the `bar` argument of every copy into that stage.
  // ptx: none
  // who: the thread issuing the copies
  // order: none
  TMAFLOW_DEVICE uint64_t* barrier(const Cursor& c) const { return full + c.stage; }
  // Producer: announce the stage's tx_bytes and arrive on full[c.stage]. Call it after
  // producer_acquire and BEFORE issuing the stage's copies; in every CTA of a multicast
  // group, the ones that issue no copy of their own included.
  // ptx: mbarrier.arrive.expect_tx.shared::cta.b64
  // who: one producer thread per stage and CTA (full_arrivals arrivals in all per stage)
  // order: in the phase of the copies it announces; the stage completes when they landed.
  TMAFLOW_DEVICE void producer_commit(const Cursor& c) const { mbarrier::arrive_expect_tx(full + c.stage, tx_bytes); }
  // Consumer: wait until stage c.stage holds its data (every producer arrived and tx_bytes
  // landed; parity c.phase). A hang names "<pipe>.full" and the stage.
  // ptx: mbarrier.try_wait.parity.shared::cta.b64 in a loop, on full[c.stage]
  // who: every consumer thread that reads the stage (each waits itself)
  // order: acquire at CTA scope: the TMA's writes (async proxy) are visible to the loads after.
  TMAFLOW_DEVICE void consumer_wait(const Cursor& c, uint32_t line = TMAFLOW_CALLER_LINE,
                                    const char* file = TMAFLOW_CALLER_FILE) const {
    mbarrier::wait(full + c.stage, c.phase, debug::Site{full_name, int32_t(c.stage), tx_bytes}, line, file);
  }
  // One release by a whole (converged) warp: lane r arrives on CTA r's empty barrier for each
  // rank r of the release mask, all at once, so no lane loops over the mask (CUTLASS spreads a
  // cluster release over threads the same way); without a cluster lane 0 arrives. One release
  // per warp: plan consumers = the number of releasing warps.
  // ptx: bar.warp.sync (__syncwarp), then mbarrier.arrive.shared::cta.b64 (lane 0) or
  // mapa.shared::cluster.u32 + mbarrier.arrive.shared::cluster.b64 (lane r, each rank r of the mask)
  // who: all 32 lanes of a warp, converged, together
  // order: the warp syncs first: one lane's arrival (a CTA-scope release) then orders every
  // lane's reads of the stage before the producer's next writes. compute-sanitizer's racecheck
  // does not credit the sync: it reports the producer's next cp.async into a stage that other
  // lanes read as a hazard (consumer_release_lanes releases each lane's reads itself).
  TMAFLOW_DEVICE void consumer_release_warp(const Cursor& c) const {
    const uint32_t lane = threadIdx.x % 32u;
    __syncwarp();
    if (release_mask == 0) {
      if (lane == 0) mbarrier::arrive(empty + c.stage);
    } else if ((release_mask >> lane) & 1u) {
      mbarrier::arrive_cluster(empty + c.stage, lane);
    }
  }
  // One release by the lanes of a (converged) warp that read the stage themselves: each lane
  // that `read` arrives on this CTA's empty barrier, releasing its own reads; then the warp
  // syncs and lane r arrives on CTA r for each other CTA r of the release mask (those gate only
  // their multicasts into this CTA, whose data the warp's wgmmas read, not its lanes). Plan
  // consumers = the warps, consumer_lanes = the lanes of a warp that read (32: all of them).
  // compute-sanitizer's racecheck credits a release only to the thread that arrives (no
  // __syncwarp or named barrier before another lane's arrival), so a stage that lanes read with
  // ld.shared and a producer refills with cp.async reports no hazard only when released so.
  // ptx: mbarrier.arrive.shared::cta.b64 (each reading lane), then with a cluster bar.warp.sync
  // and mapa.shared::cluster.u32 + mbarrier.arrive.shared::cluster.b64 (lane r, each rank r of
  // peer_mask)
  // who: all 32 lanes of a warp, converged, together
  // order: each lane's arrival is a CTA-scope release of its own reads of the stage; the other
  // CTAs' arrivals follow the warp sync, after every lane's wgmma wait, as consumer_release_warp's.
  TMAFLOW_DEVICE void consumer_release_lanes(const Cursor& c, bool read = true) const {
    if (read) mbarrier::arrive(empty + c.stage);
    // release_mask, not peer_mask: the compiler proves a cluster's nonzero and drops the test; a
    // real branch around __syncwarp cost the fp8 k-loop its uniform descriptors (280 instructions
    // a k-block pair against 227)
    if (release_mask != 0) {
      const uint32_t lane = threadIdx.x % 32u;
      __syncwarp();
      if ((peer_mask >> lane) & 1u) mbarrier::arrive_cluster(empty + c.stage, lane);
    }
  }
  // One release by one thread: an arrival on the empty barrier of every CTA of the mask.
  // ptx: mbarrier.arrive.shared::cta.b64, or per set bit r of release_mask
  // mapa.shared::cluster.u32 + mbarrier.arrive.shared::cluster.b64
  // who: one thread per release (plan consumers = the releasing threads per CTA)
  // order: release at CTA scope of this thread's reads only: other threads that read the
  // stage must be done first (__syncwarp() or a named barrier, then one thread releases).
  TMAFLOW_DEVICE void consumer_release(const Cursor& c) const {
    if (release_mask == 0) {
      mbarrier::arrive(empty + c.stage);
    } else {
      // Over the mask's set bits only: a loop over all 16 ranks unrolls into 16 predicated
      // arrivals, and in a wgmma loop that bloat cost the descriptors their uniform registers
      // (fp8 block scales in clusters of two: 457 instructions a k-block pair against 233).
      for (uint32_t m = release_mask; m != 0; m &= m - 1u)
        mbarrier::arrive_cluster(empty + c.stage, uint32_t(__ffs(int(m)) - 1));
    }
  }
};
}  // namespace tmaflow
