"""``reload_weights``: a served model filled in place with another checkpoint of its shape, against
the oracle of that checkpoint loaded from scratch (every weight the forward reads equal, bit for
bit, int8 too), and refusals that leave the served weights as they were."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixserve.models.decoder import DecoderForCausalLM
from radixserve.models.loader import load_model, reload_weights
from radixserve.models.tiny import write_tiny_model

pytestmark = pytest.mark.timeout(120)


def tensors(model: DecoderForCausalLM) -> dict[str, torch.Tensor]:
    """Every weight the forward reads: the state dict and each layer's fused q/k norm weight
    (derived from two of them at load), cloned."""
    out = {name: t.clone() for name, t in model.state_dict().items()}
    for i, layer in enumerate(model.layers):
        out[f"layers.{i}.qk_norm_weight"] = layer.self_attn.qk_norm_weight.clone()
    return out


def same(x: dict[str, torch.Tensor], y: dict[str, torch.Tensor]) -> bool:
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Any) -> tuple[Path, Path]:
    """Two qwen3 checkpoints of one shape (q/k norms: a derived weight to refresh), other seeds."""
    root = tmp_path_factory.mktemp("reload")
    spec = dict(num_heads=6, num_kv_heads=2, head_dim=48, tokenizer=tiny_tokenizer)
    a = write_tiny_model(root / "a", "qwen3", seed=1, **spec)
    b = write_tiny_model(root / "b", "qwen3", seed=2, **spec)
    return a, b


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_reload_gives_the_new_checkpoints_model(
    pair: tuple[Path, Path], quantization: str | None
) -> None:
    a, b = pair
    served, _ = load_model(a, "float32", quantization=quantization, progress=False)
    fresh, _ = load_model(b, "float32", quantization=quantization, progress=False)
    before = tensors(served)
    storage = served.layers[0].mlp.gate_up_proj.weight.data_ptr()  # type: ignore[union-attr]
    assert not same(before, tensors(fresh))
    reload_weights(served, b)
    assert same(tensors(served), tensors(fresh))
    assert served.layers[0].mlp.gate_up_proj.weight.data_ptr() == storage  # type: ignore[union-attr]
    reload_weights(served, a)  # and back
    assert same(tensors(served), before)


def test_another_shape_or_a_bad_checkpoint_leaves_the_model(
    pair: tuple[Path, Path], tmp_path: Path, tiny_tokenizer: Any
) -> None:
    a, b = pair
    served, _ = load_model(a, "float32", progress=False)
    before = tensors(served)
    wider = write_tiny_model(
        tmp_path / "wider", "qwen3", num_heads=6, num_kv_heads=2, head_dim=48,
        intermediate_size=512, tokenizer=tiny_tokenizer,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"another model: its config differs in \['intermediate"):
        reload_weights(served, wider)
    short = shutil.copytree(b, tmp_path / "short")  # a tensor missing
    weights = load_file(short / "model.safetensors")
    name = next(n for n in weights if "down_proj" in n)
    del weights[name]
    save_file(weights, short / "model.safetensors")
    with pytest.raises(ValueError, match="lacks 1 weights"):
        reload_weights(served, short)
    torn = shutil.copytree(b, tmp_path / "torn")  # not a safetensors file
    (torn / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ValueError, match="cannot read the weights"):
        reload_weights(served, torn)
    with pytest.raises(ValueError, match="does not exist"):
        reload_weights(served, tmp_path / "nowhere")
    config = json.loads((b / "config.json").read_text())
    other = shutil.copytree(b, tmp_path / "other-eos")
    (other / "generation_config.json").unlink(missing_ok=True)
    (other / "config.json").write_text(json.dumps({**config, "eos_token_id": 5}))
    with pytest.raises(ValueError, match="eos_token_ids"):
        reload_weights(served, other)
    assert same(tensors(served), before)


def test_no_memory_for_the_staging_copy_is_a_refusal(
    pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's CPU allocator failing while the copy is read (injected) refuses the update, as
    any other refusal, instead of ending the scheduler process."""
    a, b = pair
    served, _ = load_model(a, "float32", progress=False)
    before = tensors(served)

    def no_memory(self: DecoderForCausalLM, weights: object) -> None:
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8")

    monkeypatch.setattr(DecoderForCausalLM, "load_weights", no_memory)
    with pytest.raises(ValueError, match="no memory for a copy of the weights"):
        reload_weights(served, b)
    assert same(tensors(served), before)
