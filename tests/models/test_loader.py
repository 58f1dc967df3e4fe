from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixserve.models import numerics
from radixserve.models.kernels import TORCH_ONLY
from radixserve.models.loader import load_model, resolve_dtype, safetensors_files


def _copy_checkpoint(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_merged_weights_hold_the_checkpoint_tensors(tiny_model_dirs: dict[str, Path]) -> None:
    model, cfg = load_model(tiny_model_dirs["qwen3"], "float32")
    raw = load_file(str(tiny_model_dirs["qwen3"] / "model.safetensors"))
    attn = model.layers[1].self_attn
    qkv = torch.cat([raw[f"model.layers.1.self_attn.{n}_proj.weight"] for n in "qkv"])
    assert torch.equal(attn.qkv_proj.weight, qkv)
    gate_up = torch.cat([raw[f"model.layers.1.mlp.{n}_proj.weight"] for n in ("gate", "up")])
    assert torch.equal(model.layers[1].mlp.gate_up_proj.weight, gate_up)
    assert torch.equal(attn.qk_norm_weight[0], raw["model.layers.1.self_attn.q_norm.weight"])
    assert torch.equal(attn.qk_norm_weight[-1], raw["model.layers.1.self_attn.k_norm.weight"])
    assert torch.equal(model.lm_head, raw["lm_head.weight"])


def test_qwen2_biases_and_tied_lm_head(tiny_model_dirs: dict[str, Path]) -> None:
    model, cfg = load_model(tiny_model_dirs["qwen2"], "float32")
    raw = load_file(str(tiny_model_dirs["qwen2"] / "model.safetensors"))
    bias = torch.cat([raw[f"model.layers.0.self_attn.{n}_proj.bias"] for n in "qkv"])
    assert torch.equal(model.layers[0].self_attn.qkv_proj.bias, bias)
    assert model.lm_head is None and cfg.tie_word_embeddings


def test_sharded_checkpoint_loads_the_same_weights(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    src = tiny_model_dirs["llama"]
    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).save_pretrained(
        sharded, max_shard_size="200KB"
    )
    assert (sharded / "model.safetensors.index.json").is_file()
    files = safetensors_files(sharded)
    assert len(files) > 1
    single, _ = load_model(src, "float32")
    multi, _ = load_model(sharded, "float32")
    for (name, a), (_, b) in zip(single.named_parameters(), multi.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_missing_shard_raises(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    ckpt = _copy_checkpoint(tiny_model_dirs["llama"], tmp_path / "m")
    index = {
        "metadata": {},
        "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"},
    }
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="missing shard"):
        load_model(ckpt, "float32")


def test_missing_weight_raises(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    ckpt = _copy_checkpoint(tiny_model_dirs["llama"], tmp_path / "m")
    tensors = load_file(str(ckpt / "model.safetensors"))
    del tensors["model.layers.1.self_attn.v_proj.weight"]
    save_file(tensors, str(ckpt / "model.safetensors"))
    with pytest.raises(ValueError, match=r"lacks 1 weights.*qkv_proj"):
        load_model(ckpt, "float32")


def test_shape_mismatch_raises(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    ckpt = _copy_checkpoint(tiny_model_dirs["llama"], tmp_path / "m")
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(
        json.dumps({**cfg, "intermediate_size": cfg["intermediate_size"] * 2})
    )
    with pytest.raises(ValueError, match="shape"):
        load_model(ckpt, "float32")


def test_unsupported_architecture_and_missing_files(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_model(tmp_path / "absent")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="config.json"):
        load_model(empty)
    ckpt = _copy_checkpoint(tiny_model_dirs["llama"], tmp_path / "gpt2")
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'"):
        load_model(ckpt)
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    shutil.copy(tiny_model_dirs["llama"] / "config.json", no_weights / "config.json")
    with pytest.raises(ValueError, match="no safetensors"):
        load_model(no_weights)


def test_resolve_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_dtype("float32", "cpu") is torch.float32
    assert resolve_dtype("float16", "cpu") is torch.float16
    assert resolve_dtype("auto", "cuda") is torch.bfloat16
    monkeypatch.setattr(numerics, "cpu_has_native_bf16", lambda: True)
    assert resolve_dtype("auto", "cpu") is torch.bfloat16
    monkeypatch.setattr(numerics, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(numerics, "best_variant", lambda: None)  # no kernels for this CPU
    assert resolve_dtype("auto", "cpu") is torch.float32
    monkeypatch.setattr(numerics, "best_variant", lambda: "avx2")  # bf16 storage, fp32 math
    assert resolve_dtype("auto", "cpu") is torch.bfloat16
    assert resolve_dtype("auto", "cpu", TORCH_ONLY) is torch.float32  # kernels switched off
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("int8", "cpu")


def test_int8_quantization_at_load(tiny_model_dirs: dict[str, Path]) -> None:
    model, _ = load_model(tiny_model_dirs["qwen2"], "float32", quantization="int8")
    layer = model.layers[0].mlp.gate_up_proj  # type: ignore[union-attr]
    assert layer.weight.dtype == torch.int8 and layer.weight_scale.dtype == torch.float32
    assert model.head_int8 is not None and model.embed_tokens.dtype == torch.float32
    with pytest.raises(ValueError, match="quantization"):
        load_model(tiny_model_dirs["qwen2"], "float32", quantization="int4")


def test_cpu_bf16_detection_reads_cpuinfo() -> None:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    assert numerics.cpu_has_native_bf16() == ("avx512_bf16" in flags or "amx_bf16" in flags)


def test_bfloat16_load_converts(tiny_model_dirs: dict[str, Path]) -> None:
    model, _ = load_model(tiny_model_dirs["qwen2"], "bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.rotary.cos_cache.dtype == torch.bfloat16
