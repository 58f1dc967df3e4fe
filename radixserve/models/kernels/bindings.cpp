// Python bindings of the CPU kernels (one extension module; see _ext.py).
#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "linear.h"
#include "simd.h"

std::optional<at::Tensor> try_linear(const at::Tensor& x, const at::Tensor& w,
                                     const std::optional<at::Tensor>& scale,
                                     const std::optional<at::Tensor>& bias, int64_t max_m,
                                     int64_t min_task_bytes, bool gemm);

// Which GEMM try_linear gives int8 products taller than max_m (with gemm), by name: "amx"
// (amx_gemm.cpp), "vnni" (gemm_q8.cpp) or "packed" (gemm.cpp, int16 pairs), each quantizing x
// per row.
std::string int8_gemm() {
  switch (int8_gemm_kind()) {
    case Int8Gemm::kAmx: return "amx";
    case Int8Gemm::kVnni: return "vnni";
    default: return "packed";
  }
}

at::Tensor extend_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                            const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                            const at::Tensor& prefix_lens, const at::Tensor& extend_lens,
                            int64_t num_heads, double scale, int64_t window);

std::optional<std::tuple<at::Tensor, at::Tensor>> try_rms_norm(
    const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& residual,
    double eps);

std::optional<at::Tensor> try_silu_mul(const at::Tensor& gate_up);

bool try_rotary_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor>> try_split_rope_(
    at::Tensor& qkv, int64_t heads, int64_t kv_heads, const at::Tensor& cos,
    const at::Tensor& sin, const std::optional<at::Tensor>& qk_norm_w, double eps);

bool try_store_kv(at::Tensor& k_buf, at::Tensor& v_buf, const at::Tensor& slots,
                  const at::Tensor& k, const at::Tensor& v);

std::optional<std::tuple<at::Tensor, at::Tensor>> try_decoder_layer(
    const at::Tensor& x, const std::optional<at::Tensor>& residual,
    const std::vector<std::optional<at::Tensor>>& w, double eps, int64_t max_m,
    int64_t min_task_bytes, bool gemm, const at::Tensor& cos, const at::Tensor& sin,
    int64_t heads, int64_t kv_heads, at::Tensor& k_buf, at::Tensor& v_buf,
    const at::Tensor& slots, const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
    const at::Tensor& prefix_lens, const at::Tensor& extend_lens, double scale, int64_t window);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("isa") = RS_ISA_NAME;
  m.def("try_linear", &try_linear,
        "(x @ w.T) * scale + bias (M <= max_m, or any M with gemm), or None if not applicable",
        py::arg("x"), py::arg("w"), py::arg("scale"), py::arg("bias"), py::arg("max_m"),
        py::arg("min_task_bytes"), py::arg("gemm") = false,
        py::call_guard<py::gil_scoped_release>());
  m.def("int8_gemm", &int8_gemm,
        "the GEMM of int8 products taller than the skinny GEMM's rows: amx, vnni or packed");
  m.def("extend_attention", &extend_attention,
        "paged causal attention of an fp32 or bf16 EXTEND batch",
        py::call_guard<py::gil_scoped_release>());
  m.def("try_rms_norm", &try_rms_norm,
        "(RMSNorm(x [+ residual]), x [+ residual]) for fp32/bf16 rows, or None if not applicable",
        py::call_guard<py::gil_scoped_release>());
  m.def("try_silu_mul", &try_silu_mul,
        "silu(gate) * up of gate_up = [gate | up] (fp32/bf16 rows), or None if not applicable",
        py::call_guard<py::gil_scoped_release>());
  m.def("try_rotary_", &try_rotary_,
        "rotate x [T, H, d] in place by cos and signed sin [T, d]; False if not applicable",
        py::call_guard<py::gil_scoped_release>());
  m.def("try_split_rope_", &try_split_rope_,
        "(q, k, v) views of qkv with q and k rotated in place (after q/k norms with qk_norm_w), "
        "or None if not applicable",
        py::arg("qkv"), py::arg("heads"), py::arg("kv_heads"), py::arg("cos"), py::arg("sin"),
        py::arg("qk_norm_w") = py::none(), py::arg("eps") = 0.0,
        py::call_guard<py::gil_scoped_release>());
  m.def("try_decoder_layer", &try_decoder_layer,
        "(mlp output, residual sum) of one decoder layer in one call, or None (layer.cpp)",
        py::call_guard<py::gil_scoped_release>());
  m.def("try_store_kv", &try_store_kv,
        "k_buf[slots] = k, v_buf[slots] = v; False (nothing written) if not applicable",
        py::call_guard<py::gil_scoped_release>());
}
