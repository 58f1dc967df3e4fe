"""build_prefix_cache: the tree of an engine's config over its KV pool, with its tier if any.

``--disable-radix-cache``: the null cache. Otherwise a :class:`RadixCache`, or with a KV tier
(``--enable-hierarchical-cache``: host memory; ``--kv-tier-path DIR``: a memory-mapped file) a
:class:`TieredRadixCache`. A file tier holds its directory's lock from here until the scheduler
shuts down (``KVManager.close_tier``); one reopened under the same model, dtype, page size and
size gets its index back (``radix.tier_index``): the first request after a restart hits it. With
``--kv-events-config`` the tree records its KV events (``radix.kv_events``).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from radixserve.config import EngineConfig
from radixserve.memory_pool import KVCache
from radixserve.memory_pool.kv_tier import KVTier, TierLayout, file_tier, host_tier
from radixserve.radix import NoPrefixCache, PrefixCache, RadixCache
from radixserve.radix.kv_events import KVEventRecorder
from radixserve.radix.tier_index import restore_index
from radixserve.radix.tiered_cache import TieredRadixCache

logger = logging.getLogger(__name__)

TIER_RATIO = 2  # the tier's default size, in pools (SGLang's --hicache-ratio default)


def build_prefix_cache(config: EngineConfig, kv_cache: KVCache) -> PrefixCache:
    if config.disable_radix_cache:
        return NoPrefixCache(config.page_size)
    events = KVEventRecorder(config.page_size) if config.kv_events is not None else None
    if not config.kv_tier.enabled:
        return RadixCache(config.page_size, events)
    layout = TierLayout.of(kv_cache, config.page_size)
    tier_bytes = (
        config.kv_tier.kv_tier_bytes or TIER_RATIO * kv_cache.num_slots * layout.bytes_per_token
    )
    num_tokens = tier_bytes // layout.bytes_per_token
    if num_tokens < 2 * config.page_size:
        raise ValueError(f"a KV tier of {tier_bytes} bytes holds no page of this model's KV")
    reopened = False
    tier: KVTier
    if config.kv_tier.kv_tier_path is not None:
        tier, reopened = file_tier(
            config.kv_tier.kv_tier_path, layout, num_tokens, model_key(config)
        )
    else:
        tier = host_tier(layout, num_tokens, pin_memory=kv_cache.device.type == "cuda")
    tree = TieredRadixCache(
        config.page_size, tier, kv_cache, config.kv_tier.kv_tier_write_policy, events
    )
    restored = restore_index(tree) if reopened else 0
    logger.info(
        "KV tier %s: %d tokens (%.2f GB), %s; %d tokens restored",
        tier.name,
        tier.capacity,
        tier.capacity * layout.bytes_per_token / 1e9,
        config.kv_tier.kv_tier_write_policy,
        restored,
    )
    return tree


def model_key(config: EngineConfig) -> str:
    """What a file tier's bytes were computed by: the checkpoint (its path, its config, its
    weight files' names, sizes and modification times) and the quantization."""
    assert config.model_path is not None
    root = Path(config.model_path).resolve()
    h = hashlib.sha256(str(root).encode())
    config_file = root / "config.json"
    if config_file.exists():
        h.update(config_file.read_bytes())
    for weights in sorted(root.glob("*.safetensors")):
        st = os.stat(weights)
        h.update(f"{weights.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    h.update(str(config.quantization).encode())
    return h.hexdigest()
