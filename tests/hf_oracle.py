"""The Hugging Face transformers oracle shared by the Engine and server tests: a model's greedy
continuation of token ids, with no end-of-sequence token stopping it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def load_hf(model_dir: Path | str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def greedy(model: Any, ids: list[int], max_new_tokens: int) -> list[int]:
    """``model``'s (a transformers model, or a PEFT one around it) next ``max_new_tokens``
    greedy tokens after ``ids``."""
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return list(out[0, len(ids) :].tolist())
