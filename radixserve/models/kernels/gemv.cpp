// try_linear: the skinny GEMM (gemv.h) and, for taller products, the packed GEMM (gemm.h) or
// the AMX int8 GEMM (amx_gemm.cpp), on the tensors they take; None for any others.
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>

#include <cstdint>
#include <optional>

#include "amx.h"
#include "gemv.h"
#include "linear.h"

namespace {

bool dense_cpu(const at::Tensor& t) {
  return t.device().is_cpu() && t.layout() == at::kStrided && !t.is_neg() && !t.is_conj();
}

// Row stride of x seen as [M, K] without copying, or -1 when its leading dims do not collapse.
int64_t row_stride(const at::Tensor& x, int64_t K) {
  if (K > 1 && x.stride(-1) != 1) return -1;
  int64_t ld = -1, span = 0;
  for (int64_t i = x.dim() - 2; i >= 0; --i) {
    if (x.size(i) == 1) continue;
    if (ld < 0) {
      ld = x.stride(i);
    } else if (x.stride(i) != span) {
      return -1;
    }
    span = x.stride(i) * x.size(i);
  }
  return ld < 0 ? K : ld;
}

bool is_vector(const at::Tensor& t, int64_t n, at::ScalarType dtype) {
  return dense_cpu(t) && t.scalar_type() == dtype && t.dim() == 1 && t.size(0) == n &&
         (t.stride(0) == 1 || n == 1) && !t.requires_grad();
}

}  // namespace

Int8Gemm int8_gemm_kind() {
  if (amx_available()) return Int8Gemm::kAmx;
  return vnni_available() ? Int8Gemm::kVnni : Int8Gemm::kPacked;
}

// y [..., N] = (x [..., K] @ w [N, K]^T) * scale [N] (+ bias [N]) when the tensors suit the
// kernels: x (and bias) fp32 or bf16, w fp32 or bf16 (no scale) or int8 (fp32 scale required),
// dense CPU tensors, no autograd, and 1 <= M = x.numel() / K <= max_m (the skinny GEMM; tasks
// of at least min_task_bytes of weight are spread over torch's intra-op threads) or, with
// `gemm`, any larger M (int8 weights on AMX tiles in the amx variant, amx_gemm.cpp, or with
// AVX-512 VNNI, gemm_q8.cpp; otherwise gemm.cpp's packed GEMM); otherwise None, and the caller
// uses its torch path.
std::optional<at::Tensor> try_linear(const at::Tensor& x, const at::Tensor& w,
                                     const std::optional<at::Tensor>& scale,
                                     const std::optional<at::Tensor>& bias, int64_t max_m,
                                     int64_t min_task_bytes, bool gemm) {
  const auto xt = x.scalar_type(), wt = w.scalar_type();
  if (xt != at::kFloat && xt != at::kBFloat16) return std::nullopt;
  if (wt == at::kChar ? !scale.has_value() : (wt != at::kFloat && wt != at::kBFloat16) ||
                                                 scale.has_value()) {
    return std::nullopt;
  }
  if (w.dim() != 2 || x.dim() < 1 || !dense_cpu(x) || !dense_cpu(w)) return std::nullopt;
  const int64_t N = w.size(0), K = w.size(1);
  if (N < 1 || K < 1 || x.size(-1) != K) return std::nullopt;
  const int64_t M = x.numel() / K;
  if (M < 1 || (M > max_m && !gemm)) return std::nullopt;
  if (w.stride(1) != 1 && K > 1) return std::nullopt;
  if (scale.has_value() && !is_vector(*scale, N, at::kFloat)) return std::nullopt;
  if (bias.has_value() && !is_vector(*bias, N, xt)) return std::nullopt;
  if (c10::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad())) {
    return std::nullopt;
  }
  const int64_t ldx = row_stride(x, K);
  if (ldx < 0) return std::nullopt;
  if (M > max_m) {
    if (wt == at::kChar) {
      const Int8Gemm kind = int8_gemm_kind();
      if (kind == Int8Gemm::kAmx) return amx_int8_gemm(x, ldx, w, *scale, bias, M);
      if (kind == Int8Gemm::kVnni && K <= rs::kVnniMaxK) {
        return vnni_int8_gemm(x, ldx, w, *scale, bias, M);
      }
    }
    return packed_gemm(x, ldx, w, scale, bias, M);
  }
  at::Tensor y;
  rs::with_dtypes(wt, xt, [&](auto w_type, auto x_type) {
    using WT = decltype(w_type);
    using XT = decltype(x_type);
    const auto operands = rs::linear_operands<WT, XT>(x, ldx, w, scale, bias, M, y);
    rs::gemv::run_typed(operands, min_task_bytes);
  });
  return y;
}
