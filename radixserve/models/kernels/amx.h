// What the kernels on AMX tiles share (amx_gemm.cpp, attention_kernel.cpp), in the "amx"
// variant only (RS_HAS_AMX): the one tile configuration they load. amx_available()
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

}  // namespace rs
#endif
