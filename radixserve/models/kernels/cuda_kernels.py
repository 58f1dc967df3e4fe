"""CudaKernels: FlashInfer's fused pointwise kernels for a model on a CUDA GPU.

On a GPU a decode step of an 8B model spends about a quarter of its device time outside the
GEMMs and attention, in kernels of a few microseconds each: per layer two RMSNorms, two residual
adds, SiLU and a multiply (``benchmarks/README.md``, "The CUDA path"). SGLang runs these as
FlashInfer's fused kernels; so does this, where ``ExecutionConfig.flashinfer_fused_ops`` asks:

- ``rms_norm`` with a residual: ``flashinfer.norm.fused_add_rmsnorm``, one kernel, in place
  (the residual becomes ``x + residual``, ``x`` its norm); without one, ``flashinfer.norm.
  rmsnorm``;
- ``silu_mul``: ``flashinfer.activation.silu_and_mul``.

Everything else is :class:`CpuKernels`' torch path. The in-place norm overwrites ``x`` and the
residual: a decoder layer hands over tensors it does not read again, which is every caller's
contract with ``rms_norm`` (``RMSNorm.forward``). FlashInfer sums and normalizes in float32
and rounds once, as ``F.rms_norm`` does; its sum of squares runs in another order, so a bf16
output at a rounding boundary may differ by one unit in the last place.

``ops`` is the ``flashinfer`` package or, on a CPU in the tests, a stand-in with its contract.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch

from radixserve.models.kernels.cpu_kernels import CpuKernels


@dataclass(frozen=True, slots=True, eq=False)
class CudaKernels(CpuKernels):
    ops: Any = None  # flashinfer (``norm`` and ``activation``), or a stand-in with its contract

    @classmethod
    def flashinfer(cls) -> CudaKernels:
        """With FlashInfer's kernels (imported now: the ``[gpu]`` extra)."""
        return cls(ops=importlib.import_module("flashinfer"))

    def rms_norm(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        residual: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._fusable(x, weight):
            return CpuKernels.rms_norm(self, x, weight, eps, residual)
        if residual is None:
            return self.ops.norm.rmsnorm(x, weight, eps), x
        if residual.shape != x.shape or not residual.is_contiguous():
            return CpuKernels.rms_norm(self, x, weight, eps, residual)
        self.ops.norm.fused_add_rmsnorm(x, residual, weight, eps)
        return x, residual

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if not self._fusable(gate_up):
            return CpuKernels.silu_mul(self, gate_up)
        out: torch.Tensor = self.ops.activation.silu_and_mul(gate_up)
        return out

    def _fusable(self, x: torch.Tensor, weight: torch.Tensor | None = None) -> bool:
        """2-D, contiguous, half precision (FlashInfer's norms take fp16 and bf16), the weight's
        dtype the same."""
        return (
            self.ops is not None
            and x.dim() == 2
            and x.is_contiguous()
            and x.dtype in (torch.bfloat16, torch.float16)
            and (weight is None or weight.dtype == x.dtype)
        )
