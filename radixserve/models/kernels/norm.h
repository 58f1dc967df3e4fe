// RMSNorm over the last dim for fp32 or bf16 rows, optionally fused with the residual add, in
// one pass over each row (one source for every ISA, simd.h):
//
//   s = x + residual (rounded to the row dtype, as torch adds), out = T((s * rsqrt(mean(s^2) +
//   eps)) * w), the fp32 math of F.rms_norm on CPU, which rounds once at the end.
//
// Decode runs it on one row per layer twice: torch's composite rms_norm is ~8 ops there
// (~60 us per call on these CPUs); this is one call. Rows are spread over torch's threads only
// when there are many (prefill).
//
// norm.cpp is its torch entry (try_rms_norm); nothing here needs torch but ATen/Parallel.h
// (tests/models/kernel_check/ builds it with a stand-in of that header, per ISA).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "simd.h"

namespace rs {

// 1 / sqrt(mean(x^2) + eps) over the dim values of x, summed in fp32 (also pointwise.h's
// q/k norms).
template <class T>
float inv_rms(const T* x, int64_t dim, float eps) {
  VF acc = zero();
  for (int64_t c = 0; c < dim; c += W) {
    const VF v = load_n(x + c, dim - c);
    acc = fma(v, v, acc);
  }
  return 1.0f / std::sqrt(hsum(acc) / static_cast<float>(dim) + eps);
}

template <class T>
void norm_row(const T* x, const T* r, const T* w, T* out, T* sum, int64_t dim, float eps) {
  const T* src = x;
  if (r != nullptr) {  // s = T(x + r), kept in `sum` and read back below
    for (int64_t c = 0; c < dim; c += W) {
      store_n(sum + c, add(load_n(x + c, dim - c), load_n(r + c, dim - c)), dim - c);
    }
    src = sum;
  }
  const VF iv = set1(inv_rms(src, dim, eps));
  for (int64_t c = 0; c < dim; c += W) {
    const VF v = mul(load_n(src + c, dim - c), iv);
    store_n(out + c, mul(v, load_n(w + c, dim - c)), dim - c);
  }
}

// norm_row over rows of dim values (x, residual r or nullptr, out, sum or nullptr: rows dim
// apart; w [dim]).
template <class T>
void rms_norm_rows(const T* x, const T* r, const T* w, T* out, T* sum, int64_t rows, int64_t dim,
                   float eps) {
  // ~64 rows of 1k dims per task: below that one thread is faster than waking the others
  at::parallel_for(0, rows, std::max<int64_t>(1, 65536 / dim), [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) {
      norm_row(x + i * dim, r ? r + i * dim : nullptr, w, out + i * dim,
               sum ? sum + i * dim : nullptr, dim, eps);
    }
  });
}

}  // namespace rs
