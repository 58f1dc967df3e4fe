from __future__ import annotations

from pathlib import Path

import pytest
from hf_oracle import greedy, load_hf


@pytest.fixture(scope="session")
def engine_model_dir(tiny_llama_dir: Path) -> Path:
    return tiny_llama_dir


@pytest.fixture(scope="session")
def hf_greedy(engine_model_dir: Path):
    """Greedy continuation by Hugging Face transformers (the oracle), one prompt at a time."""
    model = load_hf(engine_model_dir)
    cache: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def generate(ids: list[int], max_new_tokens: int) -> list[int]:
        key = (tuple(ids), max_new_tokens)
        if key not in cache:
            cache[key] = greedy(model, ids, max_new_tokens)
        return cache[key]

    return generate
