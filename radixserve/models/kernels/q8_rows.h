// x quantized per row to int8 and packed 16 rows at a time, for the int8 GEMMs that multiply
// whole rows of x by int8 weights (amx_gemm.cpp on AMX tiles, gemm_q8.h with AVX-512 VNNI):
//
//   d[m] = max_k |x[m, k]| / 127,  q[m, k] = round-half-even(x[m, k] * (1 / d[m]))  (0 where d = 0)
//
// the int8 activations of SGLang's and vLLM's W8A8 paths on CPUs; the torch reference is
// linear.py's q8_reference with one block per row. Packed, a block of 16 rows is K64 / 4 groups
// of 64 bytes (K64: K rounded up to 64), group g holding int32 word j = the 4 bytes q[16 mb + j]
// [4g .. 4g + 3]: 16 consecutive groups are one AMX B tile, and each group is one AVX-512
// vector of 16 rows for VPDPBUSD. Rows past M and k past K are zero. The packing is AVX-512
// only; quantize_row and quantize_row_bytes serve every ISA (gemm.h's int16 pairs take the
// values, the skinny GEMM's rows the bytes).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "simd.h"

namespace rs::q8_rows {

// One row of x quantized (see the top): W values at a time handed to put(k, n, q), q their int32
// lanes, the first n valid (n < W only at the end); returns d.
template <class XT, class Put>
float quantize_row(const XT* x, int64_t K, Put&& put) {
  VF amax = zero();
  for (int64_t k = 0; k < K; k += W) amax = max(amax, abs(load_n(x + k, K - k)));
  const float d = hmax(amax) / 127.0f;
  const VF inv = set1(d > 0.0f ? 1.0f / d : 0.0f);
  for (int64_t k = 0; k < K; k += W) {
    const int64_t n = std::min<int64_t>(W, K - k);
    put(k, n, to_int(round(mul(load_n(x + k, n), inv))));
  }
  return d;
}

// One row of x quantized into out (K bytes); returns d.
template <class XT>
float quantize_row_bytes(const XT* x, int64_t K, int8_t* out) {
  return quantize_row(x, K, [&](int64_t k, int64_t n, VI q) {
#if defined(__AVX512F__)
    _mm_mask_storeu_epi8(out + k, first_lanes(n), _mm512_cvtsepi32_epi8(q));
#else
    alignas(64) int32_t lanes[W];
    store_i(lanes, q);
    for (int64_t i = 0; i < n; ++i) out[k + i] = static_cast<int8_t>(lanes[i]);  // |q| <= 127
#endif
  });
}

}  // namespace rs::q8_rows

#if defined(__AVX512F__)

namespace rs::q8_rows {

constexpr int64_t kRows = 16;       // rows of x per packed block
constexpr int64_t kKBlock = 64;     // K is padded to a multiple of this
constexpr int64_t kBlockBytes = kRows * kKBlock;  // bytes per 64 k of one block of rows

// x's rows quantized (d[m]) and packed as above into packed (blocks(M) * K64 * 16 bytes), the
// blocks of rows spread over the intra-op threads. `flip`: every byte XOR 0x80, i.e. q + 128
// as an unsigned byte (VPDPBUSD's unsigned operand; padding then reads 128, not 0).
template <class XT>
void quantize_pack(const XT* x, int64_t ldx, int64_t M, int64_t K, int64_t K64, int8_t* packed,
                   float* d, bool flip) {
  const __m512 mask = _mm512_castsi512_ps(_mm512_set1_epi8(flip ? -128 : 0));
  at::parallel_for(0, (M + kRows - 1) / kRows, 1, [&](int64_t b0, int64_t b1) {
    std::vector<int8_t> rows(static_cast<size_t>(kRows * K64));
    for (int64_t mb = b0; mb < b1; ++mb) {
      std::fill(rows.begin(), rows.end(), 0);
      for (int64_t j = 0; j < kRows && mb * kRows + j < M; ++j) {
        const int64_t m = mb * kRows + j;
        d[m] = quantize_row_bytes(x + m * ldx, K, rows.data() + j * K64);
      }
      int8_t* out = packed + mb * K64 * kRows;
      for (int64_t kb = 0; kb < K64 / kKBlock; ++kb) {
        VF v[16];
        for (int j = 0; j < 16; ++j) {
          v[j] = _mm512_loadu_ps(reinterpret_cast<const float*>(rows.data() + j * K64 + kb * kKBlock));
        }
        transpose(v);
        for (int k4 = 0; k4 < 16; ++k4) {
          float* dst = reinterpret_cast<float*>(out + kb * kBlockBytes + k4 * kKBlock);
          _mm512_storeu_ps(dst, _mm512_xor_ps(v[k4], mask));
        }
      }
    }
  });
}

}  // namespace rs::q8_rows

#endif
