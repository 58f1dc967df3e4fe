// try_rms_norm: RMSNorm (norm.h), optionally fused with the residual add, on the tensors it
// takes; None for any others.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>

#include "norm.h"

namespace {

bool dense(const at::Tensor& t, at::ScalarType dtype) {
  return t.device().is_cpu() && t.scalar_type() == dtype && t.is_contiguous();
}

template <class T>
void run(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& residual,
         at::Tensor& out, at::Tensor& sum, float eps) {
  const int64_t dim = weight.size(0), rows = x.numel() / dim;
  const auto* xp = static_cast<const T*>(x.data_ptr());
  const T* rp = residual.has_value() ? static_cast<const T*>(residual->data_ptr()) : nullptr;
  const auto* wp = static_cast<const T*>(weight.data_ptr());
  auto* op = static_cast<T*>(out.data_ptr());
  T* sp = residual.has_value() ? static_cast<T*>(sum.data_ptr()) : nullptr;
  rs::rms_norm_rows(xp, rp, wp, op, sp, rows, dim, eps);
}

}  // namespace

// (out, s) for x [..., D] and weight [D] (both fp32 or both bf16, contiguous); s is
// x + residual, or x itself when there is no residual. Returns nullopt for anything else (the
// caller uses F.rms_norm).
std::optional<std::tuple<at::Tensor, at::Tensor>> try_rms_norm(
    const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& residual,
    double eps) {
  const auto dtype = x.scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16) return std::nullopt;
  if (!dense(x, dtype) || !dense(weight, dtype) || x.dim() < 1 || weight.dim() != 1) {
    return std::nullopt;
  }
  const int64_t dim = weight.size(0);
  if (dim < 1 || x.size(-1) != dim) return std::nullopt;
  if (residual.has_value() && (!dense(*residual, dtype) || residual->sizes() != x.sizes())) {
    return std::nullopt;
  }
  if (x.requires_grad() || weight.requires_grad()) return std::nullopt;
  at::Tensor out = at::empty_like(x);
  at::Tensor sum = residual.has_value() ? at::empty_like(x) : x;
  const float e = static_cast<float>(eps);
  if (dtype == at::kBFloat16) {
    run<rs::bf16>(x, weight, residual, out, sum, e);
  } else {
    run<float>(x, weight, residual, out, sum, e);
  }
  return std::make_tuple(out, sum);
}
