// The packed GEMM of gemm.cpp, called by gemv.cpp's try_linear for products taller than the
// skinny GEMM's rows (the argument checks are try_linear's).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

// y [..., N] = (x @ w.T) * scale + bias for x [M, K] rows of stride ldx (fp32 or bf16), w [N, K]
// fp32, bf16 or int8 (then scale [N] fp32), bias [N] of x's dtype, all checked by the caller.
at::Tensor packed_gemm(const at::Tensor& x, int64_t ldx, const at::Tensor& w,
                       const std::optional<at::Tensor>& scale,
                       const std::optional<at::Tensor>& bias, int64_t M);
