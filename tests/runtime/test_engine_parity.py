"""End to end through Engine: greedy outputs equal Hugging Face's in every scheduler mode."""

from __future__ import annotations

import itertools
import random

import pytest

from radixserve import Engine

MAX_NEW = 12


def shared_prefix_prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randrange(5, 1000) for _ in range(40)]
    prompts = [
        system + [rng.randrange(5, 1000) for _ in range(rng.randint(3, 30))] for _ in range(5)
    ]
    prompts.append([rng.randrange(5, 1000) for _ in range(23)])  # no shared prefix
    prompts.append(prompts[0][:50])  # a prefix of another prompt
    return prompts


COMBOS = list(
    itertools.product(
        [False, True], [16, None], [False, True], ["fcfs", "lpm", "dfs-weight", "hrrn", "adaptive"]
    )
)


@pytest.mark.parametrize(("disable_radix", "chunk", "disable_overlap", "policy"), COMBOS)
def test_greedy_outputs_equal_hf(
    engine_model_dir, hf_greedy, disable_radix, chunk, disable_overlap, policy
) -> None:
    prompts = shared_prefix_prompts()
    expected = [hf_greedy(p, MAX_NEW) for p in prompts]
    params = {"max_new_tokens": MAX_NEW, "temperature": 0.0, "ignore_eos": True}
    with Engine(
        str(engine_model_dir),
        dtype="float32",
        disable_radix_cache=disable_radix,
        chunked_prefill_size=chunk,
        disable_overlap_schedule=disable_overlap,
        schedule_policy=policy,
        max_total_tokens=4096,
    ) as engine:
        # two rounds: the second one hits the cache the first one filled
        for _ in range(2):
            outs = engine.generate(input_ids=prompts, sampling_params=params)
            assert [o["output_ids"] for o in outs] == expected
        engine.check_integrity()
        stats = engine.get_stats()
    if disable_radix:
        assert stats["num_cached_prompt_tokens"] == 0
    else:
        # the second round matches every prompt but its last token
        assert stats["num_cached_prompt_tokens"] >= sum(len(p) - 1 for p in prompts)


def test_multi_turn_conversation_reuses_the_previous_turn(engine_model_dir, hf_greedy) -> None:
    rng = random.Random(3)
    prompt = [rng.randrange(5, 1000) for _ in range(30)]
    params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    previous_len = 0
    with Engine(str(engine_model_dir), dtype="float32", max_total_tokens=4096) as engine:
        for turn in range(3):
            out = engine.generate(input_ids=prompt, sampling_params=params)
            assert out["output_ids"] == hf_greedy(prompt, 8)
            cached = out["meta_info"]["cached_tokens"]
            if turn == 0:
                assert cached == 0
            else:
                # the previous prompt and its answer are cached, bar the last answer token
                # (its KV is never computed)
                assert cached == previous_len + 8 - 1
            previous_len = len(prompt)
            prompt = prompt + out["output_ids"] + [rng.randrange(5, 1000) for _ in range(10)]
        engine.check_integrity()


@pytest.mark.parametrize("overlap", ["off", "thread", "stream"])
def test_lpm_defers_requests_whose_prefix_an_admitted_one_computes(
    engine_model_dir, hf_greedy, overlap
) -> None:
    """A group sharing a system prompt arrives at once: LPM runs one request first and the rest
    reuse its prompt (FCFS, which has no in-batch check, computes the prompt for each)."""
    rng = random.Random(7)
    system = [rng.randrange(5, 1000) for _ in range(64)]
    prompts = [system + [rng.randrange(5, 1000) for _ in range(8)] for _ in range(4)]
    params = {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}
    cached = {}
    for policy in ("fcfs", "lpm"):
        with Engine(
            str(engine_model_dir),
            dtype="float32",
            schedule_policy=policy,
            disable_overlap_schedule=overlap == "off",
            overlap_launch="thread" if overlap == "off" else overlap,
            max_total_tokens=4096,
        ) as engine:
            outs = engine.generate(input_ids=prompts, sampling_params=params)
            assert [o["output_ids"] for o in outs] == [hf_greedy(p, 4) for p in prompts]
            cached[policy] = [o["meta_info"]["cached_tokens"] for o in outs]
            engine.check_integrity()
    assert cached["fcfs"] == [0, 0, 0, 0]
    assert sorted(cached["lpm"]) == [0, 64, 64, 64]


def test_extend_over_a_long_cached_prefix_equals_hf(engine_model_dir, hf_greedy) -> None:
    """A prefix of >= 256 cached tokens takes the single-SDPA extend path."""
    from radixserve.models.attention.torch_native import SDPA_MIN_PREFIX

    rng = random.Random(11)
    first = [rng.randrange(5, 1000) for _ in range(SDPA_MIN_PREFIX + 60)]
    params = {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}
    with Engine(str(engine_model_dir), dtype="float32", max_total_tokens=4096) as engine:
        out = engine.generate(input_ids=first, sampling_params=params)
        second = first + out["output_ids"] + [rng.randrange(5, 1000) for _ in range(30)]
        batch = [second, second[: SDPA_MIN_PREFIX + 40]]  # extends of different lengths
        outs = engine.generate(input_ids=batch, sampling_params=params)
        assert [o["output_ids"] for o in outs] == [hf_greedy(p, 6) for p in batch]
        assert all(o["meta_info"]["cached_tokens"] >= SDPA_MIN_PREFIX for o in outs)
        engine.check_integrity()


@pytest.mark.parametrize("policy", ["fcfs", "hrrn"])
@pytest.mark.parametrize("interleave", [True, False])
def test_interleaved_prefill_keeps_outputs_and_lets_short_prompts_in(
    engine_model_dir, hf_greedy, policy, interleave
) -> None:
    """A 300-token prompt chunked by 32, short prompts queued behind it in the same batch: with
    prefill interleaving the short ones are prefilled beside its chunks and finish steps before
    it and have their first token steps before it (their decode, like every decode, waits for
    the prefill steps); without, FCFS makes them wait for its whole prefill. Outputs equal
    Hugging Face's."""
    from radixserve.config import EngineConfig
    from radixserve.runtime.io_struct import GenerateRequest
    from radixserve.runtime.scheduler import Scheduler
    from radixserve.types import SamplingParams

    rng = random.Random(11)
    long = [rng.randrange(5, 1000) for _ in range(300)]
    prompts = [long, *([rng.randrange(5, 1000) for _ in range(6)] for _ in range(3))]
    config = EngineConfig.from_flat(
        model_path=str(engine_model_dir),
        dtype="float32",
        chunked_prefill_size=32,
        enable_prefill_interleaving=interleave,
        schedule_policy=policy,
        max_total_tokens=4096,
    )
    scheduler = Scheduler(config)
    params = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    for i, ids in enumerate(prompts):
        scheduler.add_request(GenerateRequest(f"r{i}", ids, params))
    outputs: dict[str, list[int]] = {f"r{i}": [] for i in range(4)}
    first_token_at: dict[str, int] = {}
    step = 0
    while scheduler.has_work:
        step += 1
        for out in scheduler.step():
            outputs[out.rid] += out.new_token_ids
            if out.new_token_ids:
                first_token_at.setdefault(out.rid, step)
    scheduler.check_integrity()
    scheduler.shutdown()
    assert [outputs[f"r{i}"] for i in range(4)] == [hf_greedy(p, 4) for p in prompts]
    shorts_first = max(first_token_at[f"r{i}"] for i in (1, 2, 3))
    if interleave:
        assert shorts_first < first_token_at["r0"] - 4
    else:  # they waited for the whole prefill (under HRRN too: none had waited, all ratios 0)
        assert shorts_first >= first_token_at["r0"]
