// RMSNorm over the last dim for bf16 rows, optionally fused with the residual add, in one pass
// over each row (AVX-512):
//
//   s = x + residual (rounded to bf16, as torch adds bf16), out = bf16((s * rsqrt(mean(s^2) +
//   eps)) * w), the fp32 math of F.rms_norm on CPU, which rounds once at the end.
//
// Decode runs it on one row per layer twice: torch's composite rms_norm is ~8 ops there
// (~60 us per call on this CPU); this is one call. Rows are spread over torch's threads only
// when there are many (prefill).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>

namespace {

inline __m512 load_bf16(const uint16_t* p, __mmask16 m) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

inline void store_bf16(uint16_t* p, __m512 v, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(v));
}

inline __mmask16 lanes(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

void norm_row(const uint16_t* x, const uint16_t* r, const uint16_t* w, uint16_t* out,
              uint16_t* sum, int64_t dim, float eps) {
  __m512 acc = _mm512_setzero_ps();
  const uint16_t* src = x;
  if (r != nullptr) {  // s = bf16(x + r), kept in `sum` and read back below
    for (int64_t c = 0; c < dim; c += 16) {
      const __mmask16 m = lanes(dim - c);
      store_bf16(sum + c, _mm512_add_ps(load_bf16(x + c, m), load_bf16(r + c, m)), m);
    }
    src = sum;
  }
  for (int64_t c = 0; c < dim; c += 16) {
    const __m512 v = load_bf16(src + c, lanes(dim - c));
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  const float inv = 1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / static_cast<float>(dim) + eps);
  const __m512 iv = _mm512_set1_ps(inv);
  for (int64_t c = 0; c < dim; c += 16) {
    const __mmask16 m = lanes(dim - c);
    const __m512 v = _mm512_mul_ps(load_bf16(src + c, m), iv);
    store_bf16(out + c, _mm512_mul_ps(v, load_bf16(w + c, m)), m);
  }
}

bool dense_bf16(const at::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == at::kBFloat16 && t.is_contiguous();
}

}  // namespace

// (out, s) for x [..., D] and weight [D] (bf16, contiguous); s is x + residual, or x itself
// when there is no residual. Returns nullopt for anything else (the caller uses F.rms_norm).
std::optional<std::tuple<at::Tensor, at::Tensor>> try_rms_norm(
    const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& residual,
    double eps) {
  if (!dense_bf16(x) || !dense_bf16(weight) || x.dim() < 1 || weight.dim() != 1) {
    return std::nullopt;
  }
  const int64_t dim = weight.size(0);
  if (dim < 1 || x.size(-1) != dim) return std::nullopt;
  if (residual.has_value() && (!dense_bf16(*residual) || residual->sizes() != x.sizes())) {
    return std::nullopt;
  }
  if (x.requires_grad() || weight.requires_grad()) return std::nullopt;
  const int64_t rows = x.numel() / dim;
  at::Tensor out = at::empty_like(x);
  at::Tensor sum = residual.has_value() ? at::empty_like(x) : x;
  const auto* xp = static_cast<const uint16_t*>(x.data_ptr());
  const auto* rp =
      residual.has_value() ? static_cast<const uint16_t*>(residual->data_ptr()) : nullptr;
  const auto* wp = static_cast<const uint16_t*>(weight.data_ptr());
  auto* op = static_cast<uint16_t*>(out.data_ptr());
  auto* sp = residual.has_value() ? static_cast<uint16_t*>(sum.data_ptr()) : nullptr;
  const float e = static_cast<float>(eps);
  // ~64 rows of 1k dims per task: below that one thread is faster than waking the others
  at::parallel_for(0, rows, std::max<int64_t>(1, 65536 / dim), [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) {
      norm_row(xp + i * dim, rp ? rp + i * dim : nullptr, wp, op + i * dim,
               sp ? sp + i * dim : nullptr, dim, e);
    }
  });
  return std::make_tuple(out, sum);
}
