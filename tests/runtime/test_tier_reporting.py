"""What a KV tier reports per request and in the scheduler's counters: ``meta_info``'s
``cached_tokens_details`` (SGLang's ``device`` / ``host`` split of ``cached_tokens``) against
what the pool and the tier must hold in a scripted eviction, outputs against HF's greedy."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from radixserve import Engine

POOL = 160  # holds one 100-token conversation, not two: the second evicts the first
GREEDY = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}


def _prompt(seed: int, n: int = 100) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 200) for _ in range(n)]


@pytest.mark.parametrize("tier", ["file", "host"])
def test_cached_tokens_split_by_tier(
    tier: str, engine_model_dir: Path, hf_greedy, tmp_path: Path
) -> None:
    kw = {"kv_tier_path": str(tmp_path)} if tier == "file" else {"enable_hierarchical_cache": True}
    a, b = _prompt(1), _prompt(2)
    with Engine(str(engine_model_dir), dtype="float32", max_total_tokens=POOL, **kw) as engine:
        first = engine.generate(input_ids=a, sampling_params=GREEDY)
        engine.generate(input_ids=b, sampling_params=GREEDY)  # evicts a to the tier
        again = engine.generate(input_ids=a, sampling_params=GREEDY)
        # a prefix of a still in the pool next to b's 103 tokens (a's own tokens past the
        # prompt's last but one are not asked for)
        short = engine.generate(input_ids=a[:50], sampling_params=GREEDY)
        engine.check_integrity()
        stats = engine.get_stats()

    assert first["meta_info"]["cached_tokens"] == 0
    assert first["meta_info"]["cached_tokens_details"] == {"device": 0, "host": 0}
    # the whole prompt but its last token was cached, all of it in the tier: b's turn evicted
    # every unlocked token of a from the pool
    meta = again["meta_info"]
    assert meta["cached_tokens"] == len(a) - 1
    assert meta["cached_tokens_details"] == {"device": 0, "host": len(a) - 1}
    # loaded back, a is in the pool again: a shorter prompt over it hits the device part
    assert short["meta_info"]["cached_tokens_details"] == {"device": 49, "host": 0}
    assert again["output_ids"] == first["output_ids"] == hf_greedy(a, 4)
    assert short["output_ids"] == hf_greedy(a[:50], 4)
    # the counters agree with the requests
    assert stats["num_cached_prompt_tokens_tier"] == len(a) - 1
    assert stats["num_cached_prompt_tokens"] == len(a) - 1 + 49
    assert stats["kv_tier_loaded_tokens"] >= len(a) - 1
    assert stats["kv_tier_written_tokens"] >= len(a) - 1
    assert stats["kv_tier_capacity_tokens"] >= 2 * POOL  # the default: twice the pool


def test_no_tier_reports_every_hit_on_the_device(engine_model_dir: Path) -> None:
    a = _prompt(3, 40)
    with Engine(str(engine_model_dir), dtype="float32", max_total_tokens=POOL) as engine:
        engine.generate(input_ids=a, sampling_params=GREEDY)
        again = engine.generate(input_ids=a, sampling_params=GREEDY)
        stats = engine.get_stats()
    assert again["meta_info"]["cached_tokens_details"] == {"device": len(a) - 1, "host": 0}
    assert "kv_tier_capacity_tokens" not in stats
    assert stats["num_cached_prompt_tokens_tier"] == 0
