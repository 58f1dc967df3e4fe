"""The KV tier with a real model: greedy outputs equal Hugging Face's with the tier on, after
evict -> load-back, swap-out -> swap-in and a restart over a file tier (float32, tiny Llama)."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from radixserve import Engine

pytestmark = pytest.mark.timeout(180)

MAX_NEW = 8
GREEDY = {"max_new_tokens": MAX_NEW, "temperature": 0.0, "ignore_eos": True}


def prompts(seed: int, n: int = 6, length: int = 60) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 1000) for _ in range(length)] for _ in range(n)]


@pytest.mark.parametrize(
    ("page_size", "overlap", "policy"),
    [(1, True, "write_back"), (4, False, "write_through")],
)
def test_greedy_outputs_equal_hf_after_load_back(
    engine_model_dir, hf_greedy, page_size, overlap, policy
) -> None:
    batch = prompts(0)
    expected = [hf_greedy(p, MAX_NEW) for p in batch]
    with Engine(
        str(engine_model_dir),
        dtype="float32",
        max_total_tokens=160,  # a third of the two rounds: the second loads back from the tier
        page_size=page_size,
        disable_overlap_schedule=not overlap,
        enable_hierarchical_cache=True,
        kv_tier_write_policy=policy,
    ) as engine:
        for _ in range(2):
            outs = engine.generate(input_ids=batch, sampling_params=GREEDY)
            assert [o["output_ids"] for o in outs] == expected
        engine.check_integrity()
        stats = engine.get_stats()
    assert stats["num_cached_prompt_tokens_tier"] > 0
    assert stats["num_cached_prompt_tokens"] >= stats["num_cached_prompt_tokens_tier"]


def test_swap_preemption_outputs_equal_hf(engine_model_dir, hf_greedy) -> None:
    low = prompts(1, n=4, length=40)
    urgent = prompts(2, n=1, length=90)[0]
    with Engine(
        str(engine_model_dir),
        dtype="float32",
        max_total_tokens=200,
        chunked_prefill_size=None,
        enable_priority_scheduling=True,
        enable_hierarchical_cache=True,
        preemption_mode="swap",
    ) as engine:
        params = dict(GREEDY, max_new_tokens=40)
        streams = [engine.generate(input_ids=p, sampling_params=params, stream=True) for p in low]
        firsts = [next(s) for s in streams]  # all four are decoding
        top = engine.generate(input_ids=urgent, sampling_params=GREEDY, priority=100)
        outs = [
            f["output_ids"] + [t for c in s for t in c["output_ids"]]
            for f, s in zip(firsts, streams, strict=True)
        ]
        engine.check_integrity()
        stats = engine.get_stats()
    assert top["output_ids"] == hf_greedy(urgent, MAX_NEW)
    assert outs == [hf_greedy(p, 40) for p in low]
    assert stats["num_preemptions"] > 0 and stats["num_swapped_out_tokens"] > 0


def test_a_restarted_engine_hits_its_file_tier(engine_model_dir, hf_greedy, tmp_path) -> None:
    batch = prompts(3, n=3)
    config = dict(
        dtype="float32",
        max_total_tokens=256,
        kv_tier_path=str(tmp_path / "tier"),
        kv_tier_write_policy="write_through",
    )
    with Engine(str(engine_model_dir), **config) as engine:
        engine.generate(input_ids=batch, sampling_params=GREEDY)
    assert (tmp_path / "tier" / "index.npz").exists()  # written at shutdown
    with Engine(str(engine_model_dir), **config) as engine:
        first = engine.generate(input_ids=batch[0], sampling_params=GREEDY)
        engine.check_integrity()
        stats = engine.get_stats()
    assert first["output_ids"] == hf_greedy(batch[0], MAX_NEW)
    assert first["meta_info"]["cached_tokens"] >= 56  # all but the last page-ish of the prompt
    assert stats["num_cached_prompt_tokens_tier"] == first["meta_info"]["cached_tokens"]


def test_kv_copied_from_another_run_is_never_served(engine_model_dir, hf_greedy, tmp_path) -> None:
    """``kv.bin`` and ``checksums.bin`` of another run (the same model and shapes, other
    prompts) copied over a tier with an index: none of it is served, the outputs are the
    no-tier outputs. While that engine runs, a second one on its directory is refused."""
    mine, theirs = prompts(5, n=2), prompts(6, n=2)
    config = dict(dtype="float32", max_total_tokens=256, kv_tier_write_policy="write_through")
    for name, batch in (("mine", mine), ("theirs", theirs)):
        with Engine(str(engine_model_dir), kv_tier_path=str(tmp_path / name), **config) as engine:
            engine.generate(input_ids=batch, sampling_params=GREEDY)
    for name in ("kv.bin", "checksums.bin"):
        shutil.copy(tmp_path / "theirs" / name, tmp_path / "mine" / name)
    with Engine(str(engine_model_dir), kv_tier_path=str(tmp_path / "mine"), **config) as engine:
        outs = engine.generate(input_ids=mine, sampling_params=GREEDY)
        assert [o["meta_info"]["cached_tokens"] for o in outs] == [0, 0]
        assert [o["output_ids"] for o in outs] == [hf_greedy(p, MAX_NEW) for p in mine]
        assert engine.get_stats()["kv_tier_corrupt_pages"] > 0
        with pytest.raises(ValueError, match=f"{tmp_path / 'mine'}: another KV tier"):
            Engine(str(engine_model_dir), kv_tier_path=str(tmp_path / "mine"), **config)


def test_a_copy_corrupted_while_running_is_recomputed(
    engine_model_dir, hf_greedy, tmp_path
) -> None:
    """``kv.bin`` overwritten under a running engine (after the first round was evicted to it): the
    load-back checks each page's checksum, drops the corrupt copies and computes the prompts again;
    every output still equals HF's."""
    batch = prompts(4)
    expected = [hf_greedy(p, MAX_NEW) for p in batch]
    tier = tmp_path / "tier"
    with Engine(
        str(engine_model_dir), dtype="float32", max_total_tokens=160, kv_tier_path=str(tier)
    ) as engine:
        outs = engine.generate(input_ids=batch, sampling_params=GREEDY)
        assert [o["output_ids"] for o in outs] == expected
        storage = tier / "kv.bin"  # memory-mapped by the engine: the write reaches its pages
        storage.write_bytes(os.urandom(storage.stat().st_size))
        outs = engine.generate(input_ids=batch, sampling_params=GREEDY)
        engine.check_integrity()
        stats = engine.get_stats()
    assert [o["output_ids"] for o in outs] == expected
    assert stats["kv_tier_corrupt_pages"] > 0  # (copies written after the overwrite may hit)


def test_a_tier_of_another_model_is_discarded(
    engine_model_dir, tiny_model_dirs, tmp_path, caplog
) -> None:
    config = dict(dtype="float32", max_total_tokens=256, kv_tier_path=str(tmp_path / "t"))
    with Engine(str(engine_model_dir), **config) as engine:
        engine.generate(input_ids=prompts(4, n=1)[0], sampling_params=GREEDY)
    other: Path = tiny_model_dirs["llama"]
    with caplog.at_level("INFO"), Engine(str(other), **config) as engine:
        out = engine.generate(input_ids=prompts(4, n=1)[0], sampling_params=GREEDY)
    assert out["meta_info"]["cached_tokens"] == 0
    assert any("another model" in r.getMessage() for r in caplog.records)
