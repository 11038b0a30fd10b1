// Warpgroup MMA with both operands MN-major in shared memory (transposed A and B), and vector
// reductions into global fp32: what attention's backward needs beyond wgmma.cuh (dQ = dS K with
// dS stored as dS^T, rows of keys). Included by the kernels that use it, not by tmaflow.cuh.
#pragma once
namespace tmaflow { namespace wgmma {
#define TMAFLOW_TN_F8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
  "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define TMAFLOW_TN_REGS_16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define TMAFLOW_TN_REGS_32 TMAFLOW_TN_REGS_16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
// D(64xN, fp32) += A(64x16) * B(16xN) for T = bf16 or f16, A stored MN-major (M contiguous:
// A^T's rows, tnspA = 1) and B MN-major (N contiguous, tnspB = 1), both by descriptors
// (desc_mn_major); N = 2 R (32 or 64).
// ptx: wgmma.mma_async.sync.aligned.m64nNk16.f32.<t>.<t> with imm-trans-a = imm-trans-b = 1
// who: a warpgroup (all 128 threads, converged; warpgroup-uniform arguments)
// order: as mma_m64n64k16_bf16 (fence before, commit_group and wait_group after; operands
// written by st.shared need fence::proxy_async_shared_cta() and a barrier first).
#define TMAFLOW_MMA_TN(T, N, R, REGS, A0, A1, A2) \
  TMAFLOW_DEVICE void mma_k16_tn_##T(float (&d)[R], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) { \
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, " A2 ", 0;\n" \
                 " wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #T "." #T " {" REGS "}, " A0 ", " A1 \
                 ", p, 1, 1, 1, 1;\n}\n" \
                 : TMAFLOW_TN_ACC_##R : "l"(desc_a), "l"(desc_b), "r"(scale_d)); }
#define TMAFLOW_TN_ACC_16 TMAFLOW_TN_F8(0), TMAFLOW_TN_F8(8)
#define TMAFLOW_TN_ACC_32 TMAFLOW_TN_ACC_16, TMAFLOW_TN_F8(16), TMAFLOW_TN_F8(24)
TMAFLOW_MMA_TN(bf16, 32, 16, TMAFLOW_TN_REGS_16, "%16", "%17", "%18")
TMAFLOW_MMA_TN(bf16, 64, 32, TMAFLOW_TN_REGS_32, "%32", "%33", "%34")
TMAFLOW_MMA_TN(f16, 32, 16, TMAFLOW_TN_REGS_16, "%16", "%17", "%18")
TMAFLOW_MMA_TN(f16, 64, 32, TMAFLOW_TN_REGS_32, "%32", "%33", "%34")
#undef TMAFLOW_MMA_TN
#undef TMAFLOW_TN_ACC_16
#undef TMAFLOW_TN_ACC_32
#undef TMAFLOW_TN_REGS_16
#undef TMAFLOW_TN_REGS_32
#undef TMAFLOW_TN_F8
}  // namespace wgmma
namespace red {
// global[0..1] += (x, y), each element atomically (one 8-byte vector reduction, 8-byte aligned).
// ptx: red.global.add.v2.f32
// who: any thread
// order: relaxed; a later release (fence + flag) publishes it.
TMAFLOW_DEVICE void add_v2(float* at, float x, float y) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" :: "l"(at), "f"(x), "f"(y) : "memory");
}
}}  // namespace tmaflow::red
