// Checks every operation of radixserve's SIMD vocabulary (simd.h) against plain scalar C++, for
// whichever ISA this file is compiled for. No torch: built by tests/models/test_kernel_isas.py
// natively (x86 variants the CPU runs) and for aarch64 NEON with a cross compiler, run there
// under qemu-user. Prints "ok <isa> <checks>" and exits 0, or prints each mismatch and exits 1.
#include <cmath>
#include <cstdio>
#include <cstring>

#include "simd.h"

using namespace rs;

static int failures = 0;
static int checks = 0;

static void expect(bool ok, const char* what, int lane, double got, double want) {
  ++checks;
  if (!ok) {
    ++failures;
    std::printf("FAIL %s lane %d: got %.9g want %.9g\n", what, lane, got, want);
  }
}

static void expect_near(const char* what, int lane, float got, float want, float rel) {
  const float tol = rel * std::fmax(1.0f, std::fabs(want));
  expect(std::fabs(got - want) <= tol, what, lane, got, want);
}

int main() {
  float a[W], b[W], c[W], out[W];
  bf16 h[W];
  int8_t q[W];
  for (int i = 0; i < W; ++i) {
    a[i] = 0.37f * static_cast<float>(i) - 1.3f;
    b[i] = 2.5f - 0.61f * static_cast<float>(i);
    c[i] = 0.125f * static_cast<float>(i * i) - 3.0f;
    h[i] = float_to_bf16(a[i] * 7.0f);
    q[i] = static_cast<int8_t>(i * 37 % 255 - 127);
  }
  const VF va = load(a), vb = load(b), vc = load(c);

  store(out, fma(va, vb, vc));
  for (int i = 0; i < W; ++i) expect_near("fma", i, out[i], std::fma(a[i], b[i], c[i]), 1e-6f);
  store(out, add(va, vb));
  for (int i = 0; i < W; ++i) expect(out[i] == a[i] + b[i], "add", i, out[i], a[i] + b[i]);
  store(out, sub(va, vb));
  for (int i = 0; i < W; ++i) expect(out[i] == a[i] - b[i], "sub", i, out[i], a[i] - b[i]);
  store(out, mul(va, vb));
  for (int i = 0; i < W; ++i) expect(out[i] == a[i] * b[i], "mul", i, out[i], a[i] * b[i]);
  store(out, div(va, vb));
  for (int i = 0; i < W; ++i) expect(out[i] == a[i] / b[i], "div", i, out[i], a[i] / b[i]);
  store(out, add(opaque(mul(va, vb)), vc));  // the product rounded: no FMA contraction
  for (int i = 0; i < W; ++i) {
    volatile float product = a[i] * b[i];  // stored: rounded, never contracted into an FMA
    const float want = product + c[i];
    expect(out[i] == want, "opaque", i, out[i], want);
  }
  store(out, abs(va));
  for (int i = 0; i < W; ++i) expect(out[i] == std::fabs(a[i]), "abs", i, out[i], std::fabs(a[i]));
  store(out, max(va, vb));
  for (int i = 0; i < W; ++i) expect(out[i] == std::fmax(a[i], b[i]), "max", i, out[i], 0);
  store(out, select_ge(va, vb, vc, zero()));
  for (int i = 0; i < W; ++i) {
    const float want = a[i] >= b[i] ? c[i] : 0.0f;
    expect(out[i] == want, "select_ge", i, out[i], want);
  }

  float sum = 0.0f, mx = -INFINITY;
  for (int i = 0; i < W; ++i) sum += a[i], mx = std::fmax(mx, a[i]);
  expect_near("hsum", 0, hsum(va), sum, 1e-6f);
  expect(hmax(va) == mx, "hmax", 0, hmax(va), mx);
  expect(hsum(set1(2.0f)) == 2.0f * W, "set1", 0, hsum(set1(2.0f)), 2.0f * W);

  float r[W];
  for (int i = 0; i < W; ++i) r[i] = static_cast<float>(i) - 2.5f + 0.25f * (i % 3);
  store(out, round(load(r)));
  for (int i = 0; i < W; ++i) {
    expect(out[i] == std::nearbyint(r[i]), "round", i, out[i], std::nearbyint(r[i]));
  }
  alignas(64) int32_t ints[W];
  VI vi = to_int(load(r));
  store(out, as_float(vi));
  std::memcpy(ints, out, sizeof ints);
  for (int i = 0; i < W; ++i) {
    const auto want = static_cast<int32_t>(std::nearbyint(r[i]));
    expect(ints[i] == want, "to_int", i, ints[i], want);
  }
  vi = add_i(slli(set1_i(3), 4), srli(set1_i(-16), 28));  // 48 + 15
  store(out, as_float(vi));
  std::memcpy(ints, out, sizeof ints);
  for (int i = 0; i < W; ++i) expect(ints[i] == 63, "shifts", i, ints[i], 63);
  vi = and_i(set1_i(0x0ff0), set1_i(0x00ff));
  store(out, as_float(vi));
  std::memcpy(ints, out, sizeof ints);
  for (int i = 0; i < W; ++i) expect(ints[i] == 0x00f0, "and_i", i, ints[i], 0x00f0);

  store(out, load(h));
  for (int i = 0; i < W; ++i) {
    expect(out[i] == bf16_to_float(h[i]), "load bf16", i, out[i], bf16_to_float(h[i]));
  }
  store(out, load(q));
  for (int i = 0; i < W; ++i) expect(out[i] == q[i], "load int8", i, out[i], q[i]);
  bf16 back[W];
  float odd[W];
  for (int i = 0; i < W; ++i) odd[i] = a[i] * 3.14159f + 1e-3f * static_cast<float>(i);
  store(back, load(odd));
  for (int i = 0; i < W; ++i) {
    expect(back[i] == float_to_bf16(odd[i]), "store bf16", i, back[i], float_to_bf16(odd[i]));
  }
  odd[W - 1] = NAN;
  store(back, load(odd));
  expect(back[W - 1] == 0x7fc0, "store bf16 NaN", W - 1, back[W - 1], 0x7fc0);

  const int tail = W - 1;
  float tail_out[W] = {};
  store_tail(tail_out, load_tail(a, tail), tail);
  for (int i = 0; i < W; ++i) {
    const float want = i < tail ? a[i] : 0.0f;
    expect(tail_out[i] == want, "load/store tail", i, tail_out[i], want);
  }

  const float xs[] = {0.0f, -0.5f, -1.0f, -3.7f, -10.0f, -40.0f, -87.0f, -90.0f, -INFINITY};
  for (float x : xs) {
    float in[W], got[W];
    for (int i = 0; i < W; ++i) in[i] = x;
    store(got, exp_nonpos(load(in)));
    const float want = x < -87.3f ? 0.0f : std::exp(x);
    expect_near("exp_nonpos", 0, got[0], want, 2e-6f);
  }

  {  // int8 dot products: lane i = sum of the products of bytes 4i .. 4i + 3, exact
    int8_t wq[Q], xq[Q];
    for (int i = 0; i < Q; ++i) {
      wq[i] = static_cast<int8_t>((i * 53 + 11) % 255 - 127);  // -127 .. 127, zeros too
      xq[i] = static_cast<int8_t>(127 - (i * 97 + 5) % 255);
    }
    wq[0] = -127, xq[0] = -127, wq[1] = -127, xq[1] = -127;  // the largest pair: 2 * 127^2
    wq[2] = 127, xq[2] = 127, wq[3] = 0;
    alignas(64) int32_t got[W];
    store(out, as_float(dot_q(prep_q(load_q(wq)), load_q(xq))));
    std::memcpy(got, out, sizeof got);
    for (int i = 0; i < W; ++i) {
      int32_t want = 0;
      for (int j = 4 * i; j < 4 * i + 4; ++j) want += wq[j] * xq[j];
      expect(got[i] == want, "dot_q", i, got[i], want);
    }
    store(out, cvt_f(load_bits(got)));
    for (int i = 0; i < W; ++i) expect(out[i] == static_cast<float>(got[i]), "cvt_f", i, out[i], got[i]);
  }

  {  // any_nan: one NaN lane anywhere (also infinities, which are not NaN)
    for (int lane = 0; lane < W; ++lane) {
      float f[W];
      for (int i = 0; i < W; ++i) f[i] = i == lane ? std::nanf("") : (i % 2 ? INFINITY : a[i]);
      expect(any_nan(load(f)), "any_nan", lane, 0, 1);
      f[lane] = -INFINITY;
      expect(!any_nan(load(f)), "any_nan (none)", lane, 1, 0);
    }
  }

  {  // transpose: element (i, j) of a W x W block goes to (j, i)
    VF blk[W];
    float rows[W][W];
    for (int i = 0; i < W; ++i) {
      for (int j = 0; j < W; ++j) rows[i][j] = static_cast<float>(i * W + j);
      blk[i] = load(rows[i]);
    }
    transpose(blk);
    for (int i = 0; i < W; ++i) {
      store(out, blk[i]);
      for (int j = 0; j < W; ++j) {
        expect(out[j] == rows[j][i], "transpose", i * W + j, out[j], rows[j][i]);
      }
    }
  }

#if defined(RS_HAS_DPBF16)
  {  // VDPBF16PS: acc[i] + p[2i] * q[2i] + p[2i + 1] * q[2i + 1], exact on these small values
    bf16 p[2 * W], q2[2 * W];
    for (int i = 0; i < 2 * W; ++i) {
      p[i] = float_to_bf16(0.25f * static_cast<float>(i % 7) - 0.75f);
      q2[i] = float_to_bf16(1.5f - 0.125f * static_cast<float>(i % 11));
    }
    const auto pf = [&](int i) { return bf16_to_float(p[i]); };
    const auto qf = [&](int i) { return bf16_to_float(q2[i]); };
    store(out, dot_pairs(load_pairs(p), load_pairs(q2), va));
    for (int i = 0; i < W; ++i) {
      const float want = a[i] + pf(2 * i) * qf(2 * i) + pf(2 * i + 1) * qf(2 * i + 1);
      expect_near("dot_pairs", i, out[i], want, 1e-6f);
    }
    const int n = 2 * W - 3;  // odd: the last pair is half padding
    store(out, dot_pairs(load_pairs_tail(p, n), load_pairs(q2), zero()));
    for (int i = 0; i < W; ++i) {
      float want = 0.0f;
      for (int j = 2 * i; j < 2 * i + 2; ++j) want += j < n ? pf(j) * qf(j) : 0.0f;
      expect_near("load_pairs_tail", i, out[i], want, 1e-6f);
    }
  }
#endif

  if (failures) return 1;
  std::printf("ok %s %d\n", RS_ISA_NAME, checks);
  return 0;
}
