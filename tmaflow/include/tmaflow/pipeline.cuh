// Barrier and pipeline helpers over layouts planned in Python (tf.Barrier, tf.Pipeline).
// Byte counts, arrival counts and multicast masks come from the generated layout header,
// so kernels never spell them.
#pragma once
namespace tmaflow {

// A named mbarrier with the counts it was planned with.
struct Barrier {
  uint64_t* bar;
  uint32_t arrivals;
  uint32_t tx_bytes;
  const char* name;
  TMAFLOW_DEVICE void init() const { mbarrier::init(bar, arrivals); }
  TMAFLOW_DEVICE void arrive() const { mbarrier::arrive(bar); }
  // Announce the planned transaction bytes and arrive (the issuing thread, once a phase).
  TMAFLOW_DEVICE void arrive_expect_tx() const { mbarrier::arrive_expect_tx(bar, tx_bytes); }
  TMAFLOW_DEVICE void wait(uint32_t parity, uint32_t line = TMAFLOW_CALLER_LINE,
                           const char* file = TMAFLOW_CALLER_FILE) const {
    mbarrier::wait(bar, parity, debug::Site{name, -1, tx_bytes}, line, file);
  }
};

// Full/empty barrier pairs of an N-stage ring. `release_mask` = CTAs (by cluster rank)
// whose empty barrier a consumer release must reach (0: this CTA only).
template <int Stages>
struct Pipeline {
  uint64_t* full;
  uint64_t* empty;
  uint32_t tx_bytes;
  uint32_t full_arrivals;
  uint32_t empty_arrivals;
  uint32_t release_mask;
  const char* full_name;
  const char* empty_name;

  // One thread initialises every barrier; then fence + CTA (or cluster) barrier.
  TMAFLOW_DEVICE void init() const {
    for (int s = 0; s < Stages; ++s) {
      mbarrier::init(full + s, full_arrivals);
      mbarrier::init(empty + s, empty_arrivals);
    }
    fence::mbarrier_init();
    fence::proxy_async_shared_cta();
  }

  struct Cursor {
    uint32_t stage = 0;
    uint32_t phase = 0;
    TMAFLOW_DEVICE void advance() {
      if (++stage == Stages) { stage = 0; phase ^= 1u; }
    }
  };

  // Producer: wait until the stage is free (first round passes at once), then announce
  // the stage's bytes and arrive; the copies complete on barrier(c).
  TMAFLOW_DEVICE void producer_acquire(const Cursor& c, uint32_t line = TMAFLOW_CALLER_LINE,
                                       const char* file = TMAFLOW_CALLER_FILE) const {
    mbarrier::wait(empty + c.stage, c.phase ^ 1u, debug::Site{empty_name, int32_t(c.stage), 0}, line, file);
  }
  TMAFLOW_DEVICE uint64_t* barrier(const Cursor& c) const { return full + c.stage; }
  TMAFLOW_DEVICE void producer_commit(const Cursor& c) const { mbarrier::arrive_expect_tx(full + c.stage, tx_bytes); }
  // Consumer: wait for the stage's data, use it, release it.
  TMAFLOW_DEVICE void consumer_wait(const Cursor& c, uint32_t line = TMAFLOW_CALLER_LINE,
                                    const char* file = TMAFLOW_CALLER_FILE) const {
    mbarrier::wait(full + c.stage, c.phase, debug::Site{full_name, int32_t(c.stage), tx_bytes}, line, file);
  }
  // One release by a whole (converged) warp: lane r arrives on CTA r's empty barrier for each
  // rank r of the release mask, all at once, so no lane loops over the mask (CUTLASS spreads a
  // cluster release over threads the same way); without a cluster lane 0 arrives. The warp
  // syncs first: one lane's arrival (a release) then orders every lane's reads of the stage
  // before the producer's next writes (compute-sanitizer's racecheck flagged the cp.async
  // scale gather overwriting scales other lanes had read).
  TMAFLOW_DEVICE void consumer_release_warp(const Cursor& c) const {
    const uint32_t lane = threadIdx.x % 32u;
    __syncwarp();
    if (release_mask == 0) {
      if (lane == 0) mbarrier::arrive(empty + c.stage);
    } else if ((release_mask >> lane) & 1u) {
      mbarrier::arrive_cluster(empty + c.stage, lane);
    }
  }
  // One release by one thread: an arrival on the empty barrier of every CTA of the mask.
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
