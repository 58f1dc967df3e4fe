"""Random LoRA adapters in PEFT's format, written by PEFT itself, for tests and benchmarks.

PEFT initialises ``lora_B`` to zero (an adapter that changes nothing); these draw both A and B
at random, large enough that the adapter changes the model's greedy tokens, so a test that
passes with the adapter applied would fail without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_tiny_lora(
    base: str | Path | Any,
    out_dir: str | Path,
    *,
    r: int = 8,
    lora_alpha: int = 16,
    target_modules: Sequence[str] = ALL_TARGETS,
    use_rslora: bool = False,
    seed: int = 0,
    std: float = 0.15,
    rank_pattern: dict[str, int] | None = None,
    alpha_pattern: dict[str, int] | None = None,
) -> Path:
    """PEFT's ``save_pretrained`` of a random adapter over ``base`` (a checkpoint directory,
    or a transformers model, left as it was: several adapters are written from one load) into
    ``out_dir`` (``adapter_config.json`` + ``adapter_model.safetensors``). Needs ``peft`` (the
    ``[test]`` extra). Returns ``out_dir``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    if isinstance(base, (str, Path)):
        base = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(
        r=r,
        lora_alpha=lora_alpha,
        target_modules=list(target_modules),
        use_rslora=use_rslora,
        lora_dropout=0.0,
        rank_pattern=rank_pattern or {},
        alpha_pattern=alpha_pattern or {},
    )
    model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * std)
    out = Path(out_dir)
    model.save_pretrained(str(out))
    model.unload()  # the base model without the adapter's layers again
    return out


def write_merged(base_dir: str | Path, adapter_dir: str | Path, out_dir: str | Path) -> Path:
    """The checkpoint at ``base_dir`` with the adapter merged into its weights (PEFT's
    ``merge_and_unload``), in the base's dtype, with its tokenizer: what serving one adapter
    without LoRA costs. Returns ``out_dir``."""
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    dtype = AutoConfig.from_pretrained(base_dir).dtype or torch.float32
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    out = Path(out_dir)
    merged.to(dtype).save_pretrained(out)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(out)
    return out
