// The one SIMD vocabulary of the CPU kernels: a vector of W fp32 lanes and the few operations
// they need, with loads that widen the storage types in registers:
//   float (fp32), bf16 (uint16_t bit pattern: the high half of an fp32), int8_t (quantized).
// The kernels are written once against this header and compiled per ISA (_ext.py builds one
// extension per variant with its -m flags): AVX-512 (W = 16), AVX2 + FMA (W = 8) or aarch64
// NEON (W = 4; built with a cross compiler and run under qemu-user by
// tests/models/test_kernel_isas.py).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#include <cstdint>
#include <cstring>

namespace rs {

using bf16 = uint16_t;

inline float bf16_to_float(bf16 v) {
  const uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline bf16 float_to_bf16(float f) {  // round to nearest even, like c10::BFloat16
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffU) > 0x7f800000U) return 0x7fc0;  // NaN
  u += 0x7fffU + ((u >> 16) & 1U);
  return static_cast<bf16>(u >> 16);
}

inline float to_float(float v) { return v; }
inline float to_float(bf16 v) { return bf16_to_float(v); }
inline float to_float(int8_t v) { return static_cast<float>(v); }
template <class T>
inline T from_float(float f);
template <>
inline float from_float<float>(float f) { return f; }
template <>
inline bf16 from_float<bf16>(float f) { return float_to_bf16(f); }

inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }
// The line at p into L2 only (PREFETCHT1, PRFM PLDL2KEEP): for streams read far ahead, where a
// prefetch into L1 would evict lines still in use before their turn came.
inline void prefetch_l2(const void* p) { __builtin_prefetch(p, 0, 2); }

#if defined(__x86_64__) && defined(__AVX512F__)

#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__AVX512BF16__)
#define RS_ISA_NAME "amx"
#define RS_HAS_AMX 1
#elif defined(__AVX512BF16__)
#define RS_ISA_NAME "avx512_bf16"
#elif defined(__AVX512VNNI__)
#define RS_ISA_NAME "avx512_vnni"
#else
#define RS_ISA_NAME "avx512"
#endif
constexpr int W = 16;
constexpr int kVectorRegisters = 32;
constexpr bool kAvx512 = true;
using VF = __m512;
using VI = __m512i;
inline VF zero() { return _mm512_setzero_ps(); }
inline VF set1(float v) { return _mm512_set1_ps(v); }
inline VF load(const float* p) { return _mm512_loadu_ps(p); }
inline VF load(const bf16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline VF load(const int8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}
inline void store(float* p, VF v) { _mm512_storeu_ps(p, v); }
inline VI as_int(VF v) { return _mm512_castps_si512(v); }
inline VF as_float(VI v) { return _mm512_castsi512_ps(v); }
inline VI add_i(VI a, VI b) { return _mm512_add_epi32(a, b); }
inline VI and_i(VI a, VI b) { return _mm512_and_si512(a, b); }
inline VI set1_i(int v) { return _mm512_set1_epi32(v); }
inline VI srli(VI a, int n) { return _mm512_srli_epi32(a, n); }
inline VI slli(VI a, int n) { return _mm512_slli_epi32(a, n); }
inline void store_halves(bf16* p, VI v) {  // the low 16 bits of each lane
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(v));
}
inline VF fma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
inline VF add(VF a, VF b) { return _mm512_add_ps(a, b); }
inline VF sub(VF a, VF b) { return _mm512_sub_ps(a, b); }
inline VF mul(VF a, VF b) { return _mm512_mul_ps(a, b); }
inline VF div(VF a, VF b) { return _mm512_div_ps(a, b); }
inline VF max(VF a, VF b) { return _mm512_max_ps(a, b); }
inline VF opaque(VF v) {  // v, hidden from the optimiser (see the note after the ISA blocks)
  asm("" : "+v"(v));
  return v;
}
inline VF round(VF a) {
  return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline VI to_int(VF a) { return _mm512_cvtps_epi32(a); }
inline VF select_ge(VF x, VF lo, VF a, VF b) {  // x >= lo ? a : b
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), b, a);
}
inline float hsum(VF v) { return _mm512_reduce_add_ps(v); }
inline int32_t hsum_i(VI v) { return _mm512_reduce_add_epi32(v); }
inline float hmax(VF v) { return _mm512_reduce_max_ps(v); }
inline bool any_nan(VF v) { return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0; }

// Raw bits of W 32-bit lanes (two bf16 values per lane, or four int8).
inline VI load_bits(const void* p) { return _mm512_loadu_si512(p); }
inline VF cvt_f(VI v) { return _mm512_cvtepi32_ps(v); }

// int16 pairs (the packed GEMM's int8 products, gemm.h): a VI of W pairs, each 32-bit lane two
// int16 values; madd_pairs adds each lane's two products, summed exactly in int32, to acc's
// lane (VPMADDWD); widen_pairs reads 2W int8 values as W pairs.
inline VI madd_pairs(VI acc, VI a, VI b) { return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b)); }
inline VI widen_pairs(const int8_t* p) {
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void store_i(int32_t* p, VI v) { _mm512_storeu_si512(p, v); }

// v[i][j] <-> v[j][i] (see the AVX2 block), in registers: 32-bit and 64-bit unpacks make 4 x 4
// blocks inside each 128-bit lane, two rounds of 128-bit lane shuffles place them.
inline void transpose(VF (&v)[W]) {
  VF t[16];
  for (int a = 0; a < 8; ++a) {
    t[2 * a] = _mm512_unpacklo_ps(v[2 * a], v[2 * a + 1]);
    t[2 * a + 1] = _mm512_unpackhi_ps(v[2 * a], v[2 * a + 1]);
  }
  VF u[16];  // u[4g + c], 128-bit lane l: column 4l + c of rows 4g .. 4g + 3
  for (int g = 0; g < 4; ++g) {
    const __m512d t0 = _mm512_castps_pd(t[4 * g]), t1 = _mm512_castps_pd(t[4 * g + 1]);
    const __m512d t2 = _mm512_castps_pd(t[4 * g + 2]), t3 = _mm512_castps_pd(t[4 * g + 3]);
    u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  for (int c = 0; c < 4; ++c) {
    const VF v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
    const VF v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
    const VF v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
    const VF v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
    v[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
    v[4 + c] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
    v[8 + c] = _mm512_shuffle_f32x4(v1, v3, 0x88);
    v[12 + c] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
  }
}

inline __mmask16 first_lanes(int64_t n) {  // lanes [0, n)
  return n >= W ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1);
}

// int8 x int8 dot products: a VQ holds Q = 4W int8 values; lane i of dot_q(w, x) is the exact
// int32 sum of the products of bytes 4i .. 4i + 3. Operands in [-127, 127] (-128 excluded: the
// sign is moved onto x, whose magnitude then multiplies |w| as unsigned bytes). prep_q readies
// a weight vector once for all the x rows it meets. With AVX512-VNNI one VPDPBUSD per 4W
// products; without, VPMADDUBSW + VPMADDWD (pairs of products stay below 2^15: no saturation).
constexpr int Q = 4 * W;
using VQ = __m512i;
struct QW {
  __m512i abs;   // |w| as unsigned bytes
  __mmask64 neg; // w < 0
};
inline VQ load_q(const int8_t* p) { return _mm512_loadu_si512(p); }
inline QW prep_q(VQ w) { return {_mm512_abs_epi8(w), _mm512_movepi8_mask(w)}; }
// acc + dot_q(w, x), lane by lane: one VPDPBUSD with VNNI
inline VI dot_q_add(const QW& w, VQ x, VI acc) {
  const __m512i xs = _mm512_mask_sub_epi8(x, w.neg, _mm512_setzero_si512(), x);  // x * sign(w)
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(acc, w.abs, xs);
#else
  return add_i(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w.abs, xs), _mm512_set1_epi16(1)));
#endif
}
inline VI dot_q(const QW& w, VQ x) { return dot_q_add(w, x, _mm512_setzero_si512()); }

#if defined(__AVX512BF16__)
// bf16 x bf16 dot products without widening: VDPBF16PS takes 2W bf16 values of each operand
// and adds the products of each pair of neighbours to one fp32 lane,
//   acc[i] += a[2i] * b[2i] + a[2i + 1] * b[2i + 1]
// (each bf16 product is exact in fp32; the adds round to nearest even; denormal inputs and
// outputs are flushed to zero, whatever MXCSR says). Twice the multiply-adds of an fp32 FMA per
// instruction, and no widening: the skinny GEMM uses it for bf16 weights times bf16 inputs.
#define RS_HAS_DPBF16 1
using VB = __m512i;  // 2W bf16 values (raw bits)
inline VB load_pairs(const bf16* p) { return _mm512_loadu_si512(p); }
inline VB load_pairs_tail(const bf16* p, int64_t n) {  // the first n < 2W values, zero-padded
  return _mm512_maskz_loadu_epi16(static_cast<__mmask32>((1ULL << n) - 1), p);
}
inline VF dot_pairs(VB a, VB b, VF acc) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}
#endif

#elif defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)

#define RS_ISA_NAME "avx2"
constexpr int W = 8;
constexpr int kVectorRegisters = 16;
constexpr bool kAvx512 = false;
using VF = __m256;
using VI = __m256i;
inline VF zero() { return _mm256_setzero_ps(); }
inline VF set1(float v) { return _mm256_set1_ps(v); }
inline VF load(const float* p) { return _mm256_loadu_ps(p); }
inline VF load(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline VF load(const int8_t* p) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}
inline void store(float* p, VF v) { _mm256_storeu_ps(p, v); }
inline VI as_int(VF v) { return _mm256_castps_si256(v); }
inline VF as_float(VI v) { return _mm256_castsi256_ps(v); }
inline VI add_i(VI a, VI b) { return _mm256_add_epi32(a, b); }
inline VI and_i(VI a, VI b) { return _mm256_and_si256(a, b); }
inline VI set1_i(int v) { return _mm256_set1_epi32(v); }
inline VI srli(VI a, int n) { return _mm256_srli_epi32(a, n); }
inline VI slli(VI a, int n) { return _mm256_slli_epi32(a, n); }
inline void store_halves(bf16* p, VI v) {  // the low 16 bits of each lane (all < 2^16 here)
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
inline VF fma(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
inline VF add(VF a, VF b) { return _mm256_add_ps(a, b); }
inline VF sub(VF a, VF b) { return _mm256_sub_ps(a, b); }
inline VF mul(VF a, VF b) { return _mm256_mul_ps(a, b); }
inline VF div(VF a, VF b) { return _mm256_div_ps(a, b); }
inline VF max(VF a, VF b) { return _mm256_max_ps(a, b); }
inline VF opaque(VF v) {
  asm("" : "+x"(v));
  return v;
}
inline VF round(VF a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline VI to_int(VF a) { return _mm256_cvtps_epi32(a); }
inline VF select_ge(VF x, VF lo, VF a, VF b) {  // x >= lo ? a : b
  return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, lo, _CMP_GE_OQ));
}
inline float hsum(VF v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline int32_t hsum_i(VI v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x55));
  return _mm_cvtsi128_si32(s);
}
inline float hmax(VF v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline bool any_nan(VF v) { return _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0; }

inline VI load_bits(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline VF cvt_f(VI v) { return _mm256_cvtepi32_ps(v); }

// int16 pairs (see the AVX-512 block)
inline VI madd_pairs(VI acc, VI a, VI b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
inline VI widen_pairs(const int8_t* p) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void store_i(int32_t* p, VI v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }

// The W x W block v (v[i] its row i) transposed in registers: v[i][j] <-> v[j][i]. 8 x 8:
// interleave pairs of rows, then pairs of pairs, then swap 128-bit halves (24 shuffles).
inline void transpose(VF (&v)[W]) {
  VF t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    v[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// int8 x int8 dot products (see the AVX-512 block): VPSIGNB moves w's sign onto x, then
// VPMADDUBSW (|w| unsigned x signed x, pairs summed to int16, below 2^15 for |values| <= 127)
// and VPMADDWD (pairs of those to int32).
constexpr int Q = 4 * W;
using VQ = __m256i;
struct QW {
  __m256i abs, w;
};
inline VQ load_q(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline QW prep_q(VQ w) { return {_mm256_abs_epi8(w), w}; }
inline VI dot_q(const QW& w, VQ x) {
  const __m256i pairs = _mm256_maddubs_epi16(w.abs, _mm256_sign_epi8(x, w.w));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}
inline VI dot_q_add(const QW& w, VQ x, VI acc) { return add_i(acc, dot_q(w, x)); }

#elif defined(__aarch64__) && defined(__ARM_NEON)

#define RS_ISA_NAME "neon"
constexpr int W = 4;
constexpr int kVectorRegisters = 32;
constexpr bool kAvx512 = false;
using VF = float32x4_t;
using VI = int32x4_t;
inline VF zero() { return vdupq_n_f32(0.0f); }
inline VF set1(float v) { return vdupq_n_f32(v); }
inline VF load(const float* p) { return vld1q_f32(p); }
inline VF load(const bf16* p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
inline VF load(const int8_t* p) {  // 4 bytes, read as one word (no read past them)
  int32_t word;
  std::memcpy(&word, p, sizeof word);
  const int16x8_t wide = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(word)));
  return vcvtq_f32_s32(vmovl_s16(vget_low_s16(wide)));
}
inline void store(float* p, VF v) { vst1q_f32(p, v); }
inline VI as_int(VF v) { return vreinterpretq_s32_f32(v); }
inline VF as_float(VI v) { return vreinterpretq_f32_s32(v); }
inline VI add_i(VI a, VI b) { return vaddq_s32(a, b); }
inline VI and_i(VI a, VI b) { return vandq_s32(a, b); }
inline VI set1_i(int v) { return vdupq_n_s32(v); }
inline VI srli(VI a, int n) {  // logical: a negative count shifts an unsigned lane right
  return vreinterpretq_s32_u32(vshlq_u32(vreinterpretq_u32_s32(a), vdupq_n_s32(-n)));
}
inline VI slli(VI a, int n) { return vshlq_s32(a, vdupq_n_s32(n)); }
inline void store_halves(bf16* p, VI v) {  // the low 16 bits of each lane
  vst1_u16(p, vmovn_u32(vreinterpretq_u32_s32(v)));
}
inline VF fma(VF a, VF b, VF c) { return vfmaq_f32(c, a, b); }
inline VF add(VF a, VF b) { return vaddq_f32(a, b); }
inline VF sub(VF a, VF b) { return vsubq_f32(a, b); }
inline VF mul(VF a, VF b) { return vmulq_f32(a, b); }
inline VF div(VF a, VF b) { return vdivq_f32(a, b); }
inline VF max(VF a, VF b) { return vmaxq_f32(a, b); }
inline VF opaque(VF v) {
  asm("" : "+w"(v));
  return v;
}
inline VF round(VF a) { return vrndnq_f32(a); }
inline VI to_int(VF a) { return vcvtnq_s32_f32(a); }
inline VF select_ge(VF x, VF lo, VF a, VF b) { return vbslq_f32(vcgeq_f32(x, lo), a, b); }
inline float hsum(VF v) { return vaddvq_f32(v); }
inline int32_t hsum_i(VI v) { return vaddvq_s32(v); }
inline float hmax(VF v) { return vmaxvq_f32(v); }
inline bool any_nan(VF v) { return vmaxvq_u32(vmvnq_u32(vceqq_f32(v, v))) != 0; }

inline VI load_bits(const void* p) { return vld1q_s32(static_cast<const int32_t*>(p)); }
inline VF cvt_f(VI v) { return vcvtq_f32_s32(v); }

// int16 pairs (see the AVX-512 block): widening multiplies, neighbours added pairwise
inline VI madd_pairs(VI acc, VI a, VI b) {
  const int16x8_t a16 = vreinterpretq_s16_s32(a), b16 = vreinterpretq_s16_s32(b);
  const int32x4_t lo = vmull_s16(vget_low_s16(a16), vget_low_s16(b16));
  return vaddq_s32(acc, vpaddq_s32(lo, vmull_high_s16(a16, b16)));
}
inline VI widen_pairs(const int8_t* p) { return vreinterpretq_s32_s16(vmovl_s8(vld1_s8(p))); }
inline void store_i(int32_t* p, VI v) { vst1q_s32(p, v); }

// v[i][j] <-> v[j][i] (see the AVX2 block): 4 x 4 with two TRN1/TRN2 levels.
inline void transpose(VF (&v)[W]) {
  const float32x4x2_t a = vtrnq_f32(v[0], v[1]), b = vtrnq_f32(v[2], v[3]);
  v[0] = vcombine_f32(vget_low_f32(a.val[0]), vget_low_f32(b.val[0]));
  v[1] = vcombine_f32(vget_low_f32(a.val[1]), vget_low_f32(b.val[1]));
  v[2] = vcombine_f32(vget_high_f32(a.val[0]), vget_high_f32(b.val[0]));
  v[3] = vcombine_f32(vget_high_f32(a.val[1]), vget_high_f32(b.val[1]));
}

// int8 x int8 dot products (see the AVX-512 block): widening multiplies to int16, pairwise adds
// to int32 (baseline NEON; no dot-product extension needed).
constexpr int Q = 4 * W;
using VQ = int8x16_t;
struct QW {
  int8x16_t w;
};
inline VQ load_q(const int8_t* p) { return vld1q_s8(p); }
inline QW prep_q(VQ w) { return {w}; }
inline VI dot_q(const QW& w, VQ x) {
  const int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(w.w), vget_low_s8(x)));
  const int32x4_t hi = vpaddlq_s16(vmull_high_s8(w.w, x));
  return vpaddq_s32(lo, hi);
}
inline VI dot_q_add(const QW& w, VQ x, VI acc) { return add_i(acc, dot_q(w, x)); }

#else
#error "radixserve CPU kernels need AVX2+FMA, AVX-512 or aarch64 NEON (built by _ext.py)"
#endif

// opaque(v) is v, hidden from the optimiser: a product passed through it is rounded before it is
// added (GCC would otherwise contract mul + add into one FMA, which torch's separate operations
// never do; pointwise.cpp's RoPE matches torch bit for bit through it).

inline VF abs(VF v) { return max(v, sub(zero(), v)); }

// v rounded to bf16, nearest even, as bit patterns in the low 16 bits of each lane (a NaN lane
// comes out as some bit pattern, not necessarily a NaN: callers deal with NaN).
inline VI bf16_bits(VF v) {
  const VI u = as_int(v);
  return srli(add_i(u, add_i(set1_i(0x7fff), and_i(srli(u, 16), set1_i(1)))), 16);
}

// bf16 stores round to nearest even (NaN -> the canonical quiet NaN), like c10::BFloat16.
inline void store(bf16* p, VF v) {
  if (!any_nan(v)) return store_halves(p, bf16_bits(v));
  alignas(64) float f[W];
  store(f, v);
  for (int i = 0; i < W; ++i) p[i] = float_to_bf16(f[i]);
}

// The first n (< W) elements, zero-padded / stored alone.
template <class T>
inline VF load_tail(const T* p, int64_t n) {
  alignas(64) T buf[W] = {};
  std::memcpy(buf, p, static_cast<size_t>(n) * sizeof(T));
  return load(buf);
}
template <class T>
inline void store_tail(T* p, VF v, int64_t n) {
  alignas(64) T buf[W];
  store(buf, v);
  std::memcpy(p, buf, static_cast<size_t>(n) * sizeof(T));
}

// W elements, or the `left` < W that remain (zero-padded / stored alone).
template <class T>
inline VF load_n(const T* p, int64_t left) {
  return left >= W ? load(p) : load_tail(p, left);
}
template <class T>
inline void store_n(T* p, VF v, int64_t left) {
  if (left >= W) return store(p, v);
  store_tail(p, v, left);
}

// exp(x) for x <= 0 (Cephes' expf polynomial, ~1 ulp); 0 below -87.3 and for -inf.
inline VF exp_nonpos(VF x) {
  const VF lo = set1(-87.3f);
  const VF xc = max(x, lo);
  const VF n = round(mul(xc, set1(1.44269504088896341f)));
  VF r = fma(n, set1(-0.693359375f), xc);
  r = fma(n, set1(2.12194440e-4f), r);
  VF p = set1(1.9875691500e-4f);
  p = fma(p, r, set1(1.3981999507e-3f));
  p = fma(p, r, set1(8.3334519073e-3f));
  p = fma(p, r, set1(4.1665795894e-2f));
  p = fma(p, r, set1(1.6666665459e-1f));
  p = fma(p, r, set1(5.0000001201e-1f));
  p = fma(p, mul(r, r), add(r, set1(1.0f)));
  const VF scale = as_float(slli(add_i(to_int(n), set1_i(127)), 23));  // 2^n, n >= -126
  return select_ge(x, lo, mul(p, scale), zero());
}

}  // namespace rs
