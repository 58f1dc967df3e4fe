from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixserve.models.model_config import ModelConfig, RopeConfig

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 1000,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
}
LLAMA3_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def test_v4_and_v5_rope_layouts_parse_the_same() -> None:
    v4 = {**BASE, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", **LLAMA3_SCALING}}
    v4_old_key = {
        **BASE,
        "rope_theta": 500000.0,
        "rope_scaling": {"type": "llama3", **LLAMA3_SCALING},
    }
    v5 = {
        **BASE,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **LLAMA3_SCALING},
    }
    expected = RopeConfig(
        theta=500000.0, rope_type="llama3", factor=8.0, original_max_position_embeddings=8192
    )
    for cfg in (v4, v4_old_key, v5):
        assert ModelConfig.from_dict(cfg).rope == expected


def test_defaults_without_rope_keys() -> None:
    cfg = ModelConfig.from_dict(BASE)
    assert cfg.rope == RopeConfig(theta=10000.0, rope_type="default")
    assert cfg.head_dim == 32 and cfg.num_kv_heads == 2 and cfg.rms_norm_eps == 1e-5
    assert not cfg.tie_word_embeddings and not cfg.qkv_bias and not cfg.o_bias and not cfg.qk_norm
    assert cfg.sliding_windows == (None, None, None)


def test_v5_default_rope_theta() -> None:
    cfg = ModelConfig.from_dict(
        {**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    )
    assert cfg.rope.theta == 1e6 and cfg.rope.rope_type == "default"


def test_family_flags() -> None:
    qwen2 = ModelConfig.from_dict(
        {
            **BASE,
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "tie_word_embeddings": True,
        }
    )
    assert qwen2.qkv_bias and not qwen2.o_bias and qwen2.tie_word_embeddings and not qwen2.qk_norm
    qwen3 = ModelConfig.from_dict(
        {**BASE, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 128}
    )
    assert qwen3.qk_norm and qwen3.head_dim == 128 and not qwen3.qkv_bias
    llama_bias = ModelConfig.from_dict({**BASE, "attention_bias": True, "mlp_bias": True})
    assert llama_bias.qkv_bias and llama_bias.o_bias and llama_bias.mlp_bias


def test_eos_ids_int_or_list_and_generation_config(tmp_path: Path) -> None:
    assert ModelConfig.from_dict({**BASE, "eos_token_id": 7}).eos_token_ids == (7,)
    assert ModelConfig.from_dict({**BASE, "eos_token_id": [7, 9]}).eos_token_ids == (7, 9)
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "eos_token_id": 7}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [8, 7]}))
    assert ModelConfig.from_dir(tmp_path).eos_token_ids == (7, 8)


def test_sliding_windows() -> None:
    mistral = {
        **BASE,
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "sliding_window": 4096,
    }
    assert ModelConfig.from_dict(mistral).sliding_windows == (4096,) * 3
    assert ModelConfig.from_dict({**mistral, "sliding_window": None}).sliding_windows == (None,) * 3
    qwen2 = {
        **BASE,
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "sliding_window": 64,
    }
    assert ModelConfig.from_dict(qwen2).sliding_windows == (None,) * 3  # use_sliding_window is off
    on = {**qwen2, "use_sliding_window": True, "max_window_layers": 1}
    assert ModelConfig.from_dict(on).sliding_windows == (None, 64, 64)
    typed = {**on, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}
    assert ModelConfig.from_dict(typed).sliding_windows == (64, None, 64)


def test_yarn_factor_defaults_from_lengths() -> None:
    cfg = {
        **BASE,
        "max_position_embeddings": 32768,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 1e6,
            "original_max_position_embeddings": 4096,
        },
    }
    rope = ModelConfig.from_dict(cfg).rope
    assert rope.factor == 8.0 and rope.original_max_position_embeddings == 4096


@pytest.mark.parametrize(
    "change, message",
    [
        ({"architectures": []}, "architectures"),
        ({"hidden_act": "gelu"}, "SiLU"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type"),
        ({"num_key_value_heads": 3}, "multiple"),
        ({"vocab_size": None}, "vocab_size"),
    ],
)
def test_bad_configs_raise_value_error(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict({**BASE, **change})


def test_from_dir_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        ModelConfig.from_dir(tmp_path / "nope")
    with pytest.raises(ValueError, match="config.json"):
        ModelConfig.from_dir(tmp_path)


def test_real_checkpoint_configs(tiny_model_dirs: dict[str, Path]) -> None:
    """What transformers 5 writes (rope_parameters, layer_types, dtype) parses as intended."""
    llama = ModelConfig.from_dir(tiny_model_dirs["llama"])
    assert (
        llama.rope.rope_type == "llama3"
        and llama.rope.theta == 500000.0
        and llama.num_kv_heads == 1
    )
    assert llama.checkpoint_dtype == "float32" and llama.o_bias
    assert ModelConfig.from_dir(tiny_model_dirs["qwen2"]).tie_word_embeddings
    assert ModelConfig.from_dir(tiny_model_dirs["qwen3"]).head_dim == 48
    assert ModelConfig.from_dir(tiny_model_dirs["mistral"]).sliding_windows == (16, 16)
