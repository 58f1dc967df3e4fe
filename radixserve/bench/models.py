"""Benchmark models, made on first use with :mod:`radixserve.models.tiny` (random weights), and
the token id range the synthetic prompts draw from."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from radixserve.config import default_model_dir

BENCH_MODELS = ("tiny", "qwen25-05b")
_READY = "radixserve-bench-model.ok"


def bench_model_root() -> Path:
    """Beside the server's default model: ``<cache>/radixserve/bench-models``."""
    return Path(default_model_dir()).parent / "bench-models"


def ensure_bench_model(kind: str, root: Path | None = None) -> Path:
    """The directory of ``kind`` (tiny: a 4-layer Llama, seconds to write; qwen25-05b: the
    Qwen2.5-0.5B-shaped model in bfloat16, about 1 GB), writing it first if missing. It is
    written beside and renamed into place, so an interrupted write leaves nothing behind."""
    if kind not in BENCH_MODELS:
        raise ValueError(f"model kind must be one of {BENCH_MODELS}, got {kind!r}")
    target = (root or bench_model_root()) / kind
    if (target / _READY).is_file():
        return target
    from radixserve.models.tiny import write_qwen25_05b_shaped, write_tiny_model

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{kind}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    try:
        if kind == "tiny":
            write_tiny_model(tmp, "llama", num_layers=4, hidden_size=256, intermediate_size=512)
        else:
            write_qwen25_05b_shaped(tmp)
        (tmp / _READY).write_text("1\n")
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def token_range(model_path: str) -> tuple[int, int]:
    """``[low, high)``: the tokenizer's ids above its special tokens (the model's vocabulary
    where there is no tokenizer), so the prompts are ordinary text to every tokenizer."""
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_path)
    except (OSError, ValueError):
        import json

        config = json.loads((Path(model_path) / "config.json").read_text())
        return 1, int(config["vocab_size"])
    low = max(tok.all_special_ids, default=-1) + 1
    return low, len(tok)
