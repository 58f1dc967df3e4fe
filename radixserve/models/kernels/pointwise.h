// The math of the small per-layer operations of a decode step around the projections, for fp32
// or bf16 rows (one source for every ISA, simd.h):
//
//   silu_mul:  out = T(T(silu(gate)) * up) for gate_up = [gate | up], torch's
//              F.silu(gate) * up with its two roundings (silu in fp32, x / (1 + exp(-x)));
//   rotary_:   x = T(T(x * cos) + T(swap(x) * sin)) in place over the heads of each token, the
//              three roundings of pointwise.apply_rotary (swap: the two halves exchanged, sin
//              signed); bit-identical to it; split_rope_ does it over the q and k columns of a
//              qkv projection and returns the views q, k, v (pointwise.split_rope);
//   norm_head: Qwen3's q/k norms before the rotation, x = T(T(x * rsqrt(mean(x^2) + eps)) * w)
//              per head, the two roundings of pointwise.split_rope (F.rms_norm, then * weight);
//              its fp32 sum of squares runs in another order than torch's, so a bf16 value at
//              a rounding boundary may differ from it by one ulp.
//
// pointwise.cpp is their torch entry (and has store_kv, a copy of rows); nothing here needs
// torch but ATen/Parallel.h (tests/models/kernel_check/ builds it with a stand-in of that
// header, per ISA).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "norm.h"
#include "simd.h"

namespace rs {

// v rounded to T and widened back: v itself for fp32 (kept from contraction), bf16
// round-to-nearest-even otherwise (NaN lanes are kept as they are: any NaN stays a NaN).
template <class T>
inline VF round_to(VF v) {
  if constexpr (std::is_same_v<T, float>) {
    return opaque(v);
  } else {
    const VF rounded = as_float(slli(bf16_bits(v), 16));
    return select_ge(v, set1(-std::numeric_limits<float>::infinity()), rounded, v);
  }
}

// silu(x) = x / (1 + exp(-x)), computed as x * e / (1 + e) with e = exp(-x) <= 1 for x < 0
// (so exp_nonpos serves both signs; within ~2 ulp of torch's fp32 silu).
inline VF silu(VF x) {
  const VF z = zero();
  const VF e = exp_nonpos(sub(z, abs(x)));  // exp(-|x|)
  return div(select_ge(x, z, x, mul(x, e)), add(set1(1.0f), e));
}

template <class T>
void silu_mul_rows(const T* in, T* out, int64_t rows, int64_t inter) {
  at::parallel_for(0, rows, std::max<int64_t>(1, 65536 / inter), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const T* g = in + i * 2 * inter;
      const T* u = g + inter;
      T* o = out + i * inter;
      for (int64_t c = 0; c < inter; c += W) {
        const int64_t left = inter - c;
        const VF s = round_to<T>(silu(load_n(g + c, left)));
        store_n(o + c, mul(s, load_n(u + c, left)), left);
      }
    }
  });
}

// One token: heads [nh][d] (rows `head_stride` apart), cos/sin [d].
template <class T>
void rotate_token(T* x, int64_t nh, int64_t head_stride, const T* cos, const T* sin,
                  int64_t d) {
  const int64_t half = d / 2;
  for (int64_t h = 0; h < nh; ++h) {
    T* a = x + h * head_stride;
    T* b = a + half;
    for (int64_t c = 0; c < half; c += W) {
      const int64_t left = half - c;
      const VF x1 = load_n(a + c, left), x2 = load_n(b + c, left);
      const VF o1 = add(round_to<T>(mul(x1, load_n(cos + c, left))),
                        round_to<T>(mul(x2, load_n(sin + c, left))));
      const VF o2 = add(round_to<T>(mul(x2, load_n(cos + half + c, left))),
                        round_to<T>(mul(x1, load_n(sin + half + c, left))));
      store_n(a + c, o1, left);
      store_n(b + c, o2, left);
    }
  }
}

// One head's d values in place, RMS-normalised (norm.h's inv_rms) and scaled by w [d].
template <class T>
void norm_head(T* x, const T* w, int64_t d, float eps) {
  const VF inv = set1(inv_rms(x, d, eps));
  for (int64_t c = 0; c < d; c += W) {
    const VF y = round_to<T>(mul(load_n(x + c, d - c), inv));
    store_n(x + c, mul(y, load_n(w + c, d - c)), d - c);
  }
}

// rotate_token over n tokens (rows `row` apart) of nh heads each (`head_stride` apart),
// cos/sin [n][d]; with norm_w ([nh][d], rows d apart) each head goes through norm_head first.
template <class T>
void rotate_tokens(T* x, int64_t n, int64_t row, int64_t nh, int64_t head_stride, const T* cos,
                   const T* sin, int64_t d, const T* norm_w = nullptr, float eps = 0.0f) {
  at::parallel_for(0, n, std::max<int64_t>(1, 16384 / (nh * d)), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      if (norm_w != nullptr) {
        for (int64_t h = 0; h < nh; ++h) {
          norm_head(x + t * row + h * head_stride, norm_w + h * d, d, eps);
        }
      }
      rotate_token(x + t * row, nh, head_stride, cos + t * d, sin + t * d, d);
    }
  });
}

}  // namespace rs
