"""``serve``'s flags for the KV cache's second tier and its KV events, in SGLang's names, and
what they build: the ``KVTierConfig`` and the parsed ``KVEventsConfig``."""

from __future__ import annotations

import argparse

from radixserve.config import KV_TIER_WRITE_POLICIES, KVTierConfig
from radixserve.kv_events_config import KVEventsConfig
from radixserve.launch.cli_parts import part_from_args
from radixserve.units import parse_size

_DEFAULTS = KVTierConfig()


def add_cache_flags(serve: argparse.ArgumentParser) -> None:
    add = serve.add_argument
    add(
        "--enable-hierarchical-cache",
        action="store_true",
        help="keep what the KV pool evicts in a host-memory tier and load it back on a hit",
    )
    add(
        "--kv-tier-path",
        default=None,
        metavar="DIR",
        help="keep the KV tier in a memory-mapped file in DIR (survives a restart)",
    )
    add(
        "--kv-tier-size",
        dest="kv_tier_bytes",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="the tier's size, e.g. 8GB or 512MiB (default: twice the KV pool)",
    )
    add(
        "--hicache-write-policy",
        "--kv-tier-write-policy",
        dest="kv_tier_write_policy",
        choices=KV_TIER_WRITE_POLICIES,
        default=_DEFAULTS.kv_tier_write_policy,
        help="copy KV to the tier when the pool evicts it (write_back) or when it is cached",
    )
    add(
        "--kv-events-config",
        default=None,
        metavar="JSON",
        help='publish KV events as SGLang does, e.g. {"publisher": "zmq", "endpoint": "tcp://*:5557"}',
    )


def kv_tier_part(args: argparse.Namespace) -> KVTierConfig:
    """The tier's part; ``ValueError`` (a config error: one line) for a ``--kv-tier-path`` that
    cannot hold a tier or that another server holds, before any model is loaded."""
    return part_from_args(KVTierConfig, args, kv_tier_path=_usable_tier_path(args.kv_tier_path))


def kv_events_config(args: argparse.Namespace) -> KVEventsConfig | None:
    """``--kv-events-config`` parsed (``ValueError`` naming what is wrong); None: not given."""
    text = args.kv_events_config
    return None if text is None else KVEventsConfig.from_cli(text)


def _usable_tier_path(path: str | None) -> str | None:
    if path is not None:
        # here, not at the top: the memory pool's package imports torch, which serve's process
        # needs only once its scheduler has started (radixserve/cli.py)
        from radixserve.memory_pool.tier_dir import TierUnavailable, check_tier_dir

        try:
            check_tier_dir(path)
        except TierUnavailable as exc:
            raise ValueError(f"--kv-tier-path {exc.path}: {exc.reason}") from None
    return path
