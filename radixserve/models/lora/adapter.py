"""A PEFT LoRA adapter, read for one base model: per layer, a low-rank delta of each merged
projection it targets.

PEFT saves ``adapter_config.json`` (``r``, ``lora_alpha``, ``use_rslora``, ``target_modules``,
``rank_pattern``, ``alpha_pattern``) and ``adapter_model.safetensors`` with tensors named
``base_model.model.model.layers.{i}.{self_attn|mlp}.{proj}.lora_{A|B}.weight``: A ``[r, in]``,
B ``[out, r]``; PEFT adds ``scaling * B(A(x))`` to the projection's output, with ``scaling =
alpha / r`` (``alpha / sqrt(r)`` under rsLoRA).

The decoder merges q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj``, so one
:class:`LoraDelta` per merged projection stacks its parts: ``a`` is the parts' A matrices one
under the other ``[sum r, in]``, ``b`` places each part's ``scaling * B`` at its output rows and
its own rank columns ``[out, sum r]`` (zero elsewhere). ``(x @ a.T) @ b.T`` is then the sum of
the parts' deltas, each in its own output columns.

The files are untrusted input: each is opened without blocking and read only if it is a regular
file (after symlinks) no larger than any adapter of the model could be, then parsed from memory;
whatever is wrong with them (not JSON or safetensors, a tensor that is not a 2-d float matrix,
NaN or infinite values) is a ``ValueError`` naming it, never another exception or a wait.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from radixserve.models.model_config import ModelConfig

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MAX_CONFIG_BYTES = 1 << 20  # PEFT writes a few hundred bytes
HEADER_BYTES = 1 << 20  # room for any adapter's safetensors header (its tensors' names, offsets)
# the dtypes LoRA weights are saved in; float8 or integers are not LoRA weights this applies
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# PEFT's module name -> (our merged projection, part index)
TARGETS = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "o_proj": ("o_proj", 0),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
    "down_proj": ("down_proj", 0),
}
_KEY = re.compile(
    r"^base_model\.model\.model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$"
)


@dataclass(frozen=True, slots=True)
class LoraDelta:
    """One merged projection's delta: ``y += (x @ a.T) @ b.T``."""

    a: torch.Tensor  # [sum of the parts' ranks, in]
    b: torch.Tensor  # [out, sum of the parts' ranks], each part's scaling folded in


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """An adapter's deltas in the model's dtype and device. ``uid`` names its content (the
    config and weight files' sha256): the radix cache's namespace of the KV it computes."""

    uid: str
    path: str
    rank: int  # the largest rank of any module
    layers: tuple[dict[str, LoraDelta], ...]  # per layer: merged projection -> delta
    device: torch.device

    @property
    def nbytes(self) -> int:
        return sum(d.a.nbytes + d.b.nbytes for layer in self.layers for d in layer.values())


def adapter_uid(path: str | Path) -> str:
    """The sha256 of an adapter directory's config and weights (16 hex digits): two loads of
    the same files share their cached KV, a changed file does not. ``ValueError`` if either is
    missing or not a regular file (it is hashed in blocks, whatever its size)."""
    digest = hashlib.sha256()
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        with _open_regular(Path(path), name) as (f, _):
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def max_weights_bytes(model: ModelConfig, max_rank: int) -> int:
    """The largest ``adapter_model.safetensors`` that could be valid for ``model``: every target
    of every layer at rank ``max_rank`` in float64, plus ``HEADER_BYTES``. A larger file is
    refused before it is read."""
    per_rank = sum(sum(_dims(model, merged, part)) for merged, part in TARGETS.values())
    return model.num_layers * per_rank * max_rank * 8 + HEADER_BYTES


def load_adapter(
    path: str | Path,
    model: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    max_rank: int,
) -> LoraAdapter:
    """Read the PEFT adapter at ``path`` for ``model``. ``ValueError`` for anything this
    runtime cannot apply exactly: a missing file, one that is not a regular file or is larger
    than ``max_weights_bytes``, a config that is not JSON, weights that are not safetensors, a
    tensor that is not a 2-d matrix of a float dtype in ``DTYPES``, NaN or infinite values, a
    non-LoRA or DoRA adapter, trained biases or extra saved modules, a target outside
    q/k/v/o/gate/up/down, a rank above ``max_rank``, a shape that does not fit the model."""
    root = Path(path)
    config_bytes = _read_file(root, CONFIG_FILE, MAX_CONFIG_BYTES)
    weights_bytes = _read_file(root, WEIGHTS_FILE, max_weights_bytes(model, max_rank))
    config = _check_config(_parse_config(config_bytes))
    digest = hashlib.sha256(config_bytes)
    digest.update(weights_bytes)
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in _parse_weights(root, weights_bytes).items():
        m = _KEY.match(key)
        if m is None:
            raise ValueError(f"adapter tensor {key!r} is not a LoRA A/B of a decoder projection")
        _check_tensor(key, tensor)
        layer, module, which = int(m[1]), m[2], m[3]
        if module not in TARGETS:
            raise ValueError(f"LoRA on {module!r} is not supported (only {', '.join(TARGETS)})")
        if layer >= model.num_layers:
            raise ValueError(f"adapter tensor {key!r}: the model has {model.num_layers} layers")
        pairs.setdefault((layer, module), {})[which] = tensor
    layers: list[dict[str, list[tuple[int, torch.Tensor, torch.Tensor]]]] = [
        {} for _ in range(model.num_layers)
    ]
    rank = 0
    for (layer, module), ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise ValueError(f"layer {layer} {module}: the adapter lacks lora_A or lora_B")
        a, b = ab["A"], ab["B"]
        r = a.shape[0]
        rank = max(rank, r)
        if r > max_rank:
            raise ValueError(f"the adapter's rank {r} exceeds --max-lora-rank {max_rank}")
        merged, part = TARGETS[module]
        in_dim, out_dim = _dims(model, merged, part)
        if tuple(a.shape) != (r, in_dim) or tuple(b.shape) != (out_dim, r):
            shapes = f"A {tuple(a.shape)}, B {tuple(b.shape)}"
            raise ValueError(f"layer {layer} {module}: {shapes} do not fit the model")
        block = "self_attn" if merged in ("qkv_proj", "o_proj") else "mlp"
        name = f"model.layers.{layer}.{block}.{module}"
        scale = _scaling(config, name, r)
        layers[layer].setdefault(merged, []).append((part, a, b * scale))
    deltas = tuple(
        {merged: _stack(model, merged, parts, dtype, device) for merged, parts in layer.items()}
        for layer in layers
    )
    return LoraAdapter(digest.hexdigest()[:16], str(root), rank, deltas, device)


@contextmanager
def _open_regular(root: Path, name: str) -> Iterator[tuple[BinaryIO, int]]:
    """``root / name`` open for reading, with its size, if it is a regular file once symlinks
    are followed; ``ValueError`` otherwise. ``O_NONBLOCK``: opening a FIFO returns at once
    instead of waiting for a writer, and the check on the open file (not the path, which could
    change in between) refuses it and any device before a byte is read."""
    path = root / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ValueError(f"{str(root)!r} is not a PEFT LoRA adapter: it has no {name}") from None
    except OSError as exc:
        raise ValueError(
            f"{str(root)!r} is not a PEFT LoRA adapter: {name}: {exc.strerror}"
        ) from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{str(path)!r} is not a regular file (a FIFO, device or directory)")
        try:
            yield f, info.st_size
        except OSError as exc:
            raise ValueError(f"{str(path)!r} could not be read: {exc.strerror}") from None


def _read_file(root: Path, name: str, max_bytes: int) -> bytes:
    """The bytes of ``root / name``, a regular file of at most ``max_bytes``."""
    with _open_regular(root, name) as (f, size):
        data = f.read(max_bytes + 1) if size <= max_bytes else b""
    if size > max_bytes or len(data) > max_bytes:  # (or it grew while being read)
        size = max(size, len(data))
        raise ValueError(
            f"{str(root / name)!r} is {size} bytes, more than an adapter of this model at "
            f"--max-lora-rank can be (at most {max_bytes})"
        )
    return data


def _parse_config(data: bytes) -> dict[str, Any]:
    try:
        config = json.loads(data)
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, or nested past the stack
        raise ValueError(f"{CONFIG_FILE} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{CONFIG_FILE} is not a JSON object")
    return config


def _parse_weights(root: Path, data: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    try:
        return load(data)
    except Exception as exc:  # the parser's own error types: any of them is a refusal
        raise ValueError(f"{str(root / WEIGHTS_FILE)!r} is not a safetensors file: {exc}") from None


def _check_tensor(key: str, tensor: torch.Tensor) -> None:
    if tensor.dtype not in DTYPES:
        dtype = str(tensor.dtype).removeprefix("torch.")
        raise ValueError(
            f"adapter tensor {key!r} is {dtype}: LoRA weights must be float16, bfloat16, "
            "float32 or float64"
        )
    if tensor.dim() != 2:
        shape = tuple(tensor.shape)
        raise ValueError(f"adapter tensor {key!r} of shape {shape} is not 2-d (a LoRA matrix)")
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"adapter tensor {key!r} holds NaN or infinite values")


def _check_config(config: dict[str, Any]) -> dict[str, Any]:
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise ValueError(f"not a LoRA adapter: peft_type {config.get('peft_type')!r}")
    refused = {
        "use_dora": "DoRA",
        "modules_to_save": "modules_to_save",
        "fan_in_fan_out": "fan_in_fan_out",
        "trainable_token_indices": "trainable tokens",
    }
    for key, what in refused.items():
        if config.get(key):
            raise ValueError(f"the adapter uses {what}, which radixserve does not apply")
    targets = config.get("target_modules")
    if isinstance(targets, list):  # (a string is a regex over module names: the tensors tell)
        for module in targets:
            if not isinstance(module, str) or module.rsplit(".", 1)[-1] not in TARGETS:
                raise ValueError(f"LoRA on {module!r} is not supported (only {', '.join(TARGETS)})")
    if config.get("bias", "none") != "none":
        raise ValueError(
            "the adapter trains biases (bias != 'none'), which radixserve does not apply"
        )
    alpha_pattern = config.get("alpha_pattern") or {}
    if not isinstance(alpha_pattern, dict):
        raise ValueError("alpha_pattern is not a mapping of module patterns to alphas")
    for alpha in (config.get("lora_alpha", 8), *alpha_pattern.values()):
        if type(alpha) not in (int, float) or not math.isfinite(alpha):
            raise ValueError(f"lora_alpha {alpha!r} is not a finite number")
    for pattern in alpha_pattern:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(
                f"alpha_pattern {pattern!r} is not a regular expression: {exc}"
            ) from None
    return config


def _scaling(config: dict[str, Any], module_name: str, r: int) -> float:
    """PEFT's scaling of one module: its alpha (``alpha_pattern`` first) over r or sqrt(r)."""
    alpha = float(config.get("lora_alpha", 8))
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", module_name):
            alpha = float(value)
            break
    return alpha / (math.sqrt(r) if config.get("use_rslora") else r)


def _dims(model: ModelConfig, merged: str, part: int) -> tuple[int, int]:
    """(in, out) of one part of a merged projection."""
    hidden, inter = model.hidden_size, model.intermediate_size
    return {
        "qkv_proj": (hidden, (model.q_size, model.kv_size, model.kv_size)[part]),
        "o_proj": (model.q_size, hidden),
        "gate_up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }[merged]


def _stack(
    model: ModelConfig,
    merged: str,
    parts: list[tuple[int, torch.Tensor, torch.Tensor]],
    dtype: torch.dtype,
    device: torch.device,
) -> LoraDelta:
    """The parts of one merged projection as one :class:`LoraDelta` (see the module doc)."""
    num_parts = sum(1 for m, _ in TARGETS.values() if m == merged)
    sizes = [_dims(model, merged, p)[1] for p in range(num_parts)]  # each part's output rows
    total_rank = sum(a.shape[0] for _, a, _ in parts)
    b = torch.zeros(sum(sizes), total_rank, dtype=torch.float32)
    col = 0
    for part, a_part, b_part in parts:
        row, r = sum(sizes[:part]), a_part.shape[0]
        b[row : row + b_part.shape[0], col : col + r] = b_part.float()
        col += r
    a = torch.cat([a_part.float() for _, a_part, _ in parts]).to(dtype)
    b = b.to(dtype)
    if not (bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())):
        raise ValueError(f"the adapter's {merged} weights, scaled, overflow {dtype}")
    return LoraDelta(a.to(device).contiguous(), b.to(device).contiguous())
