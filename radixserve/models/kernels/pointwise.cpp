// The small per-layer operations of a decode step around the projections, one call each, on
// the tensors they take: silu_mul, rotary_ and split_rope_ (their math in pointwise.h), and
//   store_kv:  k_buf[slots[t]] = k[t], v_buf[slots[t]] = v[t] (KVCache.set_kv's index_put_).
//
// At batch 1 torch spends 10-40 us per call on each of these (operator dispatch, TensorIterator
// set-up, temporaries) for a few thousand values; here it is one call of a few us. Each returns
// "not applicable" (nullopt / false) for shapes or dtypes it does not take, and the caller then
// runs the torch path, which stays the reference.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>
#include <type_traits>

#include "pointwise.h"
#include "simd.h"

namespace {

using namespace rs;

bool cpu_dtype(const at::Tensor& t, at::ScalarType dtype) {
  return t.device().is_cpu() && t.scalar_type() == dtype && !t.requires_grad();
}

template <class T>
void copy_rows(const at::Tensor& src, at::Tensor& buf, const int64_t* slots, int64_t n) {
  const int64_t row = buf.stride(0);
  const auto* s = static_cast<const T*>(src.data_ptr());
  auto* d = static_cast<T*>(buf.data_ptr());
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(d + slots[t] * row, s + t * src.stride(0), static_cast<size_t>(row) * sizeof(T));
  }
}

// src [T, heads, d] whose heads are packed in each row, buf [slots, heads, d] dense, one dtype.
bool kv_pair_fits(const at::Tensor& src, const at::Tensor& buf) {
  return cpu_dtype(src, buf.scalar_type()) && src.dim() == 3 && buf.dim() == 3 &&
         buf.is_contiguous() && src.size(1) == buf.size(1) && src.size(2) == buf.size(2) &&
         src.stride(2) == 1 && src.stride(1) == src.size(2);
}

}  // namespace

// gate_up [M, 2 * I] (contiguous, fp32 or bf16) -> silu(gate) * up [M, I]; nullopt otherwise.
std::optional<at::Tensor> try_silu_mul(const at::Tensor& gate_up) {
  const auto dtype = gate_up.scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16) return std::nullopt;
  if (!cpu_dtype(gate_up, dtype) || !gate_up.is_contiguous() || gate_up.dim() != 2) {
    return std::nullopt;
  }
  const int64_t rows = gate_up.size(0), inter = gate_up.size(1) / 2;
  if (inter < 1 || gate_up.size(1) != 2 * inter) return std::nullopt;
  at::Tensor out = at::empty({rows, inter}, gate_up.options());
  if (dtype == at::kBFloat16) {
    silu_mul_rows(static_cast<const bf16*>(gate_up.data_ptr()), static_cast<bf16*>(out.data_ptr()),
                  rows, inter);
  } else {
    silu_mul_rows(static_cast<const float*>(gate_up.data_ptr()),
                  static_cast<float*>(out.data_ptr()), rows, inter);
  }
  return out;
}

namespace {

// try_rotary_ with q/k norms first where norm_w ([H, d], x's dtype) is given.
bool rotate_heads(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                  const std::optional<at::Tensor>& norm_w, double eps) {
  const auto dtype = x.scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16) return false;
  if (!cpu_dtype(x, dtype) || !cpu_dtype(cos, dtype) || !cpu_dtype(sin, dtype)) return false;
  if (x.dim() != 3 || !cos.is_contiguous() || !sin.is_contiguous()) return false;
  const int64_t n = x.size(0), nh = x.size(1), d = x.size(2);
  if (d < 2 || d % 2 != 0 || x.stride(2) != 1 || (nh > 1 && x.stride(1) < d)) return false;
  if (cos.numel() != n * d || sin.numel() != n * d || cos.size(-1) != d || sin.size(-1) != d) {
    return false;
  }
  if (norm_w && (!cpu_dtype(*norm_w, dtype) || !norm_w->is_contiguous() || norm_w->dim() != 2 ||
                 norm_w->size(0) != nh || norm_w->size(1) != d)) {
    return false;
  }
  const int64_t row = x.stride(0), hs = x.stride(1);
  const auto e = static_cast<float>(eps);
  auto run = [&](auto* xp, const auto* cp, const auto* sp) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(cp)>>;
    const T* wp = norm_w ? static_cast<const T*>(norm_w->data_ptr()) : nullptr;
    rotate_tokens(xp, n, row, nh, hs, cp, sp, d, wp, e);
  };
  if (dtype == at::kBFloat16) {
    run(static_cast<bf16*>(x.data_ptr()), static_cast<const bf16*>(cos.data_ptr()),
        static_cast<const bf16*>(sin.data_ptr()));
  } else {
    run(static_cast<float*>(x.data_ptr()), static_cast<const float*>(cos.data_ptr()),
        static_cast<const float*>(sin.data_ptr()));
  }
  return true;
}

}  // namespace

// Rotates x [T, H, d] in place (heads packed in each row, rows any stride; d even) by cos and
// signed sin [T, ..., d] (contiguous, x's dtype). False (x untouched) when it does not apply.
bool try_rotary_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return rotate_heads(x, cos, sin, std::nullopt, 0.0);
}

// qkv [T, (H + 2 * KV) * d] (dense rows, any row stride; fp32 or bf16) -> views q [T, H, d],
// k and v [T, KV, d] of it, q and k rotated in place as try_rotary_ does (d = cos.size(-1)),
// after Qwen3's q/k norms (norm_head) where qk_norm_w ([H + KV, d]: q_norm's weight per q head,
// then k_norm's per k head) is given. nullopt (qkv untouched) when it does not apply.
std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor>> try_split_rope_(
    at::Tensor& qkv, int64_t heads, int64_t kv_heads, const at::Tensor& cos,
    const at::Tensor& sin, const std::optional<at::Tensor>& qk_norm_w, double eps) {
  if (qkv.dim() != 2 || qkv.stride(1) != 1 || cos.dim() < 1 || heads < 1 || kv_heads < 1) {
    return std::nullopt;
  }
  const int64_t n = qkv.size(0), d = cos.size(-1), row = qkv.stride(0);
  if (qkv.size(1) != (heads + 2 * kv_heads) * d) return std::nullopt;
  at::Tensor qk = qkv.as_strided({n, heads + kv_heads, d}, {row, d, 1});
  if (!rotate_heads(qk, cos, sin, qk_norm_w, eps)) return std::nullopt;
  const int64_t off = qkv.storage_offset();
  return std::make_tuple(qkv.as_strided({n, heads, d}, {row, d, 1}, off),
                         qkv.as_strided({n, kv_heads, d}, {row, d, 1}, off + heads * d),
                         qkv.as_strided({n, kv_heads, d}, {row, d, 1}, off + (heads + kv_heads) * d));
}

// k_buf[slots[t]] = k[t] and v_buf[slots[t]] = v[t] for k, v [T, kv_heads, d] (heads packed in
// each row) into dense buffers [num_slots, kv_heads, d] of their dtype, slots int64 [T] in range.
// False (nothing written) when it does not apply.
bool try_store_kv(at::Tensor& k_buf, at::Tensor& v_buf, const at::Tensor& slots,
                  const at::Tensor& k, const at::Tensor& v) {
  const auto dtype = k_buf.scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16) return false;
  if (!kv_pair_fits(k, k_buf) || !kv_pair_fits(v, v_buf) || v_buf.scalar_type() != dtype) {
    return false;
  }
  if (k_buf.sizes() != v_buf.sizes() || k.size(0) != v.size(0)) return false;
  const int64_t n = k.size(0), num_slots = k_buf.size(0);
  if (!slots.device().is_cpu() || slots.scalar_type() != at::kLong || slots.dim() != 1 ||
      slots.size(0) != n || !slots.is_contiguous()) {
    return false;
  }
  const auto* s = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < n; ++t) {
    if (s[t] < 0 || s[t] >= num_slots) return false;
  }
  if (dtype == at::kBFloat16) {
    copy_rows<bf16>(k, k_buf, s, n);
    copy_rows<bf16>(v, v_buf, s, n);
  } else {
    copy_rows<float>(k, k_buf, s, n);
    copy_rows<float>(v, v_buf, s, n);
  }
  return true;
}
