"""``weight_by_name`` (SGLang's ``get_weights_by_name``) against the checkpoint's own tensors: each
transformers name back in its shape, merged parts cut out, int8 weights as their dequantized
rows, a tied lm_head as the embedding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from radixserve.models.kernels import quantize_int8
from radixserve.models.loader import load_model
from radixserve.models.weight_lookup import weight_by_name

pytestmark = pytest.mark.timeout(120)


def names(layer: int) -> list[str]:
    parts = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
    parts += ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    return [f"model.layers.{layer}.{p}.weight" for p in parts]


@pytest.mark.parametrize("arch", ["qwen3", "qwen2"])
def test_every_tensor_comes_back_as_the_checkpoint_holds_it(
    tiny_model_dirs: dict[str, Path], arch: str
) -> None:
    """qwen3: q/k norms, its own lm_head; qwen2: tied embeddings, q/k/v biases."""
    ckpt = load_file(tiny_model_dirs[arch] / "model.safetensors")
    model, config = load_model(tiny_model_dirs[arch], "float32", progress=False)
    for name, want in ckpt.items():
        assert torch.equal(weight_by_name(model, name), want.float()), name
    if config.tie_word_embeddings:
        want = ckpt["model.embed_tokens.weight"]
        assert torch.equal(weight_by_name(model, "lm_head.weight"), want)
    for bad in ["model.nothing.weight", "lm_head", "embed_tokens", "layers.0.mlp.up_proj.weight"]:
        with pytest.raises(ValueError, match="holds no weight named"):
            weight_by_name(model, bad)


def test_int8_weights_come_back_dequantized(tiny_model_dirs: dict[str, Path]) -> None:
    ckpt = load_file(tiny_model_dirs["qwen3"] / "model.safetensors")
    model, _ = load_model(tiny_model_dirs["qwen3"], "float32", quantization="int8", progress=False)
    for name in [*names(0), "lm_head.weight"]:
        q, scale = quantize_int8(ckpt[name])  # per row: a merged weight's rows alike
        assert torch.equal(weight_by_name(model, name), q.float() * scale[:, None]), name
    norm = "model.layers.0.input_layernorm.weight"
    assert torch.equal(weight_by_name(model, norm), ckpt[norm])
