from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve.models.tiny import (
    CHATML_TOKENS,
    train_tokenizer,
    write_qwen25_05b_shaped,
    write_tiny_model,
)


def test_tokenizer_loads_with_auto_tokenizer(tiny_model_dirs: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dirs["qwen2"])
    assert 1000 <= len(tok) <= 2100
    text = "def f(x):\n    return x * 2  # héllo ✓"
    assert tok.decode(tok(text)["input_ids"]) == text  # byte-level: lossless, even off-corpus chars
    for special in CHATML_TOKENS:
        assert len(tok(special)["input_ids"]) == 1
    assert tok.eos_token == "<|im_end|>"


def test_chat_template_is_chatml(tiny_model_dirs: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dirs["llama"])
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert (
        text
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tokenizer_training_is_deterministic(tiny_tokenizer: Any) -> None:
    assert train_tokenizer().get_vocab() == tiny_tokenizer.get_vocab()


def test_checkpoint_config_and_eos(tiny_model_dirs: dict[str, Path], tiny_tokenizer: Any) -> None:
    cfg = json.loads((tiny_model_dirs["qwen3"] / "config.json").read_text())
    assert cfg["vocab_size"] == len(tiny_tokenizer) and cfg["head_dim"] == 48
    gen = json.loads((tiny_model_dirs["qwen3"] / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [
        tiny_tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")
    ]


def test_same_seed_same_weights(tmp_path: Path, tiny_tokenizer: Any) -> None:
    from safetensors.torch import load_file

    a = write_tiny_model(tmp_path / "a", "qwen2", num_layers=1, tokenizer=tiny_tokenizer, seed=3)
    b = write_tiny_model(tmp_path / "b", "qwen2", num_layers=1, tokenizer=tiny_tokenizer, seed=3)
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    # norm weights and biases are random too, so a loader that skipped them would be caught
    assert not torch.equal(wa["model.norm.weight"], torch.ones_like(wa["model.norm.weight"]))
    assert wa["model.layers.0.self_attn.q_proj.bias"].abs().sum() > 0


def test_unknown_arch_raises(tmp_path: Path, tiny_tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="arch"):
        write_tiny_model(tmp_path, "gpt2", tokenizer=tiny_tokenizer)


@pytest.mark.slow
def test_qwen25_05b_shaped(tmp_path: Path, tiny_tokenizer: Any) -> None:
    path = write_qwen25_05b_shaped(tmp_path / "q", tokenizer=tiny_tokenizer)
    cfg = json.loads((path / "config.json").read_text())
    shape = {
        k: cfg[k]
        for k in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "vocab_size",
            "tie_word_embeddings",
        )
    }
    assert shape == dict(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
        tie_word_embeddings=True,
    )
    assert cfg["dtype"] == "bfloat16"
    size = (path / "model.safetensors").stat().st_size
    assert 980e6 < size < 1000e6  # 494M parameters in bf16
