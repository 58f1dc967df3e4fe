"""``serve``'s LoRA flags, in SGLang's names, and the ``LoRAConfig`` they build."""

from __future__ import annotations

import argparse

from radixserve.config import EngineConfig, LoRAConfig
from radixserve.launch.cli_parts import part_from_args

_DEFAULTS = LoRAConfig()


def add_lora_flags(serve: argparse.ArgumentParser) -> None:
    add = serve.add_argument
    add(
        "--lora-paths",
        nargs="+",
        default=[],
        metavar="NAME=DIR",
        help="PEFT LoRA adapters served from the start (a DIR alone is named by itself); more "
        "can be loaded at run time (POST /load_lora_adapter). A request picks one by "
        "lora_path (/generate) or as its model (OpenAI routes)",
    )
    add(
        "--enable-lora",
        action="store_true",
        help="accepted for SGLang's scripts: adapters can always be loaded at run time",
    )
    add(
        "--max-loras-per-batch",
        type=int,
        default=_DEFAULTS.max_loras_per_batch,
        help="most distinct adapters in one batch (the base model not counted)",
    )
    add(
        "--max-loaded-loras",
        type=int,
        default=None,
        help="most adapters kept in memory; the least recently used one no running request "
        "needs is dropped and read again from disk when needed (default: all)",
    )
    add(
        "--max-lora-rank",
        type=int,
        default=_DEFAULTS.max_lora_rank,
        help="the largest adapter rank accepted",
    )


def lora_part(args: argparse.Namespace) -> LoRAConfig:
    return part_from_args(LoRAConfig, args)


def check_lora_paths(config: EngineConfig) -> None:
    """Read every ``--lora-paths`` adapter before a process starts: ``ValueError`` naming the
    first that cannot be served (``serve`` prints it as one line and exits 2)."""
    if not config.lora.lora_paths:
        return
    from radixserve.runtime.lora_manager import check_adapter  # torch: only to read adapters

    for name, path in config.lora.lora_paths:
        try:
            check_adapter(path, config)
        except ValueError as exc:
            raise ValueError(f"--lora-paths {name}={path}: {exc}") from None
