// How the skinny GEMM's tiles (gemv.cpp) read their operands: one policy per way of turning a
// weight vector and an x vector into fp32 products, and the one-off preparation of x each needs.
//
//   Widen<WT>  fp32 or bf16 weights widened to fp32 vectors of W lanes, x fp32: one FMA per
//              W products (every ISA).
//   Pairs      (AVX512-BF16) bf16 weights times bf16 x as raw pairs, one VDPBF16PS per 2W.
//   Q8         int8 weights times x quantized to int8 once per call, in blocks of 32 values
//              with one fp32 scale each, as llama.cpp's Q8_0 quantizes activations: Q = 4W
//              products per dot_q (simd.h), exact int32 per lane, then one FMA by the lane's
//              block scale. The weights' per-channel scale is applied at the end, as for Widen.
//
// A policy gives: XS (what one x row is made of), kStep (K elements per step), load_w /
// load_w_tail (the weight vector at w + k, or its first n < kStep elements zero-padded),
// load_x (row, k) / load_x_tail (row, k, n), madd(w, x, acc). Rows of x prepared by
// prepare_q8 are zero-padded to whole chunks, so their tails read zeros.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "simd.h"

namespace rs {

template <class WT>
struct Widen {
  using XS = float;
  using VW = VF;
  static constexpr int kStep = W;
  static VF load_w(const WT* p) { return load(p); }
  static VF load_w_tail(const WT* p, int64_t n) { return load_tail(p, n); }
  static VF load_x(const float* row, int64_t k) { return load(row + k); }
  static VF load_x_tail(const float* row, int64_t k, int64_t n) { return load_tail(row + k, n); }
  static VF madd(VF w, VF x, VF acc) { return fma(w, x, acc); }
};

#if defined(RS_HAS_DPBF16)
struct Pairs {
  using XS = bf16;
  using VW = VB;
  static constexpr int kStep = 2 * W;
  static VB load_w(const bf16* p) { return load_pairs(p); }
  static VB load_w_tail(const bf16* p, int64_t n) { return load_pairs_tail(p, n); }
  static VB load_x(const bf16* row, int64_t k) { return load_pairs(row + k); }
  static VB load_x_tail(const bf16* row, int64_t k, int64_t n) { return load_pairs_tail(row + k, n); }
  static VF madd(VB w, VB x, VF acc) { return dot_pairs(w, x, acc); }
};
#endif

// A Q8 row of x: per chunk of Q values, the Q int8 values then W fp32 lane scales (lane i of the
// chunk covers values 4i .. 4i + 3, all in one block of 32): 2Q bytes per chunk.
constexpr int64_t kQBlock = 32;

struct Q8 {
  using XS = int8_t;
  using VW = QW;
  struct VX {
    VQ q;
    VF scale;
  };
  static constexpr int kStep = Q;
  static QW load_w(const int8_t* p) { return prep_q(load_q(p)); }
  static QW load_w_tail(const int8_t* p, int64_t n) {
    alignas(64) int8_t buf[Q] = {};
    std::memcpy(buf, p, static_cast<size_t>(n));
    return prep_q(load_q(buf));
  }
  static VX load_x(const int8_t* row, int64_t k) {
    const int8_t* chunk = row + 2 * k;
    return {load_q(chunk), load(reinterpret_cast<const float*>(chunk + Q))};
  }
  static VX load_x_tail(const int8_t* row, int64_t k, int64_t) { return load_x(row, k); }
  static VF madd(const QW& w, const VX& x, VF acc) { return fma(cvt_f(dot_q(w, x.q)), x.scale, acc); }
};

inline int64_t padded(int64_t K, int64_t step) { return (K + step - 1) / step * step; }

// One row of x quantized as llama.cpp's Q8_0 does: per block of 32, d = max|x| / 127 and
// q = round-half-even(x * (1 / d)) (0 where d = 0). torch_linear's reference does the same in
// the same fp32 operations (linear.py quantize_rows_q8).
template <class XT>
void quantize_row_q8(const XT* x, int64_t K, int8_t* out) {
  static_assert(kQBlock % W == 0 && (Q % kQBlock == 0 || kQBlock % Q == 0));
  constexpr int kV = kQBlock / W;  // vectors per block
  for (int64_t b0 = 0; b0 < K; b0 += kQBlock) {
    const int64_t n = std::min(kQBlock, K - b0);
    VF v[kV];
    VF amax = zero();
    for (int i = 0; i < kV; ++i) {
      const int64_t at = i * W;
      v[i] = at + W <= n ? load(x + b0 + at) : (at < n ? load_tail(x + b0 + at, n - at) : zero());
      amax = max(amax, abs(v[i]));
    }
    const float d = hmax(amax) / 127.0f;
    const VF id = set1(d > 0.0f ? 1.0f / d : 0.0f);
    alignas(64) int32_t q[kQBlock];
    for (int i = 0; i < kV; ++i) store(reinterpret_cast<float*>(q + i * W), as_float(to_int(round(mul(v[i], id)))));
    for (int64_t k = b0; k < b0 + kQBlock; k += std::min<int64_t>(Q, kQBlock)) {  // chunk pieces
      const int64_t c = k / Q, off = k - c * Q;
      int8_t* chunk = out + c * 2 * Q;
      for (int64_t i = 0; i < std::min<int64_t>(Q, kQBlock); ++i) {
        chunk[off + i] = static_cast<int8_t>(q[k - b0 + i]);  // zero beyond K: x padded
      }
      float* scales = reinterpret_cast<float*>(chunk + Q);
      for (int64_t i = 0; i < std::min<int64_t>(Q, kQBlock) / 4; ++i) scales[off / 4 + i] = d;
    }
  }
}

// x [M, K] as Q8 rows (zero-padded to whole chunks); returns the row stride in bytes.
template <class XT>
int64_t prepare_q8(const XT* x, int64_t ldx, int64_t M, int64_t K, std::vector<int8_t>& buf) {
  const int64_t ld = 2 * padded(K, std::max<int64_t>(Q, kQBlock));  // whole blocks and chunks
  buf.assign(static_cast<size_t>(M * ld), 0);
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) quantize_row_q8(x + m * ldx, K, buf.data() + m * ld);
  });
  return ld;
}

}  // namespace rs
