// Warpgroup MMA (sm_90a): asynchronous tensor-core matrix multiply-accumulate issued by a
// warpgroup (4 consecutive warps, the first at a warp index divisible by 4).
#pragma once
namespace tmaflow { namespace wgmma {
// Shared-memory matrix descriptor of a K-major tile with a 128B, 64B or 32B swizzle (Span =
// 128, 64 or 32: the bytes of a row; 8-row atoms of 8 x Span B), as TMA writes boxes of Span-byte
// rows. A k-step of 16 bf16 elements is 32 B into a row (advance the start by 32 B), so a row
// holds Span / 32 k-steps.
// ptx: none (bit arithmetic on the shared address)
// who: any thread
// order: none
template <int Span> TMAFLOW_DEVICE uint64_t desc_k_major(const void* smem) {
  static_assert(Span == 128 || Span == 64 || Span == 32, "a swizzle span is 128, 64 or 32 B");
  uint64_t addr = smem_u32(smem);
  uint64_t desc = (addr & 0x3FFFF) >> 4;
  desc |= uint64_t(1) << 16;                          // leading byte offset (unused for K-major swizzled)
  desc |= uint64_t(8 * Span >> 4) << 32;              // stride byte offset: 8 rows
  desc |= uint64_t(Span == 128 ? 1 : Span == 64 ? 2 : 3) << 62;  // swizzle mode
  return desc;
}
// Descriptor of an MN-major tile with a 128B, 64B or 32B swizzle as TMA writes boxes of Span / 2
// MN-elements (Span bytes) x K rows: 8-row groups along K are 8 x Span B apart and consecutive
// boxes along MN `mn_block_bytes` apart. Advance the start by 16 rows x Span B per k-step of 16.
// ptx: none (bit arithmetic on the shared address)
// who: any thread
// order: none
template <int Span> TMAFLOW_DEVICE uint64_t desc_mn_major(const void* smem, uint32_t mn_block_bytes) {
  static_assert(Span == 128 || Span == 64 || Span == 32, "a swizzle span is 128, 64 or 32 B");
  uint64_t addr = smem_u32(smem);
  uint64_t desc = (addr & 0x3FFFF) >> 4;
  desc |= uint64_t((mn_block_bytes & 0x3FFFF) >> 4) << 16;
  desc |= uint64_t(8 * Span >> 4) << 32;
  desc |= uint64_t(Span == 128 ? 1 : Span == 64 ? 2 : 3) << 62;
  return desc;
}
// Shared-memory matrix descriptor for a K-major tile stored with the 128B swizzle, as TMA
// writes it: rows of 128 B, 8-row (1024 B) swizzle atoms. Advance the start address by 32 B
// per k-step of 16 bf16 elements.
// ptx: none (bit arithmetic on the shared address)
// who: any thread (every thread of the warpgroup computes the same value)
// order: none
TMAFLOW_DEVICE uint64_t desc_k_major_sw128(const void* smem) { return desc_k_major<128>(smem); }
// Descriptor for an MN-major tile stored with the 128B swizzle as TMA writes boxes of
// 64 MN-elements (128 B) x K rows: 8-row groups along K are 1024 B apart (stride byte offset)
// and consecutive 64-element blocks along MN are `mn_block_bytes` apart (leading byte
// offset: the box size when boxes are stacked). Advance the start by 16 rows x 128 B = 2048 B
// per k-step of 16.
// ptx: none (bit arithmetic on the shared address)
// who: any thread
// order: none
TMAFLOW_DEVICE uint64_t desc_mn_major_sw128(const void* smem, uint32_t mn_block_bytes) {
  return desc_mn_major<128>(smem, mn_block_bytes);
}
// Two fp32 accumulators as one bf16x2 register, lo in the low half: an epilogue word, or (from
// a C fragment) one register of an A fragment for the next wgmma.
// ptx: cvt.rn.bf16x2.f32
// who: any thread
// order: none
TMAFLOW_DEVICE uint32_t bf16x2(float lo, float hi) {
  uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
}
// ditto: for fp16.
// ptx: cvt.rn.f16x2.f32
TMAFLOW_DEVICE uint32_t f16x2(float lo, float hi) {
  uint32_t packed;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
}
// Order this warpgroup's register accesses (accumulators, A fragments) before the wgmmas that
// follow: before the first wgmma of a group, and whenever registers it reads were written.
// ptx: wgmma.fence.sync.aligned
// who: a warpgroup (all 128 threads, converged)
// order: registers only; smem written by generic stores needs fence::proxy_async_shared_cta.
TMAFLOW_DEVICE void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
// Close the group of wgmmas issued since the last commit.
// ptx: wgmma.commit_group.sync.aligned
// who: a warpgroup (all 128 threads, converged)
// order: groups are per warpgroup; wait for them with wait_group.
TMAFLOW_DEVICE void commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  TMAFLOW_TRACE_EVENT(kWgmmaCommit, -1, 0, 0);
}
// Wait until at most N of this warpgroup's wgmma groups are pending: the older groups' `d`
// registers are final and their smem operands may be overwritten (release the stage after it).
// ptx: wgmma.wait_group.sync.aligned N
// who: a warpgroup (all 128 threads, converged)
// order: then the stage may be released (consumer_release / consumer_release_warp).
template <int N> TMAFLOW_DEVICE void wait_group() {
  TMAFLOW_TRACE_BEGIN(kWgmmaWait);
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
  TMAFLOW_TRACE_SPAN(kWgmmaWait, -1, 0, N, 0);
}
// Keep accumulator registers live across asynchronous wgmma (no reordering by the compiler).
// ptx: none (an empty asm per register)
// who: a warpgroup (each thread for its own registers)
// order: a compiler barrier for `d` only.
template <int R> TMAFLOW_DEVICE void fence_operands(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}
// wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 — D(64x8, fp32) += A(64x16) * B(16x8)^T,
// A K-major, B K-major (TransB = 0) or N-major (TransB = 1), in shared memory (descriptors);
// scale_d = 0 overwrites D. Narrow N serves skinny products with the operands swapped.
// ptx: wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16
// who: a warpgroup (all 128 threads, converged; warpgroup-uniform arguments)
// order: asynchronous: wgmma::fence() before the first wgmma of a group (after `d` or A's
// registers were written), then commit_group() and wait_group<N>() before reading `d` or
// overwriting the smem operands. Operands TMA wrote need only the barrier wait; ones
// written by st.shared need fence::proxy_async_shared_cta() and a barrier first.
template <int TransB = 0>
TMAFLOW_DEVICE void mma_m64n8k16_bf16(float (&d)[4], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %6, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, %7;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransB));
}
// ditto: D(64x16, fp32) += A(64x16) * B(16x16)^T.
// ptx: wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16
template <int TransB = 0>
TMAFLOW_DEVICE void mma_m64n16k16_bf16(float (&d)[8], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, %11;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransB));
}
// ditto: D(64x32, fp32) += A(64x16) * B(16x32)^T.
// ptx: wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16
template <int TransB = 0>
TMAFLOW_DEVICE void mma_m64n32k16_bf16(float (&d)[16], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, %19;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransB));
}
// ditto: D(64x64, fp32) += A(64x16) * B(16x64)^T.
// ptx: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16
template <int TransB = 0>
TMAFLOW_DEVICE void mma_m64n64k16_bf16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, %35;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransB));
}
// ditto: D(64x128, fp32) += A(64x16) * B(16x128)^T.
// ptx: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16
template <int TransB = 0>
TMAFLOW_DEVICE void mma_m64n128k16_bf16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, %67;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransB));
}
// ditto: D(64x176, fp32) += A(64x16) * B(16x176)^T; attention's S at head dim 128: 176-key tiles.
// ptx: wgmma.mma_async.sync.aligned.m64n176k16.f32.bf16.bf16
template <int TransB = 0>
TMAFLOW_DEVICE void mma_m64n176k16_bf16(float (&d)[88], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %90, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n176k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, %88, %89, p, 1, 1, 0, %91;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransB));
}
// ditto: D(64x192, fp32) += A(64x16) * B(16x192)^T; the GEMM's 192-column tiles.
// ptx: wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16
template <int TransB = 0>
TMAFLOW_DEVICE void mma_m64n192k16_bf16(float (&d)[96], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %98, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, %96, %97, p, 1, 1, 0, %99;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransB));
}
// ditto: D(64x256, fp32) += A(64x16) * B(16x256)^T.
// ptx: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16
template <int TransB = 0>
TMAFLOW_DEVICE void mma_m64n256k16_bf16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, %131;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransB));
}
// wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 — D(64x128, fp32) += A(64x32) * B(32x128)^T
// for fp8 (e4m3) operands, both K-major (fp8 has no transposed form), in shared memory
// (descriptors; a k-step of 32 elements is 32 B, as 16 bf16 are); scale_d = 0 overwrites D.
// The tensor cores keep fewer accumulator bits for fp8 than fp32 has: long sums are added
// into fp32 registers every few k-blocks (promotion).
// ptx: wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3
// who: a warpgroup (all 128 threads, converged; warpgroup-uniform arguments)
// order: asynchronous: wgmma::fence() before the first wgmma of a group (after `d` or A's
// registers were written), then commit_group() and wait_group<N>() before reading `d` or
// overwriting the smem operands. Operands TMA wrote need only the barrier wait; ones
// written by st.shared need fence::proxy_async_shared_cta() and a barrier first.
TMAFLOW_DEVICE void mma_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
// ditto: D(64x8, fp32) += A(64x32) * B(32x8)^T.
// ptx: wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3
TMAFLOW_DEVICE void mma_m64n8k32_e4m3(float (&d)[4], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %6, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
// ditto: D(64x16, fp32) += A(64x32) * B(32x16)^T.
// ptx: wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3
TMAFLOW_DEVICE void mma_m64n16k32_e4m3(float (&d)[8], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
               : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
// ditto: D(64x32, fp32) += A(64x32) * B(32x32)^T.
// ptx: wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3
TMAFLOW_DEVICE void mma_m64n32k32_e4m3(float (&d)[16], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
               : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
// ditto: D(64x64, fp32) += A(64x32) * B(32x64)^T.
// ptx: wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3
TMAFLOW_DEVICE void mma_m64n64k32_e4m3(float (&d)[32], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
// ditto: D(64x192, fp32) += A(64x32) * B(32x192)^T.
// ptx: wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3
TMAFLOW_DEVICE void mma_m64n192k32_e4m3(float (&d)[96], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %98, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, %96, %97, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
               : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
// ditto: D(64x256, fp32) += A(64x32) * B(32x256)^T.
// ptx: wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3
TMAFLOW_DEVICE void mma_m64n256k32_e4m3(float (&d)[128], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
               : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
// wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 with A from registers — D(64x64, fp32) +=
// A(64x16) * B(16x64): each warp holds its 16 rows of A as an mma.m16n8k16 A fragment (4 x bf16x2;
// the fp32 C fragment of a previous wgmma, converted, is one), B in shared memory, K-major
// (TransB = 0) or N-major (TransB = 1). Attention's P V: P straight from the softmax registers.
// ptx: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16
// who: a warpgroup (all 128 threads, converged; warpgroup-uniform arguments)
// order: asynchronous: wgmma::fence() before the first wgmma of a group (after `d` or A's
// registers were written), then commit_group() and wait_group<N>() before reading `d` or
// overwriting the smem operands. Operands TMA wrote need only the barrier wait; ones
// written by st.shared need fence::proxy_async_shared_cta() and a barrier first.
template <int TransB = 0>
TMAFLOW_DEVICE void mma_m64n64k16_bf16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB));
}
// ditto: D(64x128, fp32) += A(64x16) * B(16x128) (A from registers).
// ptx: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16
template <int TransB = 0>
TMAFLOW_DEVICE void mma_m64n128k16_bf16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB));
}
// ditto: D(64x256, fp32) += A(64x16) * B(16x256) (A from registers); attention's P V at head dim
// 256.
// ptx: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16
template <int TransB = 0>
TMAFLOW_DEVICE void mma_m64n256k16_bf16_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %133, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB));
}
// fp16 twins of the bf16 wrappers above that attention uses (wgmma .f32.f16.f16: the same
// fragments, descriptors and layouts; only the element type differs).
// ptx: wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16
// who: a warpgroup (all 128 threads, converged; warpgroup-uniform arguments)
// order: asynchronous: wgmma::fence() before the first wgmma of a group (after `d` or A's
// registers were written), then commit_group() and wait_group<N>() before reading `d` or
// overwriting the smem operands. Operands TMA wrote need only the barrier wait; ones
// written by st.shared need fence::proxy_async_shared_cta() and a barrier first.
template <int TransB = 0>
TMAFLOW_DEVICE void mma_m64n64k16_f16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, %35;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransB));
}
// ditto: D(64x128, fp32) += A(64x16) * B(16x128)^T.
// ptx: wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16
template <int TransB = 0>
TMAFLOW_DEVICE void mma_m64n128k16_f16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, %67;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransB));
}
// ditto: D(64x176, fp32) += A(64x16) * B(16x176)^T.
// ptx: wgmma.mma_async.sync.aligned.m64n176k16.f32.f16.f16
template <int TransB = 0>
TMAFLOW_DEVICE void mma_m64n176k16_f16(float (&d)[88], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %90, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n176k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, %88, %89, p, 1, 1, 0, %91;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransB));
}
// The fp16 twin of mma_m64n64k16_bf16_rs: A (64x16 fp16) from registers as an mma.m16n8k16
// A fragment (4 x f16x2), B in shared memory.
// ptx: wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16
// who: a warpgroup (all 128 threads, converged; warpgroup-uniform arguments)
// order: asynchronous: wgmma::fence() before the first wgmma of a group (after `d` or A's
// registers were written), then commit_group() and wait_group<N>() before reading `d` or
// overwriting the smem operands. Operands TMA wrote need only the barrier wait; ones
// written by st.shared need fence::proxy_async_shared_cta() and a barrier first.
template <int TransB = 0>
TMAFLOW_DEVICE void mma_m64n64k16_f16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB));
}
// ditto: D(64x128, fp32) += A(64x16) * B(16x128) (A from registers).
// ptx: wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16
template <int TransB = 0>
TMAFLOW_DEVICE void mma_m64n128k16_f16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB));
}
// ditto: D(64x256, fp32) += A(64x16) * B(16x256) (A from registers).
// ptx: wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16
template <int TransB = 0>
TMAFLOW_DEVICE void mma_m64n256k16_f16_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %133, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB));
}
// wgmma.mma_async m64nNk16 for every N a multiple of 16 from 16 to 256, overloaded by the
// accumulator count R = N / 2 (the float array's size picks the shape): kernels whose tile
// widths are compile-time parameters call one name for every width. NVRTC's inline asm numbers
// its operands (no symbolic names), so each width's operand lists are spelled out here.
#define TMAFLOW_F8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
  "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define TMAFLOW_REGS_8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define TMAFLOW_ACC_8 TMAFLOW_F8(0)
#define TMAFLOW_REGS_16 TMAFLOW_REGS_8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define TMAFLOW_ACC_16 TMAFLOW_ACC_8, TMAFLOW_F8(8)
#define TMAFLOW_REGS_24 TMAFLOW_REGS_16 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define TMAFLOW_ACC_24 TMAFLOW_ACC_16, TMAFLOW_F8(16)
#define TMAFLOW_REGS_32 TMAFLOW_REGS_24 ", %24, %25, %26, %27, %28, %29, %30, %31"
#define TMAFLOW_ACC_32 TMAFLOW_ACC_24, TMAFLOW_F8(24)
#define TMAFLOW_REGS_40 TMAFLOW_REGS_32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define TMAFLOW_ACC_40 TMAFLOW_ACC_32, TMAFLOW_F8(32)
#define TMAFLOW_REGS_48 TMAFLOW_REGS_40 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define TMAFLOW_ACC_48 TMAFLOW_ACC_40, TMAFLOW_F8(40)
#define TMAFLOW_REGS_56 TMAFLOW_REGS_48 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define TMAFLOW_ACC_56 TMAFLOW_ACC_48, TMAFLOW_F8(48)
#define TMAFLOW_REGS_64 TMAFLOW_REGS_56 ", %56, %57, %58, %59, %60, %61, %62, %63"
#define TMAFLOW_ACC_64 TMAFLOW_ACC_56, TMAFLOW_F8(56)
#define TMAFLOW_REGS_72 TMAFLOW_REGS_64 ", %64, %65, %66, %67, %68, %69, %70, %71"
#define TMAFLOW_ACC_72 TMAFLOW_ACC_64, TMAFLOW_F8(64)
#define TMAFLOW_REGS_80 TMAFLOW_REGS_72 ", %72, %73, %74, %75, %76, %77, %78, %79"
#define TMAFLOW_ACC_80 TMAFLOW_ACC_72, TMAFLOW_F8(72)
#define TMAFLOW_REGS_88 TMAFLOW_REGS_80 ", %80, %81, %82, %83, %84, %85, %86, %87"
#define TMAFLOW_ACC_88 TMAFLOW_ACC_80, TMAFLOW_F8(80)
#define TMAFLOW_REGS_96 TMAFLOW_REGS_88 ", %88, %89, %90, %91, %92, %93, %94, %95"
#define TMAFLOW_ACC_96 TMAFLOW_ACC_88, TMAFLOW_F8(88)
#define TMAFLOW_REGS_104 TMAFLOW_REGS_96 ", %96, %97, %98, %99, %100, %101, %102, %103"
#define TMAFLOW_ACC_104 TMAFLOW_ACC_96, TMAFLOW_F8(96)
#define TMAFLOW_REGS_112 TMAFLOW_REGS_104 ", %104, %105, %106, %107, %108, %109, %110, %111"
#define TMAFLOW_ACC_112 TMAFLOW_ACC_104, TMAFLOW_F8(104)
#define TMAFLOW_REGS_120 TMAFLOW_REGS_112 ", %112, %113, %114, %115, %116, %117, %118, %119"
#define TMAFLOW_ACC_120 TMAFLOW_ACC_112, TMAFLOW_F8(112)
#define TMAFLOW_REGS_128 TMAFLOW_REGS_120 ", %120, %121, %122, %123, %124, %125, %126, %127"
#define TMAFLOW_ACC_128 TMAFLOW_ACC_120, TMAFLOW_F8(120)
// X(N, R, accumulator list, its constraints, then the numbers of the 7 operands after it)
#define TMAFLOW_WGMMA_WIDTHS(X, T) \
  X(T, 16, 8, TMAFLOW_REGS_8, TMAFLOW_ACC_8, "%8", "%9", "%10", "%11", "%12", "%13", "%14") \
  X(T, 32, 16, TMAFLOW_REGS_16, TMAFLOW_ACC_16, "%16", "%17", "%18", "%19", "%20", "%21", "%22") \
  X(T, 48, 24, TMAFLOW_REGS_24, TMAFLOW_ACC_24, "%24", "%25", "%26", "%27", "%28", "%29", "%30") \
  X(T, 64, 32, TMAFLOW_REGS_32, TMAFLOW_ACC_32, "%32", "%33", "%34", "%35", "%36", "%37", "%38") \
  X(T, 80, 40, TMAFLOW_REGS_40, TMAFLOW_ACC_40, "%40", "%41", "%42", "%43", "%44", "%45", "%46") \
  X(T, 96, 48, TMAFLOW_REGS_48, TMAFLOW_ACC_48, "%48", "%49", "%50", "%51", "%52", "%53", "%54") \
  X(T, 112, 56, TMAFLOW_REGS_56, TMAFLOW_ACC_56, "%56", "%57", "%58", "%59", "%60", "%61", "%62") \
  X(T, 128, 64, TMAFLOW_REGS_64, TMAFLOW_ACC_64, "%64", "%65", "%66", "%67", "%68", "%69", "%70") \
  X(T, 144, 72, TMAFLOW_REGS_72, TMAFLOW_ACC_72, "%72", "%73", "%74", "%75", "%76", "%77", "%78") \
  X(T, 160, 80, TMAFLOW_REGS_80, TMAFLOW_ACC_80, "%80", "%81", "%82", "%83", "%84", "%85", "%86") \
  X(T, 176, 88, TMAFLOW_REGS_88, TMAFLOW_ACC_88, "%88", "%89", "%90", "%91", "%92", "%93", "%94") \
  X(T, 192, 96, TMAFLOW_REGS_96, TMAFLOW_ACC_96, "%96", "%97", "%98", "%99", "%100", "%101", "%102") \
  X(T, 208, 104, TMAFLOW_REGS_104, TMAFLOW_ACC_104, "%104", "%105", "%106", "%107", "%108", "%109", "%110") \
  X(T, 224, 112, TMAFLOW_REGS_112, TMAFLOW_ACC_112, "%112", "%113", "%114", "%115", "%116", "%117", "%118") \
  X(T, 240, 120, TMAFLOW_REGS_120, TMAFLOW_ACC_120, "%120", "%121", "%122", "%123", "%124", "%125", "%126") \
  X(T, 256, 128, TMAFLOW_REGS_128, TMAFLOW_ACC_128, "%128", "%129", "%130", "%131", "%132", "%133", "%134")

// D(64xN, fp32) += A(64x16) * B(16xN)^T for T = bf16 or f16 operands, both in shared memory
// (descriptors), N = 2 R from the accumulator array (16 to 256); TransB as mma_m64n64k16_bf16's.
// ptx: wgmma.mma_async.sync.aligned.m64nNk16.f32.<t>.<t>
// who: a warpgroup (all 128 threads, converged; warpgroup-uniform arguments)
// order: as mma_m64n64k16_bf16 (fence before, commit_group and wait_group after).
#define TMAFLOW_MMA_K16(T, N, R, REGS, ACC, A0, A1, A2, A3, A4, A5, A6) \
  template <int TransB = 0> \
  TMAFLOW_DEVICE void mma_k16_##T(float (&d)[R], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) { \
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, " A2 ", 0;\n" \
                 " wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #T "." #T " {" REGS "}, " A0 ", " A1 \
                 ", p, 1, 1, 0, " A3 ";\n}\n" \
                 : ACC : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransB)); }
TMAFLOW_WGMMA_WIDTHS(TMAFLOW_MMA_K16, bf16)
TMAFLOW_WGMMA_WIDTHS(TMAFLOW_MMA_K16, f16)
// ditto: A (64x16) from registers as an mma.m16n8k16 A fragment (4 x <t>x2), B in shared memory.
// ptx: wgmma.mma_async.sync.aligned.m64nNk16.f32.<t>.<t> (A from registers)
#define TMAFLOW_MMA_K16_RS(T, N, R, REGS, ACC, A0, A1, A2, A3, A4, A5, A6) \
  template <int TransB = 0> \
  TMAFLOW_DEVICE void mma_k16_rs_##T(float (&d)[R], const uint32_t (&a)[4], uint64_t desc_b, uint32_t scale_d) { \
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, " A5 ", 0;\n" \
                 " wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #T "." #T " {" REGS "}, {" A0 ", " A1 ", " \
                 A2 ", " A3 "}, " A4 ", p, 1, 1, " A6 ";\n}\n" \
                 : ACC : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB)); }
TMAFLOW_WGMMA_WIDTHS(TMAFLOW_MMA_K16_RS, bf16)
TMAFLOW_WGMMA_WIDTHS(TMAFLOW_MMA_K16_RS, f16)
#undef TMAFLOW_MMA_K16
#undef TMAFLOW_MMA_K16_RS
#undef TMAFLOW_WGMMA_WIDTHS
#undef TMAFLOW_F8
#undef TMAFLOW_REGS_8
#undef TMAFLOW_ACC_8
#undef TMAFLOW_REGS_16
#undef TMAFLOW_ACC_16
#undef TMAFLOW_REGS_24
#undef TMAFLOW_ACC_24
#undef TMAFLOW_REGS_32
#undef TMAFLOW_ACC_32
#undef TMAFLOW_REGS_40
#undef TMAFLOW_ACC_40
#undef TMAFLOW_REGS_48
#undef TMAFLOW_ACC_48
#undef TMAFLOW_REGS_56
#undef TMAFLOW_ACC_56
#undef TMAFLOW_REGS_64
#undef TMAFLOW_ACC_64
#undef TMAFLOW_REGS_72
#undef TMAFLOW_ACC_72
#undef TMAFLOW_REGS_80
#undef TMAFLOW_ACC_80
#undef TMAFLOW_REGS_88
#undef TMAFLOW_ACC_88
#undef TMAFLOW_REGS_96
#undef TMAFLOW_ACC_96
#undef TMAFLOW_REGS_104
#undef TMAFLOW_ACC_104
#undef TMAFLOW_REGS_112
#undef TMAFLOW_ACC_112
#undef TMAFLOW_REGS_120
#undef TMAFLOW_ACC_120
#undef TMAFLOW_REGS_128
#undef TMAFLOW_ACC_128
}}  // namespace tmaflow::wgmma
