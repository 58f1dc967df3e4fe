// What the paged attention kernel (attention_kernel.cpp) and its AMX tasks (attention_amx.cpp)
// share: one batch's operands, a task (request, KV head, block of query tokens), and the
// dynamic task loop over torch's threads.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "simd.h"

namespace rs::attn {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kBk = 64;  // keys per block (of the vector paths' online softmax)

template <class T>
struct Problem {
  const T* q;  // [T, H, d], token stride q_stride
  int64_t q_stride;
  const T* k;  // [slots, kv_heads, d], slot stride kv_stride
  const T* v;
  int64_t kv_stride;
  const int32_t* req_to_token;  // [rows, r2t_stride]
  int64_t r2t_stride;
  T* out;  // [T, H, d] dense
  int64_t H, kvh, g, d;
  float scale;
  int64_t window;  // <= 0: none
  // per request
  std::vector<int64_t> row, prefix, q_start, seq;
};

struct Task {
  int64_t b, h, t0, t1, cost;
  int64_t nh = 1;  // KV heads [h, h + nh): more than one only for decode (attention_decode.h)
  // decode only: the task's keys [k0, k1) of the visible ones (k1 < 0: all), and where a task
  // of part of the keys leaves its rows' m, l and o for merge_parts (-1: it writes out itself)
  int64_t k0 = 0, k1 = -1, part = -1;
};

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

// The query rows of task t, padded to `padded`: row r is query head t.h * g + r % g of token
// t.t0 + r / g. Sets pos[r] (-1 for padding), m[r] = -inf, l[r] = 0, and calls
// load_q(r, q_row) for real rows and load_q(r, nullptr) for padding (to zero its row); returns
// the lowest and highest position.
template <class T, class LoadQ>
inline std::pair<int64_t, int64_t> init_rows(const Problem<T>& p, const Task& t, int64_t padded,
                                              int64_t* pos, float* m, float* l, LoadQ&& load_q) {
  const int64_t g = p.g, d = p.d, rows = (t.t1 - t.t0) * g;
  int64_t pmin = std::numeric_limits<int64_t>::max(), pmax = -1;
  for (int64_t r = 0; r < padded; ++r) {
    if (r < rows) {
      const int64_t tok = t.t0 + r / g;  // token index within request
      pos[r] = p.prefix[t.b] + tok;
      load_q(r, p.q + (p.q_start[t.b] + tok) * p.q_stride + (t.h * g + r % g) * d);
      pmin = std::min(pmin, pos[r]);
      pmax = std::max(pmax, pos[r]);
    } else {
      pos[r] = -1;
      load_q(r, static_cast<const T*>(nullptr));
    }
    m[r] = kNegInf;
    l[r] = 0.0f;
  }
  return {pmin, pmax};
}

// Whether any of the n rows at pos (-1: padding) sees a key in [j0, j0 + block).
inline bool rows_see_block(const int64_t* pos, int64_t n, int64_t j0, int64_t block,
                           int64_t window) {
  int64_t tmin = std::numeric_limits<int64_t>::max(), tmax = -1;
  for (int64_t r = 0; r < n; ++r) {
    if (pos[r] < 0) continue;
    tmin = std::min(tmin, pos[r]);
    tmax = std::max(tmax, pos[r]);
  }
  if (tmax < j0) return false;  // nothing visible yet (also: all padding)
  return !(window > 0 && j0 + block - 1 <= tmin - window);  // all left of the window
}

// The output of task t: each real row's o [d] over its sum l, rounded once to T. Rows run over
// the task's tokens, then its query heads (the g of each of its nh KV heads, consecutive in out).
template <class T>
inline void store_rows(const Problem<T>& p, const Task& t, const float* o, const float* l) {
  const int64_t heads = p.g * t.nh, d = p.d, rows = (t.t1 - t.t0) * heads;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t tok = t.t0 + r / heads;
    T* dst = p.out + ((p.q_start[t.b] + tok) * p.H + t.h * p.g + r % heads) * d;
    const VF inv = set1(l[r] > 0.0f ? 1.0f / l[r] : 0.0f);
    for (int64_t c = 0; c < d; c += W) store(dst + c, mul(load(&o[r * d + c]), inv));
  }
}

// One query row's online-softmax step against n scaled scores sr (keys j0 ..; n a multiple of
// W): masks the keys the row at pos may not see (after it, or outside the window), and where
// its running max m grows, rescales its sum l and output o [d]. Then emit(j, e) takes each W
// lanes of e = exp(sr - m) (the probabilities before normalising), whose sum is added to l.
// Returns false, emitting nothing, when no key is visible.
template <class Emit>
inline bool softmax_step(float* sr, int64_t n, int64_t j0, int64_t pos, int64_t window,
                         float& m, float& l, float* o, int64_t d, Emit&& emit) {
  if (j0 + n - 1 > pos || (window > 0 && j0 <= pos - window)) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t key = j0 + j;
      if (key > pos || (window > 0 && key <= pos - window)) sr[j] = kNegInf;
    }
  }
  VF mx = set1(kNegInf);
  for (int64_t j = 0; j < n; j += W) mx = max(mx, load(sr + j));
  const float bmax = hmax(mx);
  if (bmax == kNegInf) return false;
  const float m_new = std::max(m, bmax);
  if (m != m_new) {
    const float alpha = std::exp(m - m_new);  // 0 when m is -inf
    l *= alpha;
    const VF a = set1(alpha);
    for (int64_t c = 0; c < d; c += W) store(o + c, mul(load(o + c), a));
    m = m_new;
  }
  const VF mv = set1(m_new);
  VF sum = zero();
  for (int64_t j = 0; j < n; j += W) {
    const VF e = exp_nonpos(sub(load(sr + j), mv));
    sum = add(sum, e);
    emit(j, e);
  }
  l += hsum(sum);
  return true;
}

// The tasks of a bf16 batch on AMX tiles (attention_amx.cpp; the amx variant only, where
// amx_available(): elsewhere it is never called). max_rows: the most query rows of a task.
void run_amx_tasks(const Problem<bf16>& p, const std::vector<Task>& tasks, int64_t max_rows);

}  // namespace rs::attn
