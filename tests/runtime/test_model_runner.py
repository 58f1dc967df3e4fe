from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixserve.config import EngineConfig
from radixserve.memory_pool import num_slots_for_budget
from radixserve.models.forward_batch import ForwardBatch
from radixserve.models.loader import resolve_dtype
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.model_runner import ModelRunner


def runner_for(path: Path, **kw: object) -> ModelRunner:
    config = EngineConfig.from_flat(
        model_path=str(path), **{"dtype": "float32", "max_total_tokens": 512, **kw}
    )  # type: ignore[arg-type]
    kv = KVManager.build(config)
    assert kv.kv_cache is not None
    return ModelRunner(config, kv.kv_cache, kv.req_to_token_pool)


def extend_fresh(
    runner: ModelRunner, prompts: list[list[int]], starts: list[int | None] | None = None
) -> object:
    """Prefill ``prompts`` from scratch in rows 0.. and slots 1.. (a hand-made scheduler)."""
    slots, off = [], 1
    for row, p in enumerate(prompts):
        s = torch.arange(off, off + len(p))
        runner.req_to_token_pool.write(row, 0, s)
        slots.append(s)
        off += len(p)
    batch = ForwardBatch.extend(
        [t for p in prompts for t in p],
        list(range(len(prompts))),
        [0] * len(prompts),
        [len(p) for p in prompts],
        torch.cat(slots),
        input_logprob_start=starts,
    )
    return runner.forward(batch)


def num_kv_slots(r: ModelRunner) -> int:
    return r.kv_cache.num_slots


def test_pool_sizing(tiny_model_dirs: dict[str, Path]) -> None:
    """The KVManager sizes the pools from the model's config; the runner gets them."""
    path = tiny_model_dirs["llama"]
    r = runner_for(path, max_total_tokens=100)
    assert num_kv_slots(r) == 101 and r.kv_cache.k_buffer[0].shape[0] == 101
    assert (
        num_kv_slots(runner_for(path, max_total_tokens=10, page_size=4)) == 16
    )  # 3 pages + padding page
    r = runner_for(path, max_total_tokens=None, kv_cache_bytes=1 << 20, max_running_requests=3)
    mc = r.model_config
    assert num_kv_slots(r) == num_slots_for_budget(
        1 << 20, mc.num_layers, mc.num_kv_heads, mc.head_dim, torch.float32
    )
    assert r.req_to_token_pool.req_to_token.shape == (3, mc.max_position_embeddings)
    assert r.max_context_len == mc.max_position_embeddings and r.vocab_size == mc.vocab_size


def test_auto_dtype_and_threads(tiny_model_dirs: dict[str, Path]) -> None:
    threads = torch.get_num_threads()
    try:
        r = runner_for(tiny_model_dirs["qwen2"], dtype="auto", num_threads=1)
        assert torch.get_num_threads() == 1
        assert r.dtype == resolve_dtype("auto", "cpu") and r.kv_cache.dtype == r.dtype
    finally:
        torch.set_num_threads(threads)


def test_errors(tiny_model_dirs: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="model_path"):
        KVManager.build(EngineConfig())
    with pytest.raises(ValueError, match="max_total_tokens"):
        runner_for(tiny_model_dirs["llama"], max_total_tokens=0)
    r = runner_for(tiny_model_dirs["llama"], max_context_len=8)
    with pytest.raises(ValueError, match="context length"):  # checked before anything is touched
        r.forward(ForwardBatch.extend(list(range(9)), [0], [0], [9], torch.arange(1, 10)))


def test_lm_head_only_where_needed(
    tiny_model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    r = runner_for(tiny_model_dirs["qwen3"])
    rows: list[int] = []
    original = r.model.compute_logits
    monkeypatch.setattr(r.model, "compute_logits", lambda h: rows.append(h.shape[0]) or original(h))
    extend_fresh(r, [[5, 6, 7, 8], [9, 10, 11]])
    assert rows == [2]  # the last token of each request
    rows.clear()
    extend_fresh(r, [[5, 6, 7, 8], [9, 10, 11]], starts=[1, None])
    assert rows == [2, 2]  # plus extend offsets 1 and 2 of the first prompt (predicting 3 and 4)


def test_prompt_logprobs_in_chunks(
    tiny_model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixserve.runtime import model_runner

    prompts = [list(range(3, 40)), list(range(50, 60))]
    whole = extend_fresh(runner_for(tiny_model_dirs["llama"]), prompts, starts=[0, 4])
    monkeypatch.setattr(model_runner, "PROMPT_LOGPROB_CHUNK", 5)
    chunked = extend_fresh(runner_for(tiny_model_dirs["llama"]), prompts, starts=[0, 4])
    for a, b in zip(whole.input_token_logprobs, chunked.input_token_logprobs, strict=True):  # type: ignore[attr-defined]
        torch.testing.assert_close(a, b)
    assert [len(t) for t in chunked.input_token_logprobs] == [36, 5]  # type: ignore[attr-defined]


def test_prompt_logprobs_match_transformers(tiny_model_dirs: dict[str, Path]) -> None:
    from transformers import AutoModelForCausalLM

    path = tiny_model_dirs["qwen2"]
    prompts = [[11, 250, 37, 1999, 4, 77, 300], [8, 9, 10, 11, 12]]
    out = extend_fresh(runner_for(path), prompts, starts=[0, 2])
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for prompt, start, got in zip(prompts, [0, 2], out.input_token_logprobs, strict=True):  # type: ignore[attr-defined]
        with torch.no_grad():
            logp = torch.log_softmax(hf(torch.tensor([prompt])).logits[0], dim=-1)
        expected = (
            logp[start:-1].gather(1, torch.tensor(prompt[start + 1 :]).unsqueeze(1)).squeeze(1)
        )
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
        assert got.shape == (len(prompt) - 1 - start,)


def test_prompt_logprobs_after_a_cached_prefix(tiny_model_dirs: dict[str, Path]) -> None:
    """Offsets count inside the extend: with 3 cached tokens, start 0 scores tokens 4.. of the prompt."""
    r = runner_for(tiny_model_dirs["llama"])
    prompt = [3, 14, 15, 92, 65, 35, 89, 79]
    full = extend_fresh(r, [prompt], starts=[0]).input_token_logprobs[0]  # type: ignore[attr-defined]
    r.req_to_token_pool.write(
        1, 0, r.req_to_token_pool.req_to_token[0, :3]
    )  # share the first 3 slots
    slots = torch.arange(100, 105)
    r.req_to_token_pool.write(1, 3, slots)
    out = r.forward(ForwardBatch.extend(prompt[3:], [1], [3], [5], slots, input_logprob_start=[0]))
    torch.testing.assert_close(out.input_token_logprobs[0], full[3:], rtol=0, atol=1e-5)


def test_bfloat16_close_to_float32(tiny_model_dirs: dict[str, Path]) -> None:
    prompts = [[11, 250, 37, 1999, 4, 77, 300], [8, 9, 10]]
    f32 = extend_fresh(runner_for(tiny_model_dirs["qwen3"]), prompts).next_token_logits  # type: ignore[attr-defined]
    bf16 = extend_fresh(
        runner_for(tiny_model_dirs["qwen3"], dtype="bfloat16"), prompts
    ).next_token_logits  # type: ignore[attr-defined]
    assert bf16.dtype == torch.float32
    assert (bf16 - f32).abs().max() < 0.1 * f32.abs().max()
