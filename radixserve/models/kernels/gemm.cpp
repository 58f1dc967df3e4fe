// packed_gemm: the packed GEMM (gemm.h) on the tensors try_linear (gemv.cpp) checked.
#include <ATen/core/Tensor.h>

#include <optional>

#include "gemm.h"
#include "linear.h"

at::Tensor packed_gemm(const at::Tensor& x, int64_t ldx, const at::Tensor& w,
                       const std::optional<at::Tensor>& scale,
                       const std::optional<at::Tensor>& bias, int64_t M) {
  at::Tensor y;
  rs::with_dtypes(w.scalar_type(), x.scalar_type(), [&](auto wt, auto xt) {
    rs::gemm::run(rs::linear_operands<decltype(wt), decltype(xt)>(x, ldx, w, scale, bias, M, y));
  });
  return y;
}
