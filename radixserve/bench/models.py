"""Benchmark models, made on first use with random weights (:mod:`radixserve.models.tiny`, and
real checkpoints' shapes with their real tokenizers: :mod:`radixserve.models.checkpoint_shapes`),
the token id range random prompts draw from, and the real text prompts are cut from."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np

from radixserve.config import default_model_dir
from radixserve.models.checkpoint_shapes import SHAPES

BENCH_MODELS = ("tiny", "qwen25-05b", *SHAPES)  # SHAPES: qwen3-0.6b, qwen3-1.7b, llama3.2-1b, ...
# what a report calls each bench model: its shape, and that its weights are random
BENCH_MODEL_LABELS = {
    "tiny": "tiny Llama-shaped (4 layers, hidden 256), random weights",
    "qwen25-05b": "Qwen2.5-0.5B-shaped, random weights",
    "qwen3-0.6b": "Qwen3-0.6B-shaped, random weights",
    "qwen3-1.7b": "Qwen3-1.7B-shaped, random weights",
    "llama3.2-1b": "Llama-3.2-1B-shaped, random weights",
    "llama3.2-3b": "Llama-3.2-3B-shaped, random weights",
}
CORPUS_CHARS = 400_000  # of the stdlib's sources: about 120k tokens to cut prompts from
_READY = "radixserve-bench-model.ok"


def bench_model_root() -> Path:
    """Beside the server's default model: ``<cache>/radixserve/bench-models``."""
    return Path(default_model_dir()).parent / "bench-models"


def ensure_bench_model(kind: str, root: Path | None = None) -> Path:
    """The directory of ``kind`` (tiny: a 4-layer Llama, seconds to write; qwen25-05b: the
    Qwen2.5-0.5B-shaped model in bfloat16, about 1 GB; a checkpoint shape such as qwen3-1.7b,
    in bfloat16 with its real tokenizer, 3.4 GB), writing it first if missing. It is
    written beside and renamed into place, so an interrupted write leaves nothing behind."""
    if kind not in BENCH_MODELS:
        raise ValueError(f"model kind must be one of {BENCH_MODELS}, got {kind!r}")
    target = (root or bench_model_root()) / kind
    if (target / _READY).is_file():
        return target
    from radixserve.models.checkpoint_shapes import write_checkpoint_shaped
    from radixserve.models.tiny import write_qwen25_05b_shaped, write_tiny_model

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{kind}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    try:
        if kind == "tiny":
            write_tiny_model(tmp, "llama", num_layers=4, hidden_size=256, intermediate_size=512)
        elif kind == "qwen25-05b":
            write_qwen25_05b_shaped(tmp)
        else:
            write_checkpoint_shaped(tmp, kind)
        (tmp / _READY).write_text("1\n")
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def model_label(model: str) -> str:
    """How reports and plots name ``model``: a bench model by its shape ("Qwen2.5-0.5B-shaped,
    random weights"), any other local path by its last component (a checkpoint directory's or a
    GGUF file's name, never where the machine that ran it keeps it), a hub snapshot by its id,
    a hub id or a label as it is."""
    path = Path(model)
    if path.parent.name == bench_model_root().name and path.name in BENCH_MODELS:
        return BENCH_MODEL_LABELS.get(path.name, f"{path.name}-shaped, random weights")
    repo = path.parent.parent.name  # huggingface_hub's cache: models--ORG--NAME/snapshots/REV
    if path.parent.name == "snapshots" and repo.startswith("models--"):
        return repo.removeprefix("models--").replace("--", "/")
    return path.name if path.is_absolute() or path.exists() else model


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


def text_corpus(model_path: str) -> np.ndarray | None:
    """Real text (the Python standard library's sources) through the model's tokenizer, as one
    id array to cut prompts from; None when the model has no tokenizer."""
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_path)
    except (OSError, ValueError):
        return None
    from radixserve.models.tiny import corpus_texts

    text = "\n".join(corpus_texts(CORPUS_CHARS))
    return np.asarray(tok.encode(text, add_special_tokens=False), dtype=np.int64)
