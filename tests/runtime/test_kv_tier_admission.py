"""Admission over a KV tier: a plan's match is made before the batch is committed, and what it
says is in the tier may be in the pool by the time ``KVManager.alloc_extend`` adopts it (an
admission of the same batch loaded it back first, or a released request's insert gave the tier
nodes its slots). The request must still get its whole prefix with the right K/V, loaded once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixserve.memory_pool import KVCache, ReqToTokenPool, TokenToKVPoolAllocator
from radixserve.memory_pool.kv_tier import TierLayout, host_tier
from radixserve.policy import Admission
from radixserve.radix.tiered_cache import TieredRadixCache
from radixserve.runtime.kv_manager import KVManager
from radixserve.server.engine import Engine
from radixserve.types import Req

PAGE_SIZES = [1, 4]
LAYERS, HEADS, HEAD_DIM = 2, 1, 2


def _kv_manager(ps: int, pool_tokens: int = 64) -> KVManager:
    kv_cache = KVCache(LAYERS, pool_tokens + ps, HEADS, HEAD_DIM)
    tree = TieredRadixCache(ps, host_tier(TierLayout.of(kv_cache, ps), 64), kv_cache)
    allocator = TokenToKVPoolAllocator(pool_tokens + ps, ps)
    return KVManager(ReqToTokenPool(4, 128), allocator, tree, kv_cache)


def _token_kv(tokens: list[int]) -> torch.Tensor:
    """The K/V a forward computes for ``tokens``: a function of each token's prefix."""
    rows = [float(hash(tuple(tokens[: i + 1])) % 100_003) for i in range(len(tokens))]
    return torch.tensor(rows).view(-1, 1, 1).expand(-1, HEADS, HEAD_DIM)


def _compute(kv: KVManager, slots: torch.Tensor, tokens: list[int]) -> None:
    assert kv.kv_cache is not None
    for layer in range(LAYERS):
        kv.kv_cache.set_kv(layer, slots, _token_kv(tokens), -_token_kv(tokens))


def _kv_of(kv: KVManager, slots: torch.Tensor) -> torch.Tensor:
    assert kv.kv_cache is not None
    return torch.stack([kv.kv_cache.get_kv(layer)[0][slots, 0, 0] for layer in range(LAYERS)])


def _cache_in_tier(kv: KVManager, prefix: list[int]) -> None:
    """``prefix`` computed, cached, then evicted from the pool into the tier."""
    held = kv.allocator.alloc(len(prefix))
    assert held is not None
    _compute(kv, held, prefix)
    kv.tree.insert(prefix, held)
    kv.allocator.free(kv.tree.evict(len(prefix)))
    assert kv.tree.match_prefix(prefix).tier_len == len(prefix)


def _plan(kv: KVManager, req: Req) -> Admission:
    """What the adder does: match, lock the match, and size the extend."""
    match = kv.tree.match_prefix(req.fill_ids[:-1])
    kv.tree.inc_lock_ref(match.last_node)
    return Admission(req, match, req.seq_len - match.cached_len)


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_two_admissions_of_one_batch_share_a_tier_prefix(ps: int) -> None:
    kv = _kv_manager(ps)
    prefix = list(range(1, 1 + 4 * ps))
    _cache_in_tier(kv, prefix)
    reqs = [Req(f"a{i}", prefix + [900 + i] * (ps + 1)) for i in range(2)]
    admissions = [_plan(kv, r) for r in reqs]
    assert all(a.match is not None and a.match.tier_len == len(prefix) for a in admissions)
    assert kv.alloc_extend(admissions) is not None  # the second found it in the pool already
    tree = kv.tiered
    assert tree is not None and tree.num_loaded_tokens == len(prefix)  # loaded once
    rows = [kv.row_slots(r, 0, len(prefix)) for r in reqs]
    assert torch.equal(rows[0], rows[1])
    assert torch.equal(_kv_of(kv, rows[0]), _token_kv(prefix)[:, 0, 0].expand(LAYERS, -1))
    kv.check_integrity(reqs)
    for r in reqs:
        kv.release(r, insert=False)
    kv.check_integrity(reqs)


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_a_release_between_plan_and_commit_fills_the_tier_part(ps: int) -> None:
    kv = _kv_manager(ps)
    prefix = list(range(1, 1 + 4 * ps))
    # a running request computed prefix itself (into its own row) ...
    running = Req("running", prefix + [7] * ps)
    first = _plan(kv, running)
    assert kv.alloc_extend([first]) is not None
    _compute(kv, kv.row_slots(running), running.fill_ids.tolist())
    own = kv.row_slots(running, 0, len(prefix)).clone()
    # ... while the tree held prefix in the tier only
    _cache_in_tier(kv, prefix)
    waiting = Req("waiting", prefix + [8] * (ps + 1))
    admission = _plan(kv, waiting)
    assert admission.match is not None and admission.match.tier_len == len(prefix)
    kv.release(running)  # preempted before the commit: its insert gives the tier nodes its slots
    assert kv.alloc_extend([admission]) is not None
    row = kv.row_slots(waiting, 0, len(prefix))
    assert torch.equal(row, own)
    assert torch.equal(_kv_of(kv, row), _token_kv(prefix)[:, 0, 0].expand(LAYERS, -1))
    kv.check_integrity([running, waiting])
    kv.release(waiting)
    kv.check_integrity([running, waiting])


def test_concurrent_requests_sharing_a_prefix_in_the_tier(
    engine_model_dir: Path, hf_greedy: object
) -> None:
    """Through the engine (FCFS, the default): two prompts whose shared prefix was evicted to
    the tier, admitted in one batch, give HF's greedy outputs."""
    prefix = [5 + (i * 7) % 200 for i in range(48)]
    prompts = [prefix + [2, 3], prefix + [4, 6]]
    fillers = [[300 + k + i % 50 for i in range(120)] for k in range(3)]
    sp = {"max_new_tokens": 4, "temperature": 0}
    with Engine(
        str(engine_model_dir),
        dtype="float32",
        max_total_tokens=160,
        enable_hierarchical_cache=True,
    ) as engine:
        engine.generate(input_ids=prefix + [1], sampling_params=sp)
        for filler in fillers:  # push the prefix out of the pool, into the tier
            engine.generate(input_ids=filler, sampling_params=sp)
        outs = engine.generate(input_ids=prompts, sampling_params=sp)
        stats = engine.get_stats()
        engine.check_integrity()
    for prompt, out in zip(prompts, outs, strict=True):
        assert out["output_ids"] == hf_greedy(prompt, 4)  # type: ignore[operator]
        assert out["meta_info"]["cached_tokens"] == len(prefix)
    assert stats["kv_tier_loaded_tokens"] == len(prefix)
