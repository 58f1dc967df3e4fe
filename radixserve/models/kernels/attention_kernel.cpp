// extend_attention: the paged causal attention of attention_kernel.h (in the amx variant, bf16
// prefills on attention_amx.cpp's tiles) on the tensors it takes; ValueError for any others.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "amx.h"
#include "attention_kernel.h"
#include "attention_task.h"
#include "simd.h"

namespace {

using namespace rs;
using namespace rs::attn;

constexpr int64_t kAmxRows = 256; // the same on AMX tiles: each packed block meets 16 row tiles
constexpr int64_t kMaxDim = 256;  // head_dim limit (multiple of 16)

bool dense_kv(const at::Tensor& t, at::ScalarType dtype) {
  return t.device().is_cpu() && t.scalar_type() == dtype && t.layout() == at::kStrided;
}

template <class T>
void run(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
         const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
         const at::Tensor& prefix_lens, const at::Tensor& extend_lens, const at::Tensor& out,
         int64_t num_heads, double scale, int64_t window) {
  const int64_t bs = req_pool_indices.size(0);
  const int64_t kvh = k_buf.size(1), d = k_buf.size(2), num_tokens = q.size(0);
  Problem<T> p{};
  p.q = static_cast<const T*>(q.data_ptr());
  p.q_stride = q.stride(0);
  p.k = static_cast<const T*>(k_buf.data_ptr());
  p.v = static_cast<const T*>(v_buf.data_ptr());
  p.kv_stride = kvh * d;
  p.req_to_token = req_to_token.data_ptr<int32_t>();
  p.r2t_stride = req_to_token.stride(0);
  p.out = static_cast<T*>(out.data_ptr());
  p.H = num_heads;
  p.kvh = kvh;
  p.g = num_heads / kvh;
  p.d = d;
  p.scale = static_cast<float>(scale);
  p.window = window;
  const int64_t* rows = req_pool_indices.data_ptr<int64_t>();
  const int64_t* pre = prefix_lens.data_ptr<int64_t>();
  const int64_t* ext = extend_lens.data_ptr<int64_t>();
  int64_t total_tokens = 0;
#if defined(RS_HAS_AMX)
  // AMX tiles for bf16 KV where the requests extend by enough tokens to fill 16-row tiles
  // (a decode step's g rows per request stay on the vector path, which is faster there)
  int64_t max_ext = 0;
  for (int64_t b = 0; b < bs; ++b) max_ext = std::max(max_ext, ext[b]);
  const bool amx = std::is_same_v<T, bf16> && d % 32 == 0 && max_ext * p.g >= kTileRows &&
                   amx_available();
#else
  constexpr bool amx = false;
#endif
  const int64_t tokens_per_task = std::max<int64_t>(1, (amx ? kAmxRows : kRows) / p.g);
  for (int64_t b = 0; b < bs; ++b) {
    const int64_t seq = pre[b] + ext[b];
    TORCH_CHECK_VALUE(pre[b] >= 0 && ext[b] >= 0 && rows[b] >= 0 &&
                          rows[b] < req_to_token.size(0) && seq <= req_to_token.size(1),
                      "request ", b, " does not fit req_to_token");
    p.row.push_back(rows[b]);
    p.prefix.push_back(pre[b]);
    p.seq.push_back(seq);
    p.q_start.push_back(total_tokens);
    total_tokens += ext[b];
  }
  TORCH_CHECK_VALUE(total_tokens == num_tokens, "sum(extend_lens) must equal q.size(0)");
  for (int64_t b = 0; b < bs; ++b) {  // slots are read before any thread starts
    const int32_t* slots = p.req_to_token + p.row[b] * p.r2t_stride;
    for (int64_t j = 0; j < p.seq[b]; ++j) {
      TORCH_CHECK_VALUE(slots[j] >= 0 && slots[j] < k_buf.size(0), "KV slot out of range");
    }
  }
  const std::vector<Task> tasks = plan_tasks(p, tokens_per_task, !amx);
  const int64_t max_rows = max_task_rows(tokens_per_task, p.g, amx ? 1 : kvh);
  if constexpr (std::is_same_v<T, bf16>) {
    if (amx) return run_amx_tasks(p, tasks, max_rows);
  }
  run_tasks(p, tasks, max_rows);
}

}  // namespace

// Causal (optionally sliding-window) attention of an EXTEND batch; see the header comment.
// q [T, H * d] (rows may be strided), k_buf/v_buf [slots, kv_heads, d] dense, one dtype (fp32
// or bf16),
// req_to_token [rows, L] int32, and per request (int64, CPU): req_pool_indices, prefix_lens,
// extend_lens (sum = T). window <= 0: none. Raises ValueError (via TORCH_CHECK_VALUE) on
// shapes it cannot take; the Python side only calls it with ones it can.
at::Tensor extend_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                            const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                            const at::Tensor& prefix_lens, const at::Tensor& extend_lens,
                            int64_t num_heads, double scale, int64_t window) {
  const auto dtype = q.scalar_type();
  TORCH_CHECK_VALUE((dtype == at::kFloat || dtype == at::kBFloat16) && dense_kv(q, dtype) &&
                        dense_kv(k_buf, dtype) && dense_kv(v_buf, dtype),
                    "q, k, v: CPU tensors of one dtype, float32 or bfloat16");
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

  const at::Tensor out = at::empty({T, num_heads * d}, q.options());
  if (T == 0) return out;
  if (q.scalar_type() == at::kBFloat16) {
    run<bf16>(q, k_buf, v_buf, req_to_token, req_pool_indices, prefix_lens, extend_lens, out,
              num_heads, scale, window);
  } else {
    run<float>(q, k_buf, v_buf, req_to_token, req_pool_indices, prefix_lens, extend_lens, out,
               num_heads, scale, window);
  }
  return out;
}
