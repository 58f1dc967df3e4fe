// Skinny GEMM ("batched GEMV") for decode-shaped linear layers on AVX-512 CPUs.
//
//   y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]),  x [M, K], w [N, K] (PyTorch layout), M small.
//
// The weight is streamed once from memory in its native row-major layout; every weight vector
// loaded is reused for all M rows of x (which stay in L1), so the kernel runs at memory bandwidth
// until M * (FMA work) catches up with it (M ~ 12-16 on Zen 4). bf16 uses VDPBF16PS (AVX512_BF16,
// fp32 accumulation, like oneDNN); fp32 uses VFMADD. Work is split over N with at::parallel_for
// (PyTorch's own OpenMP pool, so torch.set_num_threads applies). Built by _ext.py with
// -mavx512f -mavx512bw -mavx512vl -mavx512bf16; the Python side checks the CPU flags first.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

namespace {

// Lane l of the result is the horizontal sum of v[l] (16 accumulators -> one vector, 45 ops).
inline __m512 hsum16(const __m512* v) {
  __m512 s1[8];
  for (int p = 0; p < 8; ++p) {
    s1[p] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * p], v[2 * p + 1]),
                          _mm512_unpackhi_ps(v[2 * p], v[2 * p + 1]));
  }
  __m512 s2[4];
  for (int q = 0; q < 4; ++q) {
    s2[q] = _mm512_add_ps(_mm512_shuffle_ps(s1[2 * q], s1[2 * q + 1], 0x44),
                          _mm512_shuffle_ps(s1[2 * q], s1[2 * q + 1], 0xEE));
  }
  const __m512 p = _mm512_add_ps(_mm512_shuffle_f32x4(s2[0], s2[1], 0x88),
                                 _mm512_shuffle_f32x4(s2[0], s2[1], 0xDD));
  const __m512 q = _mm512_add_ps(_mm512_shuffle_f32x4(s2[2], s2[3], 0x88),
                                 _mm512_shuffle_f32x4(s2[2], s2[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(p, q, 0x88), _mm512_shuffle_f32x4(p, q, 0xDD));
}

struct Bf16Ops {
  using T = uint16_t;
  using V = __m512i;
  static constexpr int kStep = 32;  // bf16 values per vector
  static inline V load(const T* p) { return _mm512_loadu_si512(p); }
  static inline V load_tail(const T* p, int64_t n) {
    return _mm512_maskz_loadu_epi16(static_cast<__mmask32>((1ULL << n) - 1), p);
  }
  static inline __m512 fma(__m512 acc, V w, V x) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(w), reinterpret_cast<__m512bh>(x));
  }
  static inline float to_float(T v) {
    const uint32_t u = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  static inline T from_float(float f) {  // round to nearest even, like c10::BFloat16
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffU) > 0x7f800000U) return 0x7fc0;  // NaN
    u += 0x7fffU + ((u >> 16) & 1U);
    return static_cast<T>(u >> 16);
  }
};

struct F32Ops {
  using T = float;
  using V = __m512;
  static constexpr int kStep = 16;
  static inline V load(const T* p) { return _mm512_loadu_ps(p); }
  static inline V load_tail(const T* p, int64_t n) {
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1U << n) - 1), p);
  }
  static inline __m512 fma(__m512 acc, V w, V x) { return _mm512_fmadd_ps(w, x, acc); }
  static inline float to_float(T v) { return v; }
  static inline T from_float(float f) { return f; }
};

// One register tile: R weight rows x MT rows of x over all of K; out[m * R + r] = dot(w[r], x[m]).
// Small tiles keep U independent accumulator sets (alternating k steps) to hide FMA latency.
// While streaming its rows, the tile prefetches the same columns two row blocks ahead into L1.
template <class Ops, int R, int MT>
inline void dot_tile(const typename Ops::T* w, int64_t ldw, const typename Ops::T* x, int64_t ldx,
                     int64_t K, float* out) {
  constexpr int T = R * MT;
  constexpr int U = T >= 8 ? 1 : (T >= 4 ? 2 : 4);
  static_assert(T <= 16, "tile too large");
  constexpr int S = Ops::kStep;
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  auto step = [&](int u, int64_t k) {
    typename Ops::V wv[R];
    for (int r = 0; r < R; ++r) {
      wv[r] = Ops::load(w + r * ldw + k);
      _mm_prefetch(reinterpret_cast<const char*>(w + (2 * R + r) * ldw + k), _MM_HINT_T0);
    }
    for (int m = 0; m < MT; ++m) {
      const typename Ops::V xv = Ops::load(x + m * ldx + k);
      __m512* a = acc + u * T + m * R;
      for (int r = 0; r < R; ++r) a[r] = Ops::fma(a[r], wv[r], xv);
    }
  };
  int64_t k = 0;
  for (; k + U * S <= K; k += U * S) {
    for (int u = 0; u < U; ++u) step(u, k + u * S);
  }
  for (; k + S <= K; k += S) step(0, k);
  if (k < K) {
    const int64_t n = K - k;
    typename Ops::V wv[R];
    for (int r = 0; r < R; ++r) wv[r] = Ops::load_tail(w + r * ldw + k, n);
    for (int m = 0; m < MT; ++m) {
      const typename Ops::V xv = Ops::load_tail(x + m * ldx + k, n);
      for (int r = 0; r < R; ++r) acc[m * R + r] = Ops::fma(acc[m * R + r], wv[r], xv);
    }
  }
  for (int u = 1; u < U; ++u) {
    for (int i = 0; i < T; ++i) acc[i] = _mm512_add_ps(acc[i], acc[u * T + i]);
  }
  if constexpr (T <= 4) {
    for (int i = 0; i < T; ++i) out[i] = _mm512_reduce_add_ps(acc[i]);
  } else {
    for (int i = T; i < 16; ++i) acc[i] = _mm512_setzero_ps();
    _mm512_storeu_ps(out, hsum16(acc));
  }
}

// dot_tile with a runtime tile height mt <= MT (the last, partial tile of x rows).
template <class Ops, int R, int MT>
inline void dot_tile_upto(int64_t mt, const typename Ops::T* w, int64_t ldw,
                          const typename Ops::T* x, int64_t ldx, int64_t K, float* out) {
  if constexpr (MT > 1) {
    if (mt < MT) return dot_tile_upto<Ops, R, MT - 1>(mt, w, ldw, x, ldx, K, out);
  }
  dot_tile<Ops, R, MT>(w, ldw, x, ldx, K, out);
}

template <class Ops>
struct Problem {
  using T = typename Ops::T;
  const T* x;
  int64_t ldx;
  const T* w;
  int64_t ldw;
  const T* bias;  // nullptr: none
  T* y;
  int64_t ldy;
  int64_t M, N, K;
};

// R output columns starting at n0, all M rows, in tiles of MT (the last tile may be smaller).
template <class Ops, int R, int MT>
void row_block(const Problem<Ops>& p, int64_t n0) {
  alignas(64) float out[16];
  const typename Ops::T* w = p.w + n0 * p.ldw;
  for (int64_t m0 = 0; m0 < p.M; m0 += MT) {
    const typename Ops::T* x = p.x + m0 * p.ldx;
    const int64_t mt = std::min<int64_t>(MT, p.M - m0);
    dot_tile_upto<Ops, R, MT>(mt, w, p.ldw, x, p.ldx, p.K, out);
    for (int64_t m = 0; m < mt; ++m) {
      typename Ops::T* y = p.y + (m0 + m) * p.ldy + n0;
      for (int r = 0; r < R; ++r) {
        const float b = p.bias ? Ops::to_float(p.bias[n0 + r]) : 0.0f;
        y[r] = Ops::from_float(out[m * R + r] + b);
      }
    }
  }
}

// Split N into blocks of R rows (a tail of single rows), spread over the intra-op threads.
template <class Ops, int R, int MT>
void run(const Problem<Ops>& p, int64_t min_task_bytes) {
  const int64_t nblocks = p.N / R;
  const int64_t tail = p.N - nblocks * R;
  const int64_t block_bytes = R * p.K * static_cast<int64_t>(sizeof(typename Ops::T));
  const int64_t grain = std::max<int64_t>(1, min_task_bytes / std::max<int64_t>(1, block_bytes));
  at::parallel_for(0, nblocks + (tail > 0 ? 1 : 0), grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      if (b < nblocks) {
        row_block<Ops, R, MT>(p, b * R);
      } else {
        for (int64_t n = nblocks * R; n < p.N; ++n) row_block<Ops, 1, 4>(p, n);
      }
    }
  });
}

// Tile choice (measured on Zen 4, cache-cold weights): one row at a time against all of x is the
// most memory-friendly (a single sequential stream per thread) while x stays in L1; otherwise
// 4x4 tiles cut the L1/L2 traffic of re-reading x per weight row.
constexpr int64_t kXL1Bytes = 16 * 1024;

template <class Ops>
void dispatch(const Problem<Ops>& p, int64_t min_task_bytes) {
  const int64_t x_bytes = p.M * p.K * static_cast<int64_t>(sizeof(typename Ops::T));
  if (p.M <= 8 && x_bytes <= kXL1Bytes) {
    run<Ops, 1, 8>(p, min_task_bytes);
  } else {
    run<Ops, 4, 4>(p, min_task_bytes);
  }
}

bool dense_cpu(const at::Tensor& t) {
  return t.device().is_cpu() && t.layout() == at::kStrided && !t.is_neg() && !t.is_conj();
}

// Row stride of x seen as [M, K] without copying, or -1 when its leading dims do not collapse.
int64_t row_stride(const at::Tensor& x, int64_t K) {
  if (K > 1 && x.stride(-1) != 1) return -1;
  int64_t ld = -1, span = 0;
  for (int64_t i = x.dim() - 2; i >= 0; --i) {
    if (x.size(i) == 1) continue;
    if (ld < 0) {
      ld = x.stride(i);
    } else if (x.stride(i) != span) {
      return -1;
    }
    span = x.stride(i) * x.size(i);
  }
  return ld < 0 ? K : ld;
}

template <class Ops>
at::Tensor run_typed(const at::Tensor& x, int64_t ldx, const at::Tensor& w,
                     const std::optional<at::Tensor>& bias, int64_t M, int64_t min_task_bytes) {
  using T = typename Ops::T;
  const int64_t N = w.size(0), K = w.size(1);
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = N;
  at::Tensor y = at::empty(sizes, x.options());
  const Problem<Ops> p{static_cast<const T*>(x.data_ptr()),
                       ldx,
                       static_cast<const T*>(w.data_ptr()),
                       N > 1 ? w.stride(0) : K,
                       bias.has_value() ? static_cast<const T*>(bias->data_ptr()) : nullptr,
                       static_cast<T*>(y.data_ptr()),
                       N,
                       M,
                       N,
                       K};
  dispatch(p, std::max<int64_t>(1, min_task_bytes));
  return y;
}

}  // namespace

// y [..., N] = x [..., K] @ w [N, K]^T (+ bias [N]) when 1 <= M = x.numel() / K <= max_m and the
// tensors suit the kernel (dense CPU tensors of one dtype allowed by `dtypes`, 1: bf16, 2: fp32,
// no autograd); otherwise None, and the caller uses F.linear. Tasks of at least min_task_bytes
// of weight are spread over torch's intra-op threads.
std::optional<at::Tensor> try_linear(const at::Tensor& x, const at::Tensor& w,
                                     const std::optional<at::Tensor>& bias, int64_t max_m,
                                     int64_t dtypes, int64_t min_task_bytes) {
  const auto dtype = w.scalar_type();
  const bool bf16 = dtype == at::kBFloat16 && (dtypes & 1);
  if (!(bf16 || (dtype == at::kFloat && (dtypes & 2)))) return std::nullopt;
  if (w.dim() != 2 || x.dim() < 1 || x.scalar_type() != dtype) return std::nullopt;
  if (!dense_cpu(x) || !dense_cpu(w)) return std::nullopt;
  const int64_t N = w.size(0), K = w.size(1);
  if (N < 1 || K < 1 || x.size(-1) != K) return std::nullopt;
  const int64_t M = x.numel() / K;
  if (M < 1 || M > max_m) return std::nullopt;
  if (w.stride(1) != 1 && K > 1) return std::nullopt;
  if (bias.has_value()) {
    const at::Tensor& b = *bias;
    if (!dense_cpu(b) || b.scalar_type() != dtype || b.dim() != 1 || b.size(0) != N ||
        (b.stride(0) != 1 && N > 1)) {
      return std::nullopt;
    }
  }
  if (c10::GradMode::is_enabled() &&
      (x.requires_grad() || w.requires_grad() || (bias.has_value() && bias->requires_grad()))) {
    return std::nullopt;
  }
  const int64_t ldx = row_stride(x, K);
  if (ldx < 0) return std::nullopt;
  return bf16 ? run_typed<Bf16Ops>(x, ldx, w, bias, M, min_task_bytes)
              : run_typed<F32Ops>(x, ldx, w, bias, M, min_task_bytes);
}
