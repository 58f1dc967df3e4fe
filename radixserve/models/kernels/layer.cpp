// One decoder layer (Llama / Qwen2 / Qwen3 / Mistral shape, one tensor-parallel rank) in one
// call, for decode steps: every step is an existing kernel (norm.cpp, gemv.cpp / amx_gemm.cpp,
// pointwise.cpp, attention_kernel.cpp) called in the order DecoderLayer.forward calls them, so
// the result is bit for bit the per-op path's; what leaves the step is Python: ~12 module and
// binding calls per layer, 2-3 ms per step of a 24-layer model at batch 1. Qwen3's q/k norms
// run in split_rope_ (pointwise.h's norm_head), which took that model's layers here too: decode
// steps of the Qwen3-1.7B shape 1.04-1.06x (Zen 4, bf16 and int8, batch 1 and 8), where its
// norms had run in torch and its layers op by op.
//
// Any step that does not take its operands (a dtype, a shape, more rows than the linear
// routing allows) returns None, and the caller runs the per-op path from the start: the only
// side effect before that point is the KV store, which the per-op path repeats with the same
// values into the same slots.
#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>
#include <vector>

std::optional<at::Tensor> try_linear(const at::Tensor& x, const at::Tensor& w,
                                     const std::optional<at::Tensor>& scale,
                                     const std::optional<at::Tensor>& bias, int64_t max_m,
                                     int64_t min_task_bytes, bool gemm);
std::optional<std::tuple<at::Tensor, at::Tensor>> try_rms_norm(
    const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& residual,
    double eps);
std::optional<at::Tensor> try_silu_mul(const at::Tensor& gate_up);
std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor>> try_split_rope_(
    at::Tensor& qkv, int64_t heads, int64_t kv_heads, const at::Tensor& cos,
    const at::Tensor& sin, const std::optional<at::Tensor>& qk_norm_w, double eps);
bool try_store_kv(at::Tensor& k_buf, at::Tensor& v_buf, const at::Tensor& slots,
                  const at::Tensor& k, const at::Tensor& v);
at::Tensor extend_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                            const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                            const at::Tensor& prefix_lens, const at::Tensor& extend_lens,
                            int64_t num_heads, double scale, int64_t window);

// weights (15): input_layernorm, post_attention_layernorm, then (weight, scale, bias) of
// qkv_proj, o_proj, gate_up_proj, down_proj (scale: int8 weights' per-channel scales, else
// None; bias None where the layer has none), then the q/k norms' weight per head ([heads +
// kv_heads, head_dim], Qwen3) or None. Returns (mlp output, running residual sum) as
// DecoderLayer.forward does, or None.
std::optional<std::tuple<at::Tensor, at::Tensor>> try_decoder_layer(
    const at::Tensor& x, const std::optional<at::Tensor>& residual,
    const std::vector<std::optional<at::Tensor>>& w, double eps, int64_t max_m,
    int64_t min_task_bytes, bool gemm, const at::Tensor& cos, const at::Tensor& sin,
    int64_t heads, int64_t kv_heads, at::Tensor& k_buf, at::Tensor& v_buf,
    const at::Tensor& slots, const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
    const at::Tensor& prefix_lens, const at::Tensor& extend_lens, double scale, int64_t window) {
  if (w.size() != 15) return std::nullopt;
  for (int i : {0, 1, 2, 5, 8, 11}) {
    if (!w[i].has_value()) return std::nullopt;
  }
  auto linear = [&](const at::Tensor& in, int i) {
    return try_linear(in, *w[i], w[i + 1], w[i + 2], max_m, min_task_bytes, gemm);
  };
  at::Tensor h, sum;
  if (residual.has_value()) {
    auto r = try_rms_norm(x, *w[0], residual, eps);
    if (!r) return std::nullopt;
    std::tie(h, sum) = *r;
  } else {
    auto r = try_rms_norm(x, *w[0], std::nullopt, eps);
    if (!r) return std::nullopt;
    h = std::get<0>(*r);
    sum = x;
  }
  auto qkv = linear(h, 2);
  if (!qkv) return std::nullopt;
  auto split = try_split_rope_(*qkv, heads, kv_heads, cos, sin, w[14], eps);
  if (!split) return std::nullopt;
  const auto& [q, k, v] = *split;
  if (!try_store_kv(k_buf, v_buf, slots, k, v)) return std::nullopt;
  const at::Tensor o = extend_attention(q.reshape({q.size(0), heads * q.size(2)}), k_buf, v_buf,
                                        req_to_token, req_pool_indices, prefix_lens,
                                        extend_lens, heads, scale, window);
  auto attn = linear(o, 5);
  if (!attn) return std::nullopt;
  auto post = try_rms_norm(*attn, *w[1], sum, eps);
  if (!post) return std::nullopt;
  const auto& [h2, sum2] = *post;
  auto gate_up = linear(h2, 8);
  if (!gate_up) return std::nullopt;
  auto act = try_silu_mul(*gate_up);
  if (!act) return std::nullopt;
  auto out = linear(*act, 11);
  if (!out) return std::nullopt;
  return std::make_tuple(*out, sum2);
}
