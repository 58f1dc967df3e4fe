// Paged causal attention for bf16 EXTEND batches on AVX512-BF16 CPUs, flash-attention style.
//
//   out[t, h, :] = softmax(scale * q[t, h] . K_b^T, causal, window) V_b   (t: a token of request b)
//
// K_b/V_b are read straight from the KV buffers [slots, kv_heads, d] through the request's
// req_to_token row, so no padded copy is made. Two passes, each over torch's intra-op threads:
//  1. pack: per (request, KV head), K into 16-key groups of dimension pairs and V into key pairs,
//     the operand layouts of VDPBF16PS (zero-padded to whole 64-key blocks);
//  2. attend: tasks of (request, KV head, block of tokens); a task's rows are its tokens times
//     the query heads of that KV head (GQA folded in, so each K/V block is loaded once for all of
//     them). Per 64-key block and 4-row tile: S = Q K^T in registers, online softmax in fp32
//     (masking only blocks that cross the diagonal or the window), P in bf16, O += P V in fp32.
// Scores and the softmax are fp32 and P is rounded to bf16 before P V, as in FlashAttention.
// Built by _ext.py with -mavx512f -mavx512bw -mavx512vl -mavx512bf16; the Python side checks
// the CPU flags first and falls back to the torch path for anything this does not take.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kBk = 64;       // keys per block (4 vectors of 16 scores)
constexpr int64_t kTile = 4;      // query rows per register tile
constexpr int64_t kRows = 64;     // target query rows per task
constexpr int64_t kMaxDim = 256;  // head_dim limit (multiple of 16)

// exp(x) for x <= 0 (Cephes' expf polynomial, ~1 ulp), 0 below -87.3 (and for -inf).
inline __m512 exp_nonpos(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.3f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
  x = _mm512_max_ps(x, lo);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_scalef_ps(keep, p, n);
}

inline __m512 bcast_pair(const uint16_t* p) {  // two bf16 values as every 32-bit lane
  uint32_t u;
  std::memcpy(&u, p, sizeof u);
  return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(u)));
}

inline __m512 dot(__m512 acc, __m512i a, __m512 b) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
}

inline uint16_t to_bf16(float f) {  // round to nearest even, like torch
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

struct Problem {
  const uint16_t* q;  // [T, H, d], token stride q_stride
  int64_t q_stride;
  const uint16_t* k;  // [slots, kv_heads, d], slot stride kv_stride
  const uint16_t* v;
  int64_t kv_stride;
  const int32_t* req_to_token;  // [rows, r2t_stride]
  int64_t r2t_stride;
  uint16_t* out;  // [T, H, d] dense
  int64_t H, kvh, g, d;
  float scale;
  int64_t window;  // <= 0: none
  // per request
  std::vector<int64_t> row, prefix, q_start, seq, pack_off;
  uint16_t* kp;  // packed K, then V: [sum Spad * kv_heads * d] each
  uint16_t* vp;
};

inline int64_t pack_base(const Problem& p, int64_t b, int64_t h) {
  const int64_t spad = (p.seq[b] + kBk - 1) / kBk * kBk;
  return (p.pack_off[b] * p.kvh + h * spad) * p.d;
}

// In place: row i, lane j -> row j, lane i (16 x 16 dwords; unpack, then 128-bit shuffles).
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 2; ++i) {
    for (int k = 0; k < 4; ++k) {
      t[8 * i + k] = _mm512_shuffle_i32x4(r[8 * i + k], r[8 * i + 4 + k], 0x88);
      t[8 * i + 4 + k] = _mm512_shuffle_i32x4(r[8 * i + k], r[8 * i + 4 + k], 0xDD);
    }
  }
  for (int k = 0; k < 8; ++k) {
    r[k] = _mm512_shuffle_i32x4(t[k], t[k + 8], 0x88);
    r[k + 8] = _mm512_shuffle_i32x4(t[k], t[k + 8], 0xDD);
  }
}

// K of (b, h) as [Spad/16][d/2][16 keys][2 dims]; V as [Spad/2][d][2 keys]. Pads stay zero.
// K: each 16-key group is a 16 x (d/2) matrix of dimension pairs (dwords), transposed 16
// columns at a time.
void pack(const Problem& p, int64_t b, int64_t h) {
  const int64_t d = p.d, half = d / 2, seq = p.seq[b];
  const int32_t* slots = p.req_to_token + p.row[b] * p.r2t_stride;
  uint32_t* kd = reinterpret_cast<uint32_t*>(p.kp + pack_base(p, b, h));
  for (int64_t j0 = 0; j0 < seq; j0 += 16) {
    const int64_t m = std::min<int64_t>(16, seq - j0);
    const uint16_t* src[16];
    for (int64_t i = 0; i < m; ++i) {
      src[i] = p.k + static_cast<int64_t>(slots[j0 + i]) * p.kv_stride + h * d;
    }
    uint32_t* dst = kd + (j0 / 16) * half * 16;
    for (int64_t q0 = 0; q0 < half; q0 += 16) {
      const int64_t w = std::min<int64_t>(16, half - q0);
      const __mmask16 lanes = static_cast<__mmask16>((1u << w) - 1);
      __m512i r[16];
      for (int64_t i = 0; i < 16; ++i) {
        r[i] = i < m ? _mm512_maskz_loadu_epi32(lanes, src[i] + 2 * q0) : _mm512_setzero_si512();
      }
      transpose16(r);
      for (int64_t q = 0; q < w; ++q) _mm512_storeu_si512(dst + (q0 + q) * 16, r[q]);
    }
  }
  uint16_t* vd = p.vp + pack_base(p, b, h);
  for (int64_t j = 0; j < seq; j += 2) {
    const uint16_t* v0 = p.v + static_cast<int64_t>(slots[j]) * p.kv_stride + h * d;
    const bool has1 = j + 1 < seq;
    const uint16_t* v1 = has1 ? p.v + static_cast<int64_t>(slots[j + 1]) * p.kv_stride + h * d : v0;
    uint16_t* dst = vd + (j / 2) * d * 2;
    for (int64_t c = 0; c < d; c += 16) {
      const __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_epi16(v0 + c));
      __m512i bv = _mm512_cvtepu16_epi32(_mm256_loadu_epi16(v1 + c));
      if (!has1) bv = _mm512_setzero_si512();
      _mm512_storeu_si512(dst + c * 2, _mm512_or_si512(a, _mm512_slli_epi32(bv, 16)));
    }
  }
}

struct Task {
  int64_t b, h, t0, t1, cost;
};

struct Scratch {
  std::vector<float> o;       // [kRowsMax][d]
  std::vector<float> m, l;    // [kRowsMax]
  std::vector<int64_t> pos;   // [kRowsMax]: -1 for padding rows
  std::vector<const uint16_t*> qrow;
  alignas(64) uint16_t pbuf[kTile][kBk];
};

// O rows [r0, r0 + 4) += P (4 x 64, bf16) V block at key j0, for dims [c0, c0 + 16 * NV).
template <int NV>
inline void pv_chunk(const Problem& p, const uint16_t* vbase, int64_t j0, Scratch& s, int64_t r0,
                     int64_t c0) {
  __m512 acc[kTile][NV];
  for (int r = 0; r < kTile; ++r)
    for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_loadu_ps(&s.o[(r0 + r) * p.d + c0 + 16 * c]);
  const uint16_t* vb = vbase + (j0 / 2) * p.d * 2 + c0 * 2;
  for (int64_t kp = 0; kp < kBk / 2; ++kp) {
    __m512i vv[NV];
    for (int c = 0; c < NV; ++c)
      vv[c] = _mm512_loadu_si512(vb + kp * p.d * 2 + 32 * c);
    for (int r = 0; r < kTile; ++r) {
      const __m512 pr = bcast_pair(&s.pbuf[r][2 * kp]);
      for (int c = 0; c < NV; ++c) acc[r][c] = dot(acc[r][c], vv[c], pr);
    }
  }
  for (int r = 0; r < kTile; ++r)
    for (int c = 0; c < NV; ++c) _mm512_storeu_ps(&s.o[(r0 + r) * p.d + c0 + 16 * c], acc[r][c]);
}

// One 4-row tile against one 64-key block: scores, online softmax, P V.
void tile_block(const Problem& p, const uint16_t* kbase, const uint16_t* vbase, int64_t j0,
                Scratch& s, int64_t r0) {
  const int64_t half = p.d / 2;
  __m512 acc[kTile][4];
  for (int r = 0; r < kTile; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  const uint16_t* kb = kbase + (j0 / 16) * half * 32;
  for (int64_t q = 0; q < half; ++q) {
    __m512i kv[4];
    for (int c = 0; c < 4; ++c) kv[c] = _mm512_loadu_si512(kb + (c * half + q) * 32);
    for (int r = 0; r < kTile; ++r) {
      const __m512 qr = bcast_pair(s.qrow[r0 + r] + 2 * q);
      for (int c = 0; c < 4; ++c) acc[r][c] = dot(acc[r][c], kv[c], qr);
    }
  }
  const __m512 scale = _mm512_set1_ps(p.scale);
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int r = 0; r < kTile; ++r) {
    const int64_t row = r0 + r, pos = s.pos[row];
    __m512 sc[4];
    for (int c = 0; c < 4; ++c) sc[c] = _mm512_mul_ps(acc[r][c], scale);
    const bool crosses = j0 + kBk - 1 > pos || (p.window > 0 && j0 <= pos - p.window);
    if (crosses) {
      const __m512i hi = _mm512_set1_epi32(static_cast<int>(pos - j0));
      const int64_t lo_key = p.window > 0 ? pos - p.window - j0 : -1;  // visible: > lo_key
      const __m512i lo = _mm512_set1_epi32(static_cast<int>(lo_key));
      for (int c = 0; c < 4; ++c) {
        const __m512i kidx = _mm512_add_epi32(iota, _mm512_set1_epi32(16 * c));
        const __mmask16 ok = _mm512_cmp_epi32_mask(kidx, hi, _MM_CMPINT_LE) &
                             _mm512_cmp_epi32_mask(kidx, lo, _MM_CMPINT_NLE);
        sc[c] = _mm512_mask_blend_ps(ok, ninf, sc[c]);
      }
    }
    const float bmax = _mm512_reduce_max_ps(
        _mm512_max_ps(_mm512_max_ps(sc[0], sc[1]), _mm512_max_ps(sc[2], sc[3])));
    if (bmax == -std::numeric_limits<float>::infinity()) {
      std::memset(s.pbuf[r], 0, sizeof s.pbuf[r]);
      continue;
    }
    const float m_old = s.m[row], m_new = std::max(m_old, bmax);
    if (m_old != m_new) {
      const float alpha = std::exp(m_old - m_new);  // 0 when m_old is -inf
      s.l[row] *= alpha;
      const __m512 a = _mm512_set1_ps(alpha);
      float* o = &s.o[row * p.d];
      for (int64_t c = 0; c < p.d; c += 16) {
        _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), a));
      }
      s.m[row] = m_new;
    }
    const __m512 mv = _mm512_set1_ps(m_new);
    __m512 sum = _mm512_setzero_ps();
    for (int c = 0; c < 4; ++c) {
      const __m512 e = exp_nonpos(_mm512_sub_ps(sc[c], mv));
      sum = _mm512_add_ps(sum, e);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(&s.pbuf[r][16 * c]),
                          (__m256i)_mm512_cvtneps_pbh(e));
    }
    s.l[row] += _mm512_reduce_add_ps(sum);
  }
  int64_t c0 = 0;
  for (; c0 + 64 <= p.d; c0 += 64) pv_chunk<4>(p, vbase, j0, s, r0, c0);
  switch ((p.d - c0) / 16) {
    case 3: pv_chunk<3>(p, vbase, j0, s, r0, c0); break;
    case 2: pv_chunk<2>(p, vbase, j0, s, r0, c0); break;
    case 1: pv_chunk<1>(p, vbase, j0, s, r0, c0); break;
    default: break;
  }
}

void run_task(const Problem& p, const Task& t, Scratch& s, const uint16_t* zero_row) {
  const int64_t g = p.g, d = p.d;
  const int64_t rows = (t.t1 - t.t0) * g, padded = (rows + kTile - 1) / kTile * kTile;
  int64_t pmin = std::numeric_limits<int64_t>::max(), pmax = -1;
  for (int64_t r = 0; r < padded; ++r) {
    if (r < rows) {
      const int64_t tok = t.t0 + r / g;  // token index within request
      s.pos[r] = p.prefix[t.b] + tok;
      s.qrow[r] = p.q + (p.q_start[t.b] + tok) * p.q_stride + (t.h * g + r % g) * d;
      pmin = std::min(pmin, s.pos[r]);
      pmax = std::max(pmax, s.pos[r]);
    } else {
      s.pos[r] = -1;
      s.qrow[r] = zero_row;
    }
    s.m[r] = -std::numeric_limits<float>::infinity();
    s.l[r] = 0.0f;
  }
  std::fill(s.o.begin(), s.o.begin() + padded * d, 0.0f);
  const uint16_t* kbase = p.kp + pack_base(p, t.b, t.h);
  const uint16_t* vbase = p.vp + pack_base(p, t.b, t.h);
  const int64_t first = p.window > 0 ? std::max<int64_t>(0, pmin - p.window + 1) / kBk * kBk : 0;
  for (int64_t j0 = first; j0 <= pmax; j0 += kBk) {
    for (int64_t r0 = 0; r0 < padded; r0 += kTile) {
      int64_t tmin = std::numeric_limits<int64_t>::max(), tmax = -1;
      for (int64_t r = r0; r < r0 + kTile; ++r) {
        if (s.pos[r] < 0) continue;
        tmin = std::min(tmin, s.pos[r]);
        tmax = std::max(tmax, s.pos[r]);
      }
      if (tmax < j0) continue;  // nothing visible yet (also: all padding)
      if (p.window > 0 && j0 + kBk - 1 <= tmin - p.window) continue;  // all left of the window
      tile_block(p, kbase, vbase, j0, s, r0);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t tok = t.t0 + r / g;
    uint16_t* dst = p.out + ((p.q_start[t.b] + tok) * p.H + t.h * g + r % g) * d;
    const float inv = s.l[r] > 0.0f ? 1.0f / s.l[r] : 0.0f;
    for (int64_t c = 0; c < d; ++c) dst[c] = to_bf16(s.o[r * d + c] * inv);
  }
}

// Tasks 0..n-1 over torch's threads: each worker makes its state once, then pulls the next
// task index until none is left (so uneven tasks balance; callers order them costliest first).
template <typename MakeState, typename F>
void run_dynamic(int64_t n, MakeState&& make_state, F&& fn) {
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(n, at::get_num_threads());
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    auto state = make_state();
    for (int64_t i = next++; i < n; i = next++) fn(state, i);
  });
}

bool dense_bf16(const at::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == at::kBFloat16 && t.layout() == at::kStrided;
}

}  // namespace

// Causal (optionally sliding-window) attention of an EXTEND batch; see the header comment.
// q [T, H * d] bf16 (rows may be strided), k_buf/v_buf [slots, kv_heads, d] bf16 dense,
// req_to_token [rows, L] int32, and per request (int64, CPU): req_pool_indices, prefix_lens,
// extend_lens (sum = T). window <= 0: none. Raises ValueError (via TORCH_CHECK_VALUE) on
// shapes it cannot take; the Python side only calls it with ones it can.
at::Tensor extend_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                            const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                            const at::Tensor& prefix_lens, const at::Tensor& extend_lens,
                            int64_t num_heads, double scale, int64_t window) {
  TORCH_CHECK_VALUE(dense_bf16(q) && dense_bf16(k_buf) && dense_bf16(v_buf), "bf16 CPU tensors");
  TORCH_CHECK_VALUE(q.dim() == 2 && q.stride(1) == 1, "q must be [T, H * d] with dense rows");
  TORCH_CHECK_VALUE(k_buf.dim() == 3 && k_buf.is_contiguous() && v_buf.is_contiguous() &&
                        v_buf.sizes() == k_buf.sizes(),
                    "k/v buffers must be dense [slots, kv_heads, d]");
  TORCH_CHECK_VALUE(req_to_token.scalar_type() == at::kInt && req_to_token.dim() == 2 &&
                        req_to_token.stride(1) == 1,
                    "req_to_token must be int32 [rows, L]");
  for (const auto* t : {&req_pool_indices, &prefix_lens, &extend_lens}) {
    TORCH_CHECK_VALUE(t->scalar_type() == at::kLong && t->dim() == 1 && t->is_contiguous() &&
                          t->device().is_cpu(),
                      "per-request tensors must be int64 CPU vectors");
  }
  const int64_t bs = req_pool_indices.size(0);
  TORCH_CHECK_VALUE(prefix_lens.size(0) == bs && extend_lens.size(0) == bs, "per-request sizes");
  const int64_t kvh = k_buf.size(1), d = k_buf.size(2), T = q.size(0);
  TORCH_CHECK_VALUE(d % 16 == 0 && d <= kMaxDim, "head_dim must be a multiple of 16, at most 256");
  TORCH_CHECK_VALUE(num_heads % kvh == 0 && q.size(1) == num_heads * d, "q heads vs kv heads");

  Problem p{};
  p.q = static_cast<const uint16_t*>(q.data_ptr());
  p.q_stride = q.stride(0);
  p.k = static_cast<const uint16_t*>(k_buf.data_ptr());
  p.v = static_cast<const uint16_t*>(v_buf.data_ptr());
  p.kv_stride = kvh * d;
  p.req_to_token = req_to_token.data_ptr<int32_t>();
  p.r2t_stride = req_to_token.stride(0);
  p.H = num_heads;
  p.kvh = kvh;
  p.g = num_heads / kvh;
  p.d = d;
  p.scale = static_cast<float>(scale);
  p.window = window;
  const int64_t* rows = req_pool_indices.data_ptr<int64_t>();
  const int64_t* pre = prefix_lens.data_ptr<int64_t>();
  const int64_t* ext = extend_lens.data_ptr<int64_t>();
  int64_t total_tokens = 0, total_pad = 0;
  std::vector<Task> tasks;
  const int64_t tokens_per_task = std::max<int64_t>(1, kRows / p.g);
  for (int64_t b = 0; b < bs; ++b) {
    const int64_t seq = pre[b] + ext[b];
    TORCH_CHECK_VALUE(pre[b] >= 0 && ext[b] >= 0 && rows[b] >= 0 &&
                          rows[b] < req_to_token.size(0) && seq <= req_to_token.size(1),
                      "request ", b, " does not fit req_to_token");
    p.row.push_back(rows[b]);
    p.prefix.push_back(pre[b]);
    p.seq.push_back(seq);
    p.q_start.push_back(total_tokens);
    p.pack_off.push_back(total_pad);
    total_tokens += ext[b];
    total_pad += (seq + kBk - 1) / kBk * kBk;
    for (int64_t h = 0; h < kvh; ++h) {
      for (int64_t t0 = 0; t0 < ext[b]; t0 += tokens_per_task) {
        const int64_t t1 = std::min(ext[b], t0 + tokens_per_task);
        const int64_t keys = window > 0 ? std::min(window, pre[b] + t1) : pre[b] + t1;
        tasks.push_back({b, h, t0, t1, (t1 - t0) * keys});
      }
    }
  }
  TORCH_CHECK_VALUE(total_tokens == T, "sum(extend_lens) must equal q.size(0)");
  at::Tensor out = at::empty({T, num_heads * d}, q.options());
  if (T == 0) return out;
  at::Tensor packed = at::zeros({2, total_pad * kvh * d}, k_buf.options());
  p.kp = static_cast<uint16_t*>(packed.data_ptr());
  p.vp = p.kp + total_pad * kvh * d;
  p.out = static_cast<uint16_t*>(out.data_ptr());
  for (int64_t b = 0; b < bs; ++b) {  // slots are read before any thread starts
    const int32_t* slots = p.req_to_token + p.row[b] * p.r2t_stride;
    for (int64_t j = 0; j < p.seq[b]; ++j) {
      TORCH_CHECK_VALUE(slots[j] >= 0 && slots[j] < k_buf.size(0), "KV slot out of range");
    }
  }
  run_dynamic(
      bs * kvh, [] { return 0; }, [&](int, int64_t i) { pack(p, i / kvh, i % kvh); });
  std::sort(tasks.begin(), tasks.end(),
            [](const Task& a, const Task& b) { return a.cost > b.cost; });
  const int64_t max_rows = (tokens_per_task * p.g + kTile - 1) / kTile * kTile;
  const std::vector<uint16_t> zero_row(d, 0);
  const auto make_scratch = [&] {
    Scratch s;
    s.o.resize(max_rows * d);
    s.m.resize(max_rows);
    s.l.resize(max_rows);
    s.pos.resize(max_rows);
    s.qrow.resize(max_rows);
    return s;
  };
  run_dynamic(static_cast<int64_t>(tasks.size()), make_scratch,
              [&](Scratch& s, int64_t i) { run_task(p, tasks[i], s, zero_row.data()); });
  return out;
}
