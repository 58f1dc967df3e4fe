"""Load a local Hugging Face checkpoint directory: config.json plus safetensors weights.

Weights come from ``model.safetensors`` or the shards listed in ``model.safetensors.index.json``
(any ``*.safetensors`` files otherwise). Nothing is downloaded: a model is a local directory.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from tqdm.auto import tqdm

from radixserve.models.decoder import DecoderForCausalLM
from radixserve.models.huge_pages import move_to_huge_pages
from radixserve.models.kernels import TORCH_ONLY, CpuKernels
from radixserve.models.model_config import ModelConfig
from radixserve.models.numerics import resolve_dtype
from radixserve.models.parallel import SINGLE, TPGroup
from radixserve.models.registry import get_model_class

QUANTIZATIONS = ("int8",)


def safetensors_files(model_dir: str | Path) -> list[Path]:
    """The weight files of a checkpoint, in a stable order. ``ValueError`` if there are none or
    the index names a shard that is missing."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ValueError(f"model directory {str(model_dir)!r} does not exist")
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [model_dir / s for s in shards]
        missing = [str(f.name) for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"{index.name} names missing shard(s): {missing}")
        return files
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(
            f"no safetensors weights in {str(model_dir)!r} (.bin checkpoints are not supported)"
        )
    return files


def iter_weights(files: list[Path], progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` from each file, with a tqdm bar over the tensors."""
    handles = [safe_open(str(f), framework="pt") for f in files]
    total = sum(len(list(h.keys())) for h in handles)
    with tqdm(
        total=total, desc="loading weights", unit="tensor", disable=not progress or None
    ) as bar:
        for handle in handles:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a dict
                yield name, handle.get_tensor(name)
                bar.update(1)


def load_model(
    model_dir: str | Path,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    max_positions: int | None = None,
    progress: bool = True,
    kernels: CpuKernels = TORCH_ONLY,
    quantization: str | None = None,
    tp: TPGroup = SINGLE,
) -> tuple[DecoderForCausalLM, ModelConfig]:
    """Build the model for ``model_dir`` and fill its weights.

    ``max_positions`` bounds the RoPE table (default: ``max_position_embeddings``); ``kernels``
    is the CPU kernel choice of every layer; ``quantization="int8"`` quantizes the weights
    after loading (weight-only, per output channel); ``tp``: the tensor-parallel rank to build
    (each keeps only its slice of the weights). On the CPU the weights end in one buffer of
    transparent huge pages where the system allows it (``huge_pages.py``). Raises
    ``ValueError`` for a missing directory/config/weights, an unsupported architecture, dtype
    or quantization, or weights that do not match the config.
    """
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(
            f"quantization must be one of {QUANTIZATIONS} or None, got {quantization!r}"
        )
    device = torch.device(device)
    torch_dtype = resolve_dtype(dtype, device, kernels)
    config = ModelConfig.from_dir(model_dir)
    cls = get_model_class(config.architecture)
    files = safetensors_files(model_dir)
    with torch.device(device):
        model = cls(
            config, torch_dtype, device, max_positions=max_positions, kernels=kernels, tp=tp
        )
    with torch.no_grad():
        model.load_weights(iter_weights(files, progress))
        if quantization == "int8":
            model.quantize_int8()
        if device.type == "cpu":
            move_to_huge_pages(model)  # decode streams the weights: fewer TLB misses
    return model.eval(), config


@dataclasses.dataclass(frozen=True, slots=True)
class StagedWeights:
    """A checkpoint's weights loaded, converted and checked for ``model``, not yet in it."""

    model: DecoderForCausalLM
    tensors: dict[str, torch.Tensor]  # by state-dict name, as ``model`` holds them

    def commit(self) -> None:
        """Copy them into the model's own tensors (their memory, huge pages and CUDA-graph
        addresses unchanged) and derive what the layers compute from them."""
        served = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in self.tensors.items():
                served[name].copy_(tensor)
            self.model.finalize()


def stage_weights(model: DecoderForCausalLM, model_dir: str | Path) -> StagedWeights:
    """The weights of ``model_dir`` for ``model`` (SGLang's ``update_weights_from_disk``): the
    same architecture and shapes (``config.json`` equal but for its saved dtype), this rank's
    slice of them, int8 again where ``model`` is; loaded into a staging copy on the CPU, so a
    ``ValueError`` (a missing directory, another shape, a tensor short, an unreadable file)
    leaves ``model`` as it was."""
    config = ModelConfig.from_dir(model_dir)
    ours = dataclasses.replace(model.config, checkpoint_dtype=None)
    if dataclasses.replace(config, checkpoint_dtype=None) != ours:
        differ = [
            f.name
            for f in dataclasses.fields(config)
            if f.name != "checkpoint_dtype" and getattr(config, f.name) != getattr(ours, f.name)
        ]
        raise ValueError(f"{model_dir} is another model: its config differs in {differ}")
    files = safetensors_files(model_dir)
    try:
        staged = type(model)(config, model.embed_tokens.dtype, torch.device("cpu"), tp=model.tp)
        with torch.no_grad():
            staged.load_weights(iter_weights(files, progress=False))
            if model.head_int8 is not None:
                staged.quantize_int8()
    except (OSError, SafetensorError) as exc:
        raise ValueError(f"cannot read the weights in {model_dir}: {exc}") from None
    except (MemoryError, RuntimeError) as exc:  # torch's CPU allocator says so in a RuntimeError
        if not isinstance(exc, MemoryError) and "allocate" not in str(exc):
            raise
        raise ValueError(f"no memory for a copy of the weights in {model_dir}: {exc}") from None
    tensors = staged.state_dict()
    if tensors.keys() != model.state_dict().keys():  # a bug, not the checkpoint's fault
        raise RuntimeError(f"staged weights {sorted(tensors)} are not the model's")
    return StagedWeights(model, tensors)


def reload_weights(model: DecoderForCausalLM, model_dir: str | Path) -> None:
    """``model`` filled in place with the weights of ``model_dir`` (:func:`stage_weights`, then
    :meth:`StagedWeights.commit`); ``ValueError`` leaves it as it was."""
    stage_weights(model, model_dir).commit()
