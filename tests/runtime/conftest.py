from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def engine_model_dir(tiny_llama_dir: Path) -> Path:
    return tiny_llama_dir


@pytest.fixture(scope="session")
def hf_greedy(engine_model_dir: Path):
    """Greedy continuation by Hugging Face transformers (the oracle), one prompt at a time."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(engine_model_dir, dtype=torch.float32).eval()
    cache: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def generate(ids: list[int], max_new_tokens: int) -> list[int]:
        key = (tuple(ids), max_new_tokens)
        if key not in cache:
            with torch.inference_mode():
                out = model.generate(
                    torch.tensor([ids]),
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=0,
                )
            cache[key] = out[0, len(ids) :].tolist()
        return cache[key]

    return generate
