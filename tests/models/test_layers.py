"""The decoder's building blocks against transformers' own implementations."""

from __future__ import annotations

import pytest
import torch

from radixserve.models.layers import (
    RMSNorm,
    RotaryEmbedding,
    SwiGLUMLP,
    apply_rotary,
    rope_inv_freq,
)
from radixserve.models.model_config import ModelConfig

ROPE_CASES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    },
    "yarn": {
        "rope_type": "yarn",
        "rope_theta": 1e6,
        "factor": 4.0,
        "original_max_position_embeddings": 1024,
    },
    "yarn_mscale": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "mscale": 1.0,
        "mscale_all_dim": 0.8,
        "beta_fast": 16,
    },
}


def _hf_config(rope: dict, head_dim: int = 64):  # noqa: ANN202 - a transformers config
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=4096,
        rope_parameters=dict(rope),
    )


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_rope_inv_freq_matches_transformers(case: str) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_config = _hf_config(ROPE_CASES[case])
    ours = ModelConfig.from_dict({**hf_config.to_dict(), "architectures": ["LlamaForCausalLM"]})
    inv_freq, scale = rope_inv_freq(64, ours.rope)
    rope_type = ROPE_CASES[case]["rope_type"]
    if rope_type == "default":
        ref = 1.0 / (ours.rope.theta ** (torch.arange(0, 64, 2, dtype=torch.int64).float() / 64))
        ref_scale = 1.0
    else:
        ref, ref_scale = ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"))
    torch.testing.assert_close(inv_freq, ref, rtol=1e-6, atol=0)
    assert scale == pytest.approx(ref_scale)


@pytest.mark.parametrize("case", ["default", "llama3", "yarn"])
def test_rotary_matches_transformers(case: str) -> None:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    hf_config = _hf_config(ROPE_CASES[case])
    ours = ModelConfig.from_dict({**hf_config.to_dict(), "architectures": ["LlamaForCausalLM"]})
    rotary = RotaryEmbedding(64, 2048, ours.rope, torch.float32, torch.device("cpu"))
    positions = torch.tensor([0, 1, 5, 300, 2047])
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(5, 4, 64, generator=gen), torch.randn(5, 2, 64, generator=gen)
    cos, sin = rotary.cos_sin(positions)
    qk = apply_rotary(torch.cat([q, k], dim=1), cos, sin)

    hf_cos, hf_sin = LlamaRotaryEmbedding(hf_config)(q, positions.view(1, -1))
    hf_q, hf_k = apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], hf_cos, hf_sin
    )
    torch.testing.assert_close(qk[:, :4], hf_q[0].transpose(0, 1), rtol=0, atol=1e-6)
    torch.testing.assert_close(qk[:, 4:], hf_k[0].transpose(0, 1), rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_and_fused_residual_match_transformers(dtype: torch.dtype) -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    hf = LlamaRMSNorm(96, eps=1e-6).to(dtype)
    ours = RMSNorm(96, 1e-6, dtype, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        hf.weight.copy_(1.0 + 0.2 * torch.randn(96, generator=gen))
        ours.weight.copy_(hf.weight)
    x, residual = (torch.randn(7, 96, generator=gen).to(dtype) for _ in range(2))
    tol = 1e-6 if dtype == torch.float32 else 1e-2  # bf16: ours rounds once, transformers twice
    torch.testing.assert_close(ours(x), hf(x), rtol=tol, atol=tol)
    normed, summed = ours(x, residual)
    torch.testing.assert_close(summed, x + residual, rtol=0, atol=0)
    torch.testing.assert_close(normed, hf(x + residual), rtol=tol, atol=tol)


def test_swiglu_mlp_matches_separate_projections() -> None:
    mlp = SwiGLUMLP(32, 48, bias=False, dtype=torch.float32, device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    gate, up, down = (
        torch.randn(shape, generator=gen) * 0.2 for shape in ((48, 32), (48, 32), (32, 48))
    )
    with torch.no_grad():
        mlp.gate_up_proj.weight.copy_(torch.cat([gate, up]))
        mlp.down_proj.weight.copy_(down)
    x = torch.randn(5, 32, generator=gen)
    expected = (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T
    # fp32; the projections may take the skinny kernel, which sums in another order than matmul
    torch.testing.assert_close(mlp(x), expected, rtol=1e-4, atol=1e-5)
