"""Validation happens once, at the edge, and both edges are the same validator: every bad
request that ``/generate`` answers with a 400 makes ``Engine.generate`` (on the same model)
raise a ``ValueError`` with the same message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from serving_harness import MAX_CONTEXT_LEN

from radixserve import Engine

BAD: dict[str, dict[str, Any]] = {
    "prompt longer than the context": {"input_ids": [5] * (MAX_CONTEXT_LEN + 10)},
    "too many new tokens": {"input_ids": [5] * 10, "sampling_params": {"max_new_tokens": 1020}},
    "empty prompt": {"input_ids": []},
    "token out of vocabulary": {"input_ids": [10**7]},
    "negative temperature": {"input_ids": [5, 6], "sampling_params": {"temperature": -1.5}},
    "top_p zero": {"input_ids": [5, 6], "sampling_params": {"top_p": 0.0}},
    "top_k zero": {"input_ids": [5, 6], "sampling_params": {"top_k": 0}},
    "empty stop string": {"input_ids": [5, 6], "sampling_params": {"stop": [""]}},
    "stop token out of vocabulary": {
        "input_ids": [5, 6],
        "sampling_params": {"stop_token_ids": [10**7]},
    },
    "too many top logprobs": {"input_ids": [5, 6], "return_logprob": True, "top_logprobs_num": 50},
    "logprob start outside the prompt": {
        "input_ids": [5, 6, 7],
        "return_logprob": True,
        "logprob_start_len": 3,
    },
}


@pytest.fixture(scope="module")
def engine(api_model_dir: Path):
    with Engine(str(api_model_dir), max_total_tokens=4096) as eng:
        yield eng


@pytest.mark.parametrize("case", list(BAD))
def test_engine_and_server_refuse_alike(client: httpx.Client, engine: Engine, case: str) -> None:
    body = BAD[case]
    response = client.post("/generate", json={"sampling_params": {"max_new_tokens": 2}, **body})
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    kwargs = {k: v for k, v in body.items() if k != "sampling_params"}
    params = {"max_new_tokens": 2, **body.get("sampling_params", {})}
    with pytest.raises(ValueError) as info:
        engine.generate(sampling_params=params, **kwargs)
    assert str(info.value) == message
    engine.check_integrity()
