// The skinny GEMM's register tiles side by side: gemv.h's own run<L, WT, XT, R, MT> (the
// production loop, its prefetch and its split over threads) at several R x MT, on a model's
// decode-step linears, bf16 weights cache-cold on huge pages. Built and run by gemv_tiles.py
// (which see), with the kernel variant's flags and tests/models/kernel_check's stand-in for
// ATen/Parallel.h, so no torch is needed.
//
//   gemv_tiles M LAYERS ROUNDS SHARED_X N:K [N:K ...]
//
// M rows of x; LAYERS copies of the shapes (cold: more bytes than the caches); SHARED_X 1 runs
// each tile a second time with every row of x at one address (x then stays in L1: what
// re-reading x from L2 costs), as tile "RxMT/x-in-L1". Prints one line per tile: "tile RxMT
// GBS_SHAPE1 GBS_SHAPE2 ... ALL" (GB/s of weight, medians over rounds; every tile runs in each
// round, so the host's phase hits them alike).
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s M LAYERS ROUNDS SHARED_X N:K [N:K ...]\n", argv[0]);
    return 2;
  }
  const int64_t M = std::atoll(argv[1]);
  const int layers = std::atoi(argv[2]), rounds = std::atoi(argv[3]);
  const bool shared_x = std::atoi(argv[4]) != 0;
  std::vector<std::pair<int64_t, int64_t>> shapes;
  int64_t max_n = 0, max_k = 0;
  for (int i = 5; i < argc; ++i) {
    const std::string s = argv[i];
    const auto colon = s.find(':');
    shapes.emplace_back(std::stoll(s.substr(0, colon)), std::stoll(s.substr(colon + 1)));
    max_n = std::max(max_n, shapes.back().first);
    max_k = std::max(max_k, shapes.back().second);
  }
  std::vector<bf16*> w;
  for (int l = 0; l < layers; ++l) {
    for (const auto& [n, k] : shapes) {
      bf16* p = huge_pages<bf16>(static_cast<size_t>(n * k));
      for (int64_t j = 0; j < n * k; ++j) p[j] = rs::from_float<bf16>(0.01f * static_cast<float>(j % 7));
      w.push_back(p);
    }
  }
  std::vector<XS> x(static_cast<size_t>(M * max_k), rs::from_float<XS>(0.5f));
  std::vector<bf16> y(static_cast<size_t>(M * max_n));
  const size_t S = shapes.size(), T = std::size(kTiles) * (shared_x ? 2 : 1);
  std::vector<std::vector<std::vector<double>>> secs(T, std::vector<std::vector<double>>(S));
  for (const Tile& tile : kTiles) {  // untimed: the OpenMP pool and y's pages, once
    const auto [n, k] = shapes[0];
    tile.fn(P{x.data(), k, w[0], k, nullptr, nullptr, y.data(), n, M, n, k}, kMinTaskBytes);
  }
  for (int r = 0; r < rounds; ++r) {
    for (size_t t = 0; t < T; ++t) {
      const Tile& tile = kTiles[t % std::size(kTiles)];
      const bool one_x = t >= std::size(kTiles);
      std::vector<double> per_shape(S, 0.0);
      for (int l = 0; l < layers; ++l) {
        for (size_t i = 0; i < S; ++i) {
          const auto [n, k] = shapes[i];
          const P p{x.data(), one_x ? 0 : k, w[l * S + i], k, nullptr, nullptr,
                    y.data(), n, M, n, k};
          const auto t0 = std::chrono::steady_clock::now();
          tile.fn(p, kMinTaskBytes);
          per_shape[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
      }
      for (size_t i = 0; i < S; ++i) secs[t][i].push_back(per_shape[i]);
    }
  }
  for (size_t t = 0; t < T; ++t) {
    std::printf("tile %s%s", kTiles[t % std::size(kTiles)].name,
                t >= std::size(kTiles) ? "/x-in-L1" : "");
    double bytes = 0, total = 0;
    for (size_t i = 0; i < S; ++i) {
      const double b = 2.0 * shapes[i].first * shapes[i].second * layers, s = median(secs[t][i]);
      std::printf(" %.2f", b / s / 1e9);
      bytes += b;
      total += s;
    }
    std::printf(" %.2f\n", bytes / total / 1e9);
  }
}
