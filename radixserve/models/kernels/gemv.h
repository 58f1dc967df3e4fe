// Skinny GEMM ("batched GEMV") for decode-shaped linear layers, one source for every ISA.
//
//   y[m, n] = s[n] * sum_k x[m, k] * w[n, k] (+ bias[n]),  x [M, K], w [N, K] (PyTorch layout).
//
// w is stored as fp32, bf16 or int8 (then s holds fp32 per-output-channel scales; otherwise
// s = 1); x, y and bias are fp32 or bf16. fp32 and bf16 weights are widened to fp32 in registers
// and multiply x in fp32 (x prepared once up front: it is small); int8 weights multiply x
// quantized to int8, per block of 32 at batch 1 (llama.cpp's Q8_0 activations, exact int32
// products per block) and per row from two rows on (exact int32 sums over all of K, as the int8
// GEMMs: q8_rows.h); see gemv_lanes.h for each way of reading the operands. Sums are fp32 (or
// exact int32), rounded once at the end, so one source serves AVX2+FMA, AVX-512 and NEON alike:
// decode is bound by the weight bytes streamed, which the narrow storage cuts, as long as the
// instructions per weight byte stay few (hence dot_q for int8: 4W products per instruction or
// two, no widening).
// The weight is streamed once in its native row-major layout; every weight vector loaded is
// reused for all M rows of x (which stay in L1/L2), so the kernel runs at memory bandwidth
// until the multiply-add work of M rows catches up with it. Work is split over N with
// at::parallel_for (PyTorch's own OpenMP pool, so torch.set_num_threads applies).
//
// gemv.cpp is its torch entry (try_linear); nothing here needs torch but ATen/Parallel.h's
// parallel_for (tests/models/kernel_check/ builds it with a stand-in of that header, per ISA).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "gemv_lanes.h"
#include "linear_problem.h"
#include "simd.h"

namespace rs::gemv {

// One register tile: R weight rows x MT rows of x over all of K; out[m * R + r] = dot(w[r], x[m]).
// Small tiles keep U independent accumulator sets (alternating k steps) to hide FMA latency.
// Each cache line of the rows it streams is prefetched into L2 `ahead` rows further on, once per
// line (prefetch_ahead), except by a tile of one weight row that is one sequential stream the
// hardware prefetchers alone follow best: with one row of x (batch 1), or int8 weights against
// any number of rows (Zen 4, 2 threads, whole int8 decode steps on the 0.5B shape, rounds side
// by side, without / with the prefetch: avx512_bf16 batch 2 1.56x, 3 1.49x; the avx2 build
// batch 3 1.16x, 4 1.12x). Widened and bf16-pair rows keep it: without, the same runs' bf16
// steps lost (avx2 batch 2 0.79x, 4 0.83x; avx512_bf16 batch 4 0.82x).
template <class WT, int R, int MT>
constexpr bool kPrefetchTile = R > 1 || (MT > 1 && !std::is_same_v<WT, int8_t>);

template <class L, class WT, int R, int MT>
inline void dot_tile(const WT* w, int64_t ldw, const typename L::XS* x, int64_t ldx, int64_t K,
                     int64_t ahead, float* out) {
  constexpr int T = R * MT;
  constexpr int U = T >= 8 ? 1 : (T >= 4 ? 2 : 4);
  constexpr int V = L::kStep;
  constexpr int kLine = 64 / static_cast<int>(sizeof(WT));  // weight elements per line
  constexpr int S = U * V >= kLine ? U : kLine / V;           // steps per iteration
  using Acc = typename L::Acc;
  Acc acc[U * T];
  for (int i = 0; i < U * T; ++i) acc[i] = acc_zero<Acc>();
  auto step = [&](int u, int64_t k) {
    typename L::VW wv[R];
    for (int r = 0; r < R; ++r) wv[r] = L::load_w(w + r * ldw + k);
    for (int m = 0; m < MT; ++m) {
      const auto xv = L::load_x(x + m * ldx, k);
      Acc* a = acc + u * T + m * R;
      for (int r = 0; r < R; ++r) a[r] = L::madd(wv[r], xv, a[r]);
    }
  };
  int64_t k = 0;
  for (; k + S * V <= K; k += S * V) {
    if constexpr (kPrefetchTile<WT, R, MT>) {
      for (int l = 0; l < S * V; l += kLine) {
        for (int r = 0; r < R; ++r) prefetch_l2(w + (ahead + r) * ldw + k + l);
      }
    }
#pragma GCC unroll 16
    for (int j = 0; j < S; ++j) step(j % U, k + j * V);
  }
  for (; k + V <= K; k += V) step(0, k);
  if (k < K) {
    const int64_t n = K - k;
    typename L::VW wv[R];
    for (int r = 0; r < R; ++r) wv[r] = L::load_w_tail(w + r * ldw + k, n);
    for (int m = 0; m < MT; ++m) {
      const auto xv = L::load_x_tail(x + m * ldx, k, n);
      for (int r = 0; r < R; ++r) acc[m * R + r] = L::madd(wv[r], xv, acc[m * R + r]);
    }
  }
  for (int u = 1; u < U; ++u) {
    for (int i = 0; i < T; ++i) acc[i] = acc_add(acc[i], acc[u * T + i]);
  }
  for (int i = 0; i < T; ++i) out[i] = acc_sum(acc[i]);
}

// dot_tile with a runtime tile height mt <= MT (the last, partial tile of x rows).
template <class L, class WT, int R, int MT>
inline void dot_tile_upto(int64_t mt, const WT* w, int64_t ldw, const typename L::XS* x,
                          int64_t ldx, int64_t K, int64_t ahead, float* out) {
  if constexpr (MT > 1) {
    if (mt < MT) return dot_tile_upto<L, WT, R, MT - 1>(mt, w, ldw, x, ldx, K, ahead, out);
  }
  dot_tile<L, WT, R, MT>(w, ldw, x, ldx, K, ahead, out);
}

// How far ahead tiles prefetch the weight rows they stream: about 64 KB, into L2 and not L1, in
// whole rows, at least one tile's. A tile busy with the multiply-adds of several rows of x keeps
// too few misses in flight for the hardware prefetchers alone, and lines prefetched into L1 two
// row blocks ahead (the former rule) did not close that gap. Zen 4, 2 threads, one layer's
// weights cache-cold per call, GB/s former / L2 64 KB ahead: bf16 pairs in 4 x 6 tiles on the
// 1.7B shape M = 8 17.0 / 23.3, 16 12.8 / 16.6, 24 9.8 / 12.5; int8 one-row tiles M = 2 19.4 /
// 26.3, 4 14.6 / 17.1 (no prefetch at all, since, streams them faster still: kPrefetchTile);
// the avx2 build on the same CPU, widened 3 x 4 tiles M = 8 14.5 / 17.7.
// 16 to 128 KB measured alike. Whole decode steps on the 1.7B shape over huge pages
// (kernel_ab.py, medians of 9 rounds): bf16 batch 8 1.38x, 16 1.29x. Batch 1 (one sequential
// stream) gained over ordinary pages but not over huge pages, where the model's weights live
// (0.86-1.00x): dot_tile leaves it to the hardware.
constexpr int64_t kPrefetchBytes = 64 * 1024;

inline int64_t prefetch_ahead(int64_t row_bytes, int64_t R) {
  return std::max<int64_t>(R, kPrefetchBytes / std::max<int64_t>(1, row_bytes));
}

// L: how tiles read the operands (gemv_lanes.h): x's rows as L reads them; XT: the dtype of y
// and bias.
template <class L, class WT, class XT>
using Problem = Linear<WT, XT, typename L::XS>;

// R output columns starting at n0, all M rows, in the fewest tiles of at most MT rows, of
// near-equal heights (M = 8 as 4 + 4, not 6 + 2: a short tile wastes the weight it re-reads).
template <class L, class WT, class XT, int R, int MT>
void row_block(const Problem<L, WT, XT>& p, int64_t n0) {
  float out[R * MT];
  const WT* w = p.w + n0 * p.ldw;
  const int64_t tiles = (p.M + MT - 1) / MT, base = p.M / tiles, extra = p.M % tiles;
  const int64_t ahead = prefetch_ahead(p.ldw * static_cast<int64_t>(sizeof(WT)), R);
  for (int64_t i = 0, m0 = 0; i < tiles; ++i) {
    const auto* x = p.x + m0 * p.ldx;
    const int64_t mt = base + (i < extra ? 1 : 0);
    dot_tile_upto<L, WT, R, MT>(mt, w, p.ldw, x, p.ldx, p.K, ahead, out);
    for (int64_t m = 0; m < mt; ++m) {
      XT* y = p.y + (m0 + m) * p.ldy + n0;
      const float d = L::row_scale(x + m * p.ldx, p.K);
      for (int r = 0; r < R; ++r) {
        const float s = p.scale ? d * p.scale[n0 + r] : d;
        const float b = p.bias ? to_float(p.bias[n0 + r]) : 0.0f;
        y[r] = from_float<XT>(out[m * R + r] * s + b);
      }
    }
    m0 += mt;
  }
}

// Split N into blocks of R rows (a tail of single rows), spread over the intra-op threads.
template <class L, class WT, class XT, int R, int MT>
void run(const Problem<L, WT, XT>& p, int64_t min_task_bytes) {
  const int64_t nblocks = p.N / R;
  const int64_t tail = p.N - nblocks * R;
  const int64_t block_bytes = R * p.K * static_cast<int64_t>(sizeof(WT));
  const int64_t grain = std::max<int64_t>(1, min_task_bytes / std::max<int64_t>(1, block_bytes));
  at::parallel_for(0, nblocks + (tail > 0 ? 1 : 0), grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      if (b < nblocks) {
        row_block<L, WT, XT, R, MT>(p, b * R);
      } else {
        for (int64_t n = nblocks * R; n < p.N; ++n) row_block<L, WT, XT, 1, 4>(p, n);
      }
    }
  });
}

// Tile choice: one row at a time against all of x is the most memory-friendly (a single
// sequential stream per thread) while x stays in L1; otherwise R x MT tiles cut the cache traffic
// of re-reading x per weight row and ready each weight vector once for MT rows of x (R = 4 with
// the 32 registers of AVX-512 or NEON: R * MT accumulators + R weight vectors). Widen: 4 x 6
// there, 3 x 4 with AVX2's 16 registers (measured on Zen 3, 1 thread, 256x896 bf16 weights in L2,
// GMAC/s at M = 16 / 64 / 128: 3 x 4 33.1 / 33.4 / 31.1, the former 2 x 6 30.6 / 28.3 / 26.8,
// 3 x 3 27.9 / 31.4 / 30.1, 4 x 3 27.7 / 27.4 / 26.9); Q8: 4 x 4, and 2 x 4 on AVX2, whose
// int8 weight vectors take two registers each.
constexpr int64_t kXL1Bytes = 32 * 1024;
constexpr bool kWideRegs = kVectorRegisters >= 32;
// R x MT tiles beyond the one-row ones, which take x of at most OneRowMaxM rows (and while it
// fits L1). Widen: 4 rows; beyond, the R x MT tiles stream more (Zen 3, 2 threads, a decode pass
// of bf16 weights, GB/s one-row / R x MT tiles: M = 4 19.5 / 19.2, 6 13.2 / 14.7, 8 10.0-10.5 /
// 10.8-12.7), while Q8's one-row tiles stay ahead to M = 8 (M = 8: 7.4-8.0 / 6.8-6.9). Pairs:
// 4 rows where weight rows are shorter than a page, else from 2 rows on (Zen 4, 2 threads, a
// layer's weights cache-cold, GB/s one-row / 4 x 6 tiles: 0.5B M = 4 21.9 / 19.6, 6 19.7 /
// 19.1, 8 15.4 / 18.0; 1.7B M = 2 23.2 / 30.1, 4 21.8 / 27.6).
template <int R, int MT, int OneRowMaxM = 8>
struct Tiles {
  static constexpr int r = R, mt = MT, one_row_max_m = OneRowMaxM;
};
using WidenTiles = Tiles<kWideRegs ? 4 : 3, kWideRegs ? 6 : 4, 4>;
using Q8Tiles = Tiles<kWideRegs ? 4 : 2, 4>;
using PairsTiles = Tiles<4, 6, 4>;  // AVX512-BF16 only (32 registers)
using PairsPageTiles = Tiles<4, 6, 1>;  // the same for weight rows of a page or more

inline bool one_row_tiles(int64_t M, int64_t K, int64_t max_m) {  // x as fp32 fits L1
  return M <= max_m && M * K * static_cast<int64_t>(sizeof(float)) <= kXL1Bytes;
}

// Big: the policy's R x MT tiles and where its one-row tiles stop (Tiles). A single row of x
// (batch-1 decode) with weight rows of a page or more takes 4 weight rows per tile in AVX2 and
// NEON builds: fewer horizontal sums and set-ups per weight byte. Shorter rows stay one per
// tile: four of them interleave four streams within a page, which the prefetchers follow worse
// (AVX2, 1 thread, cache-cold, GB/s of weight at 1 / 4 rows per tile: int8 896-wide 13.7 / 8.1,
// bf16 8.1 / 7.8; 4864-wide int8 10.5 / 12.5, bf16 10.0 / 12.3). AVX-512 builds keep one row per
// tile at every width: on Zen 4 (2 threads, a batch-1 pass over huge pages, interleaved) the
// 4-row tiles streamed less of every shape, bf16 pairs on the 1.7B shape 24.9 against 27.7 GB/s,
// int8 on the 0.5B shape 18.7 against 31.2, bf16 widened to fp32 (the avx512 variant's
// path) on the 0.5B shape 18.6 against 33.4.
constexpr bool kFourRowBatch1 = !kAvx512;

template <class Big, class L, class WT, class XT>
void dispatch(const Problem<L, WT, XT>& p, int64_t min_task_bytes) {
  if (!one_row_tiles(p.M, p.K, Big::one_row_max_m)) {
    return run<L, WT, XT, Big::r, Big::mt>(p, min_task_bytes);
  }
  if (kFourRowBatch1 && p.M == 1 && p.K * static_cast<int64_t>(sizeof(WT)) >= 4096) {
    return run<L, WT, XT, 4, 1>(p, min_task_bytes);
  }
  run<L, WT, XT, 1, 8>(p, min_task_bytes);
}

// x [M, K] (row stride ldx) as dense fp32 rows: x itself when it is fp32, else widened into buf.
template <class XT>
const float* widen_rows(const XT* x, int64_t ldx, int64_t M, int64_t K, std::vector<float>& buf,
                        int64_t& ld) {
  if constexpr (std::is_same_v<XT, float>) {
    ld = ldx;
    return x;
  } else {
    buf.resize(static_cast<size_t>(M * K));
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < K; ++k) buf[m * K + k] = to_float(x[m * ldx + k]);
    }
    ld = K;
    return buf.data();
  }
}

// The skinny GEMM of checked operands o (x as stored: fp32 or bf16), x read by the policy its
// weight type takes.
template <class WT, class XT>
void run_typed(const Linear<WT, XT>& o, int64_t min_task_bytes) {
  const XT* xs = o.x;
  const int64_t ldx = o.ldx, M = o.M, K = o.K;
  auto solve = [&](auto lanes, auto big, const auto* xl, int64_t ld) {
    using L = decltype(lanes);
    const Problem<L, WT, XT> p{xl, ld, o.w, o.ldw, o.scale, o.bias, o.y, o.ldy, o.M, o.N, K};
    dispatch<decltype(big), L, WT, XT>(p, std::max<int64_t>(1, min_task_bytes));
  };
  if constexpr (std::is_same_v<WT, int8_t>) {
    std::vector<int8_t> xq;
    if (M == 1 || K > kQ8RowMaxK) {  // batch 1: Q8_0 blocks (gemv_lanes.h)
      const int64_t ld = prepare_q8(xs, ldx, M, K, xq);
      solve(Q8{}, Q8Tiles{}, xq.data(), ld);
    } else {  // per row, exact int32 sums
      const int64_t ld = prepare_q8_rows(xs, ldx, M, K, xq);
      solve(Q8Row{}, Q8Tiles{}, xq.data(), ld);
    }
  } else {
#if defined(RS_HAS_DPBF16)
    // bf16 times bf16: x read in place, no widening of either operand, one VDPBF16PS per 2W
    // products, in one-row tiles while they suit, else in R x MT tiles. Zen 4, 2 threads, a
    // layer of each shape's weights cache-cold, GB/s Pairs 4 x 6 / Widen 4 x 6 / torch (oneDNN):
    // Qwen3-1.7B M = 6: 24.7 / 22.7 / 18.0, 8: 20.7 / 17.2 / 17.1, 16: 14.9 / 11.2 / 13.3, 24:
    // 11.8 / 7.7 / 10.9; Qwen2.5-0.5B M = 16: 14.9 / 9.7 / 11.1, 24: 11.3 / 7.0 / 9.2. (A
    // Sapphire Rapids-class CPU gave Pairs 12.3 GB/s at M = 8 in one-row tiles against Widen's
    // 9.2, and 3-15% less in R x 6 tiles at M >= 16, where its AMX GEMM takes over anyway.)
    if constexpr (std::is_same_v<WT, bf16> && std::is_same_v<XT, bf16>) {
      if (K * static_cast<int64_t>(sizeof(bf16)) >= 4096) {
        solve(Pairs{}, PairsPageTiles{}, xs, ldx);
      } else {
        solve(Pairs{}, PairsTiles{}, xs, ldx);
      }
      return;
    }
#endif
    std::vector<float> xbuf;
    int64_t ld = 0;
    const float* xf = widen_rows(xs, ldx, M, K, xbuf, ld);
    solve(Widen<WT>{}, WidenTiles{}, xf, ld);
  }
}

}  // namespace rs::gemv
