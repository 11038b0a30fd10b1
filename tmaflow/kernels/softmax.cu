// tmaflow-native example kernels. Shared-memory layouts come from tf.SharedLayout
// (tmaflow_layout.cuh), so no kernel spells a byte count, an arrival count or an offset.
#include <tmaflow.cuh>
#include "tmaflow_layout.cuh"
using namespace tmaflow;
namespace L = tmaflow_layout;

// Row softmax: a stage holds ROWS rows (boxes of ROWS x 256 fp32 along the row). WPR warps
// share a row: one pass keeps an online (max, sum) pair, a second writes exp(x - max) / sum
// in place; TMA stores the stage back.
#ifndef ROWS
#define ROWS 4
#endif
#ifndef NBOX
#define NBOX 16
#endif
#ifndef WPR
#define WPR 4
#endif
TMAFLOW_DEVICE float neg_inf() { return __int_as_float(0xff800000); }

// Merge two (max, sum of exp(x - max)) pairs.
TMAFLOW_DEVICE void merge(float& m, float& s, float m2, float s2) {
  if (m2 == neg_inf()) return;
  if (m == neg_inf()) { m = m2; s = s2; return; }
  float nm = fmaxf(m, m2);
  s = s * __expf(m - nm) + s2 * __expf(m2 - nm);
  m = nm;
}

extern "C" __global__ void __launch_bounds__(32 * ROWS * WPR, 1)
softmax(const __grid_constant__ CUtensorMap in, const __grid_constant__ CUtensorMap out,
        int n_cols, int groups) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ float red_m[ROWS][WPR], red_s[ROWS][WPR];
  L::Smem S(smem);
  auto pipe = S.rows();
  constexpr int stages = L::rows::stages;
  constexpr int box_bytes = ROWS * 256 * 4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = warp / WPR, part = warp % WPR;
  const int count = persistent_count(groups);
  auto issue_load = [&](int i) {
    int g = blockIdx.x + i * gridDim.x, s = i % stages;
    uint8_t* base = static_cast<uint8_t*>(S.rows_tile0(s));
    pipe.producer_commit({uint32_t(s), 0});
    for (int b = 0; b < NBOX; ++b) tma::load(base + b * box_bytes, &in, pipe.full + s, b * 256, g * ROWS);
  };
  if (threadIdx.x == 0) {
    pipe.init();
    griddep::wait();  // under PDL: the previous kernel's writes are visible
    griddep::launch_dependents();
    for (int i = 0; i < stages && i < count; ++i) issue_load(i);
  }
  __syncthreads();
  for (int i = 0; i < count; ++i) {
    int g = blockIdx.x + i * gridDim.x, s = i % stages;
    mbarrier::wait(pipe.full + s, (i / stages) & 1, debug::Site{"rows.full", s, L::rows::tx_bytes});
    uint8_t* base = static_cast<uint8_t*>(S.rows_tile0(s));
    auto at = [&](int c) { return reinterpret_cast<float4*>(base + (c / 256) * box_bytes + row * 1024 + (c % 256) * 4); };
    float m = neg_inf(), sum = 0.f;
    for (int c = (part * 32 + lane) * 4; c < n_cols; c += 128 * WPR) {
      float4 v = *at(c);
      if (c + 1 >= n_cols) v.y = neg_inf();
      if (c + 2 >= n_cols) v.z = neg_inf();
      if (c + 3 >= n_cols) v.w = neg_inf();
      float vm = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
      float nm = fmaxf(m, vm);
      sum = (m == neg_inf() ? 0.f : sum * __expf(m - nm)) +
            __expf(v.x - nm) + __expf(v.y - nm) + __expf(v.z - nm) + __expf(v.w - nm);
      m = nm;
    }
    for (int o = 16; o; o >>= 1) {
      float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, sum, o);
      merge(m, sum, m2, s2);
    }
    if (lane == 0) { red_m[row][part] = m; red_s[row][part] = sum; }
    named_barrier::sync(1 + row, 32 * WPR);  // this row's warps
    m = red_m[row][0]; sum = red_s[row][0];
    for (int p = 1; p < WPR; ++p) merge(m, sum, red_m[row][p], red_s[row][p]);
    const float inv = 1.f / sum;
    for (int c = (part * 32 + lane) * 4; c < n_cols; c += 128 * WPR) {
      float4 v = *at(c);
      v.x = __expf(v.x - m) * inv; v.y = __expf(v.y - m) * inv;
      v.z = __expf(v.z - m) * inv; v.w = __expf(v.w - m) * inv;
      *at(c) = v;  // columns past n_cols are clipped by the TMA store
    }
    fence::proxy_async_shared_cta();
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int b = 0; b < NBOX; ++b) tma::store(&out, base + b * box_bytes, b * 256, g * ROWS);
      tma::commit_group();
      if (i >= 1 && i - 1 + stages < count) {
        tma::wait_group_read<1>();
        issue_load(i - 1 + stages);
      }
    }
  }
  if (threadIdx.x == 0) tma::wait_group<0>();
}
