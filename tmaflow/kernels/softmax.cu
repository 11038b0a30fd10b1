// tmaflow-native example kernels. Shared-memory layouts come from tf.SharedLayout
// (tmaflow_layout.cuh), so no kernel spells a byte count, an arrival count or an offset.
#include <tmaflow.cuh>
#include "tmaflow_layout.cuh"
using namespace tmaflow;
namespace L = tmaflow_layout;

// Row softmax: a stage holds ROWS rows (boxes of ROWS x 256 fp32 along the row); one warp per
// row computes max, sum and the normalised values in place; TMA stores the stage back.
#ifndef ROWS
#define ROWS 4
#endif
#ifndef NBOX
#define NBOX 16
#endif
extern "C" __global__ void __launch_bounds__(32 * ROWS, 1)
softmax(const __grid_constant__ CUtensorMap in, const __grid_constant__ CUtensorMap out,
        int n_cols, int groups) {
  extern __shared__ __align__(1024) uint8_t smem[];
  L::Smem S(smem);
  auto pipe = S.rows();
  constexpr int stages = L::rows::stages;
  constexpr int box_bytes = ROWS * 256 * 4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int count = blockIdx.x < groups ? (groups - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  auto issue_load = [&](int i) {
    int g = blockIdx.x + i * gridDim.x, s = i % stages;
    uint8_t* base = static_cast<uint8_t*>(S.rows_tile0(s));
    pipe.producer_commit({uint32_t(s), 0});
    for (int b = 0; b < NBOX; ++b) tma::load(base + b * box_bytes, &in, pipe.full + s, b * 256, g * ROWS);
  };
  if (threadIdx.x == 0) {
    pipe.init();
    for (int i = 0; i < stages && i < count; ++i) issue_load(i);
  }
  __syncthreads();
  for (int i = 0; i < count; ++i) {
    int g = blockIdx.x + i * gridDim.x, s = i % stages;
    mbarrier::wait(pipe.full + s, (i / stages) & 1, debug::Site{"rows.full", s, L::rows::tx_bytes});
    uint8_t* base = static_cast<uint8_t*>(S.rows_tile0(s));
    auto at = [&](int c) { return reinterpret_cast<float4*>(base + (c / 256) * box_bytes + warp * 1024 + (c % 256) * 4); };
    float m = __int_as_float(0xff800000);  // -inf
    for (int c = lane * 4; c < n_cols; c += 128) {
      float4 v = *at(c);
      m = fmaxf(m, fmaxf(fmaxf(v.x, c + 1 < n_cols ? v.y : __int_as_float(0xff800000)), fmaxf(c + 2 < n_cols ? v.z : __int_as_float(0xff800000), c + 3 < n_cols ? v.w : __int_as_float(0xff800000))));
    }
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float sum = 0.f;
    for (int c = lane * 4; c < n_cols; c += 128) {
      float4 v = *at(c);
      v.x = __expf(v.x - m); v.y = c + 1 < n_cols ? __expf(v.y - m) : 0.f;
      v.z = c + 2 < n_cols ? __expf(v.z - m) : 0.f; v.w = c + 3 < n_cols ? __expf(v.w - m) : 0.f;
      sum += v.x + v.y + v.z + v.w;
      *at(c) = v;
    }
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    float inv = 1.f / sum;
    for (int c = lane * 4; c < n_cols; c += 128) {
      float4 v = *at(c);
      v.x *= inv; v.y *= inv; v.z *= inv; v.w *= inv;
      *at(c) = v;
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

