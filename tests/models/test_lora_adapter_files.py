"""Adapter files a server must refuse, read as ``load_adapter`` and the LoRA manager read them:
each is a quick ``ValueError`` naming the problem, never another exception or a blocked read.

The good adapter is written here with safetensors alone (LoRA on q/v of both layers), so these
tests need neither PEFT nor a model checkpoint."""

from __future__ import annotations

import json
import os
import shutil
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from radixserve.models.lora import adapter_uid, load_adapter
from radixserve.models.lora.adapter import max_weights_bytes
from radixserve.models.model_config import ModelConfig
from radixserve.models.tiny_lora import MALFORMED, write_malformed_lora
from radixserve.runtime.lora_manager import LoraManager

pytestmark = pytest.mark.timeout(20)

MODEL = ModelConfig.from_dict(
    {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
)
CPU = torch.device("cpu")
load = partial(load_adapter, model=MODEL, dtype=torch.float32, device=CPU, max_rank=8)


def write_good(out: Path, seed: int = 0, r: int = 4) -> Path:
    out.mkdir(parents=True)
    config = {"peft_type": "LORA", "r": r, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    (out / "adapter_config.json").write_text(json.dumps(config))
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(MODEL.num_layers):
        for module, out_dim in (("q_proj", MODEL.q_size), ("v_proj", MODEL.kv_size)):
            key = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(r, MODEL.hidden_size, generator=g)
            tensors[f"{key}.lora_B.weight"] = torch.randn(out_dim, r, generator=g)
    save_file(tensors, out / "adapter_model.safetensors")
    return out


@pytest.fixture
def good(tmp_path: Path) -> Path:
    good = write_good(tmp_path / "good")
    assert load(good).rank == 4
    return good


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_a_malformed_weights_file_is_a_value_error(good: Path, tmp_path: Path, kind: str) -> None:
    bad = write_malformed_lora(good, tmp_path / kind, kind)
    with pytest.raises(ValueError, match=MALFORMED[kind]):
        load(bad)


def test_files_that_are_not_regular_or_too_large_are_refused_unread(
    good: Path, tmp_path: Path
) -> None:
    """A FIFO or a device as either file is refused by ``adapter_uid`` (which names an adapter
    before it is read) as by ``load_adapter``; a weights file larger than any adapter of this
    model at ``max_rank`` could be is refused before it is read."""
    for kind in ("fifo", "dev-zero"):
        bad = write_malformed_lora(good, tmp_path / kind, kind)
        with pytest.raises(ValueError, match="not a regular file"):
            adapter_uid(bad)
    config_fifo = tmp_path / "config-fifo"
    shutil.copytree(good, config_fifo)
    (config_fifo / "adapter_config.json").unlink()
    os.mkfifo(config_fifo / "adapter_config.json")
    for read in (adapter_uid, load):
        with pytest.raises(ValueError, match="adapter_config.json.* not a regular file"):
            read(config_fifo)
    huge = tmp_path / "huge"
    shutil.copytree(good, huge)
    limit = max_weights_bytes(MODEL, 8)
    os.truncate(huge / "adapter_model.safetensors", limit + 1)  # sparse: nothing is written
    with pytest.raises(ValueError, match=f"{limit + 1} bytes.*at most {limit}"):
        load(huge)


def test_the_manager_refuses_bad_files_on_load_and_on_read_back(good: Path, tmp_path: Path) -> None:
    """``LoraManager.load`` (what the scheduler runs) refuses a FIFO with a ``ValueError``; an
    adapter dropped from memory whose file became garbage fails its read-back with one."""
    manager = LoraManager(partial(load, max_rank=8), max_loaded=1)
    with pytest.raises(ValueError, match="not a regular file"):
        manager.load("fifo", str(write_malformed_lora(good, tmp_path / "fifo", "fifo")))
    manager.load("x", str(good))
    manager.load("y", str(write_good(tmp_path / "other", seed=1)))  # drops "x" from memory
    uid = manager.names["x"]
    assert uid not in manager.loaded
    weights = good / "adapter_model.safetensors"
    weights.unlink()
    weights.write_bytes(os.urandom(4096))
    with pytest.raises(ValueError, match="not a safetensors file"):
        manager._weights(uid, {uid})
