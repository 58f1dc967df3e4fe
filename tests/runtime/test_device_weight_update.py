"""A weight update from disk on the device path (``runtime/weight_update.py``): on a CUDA GPU the
decode steps replay CUDA graphs captured over the old weights' tensors, which the update fills
in place, so the updated engine must decode what an engine started on the new checkpoint
decodes; ``--device cpu`` runs it as a dry run here.

Marked ``gpu``: deselected by default, run by ``pytest -m gpu [--device cpu]``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixserve import Engine

pytestmark = pytest.mark.gpu

PARAMS = {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True}
PROMPTS = [[7, 31, 2, 90, 14], [5, 6, 7, 8, 9, 10, 11, 12, 13]]


def test_an_updated_engine_decodes_as_one_started_on_the_new_weights(
    device: str, device_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    old = device_model_dirs["llama"]
    new = shutil.copytree(old, tmp_path / "new")  # the same shape, other weights
    weights = load_file(new / "model.safetensors")
    gen = torch.Generator().manual_seed(9)
    redrawn = {k: torch.randn(t.shape, generator=gen) * t.std() for k, t in weights.items()}
    save_file(redrawn, new / "model.safetensors")
    args: dict[str, Any] = dict(dtype="bfloat16", device=device, max_total_tokens=1024)
    with Engine(str(new), **args) as fresh:
        want = [r["output_ids"] for r in fresh.generate(input_ids=PROMPTS, sampling_params=PARAMS)]
    with Engine(str(old), **args) as engine:
        before = [
            r["output_ids"] for r in engine.generate(input_ids=PROMPTS, sampling_params=PARAMS)
        ]
        ok, message, _ = engine.update_weights_from_disk(str(new))
        assert ok, message
        got = [r["output_ids"] for r in engine.generate(input_ids=PROMPTS, sampling_params=PARAMS)]
        engine.check_integrity()
    assert before != want
    assert got == want
