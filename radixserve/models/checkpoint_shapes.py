"""Random-weight models of real checkpoints' shapes, each with that checkpoint's own tokenizer,
chat template and end-of-sequence ids (``checkpoint_tokenizers.py`` fetches the files).

Shapes: ``qwen3-0.6b``, ``qwen3-1.7b`` (q/k norms, tied embeddings, 151,936 vocabulary rows
over a 151,669-id tokenizer) and ``llama3.2-1b``, ``llama3.2-3b`` (Llama 3 RoPE scaling, tied
embeddings, Llama 3.1's tokenizer, and a chat template written here from Meta's published
format for JSON tool calls: ``templates/llama3.1_json_tools.jinja``). Tests keep the real
vocabulary and shrink the rest (``overrides``); the benchmarks take the full shapes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from radixserve.models.checkpoint_tokenizers import tokenizer_dir
from radixserve.models.tiny import write_tiny_model

TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True, slots=True)
class Family:
    tokenizer: str  # a key of checkpoint_tokenizers.PACKAGES
    arch: str
    eos_tokens: tuple[str, ...]  # as the checkpoint's generation_config.json lists them
    bos_token: str | None
    # a template file that replaces the package's (whose template lacks what the family's
    # checkpoints render: Llama 3.1's tools); None: the package's own
    chat_template: str | None = None


FAMILIES = {
    "qwen3": Family("qwen3", "qwen3", ("<|im_end|>", "<|endoftext|>"), None),
    "llama3": Family(
        "llama3",
        "llama",
        ("<|eot_id|>", "<|end_of_text|>", "<|eom_id|>"),
        "<|begin_of_text|>",
        "llama3.1_json_tools.jinja",
    ),
}
_LLAMA32_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@dataclass(frozen=True, slots=True)
class Shape:
    family: str
    dims: dict[str, Any] = field(default_factory=dict)


SHAPES = {
    "qwen3-0.6b": Shape(
        "qwen3",
        dict(
            num_layers=28,
            hidden_size=1024,
            num_heads=16,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=3072,
            vocab_size=151936,
            max_position_embeddings=40960,
            tie_word_embeddings=True,
            rope_theta=1000000.0,
        ),
    ),
    "qwen3-1.7b": Shape(
        "qwen3",
        dict(
            num_layers=28,
            hidden_size=2048,
            num_heads=16,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=6144,
            vocab_size=151936,
            max_position_embeddings=40960,
            tie_word_embeddings=True,
            rope_theta=1000000.0,
        ),
    ),
    "llama3.2-1b": Shape(
        "llama3",
        dict(
            num_layers=16,
            hidden_size=2048,
            num_heads=32,
            num_kv_heads=8,
            head_dim=64,
            intermediate_size=8192,
            vocab_size=128256,
            max_position_embeddings=131072,
            tie_word_embeddings=True,
            rope_parameters=_LLAMA32_ROPE,
        ),
    ),
    "llama3.2-3b": Shape(
        "llama3",
        dict(
            num_layers=28,
            hidden_size=3072,
            num_heads=24,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=8192,
            vocab_size=128256,
            max_position_embeddings=131072,
            tie_word_embeddings=True,
            rope_parameters=_LLAMA32_ROPE,
        ),
    ),
}
# what tests shrink a shape to: the real vocabulary, everything else small
SMALL = dict(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
             intermediate_size=128, max_position_embeddings=4096)  # fmt: skip


def load_checkpoint_tokenizer(family: str) -> Any:
    """``family``'s real tokenizer (``AutoTokenizer`` over the fetched files), with the
    family's chat template."""
    from transformers import AutoTokenizer

    spec = FAMILIES[family]
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(spec.tokenizer))
    if spec.chat_template is not None:
        tokenizer.chat_template = (TEMPLATES / spec.chat_template).read_text()
    return tokenizer


def write_checkpoint_shaped(
    out_dir: str | Path,
    shape: str,
    *,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    tokenizer: Any = None,
    chat_template: str | None = None,
    **overrides: Any,
) -> Path:
    """Write a random model of ``shape`` (a key of :data:`SHAPES`; ``overrides`` replace its
    dimensions, e.g. :data:`SMALL`) with its family's tokenizer (``tokenizer``, else fetched)
    and chat template (``chat_template`` replaces it). Returns ``out_dir``."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    spec = SHAPES[shape]
    family = FAMILIES[spec.family]
    tokenizer = tokenizer if tokenizer is not None else load_checkpoint_tokenizer(spec.family)
    if chat_template is not None:
        tokenizer = copy.copy(tokenizer)  # the caller's tokenizer keeps its template
        tokenizer.chat_template = chat_template
    return write_tiny_model(
        out_dir,
        family.arch,
        dtype=dtype,
        seed=seed,
        tokenizer=tokenizer,
        initializer_range=0.02,
        eos_tokens=family.eos_tokens,
        bos_token=family.bos_token,
        **{**spec.dims, **overrides},
    )
