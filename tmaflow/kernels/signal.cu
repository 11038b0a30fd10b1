// The host-ordered halves of the collectives' signal protocol (tmaflow/distributed/protocol.py):
// one thread each, launched on a stream between the copies and GEMMs they order.
#include <tmaflow.cuh>
using namespace tmaflow;

// Set a signal in a peer's (or this GPU's) pad, after everything queued before it on the stream.
extern "C" __global__ void __launch_bounds__(32) signal_put(uint32_t* slot, uint32_t value) {
  if (threadIdx.x == 0) signal::put(slot, value);
}

// Wait until this GPU's pad slot equals `expected`, then reset it to 0 for the next call
// (graph replays repeat the same values). rank / peer / index name it in a DeadlockError.
extern "C" __global__ void __launch_bounds__(32)
signal_wait_reset(uint32_t* slot, uint32_t expected, int rank, int peer, uint32_t index) {
  if (threadIdx.x != 0) return;
  if (signal::wait_eq(slot, expected, {rank, peer, index}) == expected) signal::store_relaxed(slot, 0u);
}
