"""The paged token-to-KV memory: request rows, the slot allocator and the K/V buffers."""

from radixserve.memory_pool.allocator import TokenToKVPoolAllocator
from radixserve.memory_pool.kv_cache import KVCache, kv_bytes_per_token, num_slots_for_budget
from radixserve.memory_pool.req_to_token_pool import ReqToTokenPool

__all__ = [
    "KVCache",
    "ReqToTokenPool",
    "TokenToKVPoolAllocator",
    "kv_bytes_per_token",
    "num_slots_for_budget",
]
