"""The Engine and the server on the same model: one validator at both edges (every bad request
that ``/generate`` answers with a 400 makes ``Engine.generate`` raise a ``ValueError`` with the
same message) and one result shape."""

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


def test_engine_and_server_return_one_shape(client: httpx.Client, engine: Engine) -> None:
    """The same request in process and over HTTP: the same dict, key for key (logprobs as
    [logprob, token_id, text] triples on both sides)."""
    request = {
        "input_ids": [5, 17, 42, 99, 7, 13],
        "return_logprob": True,
        "top_logprobs_num": 2,
        "logprob_start_len": 0,
        "return_text_in_logprobs": True,
    }
    params = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
    served = client.post("/generate", json={**request, "sampling_params": params}).json()
    local = engine.generate(sampling_params=params, **request)
    assert isinstance(local, dict)
    assert local.keys() == served.keys() and local["meta_info"].keys() == served["meta_info"].keys()
    assert local["output_ids"] == served["output_ids"] and local["text"] == served["text"]
    for key in ("finish_reason", "prompt_tokens", "completion_tokens"):
        assert local["meta_info"][key] == served["meta_info"][key], key
    for key in ("input_token_logprobs", "output_token_logprobs"):
        ours, theirs = local["meta_info"][key], served["meta_info"][key]
        assert [e[1:] for e in ours] == [e[1:] for e in theirs], key
        assert all(
            (a[0] is None and b[0] is None) or abs(a[0] - b[0]) < 1e-4
            for a, b in zip(ours, theirs, strict=True)
        ), key
    tops = local["meta_info"]["output_top_logprobs"], served["meta_info"]["output_top_logprobs"]
    assert [[e[1:] for e in top] for top in tops[0]] == [[e[1:] for e in top] for top in tops[1]]
