"""Engine API: batches, streaming, abort, logprobs, stop conditions and bad input."""

from __future__ import annotations

import math
import threading

import pytest
import torch
from stop_oracle import word_bias

from radixserve import Engine


@pytest.fixture(scope="module")
def engine(engine_model_dir):
    with Engine(str(engine_model_dir), dtype="float32", max_total_tokens=2048) as eng:
        yield eng


def test_text_prompt_batch_and_single(engine) -> None:
    outs = engine.generate(["def main():", "import os"], {"max_new_tokens": 5, "temperature": 0})
    assert len(outs) == 2
    for out in outs:
        assert out["meta_info"]["completion_tokens"] == len(out["output_ids"]) <= 5
        assert isinstance(out["text"], str)
    single = engine.generate("def main():", {"max_new_tokens": 5, "temperature": 0})
    assert single["output_ids"] == outs[0]["output_ids"]


def test_streaming_yields_the_same_tokens(engine) -> None:
    params = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
    whole = engine.generate("class Foo:", params)
    chunks = list(engine.generate("class Foo:", params, stream=True))
    assert [t for c in chunks for t in c["output_ids"]] == whole["output_ids"]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


def test_abort_a_stream_midway_frees_its_kv(engine) -> None:
    # 1,800 tokens take the tiny model about 2 s on a quiet machine (200 took 0.2 s, which a
    # busy one could spend between the first chunk and the abort): the abort lands midway
    stream = engine.generate(
        "for i in range(10):",
        {"max_new_tokens": 1800, "ignore_eos": True},
        stream=True,
        rid="to-abort",
    )
    got = len(next(stream)["output_ids"])
    engine.abort("to-abort")
    chunks = list(stream)
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert got + sum(len(c["output_ids"]) for c in chunks) < 1800
    engine.check_integrity()


def test_seeded_sampling_reproduces(engine) -> None:
    params = {"max_new_tokens": 8, "temperature": 1.0, "seed": 1234, "ignore_eos": True}
    a = engine.generate("x = ", params)
    b = engine.generate(["y = 1", "x = "], [params, params])[1]
    assert a["output_ids"] == b["output_ids"]


def test_logprobs_match_a_direct_computation(engine, engine_model_dir) -> None:
    from transformers import AutoModelForCausalLM

    prompt = engine.tokenizer.encode("def add(a, b): return a + b")
    out = engine.generate(
        input_ids=prompt,
        sampling_params={"max_new_tokens": 3, "temperature": 0, "ignore_eos": True},
        return_logprob=True,
        logprob_start_len=2,
    )
    model = AutoModelForCausalLM.from_pretrained(engine_model_dir, dtype=torch.float32).eval()
    full = prompt + out["output_ids"]
    with torch.inference_mode():
        logp = torch.log_softmax(model(torch.tensor([full])).logits[0].float(), dim=-1)
    want_input = [float(logp[p - 1, full[p]]) for p in range(2, len(prompt))]
    got_input = [lp for lp, _, _ in out["meta_info"]["input_token_logprobs"]]
    assert len(got_input) == len(want_input)
    assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(got_input, want_input, strict=True))
    got_output = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
    want_output = [float(logp[p - 1, full[p]]) for p in range(len(prompt), len(full))]
    assert all(
        math.isclose(a, b, abs_tol=1e-4) for a, b in zip(got_output, want_output, strict=True)
    )


def test_stop_token_ids_and_max_new_tokens_zero(engine) -> None:
    first = engine.generate(
        "while True:", {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    )
    stop_at = first["output_ids"][2]
    out = engine.generate(
        "while True:",
        {"max_new_tokens": 6, "temperature": 0, "stop_token_ids": [stop_at], "ignore_eos": True},
    )
    assert out["output_ids"] == first["output_ids"][: first["output_ids"].index(stop_at) + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_at}
    zero = engine.generate("while True:", {"max_new_tokens": 0})
    assert zero["output_ids"] == [] and zero["meta_info"]["finish_reason"]["type"] == "length"


def test_stop_strings_are_trimmed(engine) -> None:
    # biased to words, so the text is long enough to cut whatever the random weights say
    bias = word_bias(engine.tokenizer)
    params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True, "logit_bias": bias}
    text = engine.generate("print(", params)["text"]
    assert len(text.strip()) >= 4, text
    stop = text.strip()[1:3]
    out = engine.generate("print(", {**params, "stop": [stop]})
    assert stop not in out["text"] and text.startswith(out["text"])
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": -1},
        {"top_p": 0},
        {"top_p": 1.5},
        {"top_k": 0},
        {"max_new_tokens": -1},
        {"bogus": 1},
    ],
)
def test_bad_sampling_params_raise_value_error(engine, params) -> None:
    with pytest.raises(ValueError):
        engine.generate("hi", params)


def test_requests_that_can_never_run_are_rejected(engine) -> None:
    with pytest.raises(ValueError, match="context length"):
        engine.generate(input_ids=[5] * 5000, sampling_params={"max_new_tokens": 1})
    with pytest.raises(ValueError, match="KV slots"):
        engine.generate(input_ids=[5] * 1000, sampling_params={"max_new_tokens": 1500})
    with pytest.raises(ValueError, match="empty"):
        engine.generate(input_ids=[], sampling_params={"max_new_tokens": 1})
    with pytest.raises(ValueError, match="input ids"):
        engine.generate(input_ids=[10**7], sampling_params={"max_new_tokens": 1})
    engine.check_integrity()


def test_generate_from_many_threads(engine) -> None:
    params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    want = engine.generate("a = [", params)["output_ids"]
    got: list[list[int]] = []

    def worker() -> None:
        got.append(engine.generate("a = [", params)["output_ids"])

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [want] * 8
    assert engine.get_stats()["cache_hit_rate"] > 0
