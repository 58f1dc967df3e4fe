// Paged causal attention for fp32 or bf16 EXTEND batches, flash-attention style, one source
// for every ISA (simd.h):
//
//   out[t, h, :] = softmax(scale * q[t, h] . K_b^T, causal, window) V_b   (t: a token of request b)
//
// K_b/V_b are read straight from the KV buffers [slots, kv_heads, d] through the request's
// req_to_token row, so no padded copy of the sequence is made. Tasks of (request, KV head,
// block of tokens) run over torch's intra-op threads; a task's rows are its tokens times the
// query heads of that KV head (GQA folded in, so each K/V block is widened once for all of
// them). Per 64-key block the task widens K (transposed: [d][64]) and V ([64][d]) to fp32, and
// per 4-row tile computes S = Q K^T in registers, the online softmax in fp32 (masking only
// blocks that cross the diagonal or the window) and O += P V in fp32. Storage may be bf16
// (widened in registers, so CPUs without bf16 arithmetic run it at fp32 speed); the math is
// fp32 throughout and the output is rounded once. Where the build has VDPBF16PS (avx512_bf16,
// and amx below its tiles' threshold), bf16 blocks stay in pairs instead: K as [d / 2][64]
// 32-bit words (a transpose of words), V as [32][d] words of two keys' values, and both
// products run on VDPBF16PS, Q K^T on the exact products summed in fp32, P V with P rounded
// to bf16 first as the AMX path does (each p within 2^-9 of itself): half the instructions.
// Zen 4, 2 threads, Qwen3-1.7B's heads, 8 requests extending by 64 tokens, one layer: 46.6 ->
// 27.4 ms after 1,024 cached tokens, 192 -> 113 ms after 4,096. In the amx variant, bf16
// batches whose requests extend by at least 16 query rows (prefill, not decode) run
// attention_amx.cpp instead:
// Q K^T and P V on bf16 tiles with fp32 sums, P rounded to bf16 (2.2-2.6x faster on a 512-token
// prefill and a 128-token extend of a 512-token prefix, 0.5B shape, 2 threads).
//
// Decode tasks (one token, at most kDecodeRows query heads per KV head) take attention_decode.h's
// path instead: K and V read in place, several KV heads per task.
//
// attention_kernel.cpp is its torch entry (extend_attention); nothing here needs torch but
// ATen/Parallel.h (tests/models/kernel_check/ builds it with a stand-in of that header, per ISA).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <tuple>
#include <vector>

#include "attention_decode.h"
#include "attention_task.h"
#include "simd.h"

namespace rs::attn {

constexpr int kTile = 4;          // query rows per register tile
constexpr int64_t kRows = 64;     // target query rows per task

struct Scratch {
  std::vector<float> q, o;   // [rows][d]: widened queries, output accumulators
  std::vector<float> m, l;   // [rows]: running max and sum
  std::vector<int64_t> pos;  // [rows]: -1 for padding rows
  std::vector<float> kt;     // [d][kBk]: the K block, transposed
  std::vector<float> vb;     // [kBk][d]: the V block
  std::vector<float> s;      // [max(kTile, rows)][kBk]: scores, then probabilities
  // bf16 storage with VDPBF16PS (pairs<T>): Q, K, V and P as bf16 pairs instead of q, kt, vb,
  // so both products take half the instructions of fp32 FMAs
  std::vector<uint32_t> qp;  // [rows][d / 2]: each query's (2c, 2c + 1) pairs
  std::vector<uint32_t> kp;  // [d / 2][kBk]: the K block's pairs, transposed
  std::vector<uint32_t> vp;  // [kBk / 2][d]: the V block's pairs of keys (2j, 2j + 1)
  std::vector<uint32_t> pp;  // [kTile][kBk / 2]: a tile's probabilities, rounded to bf16 pairs
};

// Whether an extend of T storage runs Q K^T and P V on bf16 pairs (VDPBF16PS) in this build.
template <class T>
constexpr bool pairs() {
#if defined(RS_HAS_DPBF16)
  return std::is_same_v<T, bf16>;
#else
  return false;
#endif
}

// Widen keys [j0, j0 + nk) of (b, h) into kt/vb (with pairs<T>: into kp/vp as they are); the
// rest of the block stays zero.
template <class T>
void widen_block(const Problem<T>& p, const int32_t* slots, int64_t h, int64_t j0, int64_t nk,
                 Scratch& s) {
  const int64_t d = p.d;
  const auto row = [&](const T* buf, int64_t j) {  // key j0 + j's row of head h in buf
    return buf + static_cast<int64_t>(slots[j0 + j]) * p.kv_stride + h * d;
  };
#if defined(RS_HAS_DPBF16)
  if constexpr (pairs<T>()) {
    std::fill(s.kp.begin(), s.kp.end(), 0u);
    for (int64_t j = 0; j < nk; ++j) {
      const T* kr = row(p.k, j);
      for (int64_t c2 = 0; c2 < d / 2; ++c2) std::memcpy(&s.kp[c2 * kBk + j], kr + 2 * c2, 4);
    }
    // V's rows 2j and 2j + 1 interleaved, 32 columns at a time: word c of pair j is
    // (V[2j][c], V[2j + 1][c]); past nk, zero
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                        40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                        32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int64_t j2 = 0; j2 < kBk / 2; ++j2) {
      uint32_t* out = &s.vp[j2 * d];
      const int64_t j = 2 * j2;
      if (j >= nk) {
        std::fill(out, out + d, 0u);
        continue;
      }
      const T* v0 = row(p.v, j);
      const T* v1 = j + 1 < nk ? row(p.v, j + 1) : nullptr;
      for (int64_t c = 0; c < d; c += 2 * W) {  // d is a multiple of W: a tail of W columns
        const bool whole = c + 2 * W <= d;
        const __mmask32 m = whole ? ~__mmask32{0} : __mmask32{0xFFFF};
        const __m512i a = _mm512_maskz_loadu_epi16(m, v0 + c);
        const __m512i b = v1 ? _mm512_maskz_loadu_epi16(m, v1 + c) : _mm512_setzero_si512();
        _mm512_storeu_si512(out + c, _mm512_permutex2var_epi16(a, lo, b));
        if (whole) _mm512_storeu_si512(out + c + W, _mm512_permutex2var_epi16(a, hi, b));
      }
    }
    return;
  }
#endif
  std::fill(s.kt.begin(), s.kt.end(), 0.0f);
  std::fill(s.vb.begin() + nk * d, s.vb.end(), 0.0f);
  for (int64_t j = 0; j < nk; ++j) {
    const T* kr = row(p.k, j);
    const T* vr = row(p.v, j);
    for (int64_t c = 0; c < d; ++c) s.kt[c * kBk + j] = to_float(kr[c]);
    for (int64_t c = 0; c < d; c += W) store(&s.vb[j * d + c], load(vr + c));
  }
}

// How the two products read their operands: fp32 values (the widened block), or bf16 pairs
// held as 32-bit words (VDPBF16PS); each the broadcast operand times a loaded vector, added.
struct FloatOps {
  using E = float;
  using V = VF;
  static V load_v(const float* p) { return load(p); }
  static V bcast(float x) { return set1(x); }
  static VF madd(V a, V b, VF acc) { return fma(a, b, acc); }
};

#if defined(RS_HAS_DPBF16)
// Pairs: one VDPBF16PS per two dimensions (Q K^T: exact products summed in fp32, only the
// order of the adds differs from FloatOps) or two keys (P V: P rounded to bf16 first, as the
// AMX path does).
struct PairOps {
  using E = uint32_t;
  using V = VB;
  static V load_v(const uint32_t* p) { return _mm512_loadu_si512(p); }
  static V bcast(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
  static VF madd(V a, V b, VF acc) { return dot_pairs(a, b, acc); }
};
#endif

// O rows [r0, r0 + 4) += P V for dims [c0, c0 + NV * W): v as [n][d] (n keys, or pairs of
// keys), p the tile's rows with stride ps.
template <class O, int NV>
inline void pv_chunk(int64_t d, int64_t n, const typename O::E* v, const typename O::E* p,
                     int64_t ps, Scratch& s, int64_t r0, int64_t c0) {
  VF acc[kTile][NV];
  for (int r = 0; r < kTile; ++r)
    for (int c = 0; c < NV; ++c) acc[r][c] = load(&s.o[(r0 + r) * d + c0 + W * c]);
  for (int64_t j = 0; j < n; ++j) {
    typename O::V vv[NV];
    for (int c = 0; c < NV; ++c) vv[c] = O::load_v(&v[j * d + c0 + W * c]);
    for (int r = 0; r < kTile; ++r) {
      const auto pr = O::bcast(p[r * ps + j]);
      for (int c = 0; c < NV; ++c) acc[r][c] = O::madd(pr, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < kTile; ++r)
    for (int c = 0; c < NV; ++c) store(&s.o[(r0 + r) * d + c0 + W * c], acc[r][c]);
}

// The scores of rows [r0, r0 + 4) against the block, scaled, into s.s: k as [n][kBk] (the
// block transposed: n dimensions, or pairs of them), q as [rows][n].
template <class O>
inline void scores(int64_t n, float scale, const typename O::E* k, const typename O::E* q,
                   Scratch& s, int64_t r0) {
  for (int64_t kc = 0; kc < kBk; kc += 2 * W) {
    VF acc[kTile][2];
    for (int r = 0; r < kTile; ++r) acc[r][0] = acc[r][1] = zero();
    for (int64_t c = 0; c < n; ++c) {
      const auto k0 = O::load_v(&k[c * kBk + kc]), k1 = O::load_v(&k[c * kBk + kc + W]);
      for (int r = 0; r < kTile; ++r) {
        const auto qr = O::bcast(q[(r0 + r) * n + c]);
        acc[r][0] = O::madd(qr, k0, acc[r][0]);
        acc[r][1] = O::madd(qr, k1, acc[r][1]);
      }
    }
    const VF sc = set1(scale);
    for (int r = 0; r < kTile; ++r) {
      store(&s.s[r * kBk + kc], mul(acc[r][0], sc));
      store(&s.s[r * kBk + kc + W], mul(acc[r][1], sc));
    }
  }
}

#if defined(RS_HAS_DPBF16)
// The tile's probabilities (s.s) as bf16 pairs (s.pp).
inline void round_probabilities(Scratch& s) {
  for (int r = 0; r < kTile; ++r) {
    for (int64_t j = 0; j < kBk; j += 2 * W) {
      const __m512bh b = _mm512_cvtne2ps_pbh(load(&s.s[r * kBk + j + W]), load(&s.s[r * kBk + j]));
      _mm512_storeu_si512(&s.pp[r * (kBk / 2) + j / 2], (__m512i)b);
    }
  }
}
#endif

// One 4-row tile against one widened block at key j0: scores, online softmax, P V.
template <class T>
inline void tile_block(int64_t d, float scale, int64_t window, int64_t j0, int64_t nk,
                       Scratch& s, int64_t r0) {
#if defined(RS_HAS_DPBF16)
  if constexpr (pairs<T>()) {
    scores<PairOps>(d / 2, scale, s.kp.data(), s.qp.data(), s, r0);
  } else {
    scores<FloatOps>(d, scale, s.kt.data(), s.q.data(), s, r0);
  }
#else
  scores<FloatOps>(d, scale, s.kt.data(), s.q.data(), s, r0);
#endif
  for (int r = 0; r < kTile; ++r) {
    const int64_t row = r0 + r, pos = s.pos[row];
    float* sr = &s.s[r * kBk];
    if (pos < 0) {
      std::fill(sr, sr + kBk, 0.0f);
      continue;
    }
    const auto keep = [sr](int64_t j, VF e) { store(sr + j, e); };
    if (!softmax_step(sr, kBk, j0, pos, window, s.m[row], s.l[row], &s.o[row * d], d, keep)) {
      std::fill(sr, sr + kBk, 0.0f);
    }
  }
  // P V over all d dimensions, 2W at a time (a tail of W)
  const auto pv = [&](auto ops, int64_t n, const auto* v, const auto* p, int64_t ps) {
    using O = decltype(ops);
    int64_t c0 = 0;
    for (; c0 + 2 * W <= d; c0 += 2 * W) pv_chunk<O, 2>(d, n, v, p, ps, s, r0, c0);
    if (c0 < d) pv_chunk<O, 1>(d, n, v, p, ps, s, r0, c0);
  };
#if defined(RS_HAS_DPBF16)
  if constexpr (pairs<T>()) {
    round_probabilities(s);
    return pv(PairOps{}, (nk + 1) / 2, s.vp.data(), s.pp.data(), kBk / 2);
  }
#endif
  pv(FloatOps{}, nk, s.vb.data(), s.s.data(), kBk);
}

template <class T>
void run_task(const Problem<T>& p, const Task& t, Scratch& s) {
  const int64_t d = p.d;
  const int64_t rows = (t.t1 - t.t0) * p.g, padded = (rows + kTile - 1) / kTile * kTile;
  const auto widen_q = [&](int64_t r, const T* qs) {
    if constexpr (pairs<T>()) {
      uint32_t* qw = &s.qp[r * (d / 2)];
      if (qs == nullptr) {
        std::fill(qw, qw + d / 2, 0u);
      } else {
        std::memcpy(qw, qs, d * sizeof(T));
      }
      return;
    }
    float* qd = &s.q[r * d];
    if (qs == nullptr) {
      std::fill(qd, qd + d, 0.0f);
      return;
    }
    for (int64_t c = 0; c < d; c += W) store(qd + c, load(qs + c));
  };
  const auto [pmin, pmax] =
      init_rows(p, t, padded, s.pos.data(), s.m.data(), s.l.data(), widen_q);
  std::fill(s.o.begin(), s.o.begin() + padded * d, 0.0f);
  const int32_t* slots = p.req_to_token + p.row[t.b] * p.r2t_stride;
  const int64_t first = p.window > 0 ? std::max<int64_t>(0, pmin - p.window + 1) / kBk * kBk : 0;
  for (int64_t j0 = first; j0 <= pmax; j0 += kBk) {
    widen_block(p, slots, t.h, j0, std::min(kBk, p.seq[t.b] - j0), s);
    for (int64_t r0 = 0; r0 < padded; r0 += kTile) {
      if (!rows_see_block(&s.pos[r0], kTile, j0, kBk, p.window)) continue;
      tile_block<T>(d, p.scale, p.window, j0, std::min(kBk, p.seq[t.b] - j0), s, r0);
    }
  }
  store_rows(p, t, s.o.data(), s.l.data());
}

// Fewest keys per part of a decode request's keys split over tasks (plan_tasks).
constexpr int64_t kSplitKeys = 256;

// The tasks of p's requests (their fields in p filled), costliest first: per request and KV
// head, blocks of at most tokens_per_task tokens. With group_decode, a decode request's tasks
// (one token, g <= kDecodeRows) take several KV heads each and, in a batch of too few requests
// to keep the threads busy, part of the keys each: the batch's requests split into `want` tasks
// where their keys allow, then their heads (decode_heads). Split tasks get disjoint places for
// their partial results (Task::part: offsets in floats into run_tasks' buffer, from 0).
template <class T>
std::vector<Task> plan_tasks(const Problem<T>& p, int64_t tokens_per_task, bool group_decode) {
  const int64_t bs = static_cast<int64_t>(p.seq.size()), threads = at::get_num_threads();
  const bool decode_path = group_decode && p.g <= kDecodeRows;
  int64_t n_decode = 0;
  for (int64_t b = 0; b < bs && decode_path; ++b) n_decode += p.seq[b] - p.prefix[b] == 1;
  const int64_t want = threads * 4, per_request = std::max<int64_t>(1, n_decode);
  const int64_t split = std::max<int64_t>(1, (want + per_request - 1) / per_request);
  std::vector<Task> tasks;
  int64_t next_part = 0;
  for (int64_t b = 0; b < bs; ++b) {
    const int64_t pre = p.prefix[b], ext = p.seq[b] - pre;
    if (decode_path && ext == 1) {
      const int64_t keys = p.window > 0 ? std::min(p.window, pre + 1) : pre + 1;
      const int64_t parts = std::clamp<int64_t>(keys / kSplitKeys, 1, split);
      const int64_t nh = decode_heads(p.kvh, n_decode * parts, threads, 4);
      const int64_t per = (keys + parts - 1) / parts;
      for (int64_t h = 0; h < p.kvh; h += nh) {
        for (int64_t k0 = 0; k0 < keys; k0 += per) {
          const int64_t k1 = std::min(keys, k0 + per), part = parts > 1 ? next_part : -1;
          if (parts > 1) next_part += nh * p.g * (p.d + 2);
          tasks.push_back({b, h, 0, 1, (k1 - k0) * nh, nh, k0, parts > 1 ? k1 : -1, part});
        }
      }
      continue;
    }
    for (int64_t h = 0; h < p.kvh; ++h) {
      for (int64_t t0 = 0; t0 < ext; t0 += tokens_per_task) {
        const int64_t t1 = std::min(ext, t0 + tokens_per_task);
        const int64_t keys = p.window > 0 ? std::min(p.window, pre + t1) : pre + t1;
        tasks.push_back({b, h, t0, t1, (t1 - t0) * keys});
      }
    }
  }
  std::sort(tasks.begin(), tasks.end(),
            [](const Task& a, const Task& b) { return a.cost > b.cost; });
  return tasks;
}

// The most query rows of a task of tokens_per_task tokens, padded to whole register tiles, or
// of a decode task of all H = kvh * g query heads.
inline int64_t max_task_rows(int64_t tokens_per_task, int64_t g, int64_t kvh = 1) {
  return std::max((tokens_per_task * g + kTile - 1) / kTile * kTile, kvh * g);
}

// The tasks over torch's threads on the vector path, each worker with scratch for max_rows.
template <class T>
void run_tasks(const Problem<T>& p, const std::vector<Task>& tasks, int64_t max_rows) {
  const int64_t d = p.d;
  const auto make_scratch = [&] {
    Scratch s;
    s.q.resize(max_rows * d);
    s.o.resize(max_rows * d);
    s.m.resize(max_rows);
    s.l.resize(max_rows);
    s.pos.resize(max_rows);
    if constexpr (pairs<T>()) {
      s.qp.resize(max_rows * d / 2);
      s.kp.resize(d / 2 * kBk);
      s.vp.resize(kBk / 2 * d);
      s.pp.resize(kTile * kBk / 2);
    } else {
      s.kt.resize(d * kBk);
      s.vb.resize(kBk * d);
    }
    s.s.resize(std::max<int64_t>(kTile, max_rows) * kBk);
    return s;
  };
  // decode tasks over parts of their keys: (request, head, task) and the partial results' space
  std::vector<std::tuple<int64_t, int64_t, int64_t>> split;
  int64_t part_floats = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(tasks.size()); ++i) {
    const Task& t = tasks[i];
    if (t.part < 0) continue;
    split.emplace_back(t.b, t.h, i);
    part_floats = std::max(part_floats, t.part + t.nh * p.g * (d + 2));
  }
  std::vector<float> parts(static_cast<size_t>(part_floats));
  run_dynamic(static_cast<int64_t>(tasks.size()), make_scratch,
              [&](Scratch& s, int64_t i) {
                const Task& t = tasks[i];
                if (t.t1 - t.t0 == 1 && p.g <= kDecodeRows) {  // attention_decode.h
                  return run_decode_task(p, t, s.q.data(), s.o.data(), s.m.data(), s.l.data(),
                                         s.s.data(), parts.data());
                }
                run_task(p, t, s);
              });
  std::sort(split.begin(), split.end());
  std::vector<int64_t> at;
  std::vector<float> merged(split.empty() ? 0 : static_cast<size_t>(max_rows * (d + 1)));
  for (size_t i = 0; i < split.size();) {  // each (request, head) group: merged
    at.clear();
    size_t j = i;
    for (; j < split.size() && std::get<0>(split[j]) == std::get<0>(split[i]) &&
           std::get<1>(split[j]) == std::get<1>(split[i]);
         ++j) {
      at.push_back(tasks[std::get<2>(split[j])].part);
    }
    merge_parts(p, tasks[std::get<2>(split[i])], at.data(), static_cast<int64_t>(at.size()),
                parts.data(), merged.data(), merged.data() + max_rows * d);
    i = j;
  }
}

}  // namespace rs::attn
