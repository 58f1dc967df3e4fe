// What the paged attention kernel (attention_kernel.cpp) and its AMX tasks (attention_amx.cpp)
// share: one batch's operands, a task (request, KV head, block of query tokens), and the
// dynamic task loop over torch's threads.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <vector>

#include "simd.h"

namespace rs::attn {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

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

// The tasks of a bf16 batch on AMX tiles (attention_amx.cpp; the amx variant only, where
// amx_available(): elsewhere it is never called). max_rows: the most query rows of a task.
void run_amx_tasks(const Problem<bf16>& p, const std::vector<Task>& tasks, int64_t max_rows);

}  // namespace rs::attn
