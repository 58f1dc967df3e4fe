"""Random LoRA adapters in PEFT's format, written by PEFT itself, for tests and benchmarks.

PEFT initialises ``lora_B`` to zero (an adapter that changes nothing); these draw both A and B
at random, large enough that the adapter changes the model's greedy tokens, so a test that
passes with the adapter applied would fail without it. :func:`write_malformed_lora` breaks a
good adapter in the ways a server must refuse.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# how write_malformed_lora breaks an adapter -> words the refusal of it contains
MALFORMED = {
    "random-bytes": "not a safetensors file",
    "0-d": "is not 2-d",
    "float8": "float8_e4m3fn",
    "int": "int32",
    "nan": "NaN or infinite",
    "fifo": "not a regular file",
    "dev-zero": "not a regular file",
}


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


def write_malformed_lora(good_dir: str | Path, out_dir: str | Path, kind: str) -> Path:
    """A copy of the adapter at ``good_dir`` in ``out_dir`` whose weights file is broken as
    ``kind`` (a key of :data:`MALFORMED`) says: random bytes, a 0-d tensor, float8 or int32
    weights, a NaN, a FIFO, or a symlink to ``/dev/zero``. Returns ``out_dir``."""
    from safetensors.torch import load_file, save_file

    if kind not in MALFORMED:
        raise ValueError(f"unknown kind {kind!r} (one of {', '.join(MALFORMED)})")
    src, out = Path(good_dir), Path(out_dir)
    out.mkdir(parents=True)
    shutil.copy(src / "adapter_config.json", out / "adapter_config.json")
    weights = out / "adapter_model.safetensors"
    if kind == "random-bytes":
        weights.write_bytes(random.Random(0).randbytes(4096))
    elif kind == "fifo":
        os.mkfifo(weights)
    elif kind == "dev-zero":
        weights.symlink_to("/dev/zero")
    else:
        tensors = load_file(src / "adapter_model.safetensors")
        first = min(tensors)
        if kind == "0-d":
            tensors[first] = torch.tensor(1.0)
        elif kind == "nan":
            tensors[first] = tensors[first].clone()
            tensors[first].view(-1)[0] = float("nan")
        else:
            dtype = torch.float8_e4m3fn if kind == "float8" else torch.int32
            tensors = {key: (t * 100).to(dtype) for key, t in tensors.items()}
        save_file(tensors, weights)
    return out
