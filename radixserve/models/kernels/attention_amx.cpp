// Paged causal attention of bf16 EXTEND batches on AMX tiles (the amx variant): the tasks of
// attention_kernel.cpp, run with TDPBF16PS. Per block of 32 keys, S = Q K^T and O += P V run
// on 16-row tiles (bf16 products, fp32 sums); the online softmax stays fp32 in vector registers
// and P is rounded to bf16 once for the P V product, as torch's SDPA and FlashInfer do in bf16.
// K is packed per block as the B operand (each 16-key x 32-dim piece a 16 x 16 transpose of
// 32-bit pairs), V as key pairs interleaved; each packed block meets every row tile of its task.
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "amx.h"
#include "attention_task.h"
#include "simd.h"

#if defined(RS_HAS_AMX)
namespace {

using namespace rs;
using namespace rs::attn;

constexpr int64_t kAk = 32;  // keys per AMX block

struct AmxScratch {
  std::vector<bf16> q;       // [rows16][d]
  std::vector<float> o;      // [rows16][d]
  std::vector<float> m, l;   // [rows16]
  std::vector<int64_t> pos;  // [rows16], -1 for padding rows
  std::vector<int32_t> kp;   // [2 key groups][d / 32][16][16]: K^T tiles
  std::vector<int32_t> vp;   // [d / 16][16][16]: V tiles (key pairs)
  alignas(64) float s[kTileRows * kAk];
  alignas(64) bf16 pr[kTileRows * kAk];
  alignas(64) float ob[kTileRows * kTileRows];
};

inline __m512 load_row_or_zero(const bf16* p, bool present) {  // 32 bf16 values as 16 lanes
  return present ? _mm512_loadu_ps(reinterpret_cast<const float*>(p)) : _mm512_setzero_ps();
}

void pack_block(const Problem<bf16>& p, const int32_t* slots, int64_t h, int64_t j0, int64_t nk,
                AmxScratch& s) {
  const int64_t d = p.d, chunks = d / 32;
  auto row = [&](int64_t j) { return p.k + static_cast<int64_t>(slots[j0 + j]) * p.kv_stride + h * d; };
  for (int64_t n = 0; n < 2; ++n) {
    for (int64_t c = 0; c < chunks; ++c) {
      __m512 v[16];
      for (int64_t j = 0; j < 16; ++j) {
        const int64_t key = n * 16 + j;
        v[j] = load_row_or_zero(key < nk ? row(key) + c * 32 : nullptr, key < nk);
      }
      transpose(v);
      int32_t* out = s.kp.data() + (n * chunks + c) * 256;
      for (int64_t w = 0; w < 16; ++w) _mm512_storeu_ps(reinterpret_cast<float*>(out + w * 16), v[w]);
    }
  }
  for (int64_t kp = 0; kp < kAk / 2; ++kp) {
    const int64_t a = 2 * kp, b = a + 1;
    const bf16* va = a < nk ? p.v + static_cast<int64_t>(slots[j0 + a]) * p.kv_stride + h * d : nullptr;
    const bf16* vb = b < nk ? p.v + static_cast<int64_t>(slots[j0 + b]) * p.kv_stride + h * d : nullptr;
    for (int64_t g = 0; g < d / 16; ++g) {
      const __m512i lo = va ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(va + g * 16))) : _mm512_setzero_si512();
      const __m512i hi = vb ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vb + g * 16))) : _mm512_setzero_si512();
      _mm512_storeu_si512(s.vp.data() + g * 256 + kp * 16, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
}

// Scores of row tile i in s.s (scaled), then the online softmax of its rows: P into s.pr
// (bf16), O rows rescaled, m and l updated.
void softmax_rows(const Problem<bf16>& p, int64_t i, int64_t j0, AmxScratch& s) {
  const int64_t d = p.d;
  for (int64_t r = 0; r < kTileRows; ++r) {
    const int64_t row = i * kTileRows + r, pos = s.pos[row];
    float* sr = s.s + r * kAk;
    bf16* pr = s.pr + r * kAk;
    if (pos < 0) {
      std::memset(pr, 0, kAk * sizeof(bf16));
      continue;
    }
    const VF sc = set1(p.scale);
    for (int64_t j = 0; j < kAk; j += W) store(sr + j, mul(load(sr + j), sc));
    const auto to_bf16 = [pr](int64_t j, VF e) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pr + j), (__m256i)_mm512_cvtneps_pbh(e));
    };
    if (!softmax_step(sr, kAk, j0, pos, p.window, s.m[row], s.l[row], &s.o[row * d], d,
                      to_bf16)) {
      std::memset(pr, 0, kAk * sizeof(bf16));
    }
  }
}

void run_task_amx(const Problem<bf16>& p, const Task& t, AmxScratch& s) {
  const TileScope tiles;
  const int64_t d = p.d, chunks = d / 32;
  const int64_t rows = (t.t1 - t.t0) * p.g, tiles_m = (rows + kTileRows - 1) / kTileRows;
  const int64_t padded = tiles_m * kTileRows;
  const auto copy_q = [&](int64_t r, const bf16* qs) {
    bf16* qd = &s.q[r * d];
    if (qs == nullptr) {
      std::memset(qd, 0, d * sizeof(bf16));
    } else {
      std::memcpy(qd, qs, d * sizeof(bf16));
    }
  };
  const auto [pmin, pmax] =
      init_rows(p, t, padded, s.pos.data(), s.m.data(), s.l.data(), copy_q);
  std::fill(s.o.begin(), s.o.begin() + padded * d, 0.0f);
  const int32_t* slots = p.req_to_token + p.row[t.b] * p.r2t_stride;
  const int64_t first = p.window > 0 ? std::max<int64_t>(0, pmin - p.window + 1) / kAk * kAk : 0;
  for (int64_t j0 = first; j0 <= pmax; j0 += kAk) {
    pack_block(p, slots, t.h, j0, std::min(kAk, p.seq[t.b] - j0), s);
    for (int64_t i = 0; i < tiles_m; ++i) {
      if (!rows_see_block(&s.pos[i * kTileRows], kTileRows, j0, kAk, p.window)) continue;
      _tile_zero(0);
      _tile_zero(1);
      for (int64_t c = 0; c < chunks; ++c) {
        _tile_loadd(2, &s.q[i * kTileRows * d + c * 32], d * sizeof(bf16));
        _tile_loadd(3, s.kp.data() + c * 256, kTileBytes);
        _tile_loadd(4, s.kp.data() + (chunks + c) * 256, kTileBytes);
        _tile_dpbf16ps(0, 2, 3);
        _tile_dpbf16ps(1, 2, 4);
      }
      _tile_stored(0, s.s, kAk * sizeof(float));
      _tile_stored(1, s.s + 16, kAk * sizeof(float));
      softmax_rows(p, i, j0, s);
      _tile_loadd(5, s.pr, kAk * sizeof(bf16));
      for (int64_t gi = 0; gi < d / 16; ++gi) {
        _tile_zero(6);
        _tile_loadd(7, s.vp.data() + gi * 256, kTileBytes);
        _tile_dpbf16ps(6, 5, 7);
        _tile_stored(6, s.ob, kTileBytes);
        for (int64_t r = 0; r < kTileRows; ++r) {
          float* o = &s.o[(i * kTileRows + r) * d + gi * 16];
          _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), _mm512_loadu_ps(s.ob + r * 16)));
        }
      }
    }
  }
  store_rows(p, t, s.o.data(), s.l.data());
}
}  // namespace

void rs::attn::run_amx_tasks(const Problem<bf16>& p, const std::vector<Task>& tasks,
                             int64_t max_rows) {
  const int64_t d = p.d;
  const int64_t rows16 = (max_rows + kTileRows - 1) / kTileRows * kTileRows;
  const auto make_scratch = [&] {
    AmxScratch s;
    s.q.resize(rows16 * d);
    s.o.resize(rows16 * d);
    s.m.resize(rows16);
    s.l.resize(rows16);
    s.pos.resize(rows16);
    s.kp.resize(2 * (d / 32) * 256);
    s.vp.resize((d / 16) * 256);
    return s;
  };
  run_dynamic(static_cast<int64_t>(tasks.size()), make_scratch,
              [&](AmxScratch& s, int64_t i) { run_task_amx(p, tasks[i], s); });
}

#else  // no AMX in this variant

void rs::attn::run_amx_tasks(const Problem<bf16>&, const std::vector<Task>&, int64_t) {
  TORCH_CHECK(false, "run_amx_tasks: this build has no AMX");
}

#endif
