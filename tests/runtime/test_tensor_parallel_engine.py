"""Tensor parallelism through the Engine: tp=2 (two gloo processes) gives the greedy tokens of
tp=1 in float32, with the radix cache on, chunked prefill and a pool small enough to force
retractions; a rank that dies fails the engine with a clear error instead of a hang."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from radixserve import Engine

# small chunks (several per prompt) and a pool that cannot hold every request's full output
ENGINE_ARGS: dict[str, Any] = dict(
    dtype="float32",
    chunked_prefill_size=16,
    max_total_tokens=384,
    max_running_requests=8,
    random_seed=0,
)
PARAMS = {"max_new_tokens": 60, "temperature": 0.0}


def _prompts(tokenizer: Any) -> list[list[int]]:
    """Eight prompts of 24 tokens; pairs share a prefix (radix hits within the batch)."""
    stems = ["def fibonacci(n):\n    if n < 2:", "import os\nimport sys\nclass Foo(object):"]
    out = []
    for i in range(8):
        text = stems[i % 2] + f"\n    x_{i} = [{i}, {i + 1}] * {i + 2}  # step {i}\n"
        out.append(tokenizer.encode(text * 2)[:24])
    return out


def _run(model_dir: Path, tp_size: int, tokenizer: Any) -> dict[str, Any]:
    prompts = _prompts(tokenizer)
    with Engine(str(model_dir), tokenizer=tokenizer, tp_size=tp_size, **ENGINE_ARGS) as engine:
        first = engine.generate(input_ids=prompts, sampling_params=PARAMS)
        # turn 2: each prompt plus its answer plus more: served from the radix cache
        second_ids = [p + r["output_ids"] + p[:8] for p, r in zip(prompts, first, strict=True)]
        second = engine.generate(input_ids=second_ids, sampling_params=PARAMS)
        logprobs = engine.generate(
            input_ids=prompts[0],
            sampling_params={"max_new_tokens": 4, "temperature": 0.0},
            return_logprob=True,
            logprob_start_len=0,
        )
        engine.check_integrity()
        stats = engine.get_stats()
    return {
        "tokens": [r["output_ids"] for r in first + second],
        "cached": [r["meta_info"]["cached_tokens"] for r in second],
        "input_logprobs": [lp[0] for lp in logprobs["meta_info"]["input_token_logprobs"][1:]],
        "logprob_tokens": logprobs["output_ids"],
        "retractions": stats["num_retractions"],
    }


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tp2_engine_gives_the_tokens_of_tp1(
    tiny_model_dirs: dict[str, Path], tiny_tokenizer: Any, arch: str
) -> None:
    """llama: one KV head, replicated on both ranks; qwen2: tied embeddings, two KV heads split
    one per rank; qwen3: q/k norms, three query heads per rank."""
    one = _run(tiny_model_dirs[arch], 1, tiny_tokenizer)
    two = _run(tiny_model_dirs[arch], 2, tiny_tokenizer)
    assert one["retractions"] > 0, "the pool was meant to force retractions"
    assert all(c > 0 for c in one["cached"]), one["cached"]
    assert two["tokens"] == one["tokens"]
    assert two["cached"] == one["cached"]
    assert two["logprob_tokens"] == one["logprob_tokens"]
    assert two["input_logprobs"] == pytest.approx(one["input_logprobs"], abs=1e-4)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_rank_fails_the_engine_clearly(
    tiny_model_dirs: dict[str, Path], tiny_tokenizer: Any
) -> None:
    engine = Engine(
        str(tiny_model_dirs["qwen2"]), tokenizer=tiny_tokenizer, tp_size=2, dtype="float32"
    )
    try:
        assert engine.generate("def f(x):", {"max_new_tokens": 2})["output_ids"]
        ranks = engine.scheduler.worker.runner.tp_ranks  # type: ignore[attr-defined]
        pid = ranks.procs[0].pid
        os.kill(pid, signal.SIGKILL)
        ranks.procs[0].join(10)
        started = time.monotonic()
        with pytest.raises(RuntimeError) as info:
            engine.generate("def g(y):", {"max_new_tokens": 2})
        assert time.monotonic() - started < 30
        assert "tensor-parallel rank 1" in str(info.value.__cause__)
    finally:
        engine.shutdown()


def test_tp_size_that_does_not_divide_is_refused(tiny_model_dirs: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="tp_size 4 does not divide num_attention_heads 6"):
        Engine(str(tiny_model_dirs["qwen3"]), tp_size=4)
    with pytest.raises(ValueError, match="tp_size must be >= 1"):
        Engine(str(tiny_model_dirs["qwen3"]), tp_size=0)
