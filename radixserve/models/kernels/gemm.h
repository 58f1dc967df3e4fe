// Packed GEMM for prefill-shaped linear layers (more rows of x than the skinny GEMM takes),
// one source for every ISA:
//
//   y[m, n] = s[n] * sum_k x[m, k] * w[n, k] (+ bias[n]),  x [M, K], w [N, K] (PyTorch layout).
//
// Same operands as gemv.cpp (w fp32, bf16, or int8 with per-channel scales s; x, y, bias fp32
// or bf16), but compute-bound: each weight element meets hundreds of rows of x, so the work is
// the multiply-adds. x is packed once per call as fp32 tiles of MR rows, k-major ([K][MR]);
// then, one panel of NR output columns at a time, the panel's weights are widened to fp32 and
// packed k-major ([K][NR], in L2) and meet every tile of x in an MR x NR register tile of outer
// products: per k, NV weight vectors and MR broadcast values of x feed MR * NV FMAs (AVX2: 6 x
// 16, 12 accumulators of its 16 registers; 12 x 2W with 32 registers). Each panel streams all
// of packed x from L3, which the hardware prefetchers follow (one sequential stream); a panel
// taller than KC is done in passes whose fp32 sums (M x NR) stay in L1/L2. Measured on Zen 3
// (1 thread, K = 896 / 4864): this order runs the tile at 90-96% of the FMA peak, where the
// BLIS order (KC = 256 passes over all columns, fp32 sums of M x N) ran the whole product at
// 80%, its sums streaming through memory on every pass; with 2 threads, M = 512, bf16 weights,
// 170-181 GFLOP/s (89-92% of the peak) against torch's fp32 GEMM's 154-175 on fp32 weights
// (grouping panels so that a tile of x meets several while in L1 gained nothing). Narrow
// weights are widened in the packing, once per call: torch's route instead widens the whole
// matrix into a temporary fp32 copy first. Sums are fp32 (int8 weights are exact in fp32; their
// scales and the bias are applied once at the end, then y is rounded once), so the result
// equals torch_linear's float32 product up to summation order. Work is split over N: the
// intra-op threads (at::parallel_for) take chunks of panels from a shared counter; x is packed
// by all of them first. Each column's sums are the same whichever thread takes it. The packed
// copy of x (up to MB rows x K fp32 per calling thread) and each thread's panel buffer are kept
// between calls.
//
// int8 weights are not widened: x is quantized per row (d[m] = max_k |x[m, k]| / 127, q =
// round-half-even(x * (1 / d)) in fp32, 0 where d = 0: q8_rows.h's quantize_row, linear.py's
// q8_reference with one block per row) and both operands go in as int16 pairs, one 32-bit word
// holding k and k + 1 of a row (a zero past an odd K). The tile is the fp32 one on pairs: per
// pair of k, NV vectors of W weight pairs and MR broadcast pairs of x feed MR * NV VPMADDWD,
// each 2W multiply-adds where an FMA does W, into exact int32 sums (|q|, |w| <= 127 and at most
// 2 KC k per pass: below 2^31), which leave the tile as fp32 times d[m]. The panel's pairs are
// widened and transposed in registers as 32-bit lanes, W rows at a time, like fp32 values.
//
// gemm.cpp is its torch entry (packed_gemm); nothing here needs torch but ATen/Parallel.h
// (tests/models/kernel_check/ builds it with a stand-in of that header, per ISA).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

#include "linear_problem.h"
#include "q8_rows.h"
#include "simd.h"

namespace rs::gemm {

constexpr int NV = 2;                                 // weight vectors per tile row
constexpr int NR = NV * W;                            // output columns per tile
constexpr int MR = kVectorRegisters >= 32 ? 12 : 6;  // rows of x per tile
constexpr int64_t KC = 8192;  // most of K per pass: a packed panel is at most KC * NR fp32
constexpr int64_t MB = 1024;  // rows of x per round (bounds the packed copy of x)

// int8 weights multiply as int16 pairs (see the top); the packed operands are then int32 words,
// and the depth of a packed row (its number of elements) is that of pairs.
template <class WT>
constexpr bool kPairs = std::is_same_v<WT, int8_t>;
template <class WT>
using Packed = std::conditional_t<kPairs<WT>, int32_t, float>;
template <class WT>
int64_t depth(int64_t K) {
  return kPairs<WT> ? (K + 1) / 2 : K;
}

// The MR x NR tile of a [kc][MR] times b [kc][NR] (outer products over k), handed to `done`
// in registers (acc[i][j]: row i, columns j * W..).
template <class Done>
inline void tile(int64_t kc, const float* __restrict a, const float* __restrict b, Done&& done) {
  VF acc[MR][NV];
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NV; ++j) acc[i][j] = zero();
  }
  for (int64_t k = 0; k < kc; ++k) {
    VF bv[NV];
    for (int j = 0; j < NV; ++j) bv[j] = load(b + k * NR + j * W);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const VF av = set1(a[k * MR + i]);
      for (int j = 0; j < NV; ++j) acc[i][j] = fma(av, bv[j], acc[i][j]);
    }
  }
  done(acc);
}

// The same on int16 pairs: a [kc][MR] and b [kc][NR] words, the int32 sums handed to `done` as
// fp32 times d[i] (row i's scale of x). VPMADDWD has no accumulating form: each product needs a
// register of its own before its add, so with 16 registers the rows go PR at a time over all of
// kc (all MR at once spilled 8 of the 12 sums to the stack: no faster than the fp32 tile).
constexpr int PR = kVectorRegisters >= 32 ? MR : MR / 2;
// Pairs of k per trip of the loop: with 16 registers GCC's loop of one pair copies each sum
// into a register of its own (6 VMOVDQA per 6 VPMADDWD), and the front end, not the
// multipliers, held the tile to 1.34x the fp32 tile's multiply-adds a second; two pairs a trip
// ran it at 1.60x (Zen 4 silicon with AVX2 only, one thread, K = 896, best of 40 rounds). The
// 32-register variants keep one pair a trip: not measured unrolled.
constexpr int kPairSteps = kVectorRegisters >= 32 ? 1 : 2;
template <class Done>
inline void tile_pairs(int64_t kc, const int32_t* __restrict a, const int32_t* __restrict b,
                       const float* d, Done&& done) {
  VF out[MR][NV];
  for (int h = 0; h < MR; h += PR) {
    VI acc[PR][NV];
    for (int i = 0; i < PR; ++i) {
      for (int j = 0; j < NV; ++j) acc[i][j] = set1_i(0);
    }
    const auto step = [&](int64_t k) {
      VI bv[NV];
      for (int j = 0; j < NV; ++j) bv[j] = load_bits(b + k * NR + j * W);
#pragma GCC unroll 16
      for (int i = 0; i < PR; ++i) {
        const VI av = set1_i(a[k * MR + h + i]);
        for (int j = 0; j < NV; ++j) acc[i][j] = madd_pairs(acc[i][j], av, bv[j]);
      }
    };
    int64_t k = 0;
    if constexpr (kPairSteps == 2) {
      for (; k + 2 <= kc; k += 2) {
        step(k);
        step(k + 1);
      }
    }
    for (; k < kc; ++k) step(k);
    for (int i = 0; i < PR; ++i) {
      const VF di = set1(d[h + i]);
      for (int j = 0; j < NV; ++j) out[h + i][j] = mul(cvt_f(acc[i][j]), di);
    }
  }
  done(out);
}

inline int32_t pair(int32_t lo, int32_t hi) {  // two int16 values as one word, lo first
  return static_cast<int32_t>((static_cast<uint32_t>(lo) & 0xFFFFu) |
                              (static_cast<uint32_t>(hi) << 16));
}

// Rows [n, n + nr) of w, K range [pc, pc + kc), as one fp32 panel [kc][NR] (zero columns past
// nr). A full panel goes W x W blocks at a time: W rows widened (one load each), transposed in
// registers, stored as W k-rows of the panel (Zen 3, 9728 x 896 bf16: x4 faster than a
// scalar scatter, which took a fifth of a 128-row product).
template <class WT>
void pack_w(const WT* w, int64_t ldw, int64_t n, int64_t nr, int64_t pc, int64_t kc,
            float* out) {
  int64_t k0 = 0;
  if (nr == NR) {
    for (; k0 + W <= kc; k0 += W) {
      for (int h = 0; h < NV; ++h) {
        VF v[W];
        for (int i = 0; i < W; ++i) v[i] = load(w + (n + h * W + i) * ldw + pc + k0);
        transpose(v);
        for (int i = 0; i < W; ++i) store(out + (k0 + i) * NR + h * W, v[i]);
      }
    }
  }
  for (int64_t j = 0; j < NR; ++j) {
    const WT* src = w + (n + j) * ldw + pc;
    for (int64_t k = k0; k < kc; ++k) out[k * NR + j] = j < nr ? to_float(src[k]) : 0.0f;
  }
}

// Rows [n, n + nr) of int8 w, pairs [pc, pc + kc) (k from 2 pc), as one panel of int16 pairs
// [kc][NR] (zero past nr and past K): W rows of 2W values widened at a time (one load each) and
// transposed in registers as W words each, where the rows hold them; the rest one by one.
inline void pack_w_pairs(const int8_t* w, int64_t ldw, int64_t K, int64_t n, int64_t nr,
                         int64_t pc, int64_t kc, int32_t* out) {
  int64_t p0 = 0;
  if (nr == NR) {
    for (; p0 + W <= kc && 2 * (pc + p0 + W) <= K; p0 += W) {
      for (int h = 0; h < NV; ++h) {
        VF v[W];
        for (int i = 0; i < W; ++i) {
          v[i] = as_float(widen_pairs(w + (n + h * W + i) * ldw + 2 * (pc + p0)));
        }
        transpose(v);
        for (int i = 0; i < W; ++i) store_i(out + (p0 + i) * NR + h * W, as_int(v[i]));
      }
    }
  }
  for (int64_t j = 0; j < NR; ++j) {
    for (int64_t p = p0; p < kc; ++p) {
      const int64_t k = 2 * (pc + p);
      const int8_t* src = w + (n + std::min(j, nr - 1)) * ldw;
      const int32_t lo = j < nr ? src[k] : 0, hi = j < nr && k + 1 < K ? src[k + 1] : 0;
      out[p * NR + j] = pair(lo, hi);
    }
  }
}

// Prefetches what pack_w(w, ldw, n, nr, pc, kc) will read: NR rows read a few KB each are more
// streams than the hardware prefetchers follow.
template <class WT>
void prefetch_w(const WT* w, int64_t ldw, int64_t n, int64_t nr, int64_t pc, int64_t kc) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(WT));
  for (int64_t j = 0; j < nr; ++j) {
    for (int64_t k = 0; k < kc; k += kLine) prefetch(w + (n + j) * ldw + pc + k);
  }
}

// Rows [m0, m0 + mr) of x (mr <= MR), all of K, as one fp32 tile [K][MR] (zero rows past mr).
template <class XT>
void pack_x(const XT* x, int64_t ldx, int64_t m0, int64_t mr, int64_t K, float* out) {
  for (int r = 0; r < MR; ++r) {
    if (r < mr) {
      const XT* src = x + (m0 + r) * ldx;
      for (int64_t k = 0; k < K; ++k) out[k * MR + r] = to_float(src[k]);
    } else {
      for (int64_t k = 0; k < K; ++k) out[k * MR + r] = 0.0f;
    }
  }
}

// Rows [m0, m0 + mr) of x (mr <= MR) quantized, as one tile of int16 pairs [depth][MR] and
// their scales d [MR] (zero rows and scales past mr); q: room for K + 1 values.
template <class XT>
void pack_x_pairs(const XT* x, int64_t ldx, int64_t m0, int64_t mr, int64_t K, int32_t* out,
                  float* d, int32_t* q) {
  const int64_t pairs = depth<int8_t>(K);
  const auto put = [q](int64_t k, int64_t n, VI v) {  // the values into q [K]
    if (n == W) return store_i(q + k, v);
    alignas(64) int32_t tail[W];
    store_i(tail, v);
    std::copy(tail, tail + n, q + k);
  };
  for (int r = 0; r < MR; ++r) {
    d[r] = r < mr ? q8_rows::quantize_row(x + (m0 + r) * ldx, K, put) : 0.0f;
    q[K] = 0;  // past an odd K
    for (int64_t p = 0; p < pairs; ++p) {
      out[p * MR + r] = r < mr ? pair(q[2 * p], q[2 * p + 1]) : 0;
    }
  }
}

// A buffer kept between calls (grown when a product needs more: a fresh multi-MB buffer per
// call costs its page faults). Not zero-filled: every value is written before it is read.
template <class T>
class Scratch {
 public:
  T* get(int64_t n) {
    if (n > size_) {
      data_.reset(new (std::align_val_t(64)) T[static_cast<size_t>(n)]);
      size_ = n;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(T* p) const { operator delete[](p, std::align_val_t(64)); }
  };
  std::unique_ptr<T[], Free> data_;
  int64_t size_ = 0;
};

// Where a tile of one pass over K goes: added to the fp32 sums of its rows (those of the passes
// before, unless `first`), and after the last pass written to y as sums * scale + bias in y's
// dtype. A tile is rows m.. (mr of them) x columns n.. (nr).
template <class WT, class XT>
struct Merge {
  const Linear<WT, XT>& g;
  bool first, last;
  float* sums;  // [MR][NR]; unused when first and last
  int64_t m, n;

  void put(VF v, int64_t r, int64_t c, int64_t left) const {  // columns c.. of row r
    float* s = sums + r * NR + c;
    if (!first) v = add(load(s), v);
    if (!last) return store(s, v);
    if (g.scale) v = mul(v, load_n(g.scale + n + c, left));
    if (g.bias) v = add(v, load_n(g.bias + n + c, left));
    store_n(g.y + (m + r) * g.ldy + n + c, v, left);
  }
  void operator()(VF (&acc)[MR][NV], int64_t mr, int64_t nr) const {
    if (mr == MR && nr == NR) {
      for (int i = 0; i < MR; ++i) {
        for (int j = 0; j < NV; ++j) put(acc[i][j], i, j * W, W);
      }
      return;
    }
    for (int64_t i = 0; i < mr; ++i) {
      for (int64_t j = 0; j * W < nr; ++j) put(acc[i][j], i, j * W, nr - j * W);
    }
  }
};

// Columns [n0, n1) for the rows of x packed in xp (tiles of MR rows from row m0, rows in all;
// int8 weights: d, the rows' scales).
template <class WT, class XT>
void run_task(const Linear<WT, XT>& g, const Packed<WT>* xp, const float* d, int64_t m0,
              int64_t rows, int64_t n0, int64_t n1, Scratch<Packed<WT>>& wbuf,
              Scratch<float>& sbuf) {
  const int64_t D = depth<WT>(g.K), f = kPairs<WT> ? 2 : 1;  // f: k per packed element
  const int64_t passes = (D + KC - 1) / KC, kstep = (D + passes - 1) / passes;
  const int64_t tiles = (rows + MR - 1) / MR;
  Packed<WT>* const wp = wbuf.get(kstep * NR);
  float* const sp = passes > 1 ? sbuf.get(tiles * MR * NR) : nullptr;
  for (int64_t n = n0; n < n1; n += NR) {
    const int64_t nr = std::min<int64_t>(NR, n1 - n);
    for (int64_t pc = 0; pc < D; pc += kstep) {
      const int64_t kc = std::min(kstep, D - pc);
      if constexpr (kPairs<WT>) {
        pack_w_pairs(g.w, g.ldw, g.K, n, nr, pc, kc, wp);
      } else {
        pack_w(g.w, g.ldw, n, nr, pc, kc, wp);
      }
      if (pc + kc < D) {
        prefetch_w(g.w, g.ldw, n, nr, f * (pc + kc), f * std::min(kstep, D - pc - kc));
      } else if (n + NR < n1) {
        prefetch_w(g.w, g.ldw, n + NR, std::min<int64_t>(NR, n1 - n - NR), 0, f * kstep);
      }
      for (int64_t t = 0; t < tiles; ++t) {
        float* const sums = sp ? sp + t * MR * NR : nullptr;
        const Merge<WT, XT> out{g, pc == 0, pc + kc == D, sums, m0 + t * MR, n};
        const int64_t mr = std::min<int64_t>(MR, rows - t * MR);
        const auto done = [&](VF(&acc)[MR][NV]) { out(acc, mr, nr); };
        if constexpr (kPairs<WT>) {
          tile_pairs(kc, xp + t * MR * D + pc * MR, wp, d + t * MR, done);
        } else {
          tile(kc, xp + t * MR * D + pc * MR, wp, done);
        }
      }
    }
  }
}

template <class WT, class XT>
void run(const Linear<WT, XT>& g) {
  const int64_t panels = (g.N + NR - 1) / NR, D = depth<WT>(g.K);
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), panels));
  // The threads take chunks of panels as they go, about 8 per thread: a thread slowed by the
  // host takes fewer (a 512-token bf16 prefill ran 2-6% faster in the median than with one
  // fixed share per thread, Zen 3, 2 threads).
  const int64_t chunk = std::max<int64_t>(1, panels / (8 * tasks));
  thread_local Scratch<Packed<WT>> xbuf;
  thread_local Scratch<float> dbuf;
  for (int64_t m0 = 0; m0 < g.M; m0 += MB) {
    const int64_t rows = std::min(MB, g.M - m0), tiles = (rows + MR - 1) / MR;
    Packed<WT>* const xp = xbuf.get(tiles * MR * D);
    float* const d = kPairs<WT> ? dbuf.get(tiles * MR) : nullptr;
    at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t mr = std::min<int64_t>(MR, rows - t * MR);
        if constexpr (kPairs<WT>) {
          thread_local std::vector<int32_t> q;
          q.resize(static_cast<size_t>(g.K + 1));
          pack_x_pairs(g.x, g.ldx, m0 + t * MR, mr, g.K, xp + t * MR * D, d + t * MR, q.data());
        } else {
          pack_x(g.x, g.ldx, m0 + t * MR, mr, g.K, xp + t * MR * D);
        }
      }
    });
    std::atomic<int64_t> next{0};  // the first panel no thread has taken yet
    at::parallel_for(0, tasks, 1, [&](int64_t, int64_t) {
      thread_local Scratch<Packed<WT>> wbuf;
      thread_local Scratch<float> sbuf;
      for (int64_t p0; (p0 = next.fetch_add(chunk)) < panels;) {
        run_task(g, xp, d, m0, rows, p0 * NR, std::min(g.N, (p0 + chunk) * NR), wbuf, sbuf);
      }
    });
  }
}

}  // namespace rs::gemm
