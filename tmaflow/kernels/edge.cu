// The edge path (tmaflow/kernels/edge.py): arrays the TMA cannot address (rows that are not
// 16-byte multiples, misaligned base addresses, element strides, ranks other than 2) moved and
// reduced with plain loads and stores. Strides are in elements and may be anything.
#include <tmaflow.cuh>

#ifndef ELEM_BYTES
#define ELEM_BYTES 4
#endif
#if ELEM_BYTES == 1
typedef uint8_t Elem;
#elif ELEM_BYTES == 2
typedef uint16_t Elem;
#elif ELEM_BYTES == 4
typedef uint32_t Elem;
#else
typedef uint64_t Elem;
#endif

constexpr int TILE = 32, THREADS = 256, STEPS = THREADS / TILE;

// dst[b, r, c] = src[b, r, c] over a (batch, rows, cols) box, zeros where r >= src_rows or
// c >= src_cols (the zero padding of a staged GEMM operand). A 32 x 32 tile goes through shared
// memory so that the loads and the stores each step along whichever of rows and columns is the
// closer one in their own array: a transposing copy stays coalesced on both sides.
extern "C" __global__ void __launch_bounds__(THREADS)
strided_copy(Elem* dst, const Elem* src, long long batch, long long rows, long long cols,
             long long src_rows, long long src_cols, long long dst_b, long long dst_r,
             long long dst_c, long long src_b, long long src_r, long long src_c) {
  __shared__ Elem tile[TILE][TILE + 1];
  const long long tiles_r = (rows + TILE - 1) / TILE, tiles_c = (cols + TILE - 1) / TILE;
  const long long per_batch = tiles_r * tiles_c, total = batch * per_batch;
  const bool load_along_c = llabs(src_c) <= llabs(src_r), store_along_c = llabs(dst_c) <= llabs(dst_r);
  const int lane = threadIdx.x % TILE, step = threadIdx.x / TILE;
  for (long long t = blockIdx.x; t < total; t += gridDim.x) {
    const long long b = t / per_batch, r0 = (t % per_batch) / tiles_c * TILE, c0 = (t % tiles_c) * TILE;
    for (int i = step; i < TILE; i += STEPS) {
      const int tr = load_along_c ? i : lane, tc = load_along_c ? lane : i;
      const long long r = r0 + tr, c = c0 + tc;
      tile[tr][tc] = r < src_rows && c < src_cols && r < rows && c < cols
                         ? src[b * src_b + r * src_r + c * src_c] : Elem(0);
    }
    __syncthreads();
    for (int i = step; i < TILE; i += STEPS) {
      const int tr = store_along_c ? i : lane, tc = store_along_c ? lane : i;
      const long long r = r0 + tr, c = c0 + tc;
      if (r < rows && c < cols) dst[b * dst_b + r * dst_r + c * dst_c] = tile[tr][tc];
    }
    __syncthreads();  // the tile is refilled next round
  }
}

// The rows of a staged GEMM operand (or of a staged output copied back): up to two jobs a launch
// (edge.py stage_launches), each dst[r, c] = src[r, c] over dst's (rows, cols), zeros where
// r >= src_rows or c >= src_cols. Elements are contiguous along rows on both sides and rows
// `*_pitch` elements apart. A thread moves one 16-byte chunk of a dst row: through one 16-byte
// load (store) where that side's base and pitch are 16-byte multiples (flags SRC_VEC, DST_VEC),
// element by element elsewhere. Under PDL it waits for the previous grid before reading, and
// lets the next one (the GEMM) launch at once.
constexpr int CHUNK = 16 / ELEM_BYTES;
constexpr long long SRC_VEC = 1, DST_VEC = 2;

union Chunk {
  uint4 q;
  Elem e[CHUNK];
};

TMAFLOW_DEVICE void stage_chunk(Elem* dst, const Elem* src, long long r, long long c0, long long cols, long long src_rows,
                                long long src_cols, long long dst_pitch, long long src_pitch, long long flags) {
  Chunk v;
  const Elem* s = src + r * src_pitch + c0;
  if ((flags & SRC_VEC) && r < src_rows && c0 + CHUNK <= src_cols) {
    v.q = *reinterpret_cast<const uint4*>(s);
  } else {
#pragma unroll
    for (int i = 0; i < CHUNK; ++i) v.e[i] = r < src_rows && c0 + i < src_cols ? s[i] : Elem(0);
  }
  Elem* d = dst + r * dst_pitch + c0;
  if ((flags & DST_VEC) && c0 + CHUNK <= cols) {
    *reinterpret_cast<uint4*>(d) = v.q;
  } else {
#pragma unroll
    for (int i = 0; i < CHUNK; ++i)
      if (c0 + i < cols) d[i] = v.e[i];
  }
}

// Chunks are numbered row by row through job 0, then job 1 (32-bit: the host keeps the count
// below 2^31).
extern "C" __global__ void __launch_bounds__(THREADS)
stage_rows(Elem* dst0, const Elem* src0, long long rows0, long long cols0, long long src_rows0, long long src_cols0,
           long long dst_pitch0, long long src_pitch0, long long flags0, Elem* dst1, const Elem* src1, long long rows1,
           long long cols1, long long src_rows1, long long src_cols1, long long dst_pitch1, long long src_pitch1,
           long long flags1) {
  tmaflow::griddep::wait();  // under PDL: the previous grid's writes (and reads of dst) are done
  tmaflow::griddep::launch_dependents();
  const uint32_t per0 = uint32_t((cols0 + CHUNK - 1) / CHUNK), per1 = uint32_t((cols1 + CHUNK - 1) / CHUNK);
  const uint32_t n0 = uint32_t(rows0) * per0, total = n0 + uint32_t(rows1) * per1;
  for (uint32_t t = blockIdx.x * THREADS + threadIdx.x; t < total; t += gridDim.x * THREADS) {
    if (t < n0)
      stage_chunk(dst0, src0, t / per0, t % per0 * CHUNK, cols0, src_rows0, src_cols0, dst_pitch0, src_pitch0, flags0);
    else
      stage_chunk(dst1, src1, (t - n0) / per1, (t - n0) % per1 * CHUNK, cols1, src_rows1, src_cols1, dst_pitch1,
                  src_pitch1, flags1);
  }
}

TMAFLOW_DEVICE float neg_inf() { return __int_as_float(0xff800000); }

// Fold (m2, s2) into the pair (m, s): maxima, and sums of exp(x - max) rescaled to the larger.
TMAFLOW_DEVICE void merge(float& m, float& s, float m2, float s2) {
  if (m2 == neg_inf()) return;
  if (m == neg_inf()) { m = m2; s = s2; return; }
  const float nm = fmaxf(m, m2);
  s = s * __expf(m - nm) + s2 * __expf(m2 - nm);
  m = nm;
}

// Softmax along rows of any width and stride, a warp a row (row r is (r / inner, r % inner) of
// the outer x inner leading dims): an online (max, sum of exp) pair per lane merged across the
// warp, then exp(x - max) / sum written out; fp32 math as softmax.cu.
extern "C" __global__ void __launch_bounds__(THREADS)
softmax_rows(float* out, const float* in, long long outer, long long inner, long long cols,
             long long in_o, long long in_i, long long in_c, long long out_o, long long out_i,
             long long out_c) {
  const int lane = threadIdx.x % 32, warps = THREADS / 32;
  const long long rows = outer * inner;
  for (long long row = blockIdx.x * (long long)warps + threadIdx.x / 32; row < rows;
       row += (long long)gridDim.x * warps) {
    const float* x = in + row / inner * in_o + row % inner * in_i;
    float* y = out + row / inner * out_o + row % inner * out_i;
    float m = neg_inf(), s = 0.f;
    for (long long c = lane; c < cols; c += 32) merge(m, s, x[c * in_c], 1.f);
    for (int o = 16; o; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
      merge(m, s, m2, s2);
    }
    const float inv = 1.f / s;
    for (long long c = lane; c < cols; c += 32) y[c * out_c] = __expf(x[c * in_c] - m) * inv;
  }
}
