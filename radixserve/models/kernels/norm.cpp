// RMSNorm over the last dim for fp32 or bf16 rows, optionally fused with the residual add, in
// one pass over each row (one source for every ISA, simd.h):
//
//   s = x + residual (rounded to the row dtype, as torch adds), out = T((s * rsqrt(mean(s^2) +
//   eps)) * w), the fp32 math of F.rms_norm on CPU, which rounds once at the end.
//
// Decode runs it on one row per layer twice: torch's composite rms_norm is ~8 ops there
// (~60 us per call on these CPUs); this is one call. Rows are spread over torch's threads only
// when there are many (prefill).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>

#include "simd.h"

namespace {

using namespace rs;

template <class T>
void norm_row(const T* x, const T* r, const T* w, T* out, T* sum, int64_t dim, float eps) {
  VF acc = zero();
  const T* src = x;
  if (r != nullptr) {  // s = T(x + r), kept in `sum` and read back below
    for (int64_t c = 0; c < dim; c += W) {
      store_n(sum + c, add(load_n(x + c, dim - c), load_n(r + c, dim - c)), dim - c);
    }
    src = sum;
  }
  for (int64_t c = 0; c < dim; c += W) {
    const VF v = load_n(src + c, dim - c);
    acc = fma(v, v, acc);
  }
  const float inv = 1.0f / std::sqrt(hsum(acc) / static_cast<float>(dim) + eps);
  const VF iv = set1(inv);
  for (int64_t c = 0; c < dim; c += W) {
    const VF v = mul(load_n(src + c, dim - c), iv);
    store_n(out + c, mul(v, load_n(w + c, dim - c)), dim - c);
  }
}

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
  // ~64 rows of 1k dims per task: below that one thread is faster than waking the others
  at::parallel_for(0, rows, std::max<int64_t>(1, 65536 / dim), [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) {
      norm_row(xp + i * dim, rp ? rp + i * dim : nullptr, wp, op + i * dim,
               sp ? sp + i * dim : nullptr, dim, eps);
    }
  });
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
    run<bf16>(x, weight, residual, out, sum, e);
  } else {
    run<float>(x, weight, residual, out, sum, e);
  }
  return std::make_tuple(out, sum);
}
