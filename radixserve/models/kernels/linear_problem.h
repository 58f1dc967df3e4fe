// The typed operands of one y = (x @ w.T) * scale + bias, as the skinny GEMM (gemv.h) and the
// packed GEMM (gemm.h) take them: plain pointers and sizes, no torch (linear.h makes them from
// tensors; tests/models/kernel_check/ from its own arrays).
#pragma once

#include <cstdint>

namespace rs {

// x [M, K] (rows ldx apart), w [N, K] (rows ldw apart), scale [N] (int8 w) or nullptr, bias
// [N] or nullptr, y [M, N] (rows ldy apart). XS: what x's rows are made of, XT (as stored) unless
// a kernel prepared them (gemv.h's policies read widened or Q8 rows).
template <class WT, class XT, class XS = XT>
struct Linear {
  const XS* x;
  int64_t ldx;
  const WT* w;
  int64_t ldw;
  const float* scale;
  const XT* bias;
  XT* y;
  int64_t ldy;
  int64_t M, N, K;
};

// Most K the VNNI int8 GEMM (gemm_q8.h) takes: its int32 sums of x offset by 128 times int8
// weights, |sum| <= 255 * 127 * K, stay below 2^31 up to here (try_linear sends longer rows to
// the packed GEMM).
constexpr int64_t kVnniMaxK = 65536;

}  // namespace rs
