// The skinny GEMM's register tiles side by side: gemv.h's own run<L, WT, XT, R, MT> (the
// production loop, its prefetch and its split over threads) at several R x MT, on a model's
// decode-step linears, bf16 weights cache-cold on huge pages. Built and run by gemv_tiles.py
// (which see), with the kernel variant's flags and tests/models/kernel_check's stand-in for
// ATen/Parallel.h, so no torch is needed.
//
//   gemv_tiles decode M LAYERS ROUNDS SHARED_X PACKED N:K [N:K ...]
//   gemv_tiles prefill M ROUNDS N:K [N:K ...]
//
// decode: M rows of x; LAYERS copies of the shapes (cold: more bytes than the caches); SHARED_X 1
// runs each tile a second time with every row of x at one address (x then stays in L1: what
// re-reading x from L2 costs), as tile "RxMT/x-in-L1"; PACKED 1 (AVX512-BF16 only) also runs
// the same weights in the other orientation, packed 16 rows to a vector per pair of k, where
// each VDPBF16PS broadcasts one pair of x (tiles "P<blocks of 16 rows>x<rows of x>"; checked
// against the production tile's y, exit 1 on a mismatch). Prints one line per tile: "tile RxMT
// GBS_SHAPE1 GBS_SHAPE2 ... ALL" (GB/s of weight, medians over rounds; every tile runs in each
// round, so the host's phase hits them alike).
// prefill (AVX512-BF16 only): the packed tiles over M rows of x packed per tile, one copy of the
// weights (hot): "tile NAME GFLOPS_SHAPE1 ... ALL", a best case of a prefill GEMM over that
// layout (the weights packed beforehand, x's packing timed).
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gemv.h"

namespace {

using namespace rs;
using namespace rs::gemv;

#if defined(RS_HAS_DPBF16)
using Lanes = Pairs;  // x read in place as bf16 pairs (VDPBF16PS)
#else
using Lanes = Widen<bf16>;  // x widened to fp32 up front, weights widened in registers
#endif
using XS = Lanes::XS;
using P = Problem<Lanes, bf16, bf16>;
using Fn = void (*)(const P&, int64_t);

struct Tile {
  const char* name;
  Fn fn;
};

// The production tile first (dispatch: PairsPageTiles / WidenTiles), then the alternatives.
#if defined(RS_HAS_DPBF16) || defined(__AVX512F__)
const Tile kTiles[] = {{"4x6", run<Lanes, bf16, bf16, 4, 6>}, {"3x8", run<Lanes, bf16, bf16, 3, 8>},
                       {"4x4", run<Lanes, bf16, bf16, 4, 4>}, {"3x6", run<Lanes, bf16, bf16, 3, 6>},
                       {"2x8", run<Lanes, bf16, bf16, 2, 8>}, {"1x8", run<Lanes, bf16, bf16, 1, 8>}};
#else
const Tile kTiles[] = {{"3x4", run<Lanes, bf16, bf16, 3, 4>}, {"2x6", run<Lanes, bf16, bf16, 2, 6>},
                       {"2x4", run<Lanes, bf16, bf16, 2, 4>}, {"4x3", run<Lanes, bf16, bf16, 4, 3>},
                       {"1x8", run<Lanes, bf16, bf16, 1, 8>}};
#endif
constexpr int64_t kMinTaskBytes = 64 * 1024;  // cpu_kernels.py's MIN_TASK_BYTES

template <class T>
T* huge_pages(size_t n) {  // as models/huge_pages.py places the weights
  void* p = mmap(nullptr, n * sizeof(T), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  madvise(p, n * sizeof(T), MADV_HUGEPAGE);
  return static_cast<T*>(p);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

#if defined(RS_HAS_DPBF16)
// The other orientation: block b of 16 weight rows, pair p of k -> one vector of 16 dwords at
// (b * KP + p) * 16, lane l holding w[16b + l][2p, 2p + 1] (zeros past N and K).
uint32_t* pack_blocks(const bf16* w, int64_t N, int64_t K) {
  const int64_t KP = (K + 1) / 2, NB = (N + 15) / 16;
  auto* out = huge_pages<uint32_t>(static_cast<size_t>(NB * KP * 16));
  for (int64_t b = 0; b < NB; ++b) {
    for (int64_t p = 0; p < KP; ++p) {
      for (int l = 0; l < 16; ++l) {
        const int64_t n = b * 16 + l;
        uint16_t lo = 0, hi = 0;
        if (n < N) {
          std::memcpy(&lo, w + n * K + 2 * p, 2);
          if (2 * p + 1 < K) std::memcpy(&hi, w + n * K + 2 * p + 1, 2);
        }
        out[(b * KP + p) * 16 + l] = lo | (static_cast<uint32_t>(hi) << 16);
      }
    }
  }
  return out;
}

// NB blocks x MT rows of x over all pairs: per pair NB weight vectors, MT broadcast pairs of x
// (x[m * xm + p * xp]), NB * MT VDPBF16PS; with Ahead, each block's stream prefetched into L2
// 1 KB ahead (decode: cold weights; a prefill's panel is in L2 from its first tile of x on).
template <int NB, int MT, bool Ahead>
inline void packed_tile(const uint32_t* w, int64_t bstride, const uint32_t* x, int64_t xm,
                        int64_t xp, int64_t KP, float* y, int64_t ldy) {
  constexpr int64_t kAhead = 16;  // pairs: 16 lines of each block
  __m512 acc[MT][NB];
  for (int m = 0; m < MT; ++m) {
    for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < KP; ++p) {
    __m512i wv[NB];
    for (int b = 0; b < NB; ++b) {
      if constexpr (Ahead) prefetch_l2(w + b * bstride + (p + kAhead) * 16);
      wv[b] = _mm512_loadu_si512(w + b * bstride + p * 16);
    }
    for (int m = 0; m < MT; ++m) {
      const __m512i xb = _mm512_set1_epi32(static_cast<int>(x[m * xm + p * xp]));
      for (int b = 0; b < NB; ++b) {
        acc[m][b] = _mm512_dpbf16_ps(acc[m][b], (__m512bh)wv[b], (__m512bh)xb);
      }
    }
  }
  for (int m = 0; m < MT; ++m) {
    for (int b = 0; b < NB; ++b) _mm512_storeu_ps(y + m * ldy + b * 16, acc[m][b]);
  }
}

struct Packed {
  const uint32_t* w;
  const uint32_t* x;  // decode: x's rows as pairs (ldx KP); prefill: packed per tile of MT rows
  float* y;           // [M, NB * 16]
  int64_t N, K, M;
};

// Tiles of NB blocks (NB = 1 for the last blocks) x MT rows, split over threads by tiles.
template <int NB, int MT>
void packed_run(const Packed& o, bool x_tiled) {
  const int64_t KP = (o.K + 1) / 2, blocks = (o.N + 15) / 16, ldy = blocks * 16;
  const int64_t tiles = (blocks + NB - 1) / NB;
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t b = t * NB; b < std::min(blocks, (t + 1) * NB);) {
        const uint32_t* w = o.w + b * KP * 16;
        const int nb = b + NB <= blocks ? NB : 1;
        for (int64_t m = 0; m + MT <= o.M; m += MT) {
          const uint32_t* x = o.x + m * KP;
          float* y = o.y + m * ldy + b * 16;
          const int64_t xm = x_tiled ? 1 : KP, xp = x_tiled ? MT : 1;
          if (nb == NB && x_tiled) {
            packed_tile<NB, MT, false>(w, KP * 16, x, xm, xp, KP, y, ldy);
          } else if (nb == NB) {
            packed_tile<NB, MT, true>(w, KP * 16, x, xm, xp, KP, y, ldy);
          } else {
            packed_tile<1, MT, true>(w, KP * 16, x, xm, xp, KP, y, ldy);
          }
        }
        b += nb;
      }
    }
  });
}

struct PackedTile {
  const char* name;
  void (*fn)(const Packed&, bool);
  int mt;
};
const PackedTile kPackedTiles[] = {
    {"P8x1", packed_run<8, 1>, 1}, {"P4x1", packed_run<4, 1>, 1}, {"P4x2", packed_run<4, 2>, 2},
    {"P4x4", packed_run<4, 4>, 4}, {"P3x8", packed_run<3, 8>, 8}, {"P2x8", packed_run<2, 8>, 8},
    {"P2x12", packed_run<2, 12>, 12}, {"P2x14", packed_run<2, 14>, 14}};
#endif

using Shapes = std::vector<std::pair<int64_t, int64_t>>;

Shapes parse_shapes(int argc, char** argv, int first) {
  Shapes shapes;
  for (int i = first; i < argc; ++i) {
    const std::string s = argv[i];
    const auto colon = s.find(':');
    shapes.emplace_back(std::stoll(s.substr(0, colon)), std::stoll(s.substr(colon + 1)));
  }
  return shapes;
}

bf16* weights(int64_t n, int64_t k, int salt) {
  bf16* p = huge_pages<bf16>(static_cast<size_t>(n * k));
  for (int64_t j = 0; j < n * k; ++j) {
    p[j] = rs::from_float<bf16>(0.01f * static_cast<float>((j * 7 + salt) % 13) - 0.06f);
  }
  return p;
}

void print_line(const char* name, const char* suffix, const std::vector<double>& work,
                const std::vector<std::vector<double>>& secs) {
  std::printf("tile %s%s", name, suffix);
  double sum = 0, total = 0;
  for (size_t i = 0; i < work.size(); ++i) {
    const double s = median(secs[i]);
    std::printf(" %.2f", work[i] / s / 1e9);
    sum += work[i];
    total += s;
  }
  std::printf(" %.2f\n", sum / total / 1e9);
}

int decode(int64_t M, int layers, int rounds, bool shared_x, bool packed, const Shapes& shapes) {
  int64_t max_n = 0, max_k = 0;
  for (const auto& [n, k] : shapes) max_n = std::max(max_n, n), max_k = std::max(max_k, k);
  const size_t S = shapes.size();
  std::vector<bf16*> w;
  for (int l = 0; l < layers; ++l) {
    for (const auto& [n, k] : shapes) w.push_back(weights(n, k, l));
  }
  std::vector<XS> x(static_cast<size_t>(M * max_k));
  for (size_t j = 0; j < x.size(); ++j) {
    x[j] = rs::from_float<XS>(0.02f * static_cast<float>(j % 11) - 0.1f);
  }
  std::vector<bf16> y(static_cast<size_t>(M * max_n));
  std::vector<double> work;
  for (const auto& [n, k] : shapes) work.push_back(2.0 * n * k * layers);
  auto time_it = [&](std::vector<std::vector<double>>& secs, auto&& call) {
    std::vector<double> per_shape(S, 0.0);
    for (int l = 0; l < layers; ++l) {
      for (size_t i = 0; i < S; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        call(l * S + i, shapes[i].first, shapes[i].second);
        per_shape[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
    }
    for (size_t i = 0; i < S; ++i) secs[i].push_back(per_shape[i]);
  };
  const size_t T = std::size(kTiles) * (shared_x ? 2 : 1);
  std::vector<std::vector<std::vector<double>>> secs(T, std::vector<std::vector<double>>(S));
  for (const Tile& tile : kTiles) {  // untimed: the OpenMP pool and y's pages, once
    const auto [n, k] = shapes[0];
    tile.fn(P{x.data(), k, w[0], k, nullptr, nullptr, y.data(), n, M, n, k}, kMinTaskBytes);
  }
#if defined(RS_HAS_DPBF16)
  std::vector<const PackedTile*> ptiles;
  std::vector<uint32_t*> wp;
  std::vector<float> yp;
  if (packed) {
    for (const auto& [n, k] : shapes) {
      if (k % 2) {  // x's rows are read as pairs in place
        std::fprintf(stderr, "packed tiles need an even K, not %ld\n", static_cast<long>(k));
        return 2;
      }
    }
    for (const PackedTile& t : kPackedTiles) {
      if (M % t.mt == 0) ptiles.push_back(&t);
    }
    for (size_t i = 0; i < w.size(); ++i) wp.push_back(pack_blocks(w[i], shapes[i % S].first, shapes[i % S].second));
    yp.resize(static_cast<size_t>(M * (max_n + 15) / 16 * 16));
    const auto [n, k] = shapes[0];  // each against the production tile's y
    kTiles[0].fn(P{x.data(), k, w[0], k, nullptr, nullptr, y.data(), n, M, n, k}, kMinTaskBytes);
    const auto* xd = reinterpret_cast<const uint32_t*>(x.data());
    const int64_t ldy = (n + 15) / 16 * 16;
    for (const PackedTile* t : ptiles) {
      t->fn(Packed{wp[0], xd, yp.data(), n, k, M}, false);
      for (int64_t j = 0; j < M * n; ++j) {
        const float want = rs::to_float(y[j]), got = yp[j / n * ldy + j % n];
        if (std::abs(got - want) > 0.01f * (1.0f + std::abs(want))) {
          std::fprintf(stderr, "%s: y[%ld] = %g, the production tile's %g\n", t->name,
                       static_cast<long>(j), got, want);
          return 1;
        }
      }
    }
  }
  std::vector<std::vector<std::vector<double>>> psecs(ptiles.size(), std::vector<std::vector<double>>(S));
#else
  if (packed) {
    std::fprintf(stderr, "packed tiles need AVX512-BF16\n");
    return 2;
  }
#endif
  for (int r = 0; r < rounds; ++r) {
    for (size_t t = 0; t < T; ++t) {
      const Tile& tile = kTiles[t % std::size(kTiles)];
      const bool one_x = t >= std::size(kTiles);
      time_it(secs[t], [&](size_t wi, int64_t n, int64_t k) {
        tile.fn(P{x.data(), one_x ? 0 : k, w[wi], k, nullptr, nullptr, y.data(), n, M, n, k},
                kMinTaskBytes);
      });
    }
#if defined(RS_HAS_DPBF16)
    for (size_t t = 0; t < ptiles.size(); ++t) {
      time_it(psecs[t], [&](size_t wi, int64_t n, int64_t k) {
        ptiles[t]->fn(Packed{wp[wi], reinterpret_cast<const uint32_t*>(x.data()), yp.data(), n, k, M}, false);
      });
    }
#endif
  }
  for (size_t t = 0; t < T; ++t) {
    print_line(kTiles[t % std::size(kTiles)].name, t >= std::size(kTiles) ? "/x-in-L1" : "", work,
               secs[t]);
  }
#if defined(RS_HAS_DPBF16)
  for (size_t t = 0; t < ptiles.size(); ++t) print_line(ptiles[t]->name, "", work, psecs[t]);
#endif
  return 0;
}

int prefill(int64_t M, int rounds, const Shapes& shapes) {
#if defined(RS_HAS_DPBF16)
  const size_t S = shapes.size();
  int64_t max_n = 0, max_k = 0;
  for (const auto& [n, k] : shapes) max_n = std::max(max_n, n), max_k = std::max(max_k, k);
  std::vector<uint32_t*> wp;
  for (const auto& [n, k] : shapes) wp.push_back(pack_blocks(weights(n, k, 0), n, k));
  const int64_t KPM = (max_k + 1) / 2;
  std::vector<uint32_t> x(static_cast<size_t>(M * KPM), 0x3f003f00u), xt(x.size());
  std::vector<float> y(static_cast<size_t>(M * (max_n + 15) / 16 * 16));
  for (const PackedTile& t : kPackedTiles) {
    if (t.mt < 8) continue;  // decode-shaped
    const int64_t rows = M / t.mt * t.mt;
    std::vector<double> work;
    std::vector<std::vector<double>> secs(S);
    for (int r = 0; r <= rounds; ++r) {  // round 0 untimed
      for (size_t i = 0; i < S; ++i) {
        const auto [n, k] = shapes[i];
        const int64_t KP = (k + 1) / 2;
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t m0 = 0; m0 < rows; m0 += t.mt) {  // x as tiles of mt rows, pair-major
          for (int64_t p = 0; p < KP; ++p) {
            for (int m = 0; m < t.mt; ++m) xt[m0 * KP + p * t.mt + m] = x[(m0 + m) * KP + p];
          }
        }
        t.fn(Packed{wp[i], xt.data(), y.data(), n, k, rows}, true);
        if (r > 0) secs[i].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        if (r == 0) work.push_back(2.0 * rows * n * k);
      }
    }
    print_line(t.name, "", work, secs);
  }
  return 0;
#else
  (void)M, (void)rounds, (void)shapes;
  std::fprintf(stderr, "packed tiles need AVX512-BF16\n");
  return 2;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "decode" && argc >= 8) {
    return decode(std::atoll(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]),
                  std::atoi(argv[5]) != 0, std::atoi(argv[6]) != 0, parse_shapes(argc, argv, 7));
  }
  if (mode == "prefill" && argc >= 5) {
    return prefill(std::atoll(argv[2]), std::atoi(argv[3]), parse_shapes(argc, argv, 4));
  }
  std::fprintf(stderr,
               "usage: %s decode M LAYERS ROUNDS SHARED_X PACKED N:K [N:K ...]\n"
               "       %s prefill M ROUNDS N:K [N:K ...]\n",
               argv[0], argv[0]);
  return 2;
}
