// Device-side tensor maps: patch a template per group, publish it to a workspace slot, then
// load through the slots (in another launch, and in the same CTA right after publishing).
#include <tmaflow.cuh>
using namespace tmaflow;

// Slot g = the template with address addrs[g] and rows[g] rows (dimension 1); its row pitch
// is pitches[g] bytes.
extern "C" __global__ void patch_maps(const __grid_constant__ CUtensorMap tmpl, CUtensorMap* slots,
                                      const uint64_t* addrs, const uint32_t* rows,
                                      const uint64_t* pitches) {
  __shared__ alignas(128) CUtensorMap m;
  const int g = blockIdx.x;
  if (threadIdx.x >= 32) return;
  tensormap::load_warp(&m, &tmpl);
  if (threadIdx.x == 0) {
    tensormap::replace_address(&m, reinterpret_cast<const void*>(addrs[g]));
#if defined(BUG_WRONG_ROWS)
    tensormap::replace_dim<1>(&m, rows[g] + (g == 1));  // one group off by a row
#else
    tensormap::replace_dim<1>(&m, rows[g]);
#endif
    tensormap::replace_stride<0>(&m, pitches[g]);
  }
  __syncwarp();
  tensormap::publish_warp(slots + g, &m);
}

// One CTA per slot: load box (x0, y0) through slot g, write it to out[g] (BOX_ROWS x BOX_COLS
// floats). With PATCH, the CTA first patches and publishes slot g itself.
#ifndef BOX_ROWS
#define BOX_ROWS 8
#endif
#ifndef BOX_COLS
#define BOX_COLS 32
#endif
extern "C" __global__ void load_slots(const __grid_constant__ CUtensorMap tmpl, CUtensorMap* slots,
                                      const uint64_t* addrs, const uint32_t* rows,
                                      const uint64_t* pitches, float* out, int x0, int y0, int patch) {
  __shared__ alignas(128) CUtensorMap m;
  __shared__ alignas(128) float tile[BOX_ROWS * BOX_COLS];
  __shared__ alignas(8) uint64_t bar;
  const int g = blockIdx.x;
  if (patch && threadIdx.x < 32) {
    tensormap::load_warp(&m, &tmpl);
    if (threadIdx.x == 0) {
      tensormap::replace_address(&m, reinterpret_cast<const void*>(addrs[g]));
      tensormap::replace_dim<1>(&m, rows[g]);
      tensormap::replace_stride<0>(&m, pitches[g]);
    }
    __syncwarp();
    tensormap::publish_warp(slots + g, &m);
  }
  if (threadIdx.x == 0) {
    mbarrier::init(&bar, 1);
    fence::proxy_async_shared_cta();
#if !defined(BUG_NO_ACQUIRE)
    tensormap::acquire(slots + g);
#endif
    mbarrier::arrive_expect_tx(&bar, sizeof(tile));
    tma::load(tile, slots + g, &bar, x0, y0);
    mbarrier::wait(&bar, 0);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < BOX_ROWS * BOX_COLS; i += blockDim.x) out[g * BOX_ROWS * BOX_COLS + i] = tile[i];
}
