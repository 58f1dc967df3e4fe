"""ModelConfig: the decoder shape read from a Hugging Face ``config.json``.

Accepts both layouts that transformers writes:

- v4: ``rope_theta`` at the top level and an optional ``rope_scaling`` dict (key ``type`` or
  ``rope_type``);
- v5: a ``rope_parameters`` dict holding ``rope_type``, ``rope_theta`` and the scaling keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """Rotary embedding parameters (only the keys that the supported ``rope_type`` values use)."""

    theta: float = 10000.0
    rope_type: str = "default"  # default | linear | llama3 | yarn
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int | None = None  # llama3, yarn
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    attention_factor: float | None = None  # yarn: scale on cos/sin; None = derived from factor
    truncate: bool = True  # yarn


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Everything the decoder needs to know about a checkpoint. Built by :meth:`from_dict`."""

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # bias on q/k/v projections (Qwen2 always; Llama/Qwen3 with attention_bias)
    o_bias: bool  # bias on the output projection (Llama/Qwen3 attention_bias; never Qwen2)
    mlp_bias: bool
    qk_norm: bool  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    # per layer: the sliding window size, or None for full attention
    sliding_windows: tuple[int | None, ...]
    # the dtype the weights were saved in (config "dtype" or "torch_dtype")
    checkpoint_dtype: str | None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        """Parse a ``config.json`` dict. Raises ``ValueError`` for a config it cannot run."""
        archs = cfg.get("architectures") or []
        if not archs:
            raise ValueError("config.json has no 'architectures' entry")
        model_type = str(cfg.get("model_type", ""))
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"only the SiLU (SwiGLU) MLP is supported, got hidden_act={act!r}")
        hidden = _required(cfg, "hidden_size")
        num_heads = _required(cfg, "num_attention_heads")
        num_kv_heads = int(cfg.get("num_key_value_heads") or num_heads)
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv_heads}"
            )
        head_dim = int(cfg.get("head_dim") or hidden // num_heads)
        num_layers = _required(cfg, "num_hidden_layers")
        max_pos = int(cfg.get("max_position_embeddings") or 2048)
        attention_bias = bool(cfg.get("attention_bias", False))
        is_qwen2 = model_type == "qwen2" or archs[0] == "Qwen2ForCausalLM"
        eos = cfg.get("eos_token_id")
        eos_ids = (
            () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        )
        return cls(
            architecture=str(archs[0]),
            model_type=model_type,
            vocab_size=_required(cfg, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_required(cfg, "intermediate_size"),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope=parse_rope(cfg),
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=True if is_qwen2 else attention_bias,
            o_bias=False if is_qwen2 else attention_bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3" or archs[0] == "Qwen3ForCausalLM",
            eos_token_ids=eos_ids,
            bos_token_id=cfg.get("bos_token_id"),
            sliding_windows=_parse_sliding_windows(cfg, model_type, num_layers),
            checkpoint_dtype=cfg.get("dtype") or cfg.get("torch_dtype"),
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        """Read ``config.json`` (and ``generation_config.json``'s EOS ids, when present)."""
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise ValueError(f"model directory {str(model_dir)!r} does not exist")
        path = model_dir / "config.json"
        if not path.is_file():
            raise ValueError(f"no config.json in model directory {str(model_dir)!r}")
        cfg = json.loads(path.read_text())
        gen_path = model_dir / "generation_config.json"
        if gen_path.is_file():
            gen_eos = json.loads(gen_path.read_text()).get("eos_token_id")
            if gen_eos is not None:
                own = cfg.get("eos_token_id")
                own_list = [] if own is None else (own if isinstance(own, list) else [own])
                gen_list = gen_eos if isinstance(gen_eos, list) else [gen_eos]
                cfg = {**cfg, "eos_token_id": list(dict.fromkeys(own_list + gen_list))}
        return cls.from_dict(cfg)


def parse_rope(cfg: dict[str, Any]) -> RopeConfig:
    """The RoPE parameters from either config layout (v5 ``rope_parameters`` wins over v4 keys)."""
    params = dict(cfg.get("rope_parameters") or {})
    if params and all(isinstance(v, dict) for v in params.values()):
        raise ValueError("per-layer-type rope_parameters are not supported")
    legacy = dict(cfg.get("rope_scaling") or {})
    merged = {**legacy, **params}
    theta = merged.get("rope_theta", cfg.get("rope_theta", 10000.0))
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_type {rope_type!r} is not supported (supported: {SUPPORTED_ROPE_TYPES})"
        )
    orig = merged.get("original_max_position_embeddings")
    if rope_type in ("llama3", "yarn") and orig is None:
        orig = cfg.get("max_position_embeddings")
    factor = merged.get("factor")
    if factor is None:
        if rope_type == "yarn" and orig:
            factor = cfg.get("max_position_embeddings", orig) / orig
        else:
            factor = 1.0
    return RopeConfig(
        theta=float(theta),
        rope_type=str(rope_type),
        factor=float(factor),
        low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
        high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=None if orig is None else int(orig),
        beta_fast=float(merged.get("beta_fast") or 32.0),
        beta_slow=float(merged.get("beta_slow") or 1.0),
        mscale=merged.get("mscale"),
        mscale_all_dim=merged.get("mscale_all_dim"),
        attention_factor=merged.get("attention_factor"),
        truncate=bool(merged.get("truncate", True)),
    )


def _parse_sliding_windows(
    cfg: dict[str, Any], model_type: str, num_layers: int
) -> tuple[int | None, ...]:
    """Per-layer windows following transformers: Mistral slides every layer when
    ``sliding_window`` is set; Qwen2/Qwen3 only with ``use_sliding_window``, from layer
    ``max_window_layers`` on (or as ``layer_types`` says)."""
    window = cfg.get("sliding_window")
    if model_type in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
        window = None
    if not window:
        return (None,) * num_layers
    layer_types = cfg.get("layer_types")
    if layer_types:
        if len(layer_types) != num_layers:
            raise ValueError(f"layer_types has {len(layer_types)} entries for {num_layers} layers")
        return tuple(int(window) if t == "sliding_attention" else None for t in layer_types)
    if model_type in ("qwen2", "qwen3"):
        first = int(cfg.get("max_window_layers", num_layers))
        return tuple(int(window) if i >= first else None for i in range(num_layers))
    return (int(window),) * num_layers


def _required(cfg: dict[str, Any], key: str) -> int:
    if cfg.get(key) is None:
        raise ValueError(f"config.json lacks {key!r}")
    return int(cfg[key])
