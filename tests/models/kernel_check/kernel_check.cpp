// The CPU kernels' compute checked against scalar references, for whichever ISA this file is
// compiled for, without torch: the skinny GEMM (gemv.h) and the packed GEMM (gemm.h) with fp32,
// bf16 and int8 weights times fp32 and bf16 x, the paged causal attention (attention_kernel.h)
// in fp32 and bf16, RMSNorm with and without the residual (norm.h), SiLU-and-mul and RoPE
// (pointwise.h). Each reference is plain C++ in double, except where the kernel's contract is a
// rounding, which the reference repeats: the Q8 quantization of x, the sum RMSNorm returns and
// RoPE's three roundings (the last two compared bit for bit).
//
// Built by tests/models/test_kernel_isas.py natively for the x86 variants the CPU runs, and
// for aarch64 NEON with a cross compiler, run under qemu-user. ATen/Parallel.h here is a
// stand-in for ATen's (OpenMP), the only torch the compute headers use. Prints one line per
// failing check and exits 1, or prints "ok <isa> <checks>" and exits 0.
//
// Tolerances (|got - want| <= bound): a kernel rounds its fp32 result once to bf16 (half a bf16
// ulp: at most 2^-8 relative) and sums in fp32 in its own order (1e-5 of the sum of the terms'
// magnitudes bounds that); a wrong lane or element is off by O(|want|).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention_kernel.h"
#include "gemm.h"
#include "gemv.h"
#include "norm.h"
#include "pointwise.h"
#include "simd.h"

using namespace rs;

namespace {

int failures = 0;
int checks = 0;

// The worst |got - want| / bound over one check's elements; one check, failed when above 1.
// A bound of 0 asks for equality.
class Check {
 public:
  explicit Check(std::string what) : what_(std::move(what)) {}
  Check(const Check&) = delete;
  Check& operator=(const Check&) = delete;
  ~Check() {
    ++checks;
    if (worst_ <= 1.0) return;
    ++failures;
    std::printf("FAIL %s: element %lld got %.9g want %.9g (err/bound %.3g)\n", what_.c_str(),
                static_cast<long long>(at_), got_, want_, worst_);
  }
  void operator()(int64_t i, double got, double want, double bound) {
    const double err = std::fabs(got - want);
    double r = bound > 0.0 ? err / bound : (err == 0.0 ? 0.0 : INFINITY);
    if (std::isnan(r)) r = INFINITY;
    if (r > worst_) worst_ = r, at_ = i, got_ = got, want_ = want;
  }

 private:
  std::string what_;
  double worst_ = 0.0, got_ = 0.0, want_ = 0.0;
  int64_t at_ = -1;
};

// Deterministic values in [-1, 1), exact in fp32 (24 random bits).
struct Rng {
  uint64_t s;
  float uniform() {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<float>(static_cast<double>(s >> 40) * 0x1p-23) - 1.0f;
  }
};

template <class T>
const char* name_of() {
  if constexpr (std::is_same_v<T, float>) return "fp32";
  if constexpr (std::is_same_v<T, bf16>) return "bf16";
  return "int8";
}

template <class T>
T stored(float v) {
  if constexpr (std::is_same_v<T, int8_t>) {
    return static_cast<int8_t>(v);
  } else {
    return from_float<T>(v);
  }
}

template <class T>
T poison() {  // what fills the gaps between rows: a kernel that reads one shows it
  if constexpr (std::is_same_v<T, int8_t>) {
    return 127;
  } else {
    return from_float<T>(NAN);
  }
}

template <class T>
double rtol() {  // half a bf16 ulp, or fp32 rounding
  return std::is_same_v<T, bf16> ? 0x1p-8 : 1e-6;
}

float rounded_mul(float a, float b) {  // a * b rounded to fp32, never contracted into an FMA
  volatile float p = a * b;
  return p;
}

template <class T>
float round_to_t(float v) {
  return to_float(from_float<T>(v));
}

// x [M, K] (row stride ldx) times w [N, K] (row stride ldw), scale, bias: the skinny GEMM or
// the packed one. int8 weights multiply x quantized per block of 32 in the skinny GEMM at batch 1
// (Q8_0) and per row otherwise: d = max|x| / 127, q = round-half-even(x * (1 / d)) in fp32,
// which the reference repeats.
template <class WT, class XT>
void check_linear(bool packed, int64_t M, int64_t N, int64_t K, bool with_bias, Rng& rng) {
  constexpr bool kInt8 = std::is_same_v<WT, int8_t>;
  const int64_t ldx = K + 3, ldw = K + 1;
  std::vector<XT> x(M * ldx, poison<XT>());
  std::vector<float> xf(M * K);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) {
      x[m * ldx + k] = stored<XT>(rng.uniform());
      xf[m * K + k] = to_float(x[m * ldx + k]);
    }
  }
  std::vector<WT> w(N * ldw, poison<WT>());
  std::vector<float> wf(N * K), scale(N, 1.0f);
  for (int64_t n = 0; n < N; ++n) {
    std::vector<float> row(K);
    float amax = 0.0f;
    for (auto& v : row) amax = std::max(amax, std::fabs(v = 0.05f * rng.uniform()));
    if constexpr (kInt8) scale[n] = amax > 0.0f ? amax / 127.0f : 1.0f;
    for (int64_t k = 0; k < K; ++k) {
      w[n * ldw + k] = kInt8 ? stored<WT>(std::nearbyint(row[k] / scale[n])) : stored<WT>(row[k]);
      wf[n * K + k] = to_float(w[n * ldw + k]);
    }
  }
  std::vector<XT> bias(N);
  for (auto& b : bias) b = stored<XT>(0.1f * rng.uniform());
  std::vector<XT> y(M * N, poison<XT>());
  const Linear<WT, XT> o{x.data(), ldx, w.data(), ldw, kInt8 ? scale.data() : nullptr,
                         with_bias ? bias.data() : nullptr, y.data(), N, M, N, K};
  if (packed) {
    gemm::run(o);
  } else {
    gemv::run_typed(o, 4096);
  }
  if (kInt8) {  // the Q8 values of x multiplied: per block of 32 (batch 1), or per row
    const int64_t block = packed || M > 1 ? K : 32;
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t b0 = 0; b0 < K; b0 += block) {
        float* blk = &xf[m * K + b0];
        const int64_t n = std::min<int64_t>(block, K - b0);
        float amax = 0.0f;
        for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(blk[i]));
        const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        for (int64_t i = 0; i < n; ++i) blk[i] = std::nearbyint(blk[i] * id) * d;
      }
    }
  }
  char what[128];
  std::snprintf(what, sizeof what, "%s %s w x %s x, M %lld N %lld K %lld%s",
                packed ? "gemm" : "gemv", name_of<WT>(), name_of<XT>(), static_cast<long long>(M),
                static_cast<long long>(N), static_cast<long long>(K), with_bias ? " +bias" : "");
  Check check(what);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0, mag = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(xf[m * K + k]) * wf[n * K + k];
        acc += p;
        mag += std::fabs(p);
      }
      const double b = with_bias ? to_float(bias[n]) : 0.0;
      const double want = acc * scale[n] + b, size = mag * scale[n] + std::fabs(b);
      check(m * N + n, to_float(y[m * N + n]), want, rtol<XT>() * std::fabs(want) + 1e-5 * size);
    }
  }
}

template <class WT, class XT>
void check_linears(Rng& rng) {
  // (M, N, K): one-row tiles (K < W, K tails, N tails), a batch-1 row of 4 KB or more (4 weight
  // rows per tile), the R x MT tiles (M past the one-row bound, or x past L1), partial tiles
  const int64_t skinny[][3] = {{1, 13, 37}, {1, 9, 2100}, {1, 6, 4104}, {3, 7, 3},
                               {5, 13, 100}, {9, 11, 70}, {17, 21, 129}, {2, 5, 9000}};
  for (const auto& [M, N, K] : skinny) check_linear<WT, XT>(false, M, N, K, N % 2 == 1, rng);
  // the packed GEMM: partial row tiles and column panels, K tails of the W x W packing, two
  // passes over K (K > KC), two rounds of x (M > MB)
  const int64_t tall[][3] = {{13, 17, 37}, {30, 24, 64}, {7, 9, 8201}, {1030, 8, 16},
                             {5, 9, 16391}};
  for (const auto& [M, N, K] : tall) check_linear<WT, XT>(true, M, N, K, N % 2 == 1, rng);
}

struct Req {
  int64_t prefix, extend;
};

// Paged causal attention over a KV pool whose slots are shuffled: H query heads over kvh KV
// heads of head_dim d, q rows strided as in a qkv projection, tasks of tokens_per_task tokens.
template <class T>
void check_attention(int64_t H, int64_t kvh, int64_t d, int64_t window,
                     const std::vector<Req>& reqs, int64_t tokens_per_task, Rng& rng) {
  const int64_t bs = static_cast<int64_t>(reqs.size());
  int64_t keys = 0, tokens = 0, longest = 0;
  for (const Req& r : reqs) {
    keys += r.prefix + r.extend;
    tokens += r.extend;
    longest = std::max(longest, r.prefix + r.extend);
  }
  const int64_t num_slots = keys + 7, rows = bs + 2, L = longest + 5, qs = (H + 2 * kvh) * d;
  std::vector<int32_t> free_slots(num_slots - 1);  // slot 0 stays unused, as in the pool
  for (int64_t i = 0; i < num_slots - 1; ++i) free_slots[i] = static_cast<int32_t>(i + 1);
  for (int64_t i = num_slots - 2; i > 0; --i) {
    const auto j = static_cast<int64_t>((rng.uniform() + 1.0f) * 0.5f * static_cast<float>(i + 1));
    std::swap(free_slots[i], free_slots[std::min(j, i)]);
  }
  std::vector<int32_t> r2t(rows * L, 0);
  std::vector<T> k(num_slots * kvh * d), v(num_slots * kvh * d), q(tokens * qs, poison<T>());
  for (auto& e : k) e = stored<T>(rng.uniform());
  for (auto& e : v) e = stored<T>(rng.uniform());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 0; c < H * d; ++c) q[t * qs + c] = stored<T>(rng.uniform());
  }
  std::vector<T> out(tokens * H * d, poison<T>());
  attn::Problem<T> p{};
  p.q = q.data();
  p.q_stride = qs;
  p.k = k.data();
  p.v = v.data();
  p.kv_stride = kvh * d;
  p.req_to_token = r2t.data();
  p.r2t_stride = L;
  p.out = out.data();
  p.H = H;
  p.kvh = kvh;
  p.g = H / kvh;
  p.d = d;
  p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  p.window = window;
  int64_t next_slot = 0, q_start = 0;
  for (int64_t b = 0; b < bs; ++b) {
    const int64_t row = rows - 1 - b, seq = reqs[b].prefix + reqs[b].extend;
    for (int64_t j = 0; j < seq; ++j) r2t[row * L + j] = free_slots[next_slot++];
    p.row.push_back(row);
    p.prefix.push_back(reqs[b].prefix);
    p.seq.push_back(seq);
    p.q_start.push_back(q_start);
    q_start += reqs[b].extend;
  }
  attn::run_tasks(p, attn::plan_tasks(p, tokens_per_task, true),
                  attn::max_task_rows(tokens_per_task, p.g, kvh));

  char what[128];
  std::snprintf(what, sizeof what, "attention %s, H %lld kv %lld d %lld window %lld, %lld requests",
                name_of<T>(), static_cast<long long>(H), static_cast<long long>(kvh),
                static_cast<long long>(d), static_cast<long long>(window),
                static_cast<long long>(bs));
  Check check(what);
  // bf16 storage with VDPBF16PS rounds the probabilities to bf16 before P V (as the AMX path
  // does): each p within 2^-9 of itself, so the output within 2^-9 of sum p |v| / sum p
  const double p_rounding = attn::pairs<T>() ? std::ldexp(1.0, -8) : 0.0;
  std::vector<double> s, o(d), oabs(d);
  for (int64_t b = 0; b < bs; ++b) {
    const int32_t* slots = &r2t[p.row[b] * L];
    for (int64_t i = 0; i < reqs[b].extend; ++i) {
      const int64_t pos = reqs[b].prefix + i, tok = p.q_start[b] + i;
      const int64_t first = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
      for (int64_t h = 0; h < H; ++h) {
        const T* qr = &q[tok * qs + h * d];
        const int64_t kv = h / p.g;
        s.assign(pos + 1 - first, 0.0);
        double mx = -INFINITY, sum = 0.0;
        for (int64_t j = first; j <= pos; ++j) {
          const T* kr = &k[(slots[j] * kvh + kv) * d];
          double dot = 0.0;
          for (int64_t c = 0; c < d; ++c) {
            dot += static_cast<double>(to_float(qr[c])) * to_float(kr[c]);
          }
          mx = std::max(mx, s[j - first] = dot * p.scale);
        }
        std::fill(o.begin(), o.end(), 0.0);
        std::fill(oabs.begin(), oabs.end(), 0.0);
        for (int64_t j = first; j <= pos; ++j) {
          const double e = std::exp(s[j - first] - mx);
          sum += e;
          const T* vr = &v[(slots[j] * kvh + kv) * d];
          for (int64_t c = 0; c < d; ++c) {
            o[c] += e * to_float(vr[c]);
            oabs[c] += e * std::fabs(to_float(vr[c]));
          }
        }
        const T* got = &out[(tok * H + h) * d];
        for (int64_t c = 0; c < d; ++c) {
          const double want = o[c] / sum;  // |v| < 1: 2e-5 bounds fp32 sums over the keys
          const double bound = rtol<T>() * std::fabs(want) + 2e-5 + p_rounding * oabs[c] / sum;
          check((tok * H + h) * d + c, to_float(got[c]), want, bound);
        }
      }
    }
  }
}

template <class T>
void check_attentions(Rng& rng) {
  // a prefill crossing 64-key blocks, decodes on long prefixes, an extend on a prefix; GQA
  check_attention<T>(4, 2, 64, 0, {{0, 70}, {130, 1}, {37, 5}}, 32, rng);
  // tasks of one token, a sliding window, head_dim 80 (an odd number of 2W chunks), MHA
  check_attention<T>(2, 2, 80, 20, {{50, 3}, {0, 40}}, 1, rng);
  check_attention<T>(6, 1, 16, 0, {{3, 1}, {65, 2}}, 64, rng);
}

// RMSNorm of rows (with the residual: s = T(x + r), returned bit for bit).
template <class T>
void check_norm(int64_t rows, int64_t dim, bool residual, Rng& rng) {
  std::vector<T> x(rows * dim), r(rows * dim), w(dim), out(rows * dim), sum(rows * dim);
  for (auto& e : x) e = stored<T>(2.0f * rng.uniform());
  for (auto& e : r) e = stored<T>(rng.uniform());
  for (auto& e : w) e = stored<T>(1.0f + 0.5f * rng.uniform());
  const float eps = 1e-6f;
  rms_norm_rows(x.data(), residual ? r.data() : nullptr, w.data(), out.data(),
                residual ? sum.data() : nullptr, rows, dim, eps);
  char what[96];
  std::snprintf(what, sizeof what, "rms_norm %s, %lld x %lld%s", name_of<T>(),
                static_cast<long long>(rows), static_cast<long long>(dim),
                residual ? " +residual" : "");
  Check check(what);
  Check sums(std::string(what) + " (sum)");
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<double> s(dim);
    double ss = 0.0;
    for (int64_t c = 0; c < dim; ++c) {
      const int64_t at = i * dim + c;
      const float xv = to_float(x[at]);
      s[c] = residual ? round_to_t<T>(xv + to_float(r[at])) : xv;
      if (residual) sums(at, to_float(sum[at]), s[c], 0.0);
      ss += s[c] * s[c];
    }
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
    for (int64_t c = 0; c < dim; ++c) {
      const double want = s[c] * inv * to_float(w[c]);
      const double bound = (rtol<T>() + 1e-5) * std::fabs(want) + 1e-6;
      check(i * dim + c, to_float(out[i * dim + c]), want, bound);
    }
  }
}

// out = T(T(silu(gate)) * up): silu within a few fp32 ulp, then two roundings to T.
template <class T>
void check_silu_mul(int64_t rows, int64_t inter, Rng& rng) {
  std::vector<T> gate_up(rows * 2 * inter), out(rows * inter);
  for (auto& e : gate_up) e = stored<T>(8.0f * rng.uniform());
  silu_mul_rows(gate_up.data(), out.data(), rows, inter);
  char what[64];
  std::snprintf(what, sizeof what, "silu_mul %s, %lld x %lld", name_of<T>(),
                static_cast<long long>(rows), static_cast<long long>(inter));
  Check check(what);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < inter; ++c) {
      const double g = to_float(gate_up[i * 2 * inter + c]);
      const double u = to_float(gate_up[i * 2 * inter + inter + c]);
      const double want = g / (1.0 + std::exp(-g)) * u;
      check(i * inter + c, to_float(out[i * inter + c]), want,
            (2.0 * rtol<T>() + 1e-4) * std::fabs(want) + 1e-7);
    }
  }
}

// The name of a check over the heads of qkv rows: "<kind> <dtype>, <n> tokens x <nh> heads, d <d>".
template <class T>
std::string heads_check(const char* kind, int64_t tokens, int64_t nh, int64_t d) {
  char what[96];
  std::snprintf(what, sizeof what, "%s %s, %lld tokens x %lld heads, d %lld", kind, name_of<T>(),
                static_cast<long long>(tokens), static_cast<long long>(nh),
                static_cast<long long>(d));
  return what;
}

// RoPE in place over the q and k heads of qkv rows: bit for bit T(T(x1 c) + T(x2 s)) and
// T(T(x2 c') + T(x1 s')), each product rounded to fp32 first.
template <class T>
void check_rotary(int64_t tokens, int64_t heads, int64_t kv_heads, int64_t d, Rng& rng) {
  const int64_t row = (heads + 2 * kv_heads) * d, nh = heads + kv_heads, half = d / 2;
  std::vector<T> qkv(tokens * row), cos(tokens * d), sin(tokens * d);
  for (auto& e : qkv) e = stored<T>(4.0f * rng.uniform());
  for (auto& e : cos) e = stored<T>(rng.uniform());
  for (auto& e : sin) e = stored<T>(rng.uniform());
  const std::vector<T> before = qkv;
  rotate_tokens(qkv.data(), tokens, row, nh, d, cos.data(), sin.data(), d);
  Check check(heads_check<T>("rotary", tokens, nh, d));
  for (int64_t t = 0; t < tokens; ++t) {
    const T* c = &cos[t * d];
    const T* s = &sin[t * d];
    for (int64_t h = 0; h < heads + 2 * kv_heads; ++h) {
      for (int64_t i = 0; i < d; ++i) {
        const int64_t at = t * row + h * d + i;
        float want = to_float(before[at]);  // v stays as it was
        if (h < nh) {
          const int64_t j = i < half ? i + half : i - half;  // the other half
          const float a = round_to_t<T>(rounded_mul(to_float(before[at]), to_float(c[i])));
          const float b = round_to_t<T>(rounded_mul(to_float(before[t * row + h * d + j]),
                                                    to_float(s[i])));
          want = round_to_t<T>(a + b);
        }
        check(at, to_float(qkv[at]), want, 0.0);
      }
    }
  }
}

// Qwen3's q/k norms before RoPE (rotate_tokens with norm weights): each q and k head
// T(T(x * rsqrt(mean(x^2) + eps)) * w_h), within two roundings of the exact value, then rotated;
// with cos = 1 and sin = 0 the rotation keeps each value (T(T(x * 1) + T(y * 0)) = x), so the
// output is the norm alone. v stays as it was.
template <class T>
void check_qk_norm(int64_t tokens, int64_t heads, int64_t kv_heads, int64_t d, Rng& rng) {
  const int64_t row = (heads + 2 * kv_heads) * d, nh = heads + kv_heads;
  const float eps = 1e-6f;
  std::vector<T> qkv(tokens * row), cos(tokens * d, stored<T>(1.0f));
  std::vector<T> sin(tokens * d, stored<T>(0.0f));
  std::vector<T> w(nh * d);
  for (auto& e : qkv) e = stored<T>(4.0f * rng.uniform());
  for (auto& e : w) e = stored<T>(2.0f * rng.uniform());
  const std::vector<T> before = qkv;
  rotate_tokens(qkv.data(), tokens, row, nh, d, cos.data(), sin.data(), d, w.data(), eps);
  Check check(heads_check<T>("qk norm", tokens, nh, d));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads + 2 * kv_heads; ++h) {
      const int64_t at0 = t * row + h * d;
      double ss = 0.0;
      for (int64_t i = 0; i < d; ++i) {
        const double x = to_float(before[at0 + i]);
        ss += x * x;
      }
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
      for (int64_t i = 0; i < d; ++i) {
        const double x = to_float(before[at0 + i]);
        const double want = h < nh ? x * inv * to_float(w[h * d + i]) : x;
        const double bound = h < nh ? (2.0 * rtol<T>() + 1e-5) * std::fabs(want) + 1e-6 : 0.0;
        check(at0 + i, to_float(qkv[at0 + i]), want, bound);
      }
    }
  }
}

template <class T>
void check_pointwise(Rng& rng) {
  check_norm<T>(3, 100, false, rng);
  check_norm<T>(150, 896, true, rng);  // rows over two threads
  check_norm<T>(2, 5, true, rng);
  check_silu_mul<T>(3, 37, rng);
  check_silu_mul<T>(250, 300, rng);  // rows over two threads
  check_rotary<T>(50, 4, 2, 64, rng);  // tokens over two threads
  check_rotary<T>(5, 2, 1, 20, rng);  // half of d not a multiple of W
  check_qk_norm<T>(40, 4, 2, 128, rng);  // tokens over two threads
  check_qk_norm<T>(3, 3, 1, 40, rng);  // d not a multiple of W
}

}  // namespace

int main() {
  Rng rng{12345};
  check_linears<float, float>(rng);
  check_linears<float, bf16>(rng);
  check_linears<bf16, float>(rng);
  check_linears<bf16, bf16>(rng);
  check_linears<int8_t, float>(rng);
  check_linears<int8_t, bf16>(rng);
  check_attentions<float>(rng);
  check_attentions<bf16>(rng);
  check_pointwise<float>(rng);
  check_pointwise<bf16>(rng);
  if (failures > 0) {
    std::printf("%d of %d checks failed (%s)\n", failures, checks, RS_ISA_NAME);
    return 1;
  }
  std::printf("ok %s %d\n", RS_ISA_NAME, checks);
  return 0;
}
