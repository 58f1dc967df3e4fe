// int8 GEMM with AVX-512 VNNI (VPDPBUSD) for products taller than the skinny GEMM's rows, on
// CPUs with AVX-512 VNNI but no AMX (Cascade Lake, Ice Lake, Cooper Lake, Zen 4):
//
//   y[m, n] = s[n] * d[m] * sum_k q[m, k] * w[n, k] (+ bias[n]),  x [M, K] -> q, d; w [N, K] int8
//
// x is quantized per row (q8_rows.h, as the AMX GEMM does) and packed 16 rows to a vector; the
// weights are read in place, never packed or widened. VPDPBUSD multiplies unsigned by signed
// bytes, so x goes in as q + 128 and each output takes 128 * sum_k w[n, k] back off (exact:
// int32 sums, below 2^31 up to kVnniMaxK, linear_problem.h). One VPDPBUSD is 64 products: 4 k
// of 16 rows of x times one weight's 4 bytes broadcast. A register tile is NW weight rows x MV
// vectors of rows of x (NW * MV accumulators, lanes along m), y's transpose; its epilogue scales
// the sums and transposes them in registers to y's rows. On Zen 4 (2 threads, one 0.5B layer,
// M = 512) that ran at 3x the GOP/s of the skinny GEMM's int8 products and 1.75x torch's bf16
// GEMM's GFLOP/s on the same weights in bf16.
//
// x's rows go in chunks of about 1 MB packed (kept in L2); per chunk, the intra-op threads take
// blocks of NW weight rows from a shared counter (weights of a block stay in L1/L2 while they
// meet every row of the chunk), and a thread's first tile of a block prefetches into L2 the
// block it will likely take next (the threads take turns). Built by the variants with VNNI
// (avx512_vnni, avx512_bf16; amx has its own int8 GEMM); gemm_q8.cpp is its torch entry.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "linear_problem.h"
#include "q8_rows.h"
#include "simd.h"

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define RS_HAS_Q8_GEMM 1

namespace rs::gemm_q8 {

constexpr int64_t kChunkBytes = 1 << 20;  // packed x per chunk of rows

// acc + the dot products of u8's unsigned bytes with s8's signed bytes, 4 per 32-bit lane
// (VPDPBUSD), on 16 lanes (__m512i) or 8 (__m256i, AVX512-VL).
template <class V>
inline V dpbusd(V acc, V u8, V s8) {
  static_assert(std::is_same_v<V, __m512i> || std::is_same_v<V, __m256i>);
  if constexpr (std::is_same_v<V, __m512i>) {
    return _mm512_dpbusd_epi32(acc, u8, s8);
  } else {
    return _mm256_dpbusd_epi32(acc, u8, s8);
  }
}

// Bytes [4g, 4g + 4) of a weight row as one int32 word; past K (the last, partial group) zero.
inline int32_t word(const int8_t* row, int64_t g, int64_t K) {
  int32_t v = 0;
  std::memcpy(&v, row + 4 * g, static_cast<size_t>(std::min<int64_t>(4, K - 4 * g)));
  return v;
}

// acc plus the bytes [k, K) of a weight row, summed in int32 lanes.
inline __m512i row_sum(__m512i acc, const int8_t* row, int64_t k, int64_t K) {
  const __m512i ones = _mm512_set1_epi8(1);
  for (; k + 64 <= K; k += 64) acc = dpbusd(acc, ones, _mm512_loadu_si512(row + k));
  if (k < K) {
    const __mmask64 tail = (~0ULL) >> (64 - (K - k));
    acc = dpbusd(acc, ones, _mm512_maskz_loadu_epi8(tail, row + k));
  }
  return acc;
}

// 128 * sum_k w[r, k] for the rows of one weight block (rows past the end repeat the last). A
// product of fewer than 16 rows of x needs no such pass: a row of padding reads 128 at every k,
// so its lane of a tile's sums is this very offset (offsets_from_padding).
template <int NW>
inline void offsets(const int8_t* const (&rows)[NW], int64_t K, int32_t* out) {
  for (int r = 0; r < NW; ++r) {
    out[r] = 128 * _mm512_reduce_add_epi32(row_sum(_mm512_setzero_si512(), rows[r], 0, K));
  }
}

// One group of 4 k: the MV vectors of x at group g times the NW weight words b.
template <int NW, int MV>
inline void step(const int8_t* x, int64_t block, int64_t g, const int32_t (&b)[NW],
                 __m512i (&acc)[NW][MV]) {
  __m512i xv[MV];
  for (int v = 0; v < MV; ++v) xv[v] = _mm512_loadu_si512(x + v * block + g * 64);
  for (int r = 0; r < NW; ++r) {
    const __m512i wb = _mm512_set1_epi32(b[r]);
    for (int v = 0; v < MV; ++v) acc[r][v] = dpbusd(acc[r][v], xv[v], wb);
  }
}

// The int32 sums of NW weight rows x MV * 16 packed rows of x (blocks `block` bytes apart),
// over all of K: acc[r][v] lane j = sum_k (q + 128)[16 v + j, k] * w[r, k]. Where `next` is
// not null, the NW rows it points at (a block this thread takes later) are prefetched into L2
// on the way, a line of each per 64 k.
template <int NW, int MV>
inline void tile(const int8_t* const (&rows)[NW], const int8_t* const* next, const int8_t* x,
                 int64_t block, int64_t K, __m512i (&acc)[NW][MV]) {
  // Sums in a local array, copied out at the end: acc's memory could alias the weight bytes
  // read in the loop, which would keep the sums in memory where tile is not inlined.
  __m512i sums[NW][MV];
  for (int r = 0; r < NW; ++r) {
    for (int v = 0; v < MV; ++v) sums[r][v] = _mm512_setzero_si512();
  }
  const int64_t whole = K / 4;
  int64_t g = 0;
  for (; g < whole; ++g) {
    if (next != nullptr && g % 16 == 0) {
      for (int r = 0; r < NW; ++r) prefetch_l2(next[r] + 4 * g);
    }
    int32_t b[NW];
    for (int r = 0; r < NW; ++r) std::memcpy(&b[r], rows[r] + 4 * g, 4);
    step(x, block, g, b, sums);
  }
  if (g * 4 < K) {  // the last, partial group of 4 k
    int32_t b[NW];
    for (int r = 0; r < NW; ++r) b[r] = word(rows[r], g, K);
    step(x, block, g, b, sums);
  }
  for (int r = 0; r < NW; ++r) {
    for (int v = 0; v < MV; ++v) acc[r][v] = sums[r][v];
  }
}

// tile<NW, 1> for at most 8 rows of x (the first 8 lanes of one packed block) on 8-lane vectors,
// the 256-bit VPDPBUSD: no work on the 8 lanes the 16-lane tile would leave unused (on Zen 4,
// which splits a 512-bit VPDPBUSD into two 256-bit halves, that is half the work). The rows'
// offsets are summed on the way, a line of each row per 16 groups (from L1, where the broadcasts
// read it), so there is no pass of their own and no row of padding needed; acc's upper 8 lanes
// are zero.
template <int NW>
inline void tile8(const int8_t* const (&rows)[NW], const int8_t* const* next, const int8_t* x,
                  int64_t K, __m512i (&acc)[NW][1], int32_t* offset) {
  const __m512i ones = _mm512_set1_epi8(1);
  __m256i sums[NW];
  __m512i wsum[NW];
  for (int r = 0; r < NW; ++r) {
    sums[r] = _mm256_setzero_si256();
    wsum[r] = _mm512_setzero_si512();
  }
  auto group = [&](int64_t g, const int32_t (&b)[NW]) {
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + g * 64));
    for (int r = 0; r < NW; ++r) sums[r] = dpbusd(sums[r], xv, _mm256_set1_epi32(b[r]));
  };
  const int64_t whole = K / 4;
  int64_t g = 0;
  for (; g + 16 <= whole; g += 16) {
    for (int r = 0; r < NW; ++r) {
      if (next != nullptr) prefetch_l2(next[r] + 4 * g);
      wsum[r] = dpbusd(wsum[r], ones, _mm512_loadu_si512(rows[r] + 4 * g));
    }
    for (int j = 0; j < 16; ++j) {
      int32_t b[NW];
      for (int r = 0; r < NW; ++r) std::memcpy(&b[r], rows[r] + 4 * (g + j), 4);
      group(g + j, b);
    }
  }
  for (int r = 0; r < NW; ++r) {
    offset[r] = 128 * _mm512_reduce_add_epi32(row_sum(wsum[r], rows[r], 4 * g, K));
  }
  for (; g * 4 < K; ++g) {  // the groups past the last 16, the last one partial
    int32_t b[NW];
    for (int r = 0; r < NW; ++r) b[r] = word(rows[r], g, K);
    group(g, b);
  }
  for (int r = 0; r < NW; ++r) acc[r][0] = _mm512_zextsi256_si512(sums[r]);
}

// y rows [m0, m0 + 16 * MV) x columns [n0, n0 + nw) from a tile's sums: (acc - offset[r]) *
// d[m] * s[n] + bias[n], rounded once to y's dtype.
template <int NW, int MV, class XT>
void epilogue(const Linear<int8_t, XT>& o, const float* d, const __m512i (&acc)[NW][MV],
              const int32_t* offset, int64_t n0, int64_t nw, int64_t m0) {
  const VF bias = o.bias != nullptr ? load_n(o.bias + n0, nw) : zero();
  for (int v = 0; v < MV; ++v) {
    const int64_t mb = m0 + 16 * v, mm = std::min<int64_t>(16, o.M - mb);
    if (mm <= 0) break;
    const VF dm = _mm512_maskz_loadu_ps(first_lanes(mm), d + mb);
    VF t[16];
    for (int r = 0; r < 16; ++r) {
      if (r >= nw || r >= NW) {
        t[r] = zero();
        continue;
      }
      const VF sums = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][v], _mm512_set1_epi32(offset[r])));
      t[r] = mul(sums, mul(dm, set1(o.scale[n0 + r])));
    }
    transpose(t);  // t[m - mb]: lanes n - n0
    for (int64_t j = 0; j < mm; ++j) store_n(o.y + (mb + j) * o.ldy + n0, add(t[j], bias), nw);
  }
}

// The NW weight rows of the block at column n0 (rows past N repeat the last).
template <int NW, class XT>
inline void block_rows(const Linear<int8_t, XT>& o, int64_t n0, const int8_t* (&rows)[NW]) {
  const int64_t nw = std::min<int64_t>(NW, o.N - n0);
  for (int r = 0; r < NW; ++r) rows[r] = o.w + (n0 + std::min<int64_t>(r, nw - 1)) * o.ldw;
}

// The offsets of a tile's NW rows from its sums' last lane, a row of padding (M < 16).
template <int NW>
inline void offsets_from_padding(const __m512i (&acc)[NW][1], int32_t* out) {
  for (int r = 0; r < NW; ++r) {
    out[r] = _mm_extract_epi32(_mm512_extracti32x4_epi32(acc[r][0], 3), 3);
  }
}

// Columns in blocks of NW weight rows, rows of x MV packed blocks at a time (see the top);
// Narrow: at most 8 rows of x, in tile8.
template <int NW, int MV, class XT, bool Narrow = false>
void run_tiles(const Linear<int8_t, XT>& o, const int8_t* xp, const float* d, int64_t block,
               int64_t blocks) {
  static_assert(!Narrow || MV == 1);
  const int64_t wblocks = (o.N + NW - 1) / NW;
  const int64_t chunk = std::max<int64_t>(MV, kChunkBytes / block / MV * MV);
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), wblocks));
  const bool padded = MV == 1 && blocks == 1 && o.M < q8_rows::kRows;
  for (int64_t c0 = 0; c0 < blocks; c0 += chunk) {
    const int64_t c1 = std::min(blocks, c0 + chunk);
    std::atomic<int64_t> next{0};  // the first weight block no thread has taken yet
    at::parallel_for(0, tasks, 1, [&](int64_t, int64_t) {
      for (int64_t wb; (wb = next.fetch_add(1)) < wblocks;) {
        const int64_t n0 = wb * NW, nw = std::min<int64_t>(NW, o.N - n0);
        const int8_t* rows[NW];
        block_rows<NW>(o, n0, rows);
        const int8_t* next[NW];  // the block this thread likely takes next (threads alternate)
        const bool ahead = wb + tasks < wblocks;
        if (ahead) block_rows<NW>(o, n0 + tasks * NW, next);
        alignas(64) int32_t offset[NW];
        if (!padded && !Narrow) offsets<NW>(rows, o.K, offset);
        for (int64_t mb = c0; mb < c1; mb += MV) {
          __m512i acc[NW][MV];
          const int8_t* const* ahead_rows = ahead && mb == c0 ? next : nullptr;
          if constexpr (Narrow) {
            tile8<NW>(rows, ahead_rows, xp + mb * block, o.K, acc, offset);
          } else {
            tile<NW, MV>(rows, ahead_rows, xp + mb * block, block, o.K, acc);
          }
          if constexpr (MV == 1 && !Narrow) {
            if (padded) offsets_from_padding<NW>(acc, offset);
          }
          epilogue<NW, MV>(o, d, acc, offset, n0, nw, mb * q8_rows::kRows);
        }
      }
    });
  }
}

template <class XT>
void run(const Linear<int8_t, XT>& o) {
  const int64_t K64 = (o.K + q8_rows::kKBlock - 1) / q8_rows::kKBlock * q8_rows::kKBlock;
  const int64_t block = K64 * q8_rows::kRows;  // bytes per packed block of 16 rows
  const int64_t blocks = (o.M + q8_rows::kRows - 1) / q8_rows::kRows;
  thread_local std::vector<int8_t> packed;
  thread_local std::vector<float> d;
  packed.resize(static_cast<size_t>((blocks + 1) * block));  // + 1: a tile past the last block
  d.resize(static_cast<size_t>(blocks * q8_rows::kRows));
  q8_rows::quantize_pack(o.x, o.ldx, o.M, o.K, K64, packed.data(), d.data(), true);
  // (the threads of run_tiles see their own thread_locals: it takes the pointers)
  // 16 rows or fewer: one vector of x meets 12 weight rows. Zen 4, 2 threads, the 1.7B shape's
  // layer weights over huge pages, GB/s at M = 6 / 8 / 16: 12 rows 18.9 / 18.5 / 17.3, 16 rows
  // 17.9 / 17.9 / 16.7; with the offsets from padding 23.5 / 22.5 (12 rows), 21.7 / 21.1 (10).
  // 8 rows or fewer on 8-lane vectors (tile8). GB/s as above at M = 2 / 4 / 6 / 8: 16 lanes
  // 22.2 / 21.1 / 22.9 / 20.7, 8 lanes 23.1 / 24.3 / 23.8 / 24.9.
  if (o.M <= 8) {
    run_tiles<12, 1, XT, true>(o, packed.data(), d.data(), block, blocks);
  } else if (blocks == 1) {
    run_tiles<12, 1>(o, packed.data(), d.data(), block, blocks);
  } else {  // two vectors of x meet 8 weight rows: half the loads of x per product
    run_tiles<8, 2>(o, packed.data(), d.data(), block, blocks);
  }
}

}  // namespace rs::gemm_q8

#endif
