// Decode-shaped tasks of the paged attention kernel (attention_kernel.h): one query token of one
// request against nh KV heads [t.h, t.h + nh), each with its g query heads (g at most
// kDecodeRows). All rows sit at one position and see the same keys, so each K and V row is read
// once, straight from the KV buffer through the request's slots, and widened in registers: no
// block copy, no transpose, no padding rows (the extend path widens and transposes each 64-key
// block into scratch and computes 4-row tiles, which decode's 1-2 rows per KV head leave mostly
// empty). Keys are visited in order with all nh heads of each: a slot's rows of those heads lie
// side by side in the KV buffer ([slots, kv_heads, d]), so the task streams them, where one head
// alone reads d values every kv_heads * d. Zen 4, 2 threads, bf16, 28 layers of 8 requests x 512
// tokens x 8 KV heads of 128 (Qwen3-1.7B), cache-cold, GB/s of KV read: the extend path 5.7;
// this path with one head per task 12.5, with all 8 heads 18.1, and with VDPBF16PS scores 19.0
// (21.8 at 32 requests), with K prefetched into L2 24.5 (decode_scores). A batch too small to
// keep the threads busy splits each request's keys over tasks, at least kSplitKeys each, whose
// results merge_parts combines (one request of 4096 tokens: 12.9 -> 20.7 GB/s; two of 1024: 12.6
// -> 19.6), and then its heads (decode_heads).
// Scores are dot products per key, the softmax the extend path's online one per block of kBk
// keys, P V g rows at a time.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention_task.h"
#include "simd.h"

namespace rs::attn {

constexpr int64_t kDecodeRows = 8;  // the most query heads per KV head this path takes
constexpr int64_t kAheadBytes = 8192;  // how far ahead K is prefetched (2 keys at least)

// acc[i][r] += q_r . k_i over d: G rows of q (qf: [G][d] fp32; qb: the same rows as stored) and
// NJ keys. bf16 rows with AVX512-BF16 multiply as raw pairs (VDPBF16PS: exact products, half
// the instructions and no widening), others widened to fp32.
template <int G, int NJ, class T>
inline void dot_rows(const float* qf, const T* qb, const T* const* k, int64_t d, VF (&acc)[NJ][G]) {
#if defined(RS_HAS_DPBF16)
  if constexpr (std::is_same_v<T, bf16>) {
    for (int64_t c = 0; c < d; c += 2 * W) {
      const int64_t rem = d - c;
      const auto pairs = [rem](const bf16* at) {
        return rem >= 2 * W ? load_pairs(at) : load_pairs_tail(at, rem);
      };
      VB kv[NJ];
      for (int i = 0; i < NJ; ++i) kv[i] = pairs(k[i] + c);
      for (int r = 0; r < G; ++r) {
        const VB qv = pairs(qb + r * d + c);
        for (int i = 0; i < NJ; ++i) acc[i][r] = dot_pairs(qv, kv[i], acc[i][r]);
      }
    }
    return;
  }
#endif
  for (int64_t c = 0; c < d; c += W) {
    VF kv[NJ];
    for (int i = 0; i < NJ; ++i) kv[i] = load(k[i] + c);
    for (int r = 0; r < G; ++r) {
      const VF qv = load(qf + r * d + c);
      for (int i = 0; i < NJ; ++i) acc[i][r] = fma(qv, kv[i], acc[i][r]);
    }
  }
}

// sr[(hh * G + r) * ld + j] = scale * q_{hh,r} . k_{hh, j0 + j} for j < n and heads hh < nh from
// h0: G rows of q per head (qf: dense [nh * G][d] fp32; qb: as stored, rows d apart) against the
// keys at slots[j0 ..], of which the request has `avail` from j0. J keys at a time: G * J
// independent sums. Each key prefetches its V rows, which decode_pv reads after the block, and
// the K rows of the key kAheadBytes further on, both into L2 (L1 would evict them before their
// turn: V is read up to a block of keys later). Without the K prefetch the dot products wait on
// each K row's miss, and the loop alternates between computing and waiting (cache-cold KV of 28
// layers, 2 threads, Zen 4, GB/s of KV, V into L1 and K prefetched by one-head tasks only ->
// this: avx512_bf16 8 requests x 600 tokens 19.3 -> 24.5, one of 4096 19.9 -> 23.6, one of 400
// 13.3 -> 19.1; the avx512 build 15.1 -> 21.9, 8.6 -> 15.9, 10.3 -> 14.6; avx2 15.9 -> 21.8,
// 13.4 -> 18.6, 11.4 -> 15.3).
template <int G, class T>
inline void decode_scores(const Problem<T>& p, const int32_t* slots, int64_t h0, int64_t nh,
                          int64_t j0, int64_t n, int64_t avail, const float* qf, const T* qb,
                          float* sr, int64_t ld) {
  constexpr int J = 2 * G + 3 <= kVectorRegisters ? 2 : 1;
  const int64_t d = p.d, span = nh * d * static_cast<int64_t>(sizeof(T));
  const int64_t ahead_keys = std::max<int64_t>(2, kAheadBytes / span);
  int64_t j = 0;
  auto keys = [&](auto nj) {
    constexpr int NJ = decltype(nj)::value;
    int64_t base[NJ];
    for (int i = 0; i < NJ; ++i) {
      base[i] = static_cast<int64_t>(slots[j0 + j + i]) * p.kv_stride + h0 * d;
      const auto* vn = reinterpret_cast<const char*>(p.v + base[i]);
      for (int64_t b = 0; b < span; b += 64) prefetch_l2(vn + b);
      const int64_t ahead = std::min(j + i + ahead_keys, avail - 1);
      const auto* kn = reinterpret_cast<const char*>(
          p.k + static_cast<int64_t>(slots[j0 + ahead]) * p.kv_stride + h0 * d);
      for (int64_t b = 0; b < span; b += 64) prefetch_l2(kn + b);
    }
    for (int64_t hh = 0; hh < nh; ++hh) {
      const T* kr[NJ];
      for (int i = 0; i < NJ; ++i) kr[i] = p.k + base[i] + hh * d;
      VF acc[NJ][G];
      for (int i = 0; i < NJ; ++i)
        for (int r = 0; r < G; ++r) acc[i][r] = zero();
      dot_rows<G, NJ>(qf + hh * G * d, qb + hh * G * d, kr, d, acc);
      for (int i = 0; i < NJ; ++i)
        for (int r = 0; r < G; ++r) sr[(hh * G + r) * ld + j + i] = hsum(acc[i][r]) * p.scale;
    }
  };
  for (; j + J <= n; j += J) keys(std::integral_constant<int, J>{});
  for (; j < n; ++j) keys(std::integral_constant<int, 1>{});
}

// o[r] (dense [G][d]) += sum_j pr[r * ld + j] v_{h, j0 + j} over j < n, NV vectors of d at a time.
template <int G, class T>
inline void decode_pv(const Problem<T>& p, const int32_t* slots, int64_t h, int64_t j0, int64_t n,
                      const float* pr, int64_t ld, float* o) {
  constexpr int NV = G * 2 + 3 <= kVectorRegisters ? 2 : 1;
  const int64_t d = p.d;
  const T* vh = p.v + h * d;
  auto chunk = [&](int64_t c0, auto nv) {
    constexpr int V = decltype(nv)::value;
    VF acc[G][V];
    for (int r = 0; r < G; ++r)
      for (int c = 0; c < V; ++c) acc[r][c] = load(o + r * d + c0 + c * W);
    for (int64_t j = 0; j < n; ++j) {
      const T* vr = vh + static_cast<int64_t>(slots[j0 + j]) * p.kv_stride + c0;
      VF vv[V];
      for (int c = 0; c < V; ++c) vv[c] = load(vr + c * W);
      for (int r = 0; r < G; ++r) {
        const VF pj = set1(pr[r * ld + j]);
        for (int c = 0; c < V; ++c) acc[r][c] = fma(pj, vv[c], acc[r][c]);
      }
    }
    for (int r = 0; r < G; ++r)
      for (int c = 0; c < V; ++c) store(o + r * d + c0 + c * W, acc[r][c]);
  };
  int64_t c0 = 0;
  for (; c0 + NV * W <= d; c0 += NV * W) chunk(c0, std::integral_constant<int, NV>{});
  for (; c0 < d; c0 += W) chunk(c0, std::integral_constant<int, 1>{});
}

// Task t (one token: t.t1 == t.t0 + 1; heads [t.h, t.h + t.nh)) with G = p.g: R = t.nh * G
// query rows, consecutive in q and out. q, o: [R][d] scratch; m, l: [R]; s: [R][kBk] scratch for
// scores, then probabilities. A task of part of the keys (t.part >= 0) leaves each row's m, l
// and unnormalised o, d + 2 floats, in parts + t.part for merge_parts.
template <int G, class T>
void decode_task(const Problem<T>& p, const Task& t, float* q, float* o, float* m, float* l,
                 float* s, float* parts) {
  const int64_t d = p.d, pos = p.prefix[t.b] + t.t0, rows = t.nh * G;
  const T* qt = p.q + (p.q_start[t.b] + t.t0) * p.q_stride + t.h * G * d;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < d; c += W) {
      store(q + r * d + c, load(qt + r * d + c));
      store(o + r * d + c, zero());
    }
    m[r] = kNegInf;
    l[r] = 0.0f;
  }
  const int32_t* slots = p.req_to_token + p.row[t.b] * p.r2t_stride;
  const int64_t first = (p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0) + t.k0;
  const int64_t last = t.k1 < 0 ? pos : std::min(pos, first - t.k0 + t.k1 - 1);
  for (int64_t j0 = first; j0 <= last; j0 += kBk) {
    const int64_t n = std::min(kBk, last + 1 - j0), padded = (n + W - 1) / W * W;
    decode_scores<G>(p, slots, t.h, t.nh, j0, n, last + 1 - j0, q, qt, s, kBk);
    for (int64_t r = 0; r < rows; ++r) {
      float* sr = s + r * kBk;
      std::fill(sr + n, sr + padded, kNegInf);  // padding: past the task's keys
      const auto keep = [sr](int64_t j, VF e) { store(sr + j, e); };
      if (!softmax_step(sr, padded, j0, pos, p.window, m[r], l[r], o + r * d, d, keep)) {
        std::fill(sr, sr + padded, 0.0f);
      }
    }
    for (int64_t hh = 0; hh < t.nh; ++hh) {
      decode_pv<G>(p, slots, t.h + hh, j0, n, s + hh * G * kBk, kBk, o + hh * G * d);
    }
  }
  if (t.part >= 0) {
    float* out = parts + t.part;
    for (int64_t r = 0; r < rows; ++r, out += d + 2) {
      out[0] = m[r];
      out[1] = l[r];
      std::copy(o + r * d, o + (r + 1) * d, out + 2);
    }
    return;
  }
  store_rows(p, t, o, l);
}

// decode_task with G = p.g <= kDecodeRows (the caller checked).
template <class T>
void run_decode_task(const Problem<T>& p, const Task& t, float* q, float* o, float* m, float* l,
                     float* s, float* parts) {
  switch (p.g) {
    case 1: return decode_task<1>(p, t, q, o, m, l, s, parts);
    case 2: return decode_task<2>(p, t, q, o, m, l, s, parts);
    case 3: return decode_task<3>(p, t, q, o, m, l, s, parts);
    case 4: return decode_task<4>(p, t, q, o, m, l, s, parts);
    case 5: return decode_task<5>(p, t, q, o, m, l, s, parts);
    case 6: return decode_task<6>(p, t, q, o, m, l, s, parts);
    case 7: return decode_task<7>(p, t, q, o, m, l, s, parts);
    default: return decode_task<8>(p, t, q, o, m, l, s, parts);
  }
}

// The output rows of decode task t's request and heads from the n tasks over parts of its keys
// whose results start at parts + at[i] (decode_task's layout): merged into o [rows][d] and l
// [rows] (scratch), then stored as a whole task's are.
template <class T>
void merge_parts(const Problem<T>& p, const Task& t, const int64_t* at, int64_t n,
                 const float* parts, float* o, float* l) {
  const int64_t d = p.d, rows = t.nh * p.g;
  for (int64_t r = 0; r < rows; ++r) {
    float mx = kNegInf;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, parts[at[i] + r * (d + 2)]);
    float* orow = o + r * d;
    for (int64_t c = 0; c < d; c += W) store(orow + c, zero());
    l[r] = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      const float* part = parts + at[i] + r * (d + 2);
      const float scale = part[0] == kNegInf ? 0.0f : std::exp(part[0] - mx);
      l[r] += part[1] * scale;
      for (int64_t c = 0; c < d; c += W) {
        store(orow + c, fma(set1(scale), load(part + 2 + c), load(orow + c)));
      }
    }
  }
  store_rows(p, t, o, l);
}

// KV heads per decode task for n_decode decode requests: the fewest groups of kvh heads (a
// divisor) that give every thread `per_thread` tasks, so heads stay together where the batch
// alone keeps the threads busy.
inline int64_t decode_heads(int64_t kvh, int64_t n_decode, int64_t threads, int64_t per_thread) {
  for (int64_t groups = 1; groups < kvh; ++groups) {
    if (kvh % groups == 0 && n_decode * groups >= threads * per_thread) return kvh / groups;
  }
  return 1;
}

}  // namespace rs::attn
