// int8 GEMM on AMX tiles (TDPBSSD) for products taller than the skinny GEMM's rows, on CPUs
// with AMX-INT8 (Sapphire Rapids and later; the "amx" variant of _ext.py).
//
//   y[m, n] = s[n] * d[m] * sum_k q[m, k] * w[n, k] (+ bias[n]),  x [M, K] -> q, d; w [N, K] int8
//
// x is quantized per row, once per call (q8_rows.h). Products are exact int32 sums over all of
// K, scaled once at the end in fp32.
//
// The tiles compute y's transpose: a tile of 16 weight rows x 64 bytes of K is read straight
// from w's row-major layout (the A operand, rows ldw apart: the weights are never packed or
// widened), and x's int8 rows, packed once per call into the VNNI layout the B operand needs
// (16 groups of 4 k x 16 rows of x per 1 KB tile), are the other. One register block is 2 x 2
// tiles (32 weight rows x 32 rows of x, 4 TDPBSSD per 64 k); a block with fewer rows uses 1 x 2,
// 2 x 1 or 1 x 1. x's rows go in chunks of about 1 MB packed (kept in L2); per chunk, threads
// split the weight rows (at::parallel_for), each with its own tile configuration. Weight rows and k past the end are read from a zero-padded copy, never past
// the tensor. Without AMX (any other variant), amx_int8_gemm is not called (try_linear checks
// amx_available()).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "amx.h"
#include "linear.h"
#include "q8_rows.h"
#include "simd.h"

#if defined(RS_HAS_AMX)
#include <sys/syscall.h>
#include <unistd.h>

namespace {

using namespace rs;

constexpr int64_t kTk = kTileBytes;  // bytes of K per tile row
constexpr int64_t kTm = kTileRows;   // rows per tile
constexpr int64_t kTile = kTm * kTk;  // bytes per tile
// Packed x per chunk of rows (see run). 512 KB, 1 MB and 2 MB measured alike (2 threads, 0.5B
// shapes, M = 128 and 512: within 5%, the host's noise).
constexpr int64_t kChunkBytes = 1 << 20;

// C (tiles 0-3) = sum over nkb k blocks of the NB weight tiles at a (rows lda apart, 16 rows
// each, the second 16 rows after the first) times the MB packed x tiles at b (the second one
// nkb tiles after the first); the NB x MB results stored to c, 256 int32 each.
template <int NB, int MB>
void tile_block(const int8_t* a, int64_t lda, const int8_t* b, int64_t nkb, int32_t* c) {
  _tile_zero(0);
  if constexpr (MB > 1) _tile_zero(1);
  if constexpr (NB > 1) _tile_zero(2);
  if constexpr (NB > 1 && MB > 1) _tile_zero(3);
  const int8_t* a1 = a + kTm * lda;
  const int8_t* b1 = b + nkb * kTile;
  for (int64_t kb = 0; kb < nkb; ++kb) {
    _tile_loadd(4, a + kb * kTk, lda);
    _tile_loadd(6, b + kb * kTile, kTk);
    if constexpr (MB > 1) _tile_loadd(7, b1 + kb * kTile, kTk);
    _tile_dpbssd(0, 4, 6);
    if constexpr (MB > 1) _tile_dpbssd(1, 4, 7);
    if constexpr (NB > 1) {
      _tile_loadd(5, a1 + kb * kTk, lda);
      _tile_dpbssd(2, 5, 6);
      if constexpr (MB > 1) _tile_dpbssd(3, 5, 7);
    }
  }
  _tile_stored(0, c, kTk);
  if constexpr (MB > 1) _tile_stored(1, c + 256, kTk);
  if constexpr (NB > 1) _tile_stored(2, c + 512, kTk);
  if constexpr (NB > 1 && MB > 1) _tile_stored(3, c + 768, kTk);
}

template <int NB>
void tile_rows(int mb_count, const int8_t* a, int64_t lda, const int8_t* b, int64_t nkb,
               int32_t* c) {
  if (mb_count > 1) {
    tile_block<NB, 2>(a, lda, b, nkb, c);
  } else {
    tile_block<NB, 1>(a, lda, b, nkb, c);
  }
}

// y rows [m0, m0 + 32) x columns [n0, n0 + 32) from the int32 tiles c (tile (i, j) at
// (i * 2 + j) * 256, word [n][m]): y = acc * (d[m] * s[n]) + bias[n], cast once. Each tile is
// scaled along m, transposed in registers, and stored 16 columns at a time.
template <class XT>
void epilogue(const Linear<int8_t, XT>& o, const float* d, const int32_t* c, int64_t n0,
              int64_t m0) {
  for (int i = 0; i < 2; ++i) {
    const int64_t nb = n0 + i * kTm, nn = std::min<int64_t>(kTm, o.N - nb);
    if (nn <= 0) break;
    const __mmask16 nmask = first_lanes(nn);
    const __m512 bias = o.bias != nullptr ? load_tail(o.bias + nb, nn) : zero();
    for (int j = 0; j < 2; ++j) {
      const int64_t mb = m0 + j * kTm, mm = std::min<int64_t>(kTm, o.M - mb);
      if (mm <= 0) break;
      const __m512 dm = _mm512_maskz_loadu_ps(first_lanes(mm), d + mb);
      const int32_t* t = c + (i * 2 + j) * 256;
      __m512 v[16];
      for (int r = 0; r < 16; ++r) {
        const float s = r < nn ? o.scale[nb + r] : 0.0f;
        const __m512 acc = _mm512_cvtepi32_ps(_mm512_loadu_si512(t + r * kTm));
        v[r] = _mm512_mul_ps(acc, _mm512_mul_ps(dm, _mm512_set1_ps(s)));
      }
      transpose(v);  // v[m - mb]: lanes n - nb
      for (int64_t r = 0; r < mm; ++r) {
        XT* out = o.y + (mb + r) * o.ldy + nb;
        const __m512 y = _mm512_add_ps(v[r], bias);
        if constexpr (std::is_same_v<XT, float>) {
          _mm512_mask_storeu_ps(out, nmask, y);
        } else {
          _mm256_mask_storeu_epi16(out, nmask, (__m256i)_mm512_cvtneps_pbh(y));
        }
      }
    }
  }
}

template <class XT>
void run(const Linear<int8_t, XT>& o) {
  const int64_t nkb = (o.K + kTk - 1) / kTk, K64 = nkb * kTk;
  const int64_t mbs = (o.M + kTm - 1) / kTm;
  std::vector<int8_t> packed(static_cast<size_t>(mbs * nkb * kTile));
  std::vector<float> d(static_cast<size_t>(o.M));
  q8_rows::quantize_pack(o.x, o.ldx, o.M, o.K, K64, packed.data(), d.data(), false);
  const int64_t pairs = (o.N + 2 * kTm - 1) / (2 * kTm);  // blocks of 32 weight rows
  // Rows of w read in place: whole pairs of 16 rows when K is whole 64-byte blocks (else a
  // tile row of the last weight row would read past the tensor), other pairs from a padded copy.
  const bool k_whole = o.K % kTk == 0;
  // The rows of x in chunks of about kChunkBytes of packed x (whole pairs of row blocks), so
  // a chunk stays in L2 while every weight row block meets it.
  const int64_t chunk = std::max<int64_t>(2, kChunkBytes / (K64 * kTm) / 2 * 2);
  for (int64_t c0 = 0; c0 < mbs; c0 += chunk) {
    const int64_t c1 = std::min(mbs, c0 + chunk);
    at::parallel_for(0, pairs, 1, [&](int64_t p0, int64_t p1) {
      const TileScope tiles;
      alignas(64) int32_t c[4 * 256];
      std::vector<int8_t> pad;
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t n0 = p * 2 * kTm, rows = std::min<int64_t>(2 * kTm, o.N - n0);
        const int8_t* a = o.w + n0 * o.ldw;
        int64_t lda = o.ldw;
        if (!k_whole || rows < 2 * kTm) {
          pad.assign(static_cast<size_t>(2 * kTm * K64), 0);
          for (int64_t r = 0; r < rows; ++r) {
            std::memcpy(pad.data() + r * K64, a + r * o.ldw, static_cast<size_t>(o.K));
          }
          a = pad.data();
          lda = K64;
        }
        for (int64_t mb = c0; mb < c1; mb += 2) {
          const int8_t* b = packed.data() + mb * nkb * kTile;
          const int mb_count = static_cast<int>(std::min<int64_t>(2, c1 - mb));
          if (rows > kTm) {
            tile_rows<2>(mb_count, a, lda, b, nkb, c);
          } else {
            tile_rows<1>(mb_count, a, lda, b, nkb, c);
          }
          epilogue(o, d.data(), c, n0, mb * kTm);
        }
      }
    });
  }
}

}  // namespace

// Linux hands a process AMX tile data only on request (arch_prctl ARCH_REQ_XCOMP_PERM); asked
// once, the grant covers every thread.
bool amx_available() {
  constexpr int kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  static const bool granted = syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
}

at::Tensor amx_int8_gemm(const at::Tensor& x, int64_t ldx, const at::Tensor& w,
                         const at::Tensor& scale, const std::optional<at::Tensor>& bias,
                         int64_t M) {
  at::Tensor y;
  if (x.scalar_type() == at::kBFloat16) {
    run(rs::linear_operands<int8_t, rs::bf16>(x, ldx, w, scale, bias, M, y));
  } else {
    run(rs::linear_operands<int8_t, float>(x, ldx, w, scale, bias, M, y));
  }
  return y;
}

#else  // no AMX in this variant

bool amx_available() { return false; }

at::Tensor amx_int8_gemm(const at::Tensor&, int64_t, const at::Tensor&, const at::Tensor&,
                         const std::optional<at::Tensor>&, int64_t) {
  TORCH_CHECK(false, "amx_int8_gemm: this build has no AMX");
}

#endif
