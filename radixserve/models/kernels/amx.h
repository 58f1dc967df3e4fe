// What the kernels on AMX tiles share (amx_gemm.cpp, attention_kernel.cpp), in the "amx"
// variant only (RS_HAS_AMX): the one tile configuration they load, the 16 x 16 transpose of
// 32-bit lanes their packing and epilogues use, and masks of the first n lanes. amx_available()
// is defined in every variant (false without AMX).
#pragma once

#include <cstdint>

#include "simd.h"  // RS_HAS_AMX

bool amx_available();  // AMX tile data granted to this process (asked of Linux once)

#if defined(RS_HAS_AMX)
#include <immintrin.h>

namespace rs {

constexpr int64_t kTileRows = 16;   // rows per tile
constexpr int64_t kTileBytes = 64;  // bytes per tile row

// The tile configuration every AMX kernel loads (palette 1): tiles 0-7, each 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  TileConfig() {
    for (int t = 0; t < 8; ++t) {
      colsb[t] = kTileBytes;
      rows[t] = kTileRows;
    }
  }
};

// Loads the configuration on this thread now and releases the tiles when it goes out of scope.
struct TileScope {
  TileScope() {
    static const TileConfig config;
    _tile_loadconfig(&config);
  }
  ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// v[i][j] <-> v[j][i] for 16 vectors of 16 32-bit lanes, in registers: 32-bit and 64-bit
// unpacks make 4 x 4 blocks inside each 128-bit lane, two rounds of 128-bit lane shuffles place
// them.
inline void transpose16(__m512 (&v)[16]) {
  __m512 t[16];
  for (int a = 0; a < 8; ++a) {
    t[2 * a] = _mm512_unpacklo_ps(v[2 * a], v[2 * a + 1]);
    t[2 * a + 1] = _mm512_unpackhi_ps(v[2 * a], v[2 * a + 1]);
  }
  __m512 u[16];  // u[4g + c], 128-bit lane l: column 4l + c of rows 4g .. 4g + 3
  for (int g = 0; g < 4; ++g) {
    const __m512d t0 = _mm512_castps_pd(t[4 * g]), t1 = _mm512_castps_pd(t[4 * g + 1]);
    const __m512d t2 = _mm512_castps_pd(t[4 * g + 2]), t3 = _mm512_castps_pd(t[4 * g + 3]);
    u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  for (int c = 0; c < 4; ++c) {
    const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
    const __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
    const __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
    const __m512 v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
    v[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
    v[4 + c] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
    v[8 + c] = _mm512_shuffle_f32x4(v1, v3, 0x88);
    v[12 + c] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
  }
}

inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1);
}

}  // namespace rs
#endif
