"""CudaKernels: FlashInfer's fused add+RMSNorm and SiLU-and-mul in place of the torch ops.

On the CPU a stand-in with FlashInfer's contract (the same values as the torch ops, written in
place where FlashInfer writes in place) runs whole models: their logits must equal the torch
path's exactly, so no layer reads a tensor the in-place norm overwrote, and the fused calls
must be the ones made. On a GPU (`gpu`) FlashInfer's own kernels against the torch ops.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from test_cpu_kernels_model import run_model

from radixserve.models.kernels import TORCH_ONLY, CudaKernels
from radixserve.models.kernels.pointwise import silu_mul
from radixserve.models.loader import load_model

pytestmark = pytest.mark.timeout(120)
FAMILIES = ["llama", "qwen2", "qwen3", "mistral"]


class StandIn:
    """``flashinfer.norm`` and ``flashinfer.activation`` as CudaKernels calls them, in torch,
    each call counted."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {"rmsnorm": 0, "fused_add_rmsnorm": 0, "silu_and_mul": 0}
        self.norm = SimpleNamespace(rmsnorm=self.rmsnorm, fused_add_rmsnorm=self.fused_add_rmsnorm)
        self.activation = SimpleNamespace(silu_and_mul=self.silu_and_mul)

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        self.calls["rmsnorm"] += 1
        return F.rms_norm(x, (weight.shape[0],), weight, eps)

    def fused_add_rmsnorm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> None:
        """In place, as FlashInfer: ``residual += x``, then ``x = rmsnorm(residual)``."""
        self.calls["fused_add_rmsnorm"] += 1
        residual.add_(x)
        x.copy_(F.rms_norm(residual, (weight.shape[0],), weight, eps))

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        self.calls["silu_and_mul"] += 1
        return silu_mul(gate_up)


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_ops_give_the_torch_paths_logits(
    tiny_model_dirs: dict[str, Path], family: str
) -> None:
    path = tiny_model_dirs[family]
    layers = load_model(path, "float32")[1].num_layers
    want, _ = run_model(path, TORCH_ONLY, "bfloat16", None)
    ops = StandIn()
    got, _ = run_model(path, CudaKernels(ops=ops), "bfloat16", None)
    assert torch.equal(got, want)
    # two forwards (an extend, a decode) and two logits passes: per forward the first layer's
    # input norm alone has no residual; every other norm, the final one included, is fused
    assert ops.calls == {
        "rmsnorm": 2,
        "fused_add_rmsnorm": 2 * 2 * layers,
        "silu_and_mul": 2 * layers,
    }


def test_other_tensors_keep_the_torch_path() -> None:
    """float32, a non-contiguous or 3-D input: no fused call (FlashInfer's norms take 2-D
    half-precision rows)."""
    ops = StandIn()
    kernels = CudaKernels(ops=ops)
    w = torch.ones(8)
    x = torch.randn(4, 8)
    out, s = kernels.rms_norm(x, w, 1e-6, torch.randn(4, 8))
    assert out.dtype == torch.float32
    kernels.rms_norm(torch.randn(8, 4, dtype=torch.bfloat16).t(), w.bfloat16(), 1e-6)
    kernels.silu_mul(torch.randn(2, 3, 16, dtype=torch.bfloat16))
    assert sum(ops.calls.values()) == 0


@pytest.mark.gpu
def test_flashinfer_fused_ops_match_the_torch_ops_on_gpu(device: str) -> None:
    if not device.startswith("cuda"):
        pytest.skip("FlashInfer's kernels run on CUDA only (--device cpu: the stand-in above)")
    kernels = CudaKernels.flashinfer()
    gen = torch.Generator(device=device).manual_seed(0)
    for hidden in (896, 4096):
        x = torch.randn(5, hidden, device=device, generator=gen).bfloat16()
        r = torch.randn(5, hidden, device=device, generator=gen).bfloat16()
        w = (1 + 0.1 * torch.randn(hidden, device=device, generator=gen)).bfloat16()
        want, want_s = TORCH_ONLY.rms_norm(x, w, 1e-6, r)
        got, got_s = kernels.rms_norm(x.clone(), w, 1e-6, r.clone())
        torch.testing.assert_close(got_s, want_s, rtol=0, atol=0)
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
        alone, _ = kernels.rms_norm(x.clone(), w, 1e-6)
        torch.testing.assert_close(
            alone.float(), TORCH_ONLY.rms_norm(x, w, 1e-6)[0].float(), rtol=2e-2, atol=2e-2
        )
        gate_up = torch.randn(5, 2 * hidden, device=device, generator=gen).bfloat16()
        torch.testing.assert_close(
            kernels.silu_mul(gate_up).float(), silu_mul(gate_up).float(), rtol=2e-2, atol=2e-2
        )
