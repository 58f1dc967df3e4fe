// vnni_int8_gemm: the AVX-512 VNNI int8 GEMM (gemm_q8.h) on the tensors try_linear (gemv.cpp)
// checked; vnni_available() says whether this build has it (the variants built with AVX-512
// VNNI: their CPUs all run it).
#include <ATen/core/Tensor.h>

#include <optional>

#include "gemm_q8.h"
#include "linear.h"

#if defined(RS_HAS_Q8_GEMM)

bool vnni_available() { return true; }

at::Tensor vnni_int8_gemm(const at::Tensor& x, int64_t ldx, const at::Tensor& w,
                          const at::Tensor& scale, const std::optional<at::Tensor>& bias,
                          int64_t M) {
  TORCH_CHECK(w.size(1) <= rs::kVnniMaxK, "vnni_int8_gemm: K past ", rs::kVnniMaxK);
  at::Tensor y;
  if (x.scalar_type() == at::kBFloat16) {
    rs::gemm_q8::run(rs::linear_operands<int8_t, rs::bf16>(x, ldx, w, scale, bias, M, y));
  } else {
    rs::gemm_q8::run(rs::linear_operands<int8_t, float>(x, ldx, w, scale, bias, M, y));
  }
  return y;
}

#else  // no AVX-512 VNNI in this build

bool vnni_available() { return false; }

at::Tensor vnni_int8_gemm(const at::Tensor&, int64_t, const at::Tensor&, const at::Tensor&,
                          const std::optional<at::Tensor>&, int64_t) {
  TORCH_CHECK(false, "vnni_int8_gemm: this build has no AVX-512 VNNI");
}

#endif
