// Arithmetic the library's kernels share: single-instruction forms of what the math library
// computes in several (the softmax of attention sits between two GEMMs on the critical path).
#pragma once
namespace tmaflow { namespace math {
// 2^x in one MUFU instruction (exp2f without fast math is a multi-instruction routine);
// approximate (2 ulp), subnormal results flushed to zero, exp2_approx(-inf) = 0.
// ptx: ex2.approx.ftz.f32
// who: any thread
// order: none (registers only)
TMAFLOW_DEVICE float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
}}  // namespace tmaflow::math
