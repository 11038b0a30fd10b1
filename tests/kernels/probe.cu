// Probe kernels: what the hardware really does, dumped for comparison with tf.reference
// and with the launch configuration.
#include <tmaflow.cuh>
using namespace tmaflow;

TMAFLOW_DEVICE void load_box(void* dst, const CUtensorMap* map, uint64_t* bar, int rank, const int* c) {
  switch (rank) {
    case 1: tma::load(dst, map, bar, c[0]); break;
    case 2: tma::load(dst, map, bar, c[0], c[1]); break;
    case 3: tma::load(dst, map, bar, c[0], c[1], c[2]); break;
    case 4: tma::load(dst, map, bar, c[0], c[1], c[2], c[3]); break;
    default: tma::load(dst, map, bar, c[0], c[1], c[2], c[3], c[4]); break;
  }
}

TMAFLOW_DEVICE void store_box(const CUtensorMap* map, const void* src, int rank, const int* c) {
  switch (rank) {
    case 1: tma::store(map, src, c[0]); break;
    case 2: tma::store(map, src, c[0], c[1]); break;
    case 3: tma::store(map, src, c[0], c[1], c[2]); break;
    case 4: tma::store(map, src, c[0], c[1], c[2], c[3]); break;
    default: tma::store(map, src, c[0], c[1], c[2], c[3], c[4]); break;
  }
}

// Each block loads box `blockIdx.x` (coords[5*b .. 5*b+4], innermost first) into smem at
// `base_offset` after poisoning it with 0xA5, and dumps `nbytes` bytes from there.
// out_addr[b] = absolute shared address of the destination (the swizzle depends on it).
extern "C" __global__ void tma_load_probe(const __grid_constant__ CUtensorMap map, uint8_t* out,
                                          uint32_t* out_addr, const int* coords, int rank,
                                          uint32_t base_offset, uint32_t nbytes, uint32_t tx_bytes) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ uint64_t bar;
  uint8_t* dst = smem + base_offset;
  for (uint32_t i = threadIdx.x; i < nbytes; i += blockDim.x) dst[i] = 0xA5;
  if (threadIdx.x == 0) mbarrier::init(&bar, 1);
  fence::proxy_async_shared_cta();
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier::arrive_expect_tx(&bar, tx_bytes);
    load_box(dst, &map, &bar, rank, coords + 5 * blockIdx.x);
    out_addr[blockIdx.x] = smem_u32(dst);
  }
  mbarrier::wait(&bar, 0);
  uint8_t* o = out + size_t(blockIdx.x) * nbytes;
  for (uint32_t i = threadIdx.x; i < nbytes; i += blockDim.x) o[i] = dst[i];
}

// Block b copies image b into smem at `base_offset` and TMA-stores it at coords b.
extern "C" __global__ void tma_store_probe(const __grid_constant__ CUtensorMap map, const uint8_t* images,
                                           uint32_t* out_addr, const int* coords, int rank,
                                           uint32_t base_offset, uint32_t nbytes) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* src = smem + base_offset;
  const uint8_t* img = images + size_t(blockIdx.x) * nbytes;
  for (uint32_t i = threadIdx.x; i < nbytes; i += blockDim.x) src[i] = img[i];
  fence::proxy_async_shared_cta();  // generic-proxy writes -> visible to the TMA store
  __syncthreads();
  if (threadIdx.x == 0) {
    out_addr[blockIdx.x] = smem_u32(src);
    store_box(&map, src, rank, coords + 5 * blockIdx.x);
    tma::commit_group();
    tma::wait_group<0>();
  }
}


// Uses `nbytes` of dynamic smem: writes a pattern, then reads it back reversed.
extern "C" __global__ void big_smem(uint32_t* out, uint32_t nbytes, uint32_t seed) {
  extern __shared__ __align__(16) uint32_t words[];
  uint32_t n = nbytes / 4;
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) words[i] = i * 2654435761u ^ seed;
  __syncthreads();
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = words[n - 1 - i];
}

// Echo every argument kind back as bytes.
extern "C" __global__ void echo_args(const __grid_constant__ CUtensorMap a, int8_t i8, uint16_t u16,
                                     int32_t i32, int64_t i64, float f32, double f64,
                                     const float* p0, const float* p1, uint64_t* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    const uint64_t* words = reinterpret_cast<const uint64_t*>(&a);
    for (int i = 0; i < 16; ++i) out[i] = words[i];
    out[16] = uint64_t(int64_t(i8)); out[17] = u16; out[18] = uint64_t(int64_t(i32));
    out[19] = uint64_t(i64);
    out[20] = __float_as_uint(f32); out[21] = __double_as_longlong(f64);
    out[22] = __float_as_uint(p0[0]); out[23] = __float_as_uint(p1[0]);
  }
}


// A two-stage hand-off of the row-major block-scale gather's shape (gemm.cu): warp 0 copies 32
// floats a round into a stage with cp.async and arrives on the stage's full barrier with
// cp.async.mbarrier.arrive.noinc (the arrival lands when its copies have); warp 1 waits on it,
// reads the stage, and releases it. Correct by the PTX memory model; tools/sanitize.sh runs it
// under racecheck to see whether the tool models the noinc arrival (it reports hazards if not).
// With warp_release 1, the consumer warp releases a stage as the GEMM's consumers do
// (Pipeline::consumer_release_warp): __syncwarp, then one lane arrives; with 2, a named barrier
// of the warp's 32 threads (bar.sync 1, 32) in place of __syncwarp.
extern "C" __global__ void cp_async_noinc_handoff(const float* src, float* out, int rounds,
                                                  int warp_release) {
  __shared__ __align__(16) float stage[2][32];
  __shared__ __align__(8) uint64_t full[2], empty[2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < 2; ++s) {
      tmaflow::mbarrier::init(&full[s], 32);
      tmaflow::mbarrier::init(&empty[s], warp_release ? 1 : 32);
    }
  }
  __syncthreads();
  for (int r = 0; r < rounds; ++r) {
    const int s = r & 1;
    const uint32_t phase = (r >> 1) & 1;
    if (warp == 0) {
      if (r >= 2) tmaflow::mbarrier::wait(&empty[s], phase ^ 1u);
      tmaflow::cp_async::copy4(&stage[s][lane], src + r * 32 + lane);
      tmaflow::cp_async::arrive_on(&full[s]);
    } else if (warp == 1) {
      tmaflow::mbarrier::wait(&full[s], phase);
      out[r * 32 + lane] = stage[s][lane];
      if (warp_release == 2) {
        asm volatile("bar.sync 1, 32;" ::: "memory");
      } else {
        __syncwarp();
      }
      if (!warp_release || lane == 0) tmaflow::mbarrier::arrive(&empty[s]);
    }
  }
}

// The row-major block-scale GEMM's hand-off in clusters of 2, through tmaflow::Pipeline as
// gemm.cu releases it (SCALE_RELEASE): in each CTA warp 0 gathers 32 floats a round into a stage
// with cp.async (arrive.noinc on the full barrier, 32 producers); two consumer warps wait, read
// the stage with ld.shared and release it. release 1: Pipeline::consumer_release_lanes, every
// lane arrives on its own CTA's empty barrier and one lane per warp on the other CTA's (the
// default); 2: one lane per quad reads its quad's floats and hands them on with shuffles, only
// readers arrive on their own CTA's; 0: consumer_release_warp, __syncwarp then one lane per CTA
// (the release before). out[cta][warp][round][lane] = src[cta][round][lane].
extern "C" __global__ void cp_async_lanes_handoff(const float* src, float* out, int rounds, int release) {
  constexpr int kStages = 2, kConsumerWarps = 2;
  __shared__ __align__(16) float stage[kStages][32];
  __shared__ __align__(8) uint64_t full[kStages], empty[kStages];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t rank = cluster::rank(), peers = cluster::size() - 1;
  const uint32_t mask = (1u << cluster::size()) - 1u;
  const uint32_t readers = release == 1 ? 32 : release == 2 ? 8 : 1;  // own arrivals a warp
  const Pipeline<kStages> pipe{full, empty, 0, 32, kConsumerWarps * (readers + peers), mask, mask & ~(1u << rank),
                               "handoff.full", "handoff.empty"};
  if (threadIdx.x == 0) pipe.init();
  cluster::sync();  // both CTAs' barriers exist before the other's releases reach them
  const float* mine = src + size_t(rank) * rounds * 32;
  Pipeline<kStages>::Cursor c;
  for (int r = 0; r < rounds; ++r, c.advance()) {
    if (warp == 0) {
      pipe.producer_acquire(c);
      cp_async::copy4(&stage[c.stage][lane], mine + r * 32 + lane);
      cp_async::arrive_on(pipe.barrier(c));
    } else {
      pipe.consumer_wait(c);
      float v;
      if (release == 2) {
        float4 q = make_float4(0.f, 0.f, 0.f, 0.f);
        if (lane % 4 == 0) q = *reinterpret_cast<const float4*>(&stage[c.stage][lane]);
        const float x = __shfl_sync(0xffffffffu, q.x, lane & ~3), y = __shfl_sync(0xffffffffu, q.y, lane & ~3);
        const float z = __shfl_sync(0xffffffffu, q.z, lane & ~3), w = __shfl_sync(0xffffffffu, q.w, lane & ~3);
        v = lane % 4 == 0 ? x : lane % 4 == 1 ? y : lane % 4 == 2 ? z : w;
      } else {
        v = stage[c.stage][lane];
      }
      out[((size_t(rank) * kConsumerWarps + warp - 1) * rounds + r) * 32 + lane] = v;
      if (release == 0) {
        pipe.consumer_release_warp(c);
      } else {
        pipe.consumer_release_lanes(c, release == 1 || lane % 4 == 0);
      }
    }
  }
  cluster::sync();  // no CTA leaves while the other's releases may still reach it
}
