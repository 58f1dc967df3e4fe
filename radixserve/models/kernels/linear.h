// What gemv.cpp (skinny GEMM) and gemm.cpp (packed GEMM) share: the typed operands of one
// y = (x @ w.T) * scale + bias (linear_problem.h) made from the tensors try_linear checked, the
// dispatch over their dtypes, and the packed GEMM's entry point (called by try_linear for
// products taller than the skinny GEMM's rows).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "linear_problem.h"
#include "simd.h"

namespace rs {

// Allocates y ([..., N] in x's dtype) and returns the typed operands.
template <class WT, class XT>
Linear<WT, XT> linear_operands(const at::Tensor& x, int64_t ldx, const at::Tensor& w,
                               const std::optional<at::Tensor>& scale,
                               const std::optional<at::Tensor>& bias, int64_t M, at::Tensor& y) {
  const int64_t N = w.size(0), K = w.size(1);
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = N;
  y = at::empty(sizes, x.options());
  return {static_cast<const XT*>(x.data_ptr()),
          ldx,
          static_cast<const WT*>(w.data_ptr()),
          N > 1 ? w.stride(0) : K,
          scale.has_value() ? scale->data_ptr<float>() : nullptr,
          bias.has_value() ? static_cast<const XT*>(bias->data_ptr()) : nullptr,
          static_cast<XT*>(y.data_ptr()),
          N,
          M,
          N,
          K};
}

// f(WT{}, XT{}) with the element types of w (fp32, bf16 or int8) and x (fp32 or bf16).
template <class F>
auto with_dtypes(at::ScalarType wt, at::ScalarType xt, F&& f) {
  auto with_x = [&](auto w) { return xt == at::kBFloat16 ? f(w, bf16{}) : f(w, float{}); };
  switch (wt) {
    case at::kFloat: return with_x(float{});
    case at::kBFloat16: return with_x(bf16{});
    default: return with_x(int8_t{});
  }
}

}  // namespace rs

// The packed GEMM (gemm.cpp) of operands try_linear checked: x [M, K] rows of stride ldx, fp32
// or bf16; w [N, K] fp32, bf16 or int8 (then scale [N] fp32); bias [N] of x's dtype.
at::Tensor packed_gemm(const at::Tensor& x, int64_t ldx, const at::Tensor& w,
                       const std::optional<at::Tensor>& scale,
                       const std::optional<at::Tensor>& bias, int64_t M);
// The int8 GEMM on AMX tiles (amx_gemm.cpp): w [N, K] int8 with scale [N], x quantized per row.
// Only where amx_available() (amx.h): the "amx" variant on a CPU (and kernel) that grants AMX.
at::Tensor amx_int8_gemm(const at::Tensor& x, int64_t ldx, const at::Tensor& w,
                         const at::Tensor& scale, const std::optional<at::Tensor>& bias,
                         int64_t M);
// The int8 GEMM with AVX-512 VNNI (gemm_q8.cpp), the same product and quantization of x as
// amx_int8_gemm. Only where vnni_available(): a variant built with AVX-512 VNNI.
bool vnni_available();
// Which of them takes this build's int8 products taller than the skinny GEMM's rows (gemv.cpp,
// the one place that decides; Python asks through the binding int8_gemm): the AMX GEMM, the
// VNNI GEMM or the packed GEMM (int16 pairs), each quantizing x per row.
enum class Int8Gemm { kAmx, kVnni, kPacked };
Int8Gemm int8_gemm_kind();
at::Tensor vnni_int8_gemm(const at::Tensor& x, int64_t ldx, const at::Tensor& w,
                          const at::Tensor& scale, const std::optional<at::Tensor>& bias,
                          int64_t M);
