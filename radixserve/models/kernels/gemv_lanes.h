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
//              Batch 1 (one row of x), where the weight stream alone sets the pace.
//   Q8Row      int8 weights times x quantized per row (one scale d for the row, as the int8
//              GEMMs do: q8_rows.h), exact int32 sums over all of K (dot_q_add, one VPDPBUSD
//              with VNNI), converted and scaled once at the end: per Q products, no conversion
//              and no FMA. Two rows of x or more, where the multiply-adds set the pace.
//
// A policy gives: XS (what one x row is made of), kStep (K elements per step), load_w /
// load_w_tail (the weight vector at w + k, or its first n < kStep elements zero-padded),
// load_x (row, k) / load_x_tail (row, k, n), madd(w, x, acc) on accumulators of type Acc (VF,
// or VI for exact int32 sums), and row_scale(row, K), what the row's sums are multiplied by.
// Rows of x prepared by prepare_q8 / prepare_q8_rows are zero-padded to whole chunks, so their
// tails read zeros.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "q8_rows.h"
#include "simd.h"

namespace rs {

// The accumulators' operations, by their type: fp32 (VF) or exact int32 (VI).
template <class A>
A acc_zero() {
  if constexpr (std::is_same_v<A, VI>) {
    return set1_i(0);
  } else {
    return zero();
  }
}
inline VF acc_add(VF a, VF b) { return add(a, b); }
inline VI acc_add(VI a, VI b) { return add_i(a, b); }
inline float acc_sum(VF a) { return hsum(a); }
inline float acc_sum(VI a) { return static_cast<float>(hsum_i(a)); }

struct FloatSums {  // fp32 accumulators; the row's sums are the products' (scale 1)
  using Acc = VF;
  template <class XS>
  static float row_scale(const XS*, int64_t) {
    return 1.0f;
  }
};

template <class WT>
struct Widen : FloatSums {
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
struct Pairs : FloatSums {
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

struct Q8Weights {  // int8 weight vectors, readied for dot_q
  using XS = int8_t;
  using VW = QW;
  static constexpr int kStep = Q;
  static QW load_w(const int8_t* p) { return prep_q(load_q(p)); }
  static QW load_w_tail(const int8_t* p, int64_t n) {
    alignas(64) int8_t buf[Q] = {};
    std::memcpy(buf, p, static_cast<size_t>(n));
    return prep_q(load_q(buf));
  }
};

struct Q8 : Q8Weights, FloatSums {
  struct VX {
    VQ q;
    VF scale;
  };
  static VX load_x(const int8_t* row, int64_t k) {
    const int8_t* chunk = row + 2 * k;
    return {load_q(chunk), load(reinterpret_cast<const float*>(chunk + Q))};
  }
  static VX load_x_tail(const int8_t* row, int64_t k, int64_t) { return load_x(row, k); }
  static VF madd(const QW& w, const VX& x, VF acc) { return fma(cvt_f(dot_q(w, x.q)), x.scale, acc); }
};

inline int64_t padded(int64_t K, int64_t step) { return (K + step - 1) / step * step; }

// A Q8Row row of x: its K int8 values zero-padded to whole Q chunks, then d (fp32). Its int32
// sums hold K products of at most 127 * 128 each: rows longer than kQ8RowMaxK (linear.py's
// Q8_ROW_MAX_K) take Q8's blocks instead.
constexpr int64_t kQ8RowMaxK = int64_t{1} << 17;
struct Q8Row : Q8Weights {
  using Acc = VI;
  static VQ load_x(const int8_t* row, int64_t k) { return load_q(row + k); }
  static VQ load_x_tail(const int8_t* row, int64_t k, int64_t) { return load_x(row, k); }
  static VI madd(const QW& w, VQ x, VI acc) { return dot_q_add(w, x, acc); }
  static float row_scale(const int8_t* row, int64_t K) {
    float d;
    std::memcpy(&d, row + padded(K, Q), sizeof d);
    return d;
  }
};

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

// x [M, K] as Q8Row rows (q8_rows::quantize_row_bytes, linear.py's q8_reference(x, K)); returns the
// row stride in bytes (whole cache lines).
template <class XT>
int64_t prepare_q8_rows(const XT* x, int64_t ldx, int64_t M, int64_t K, std::vector<int8_t>& buf) {
  const int64_t kq = padded(K, Q), ld = padded(kq + static_cast<int64_t>(sizeof(float)), 64);
  buf.assign(static_cast<size_t>(M * ld), 0);
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      int8_t* row = buf.data() + m * ld;
      const float d = q8_rows::quantize_row_bytes(x + m * ldx, K, row);
      std::memcpy(row + kq, &d, sizeof d);
    }
  });
  return ld;
}

}  // namespace rs
