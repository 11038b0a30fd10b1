// Warp-level tensor-core math (mma.sync, sm_80 style), ldmatrix and stmatrix: small GEMMs where a
// wgmma's 64 rows would be mostly padding (attention_cp_async, decode attention).
#pragma once
namespace tmaflow { namespace warp {
// Four 8x8 16-bit matrices from shared memory: lane l gives the address of row l % 8 of
// matrix l / 8 (16 contiguous bytes); register i holds this lane's two elements of matrix i
// (row lane / 4, columns 2 (lane % 4) and + 1): the A/B fragment layout of mma_16816.
// ptx: ldmatrix.sync.aligned.m8n8.x4.shared.b16
// who: all 32 lanes of a warp, converged
// order: a shared-memory load: the rows must be written (and a barrier passed) before.
TMAFLOW_DEVICE void ldmatrix_x4(uint32_t (&r)[4], const void* at) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(at)));
}
// ditto: each matrix transposed (lane holds column lane / 4, rows 2 (lane % 4) and + 1): the B
// fragment of a row-major K x N operand (V in P V).
// ptx: ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16
TMAFLOW_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], const void* at) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(at)));
}
// Four 8x8 16-bit matrices to shared memory, ldmatrix_x4's inverse: lane l gives the address of
// row l % 8 of matrix l / 8 (16 contiguous bytes); register i holds this lane's two elements of
// matrix i (row lane / 4, columns 2 (lane % 4) and + 1): an accumulator fragment's layout.
// ptx: stmatrix.sync.aligned.m8n8.x4.shared.b16
// who: all 32 lanes of a warp, converged
// order: a shared-memory store (a TMA store of the rows takes fence::proxy_async_shared_cta and
// a barrier after it).
TMAFLOW_DEVICE void stmatrix_x4(void* at, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
               :: "r"(smem_u32(at)), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}
// D(16x8, fp32) += A(16x16, bf16, row-major) * B(16x8, bf16, column-major). Fragments: a[0..3]
// rows lane / 4 (+ 8 in a[1], a[3]), columns 2 (lane % 4) (+ 8 in a[2], a[3]); b0 / b1 rows
// 2 (lane % 4) (+ 8 in b1), column lane / 4; d[0..1] row lane / 4, d[2..3] row + 8, columns
// 2 (lane % 4) and + 1.
// ptx: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
// who: all 32 lanes of a warp, converged
// order: synchronous (registers only).
TMAFLOW_DEVICE void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// ditto: fp16 A and B.
// ptx: mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
TMAFLOW_DEVICE void mma_16816_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
}}  // namespace tmaflow::warp
