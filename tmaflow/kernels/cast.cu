// fp32 -> bf16 for a 2-D result: the last step of a split-K GEMM.
#include <cuda_bf16.h>

extern "C" __global__ void __launch_bounds__(256)
cast_f32_bf16(const float* __restrict__ src, __nv_bfloat16* __restrict__ dst, int rows, int cols,
              long long dst_pitch) {
  const long long n = (long long)rows * cols;
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n; i += (long long)gridDim.x * 256) {
    const long long r = i / cols, c = i % cols;
    dst[r * dst_pitch + c] = __float2bfloat16_rn(src[i]);
  }
}
