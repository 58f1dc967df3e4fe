"""SGLang compatibility of the HTTP routes against a real server whose tokenizer renders
tools (a Qwen2.5-style template): what SGLang's clients send, its newer routes, the model id,
the OpenAI routes' strictness, tools and structured output through the official client, and
``--allow-auto-truncate``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from serving_harness import MAX_CONTEXT_LEN as CONTEXT
from serving_harness import Server

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}},
                "required": ["tz"],
                "additionalProperties": False,
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def assert_openai_400(resp: httpx.Response, *words: str) -> dict[str, Any]:
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    for word in words:
        assert word in error["message"], error
    return dict(error)


# ---- native: what SGLang's clients send ----------------------------------------------------

# sglang.lang's RuntimeEndpoint.generate (v0.5): global_config's two flags, then
# SglSamplingParams.to_srt_kwargs() with every unset field null
FRONTEND_SAMPLING_PARAMS = {
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "max_new_tokens": 4,
    "min_new_tokens": 0,
    "n": 1,
    "stop": [],
    "stop_token_ids": None,
    "stop_regex": None,
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "ignore_eos": False,
    "regex": None,
    "json_schema": None,
}


def test_generate_accepts_every_field_sglang_sends_at_its_default(http: httpx.Client) -> None:
    body = {
        "text": "def main():",
        "sampling_params": {
            **FRONTEND_SAMPLING_PARAMS,
            "ebnf": None,
            "structural_tag": None,
            "no_stop_trim": False,
            "custom_params": None,
            "logit_bias": None,
            "stream_interval": None,
            "lora_path": None,
            "return_hidden_states": False,
            "sampling_seed": 7,
        },
        # bench_serving's top level
        "lora_path": None,
        "return_logprob": False,
        "logprob_start_len": -1,
        "stream": False,
        "image_data": None,
        "custom_logit_processor": None,
        "return_hidden_states": False,
    }
    resp = http.post("/generate", json=body)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["meta_info"]["completion_tokens"] == 4 and isinstance(out["text"], str)
    # null means unset: the same greedy text as without those fields
    plain = http.post(
        "/generate",
        json={"text": "def main():", "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
    )
    assert plain.json()["text"] == out["text"]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"sampling_params": {"n": 2}}, "sampling_params.n", ["n is not supported"]),
        ({"sampling_params": {"stop_regex": "x+"}}, "sampling_params.stop_regex", ["stop_regex"]),
        (
            {"sampling_params": {"logit_bias": {"one": 5.0}}},  # a key that is no token id
            "sampling_params.logit_bias.one",
            ["logit_bias"],
        ),
        ({"sampling_params": {"lora_path": "a"}}, "sampling_params.lora_path", ["lora_path"]),
        ({"sampling_params": {"min_new_tokens": 3}}, "sampling_params.min_new_tokens", ["min_new"]),
        ({"sampling_params": {"bogus": 1}}, "sampling_params.bogus", ["unknown field"]),
        ({"lora_path": "adapter"}, "lora_path", ["'adapter' is not loaded (loaded: none)"]),
        ({"image_data": "x.png"}, "image_data", ["image_data"]),
        ({"bogus": True}, "bogus", ["unknown field: bogus"]),
        ({"sampling_params": {"json_schema": "{not json"}}, "sampling_params", ["json_schema"]),
    ],
)
def test_generate_refuses_set_unsupported_and_unknown_fields(
    http: httpx.Client, body: dict[str, Any], param: str, words: list[str]
) -> None:
    error = assert_openai_400(http.post("/generate", json={"text": "hi", **body}), *words)
    assert error["param"] == param or param == "sampling_params"


def test_batch_sampling_params_name_the_item(http: httpx.Client) -> None:
    body = {"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 1}, {"stop_regex": "x"}]}
    error = assert_openai_400(http.post("/generate", json=body), "stop_regex")
    assert error["param"] == "sampling_params.1.stop_regex"


# ---- routes --------------------------------------------------------------------------------


def test_server_info_routes_have_sglang_internal_states_and_version(http: httpx.Client) -> None:
    http.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 8}})
    old, new = http.get("/get_server_info").json(), http.get("/server_info").json()
    assert set(old) == set(new)
    for info in (old, new):
        assert isinstance(info["version"], str) and info["version"]
        (rank,) = info["internal_states"]
        assert rank["load"] == 0 and rank["last_gen_throughput"] >= 0
        assert rank["model_path"] == info["model_path"] and rank["page_size"] >= 1
        assert info["integrity_ok"] is True
    assert http.get("/model_info").json() == http.get("/get_model_info").json()
    assert http.get("/health_generate").status_code == 200
    assert http.get("/get_load").json()["load"] == 0


def test_model_id_is_the_path_as_given(oai: openai.OpenAI, tools_model_dir: Path) -> None:
    (card,) = oai.models.list().data
    assert card.id == str(tools_model_dir)
    resp = oai.completions.create(model=card.id, prompt="x", max_tokens=2)
    assert resp.model == str(tools_model_dir)
    # the directory's name still works (older clients and tests)
    assert oai.completions.create(model="tiny-tools", prompt="x", max_tokens=1).choices


# ---- OpenAI routes: strict ------------------------------------------------------------------


def test_openai_unknown_field_is_a_400_in_openai_shape(oai: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(
            model="tiny-tools", messages=messages, max_tokens=2, extra_body={"frobnicate": 1}
        )
    assert info.value.status_code == 400
    error = info.value.body
    assert isinstance(error, dict) and "frobnicate" in error["message"]
    assert error["param"] == "frobnicate" and error["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError, match="unknown field"):
        oai.completions.create(model="tiny-tools", prompt="x", extra_body={"best_of_n": 2})


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"web_search_options": {"search_context_size": "low"}}, "web_search_options"),
        ({"reasoning_effort": "ultra"}, "reasoning_effort"),  # served, but not this value
        ({"extra_body": {"min_tokens": 3}}, "min_tokens"),
        ({"store": True}, "store"),
    ],
)
def test_openai_known_but_unimplemented_field_is_named(
    oai: openai.OpenAI, kwargs: dict[str, Any], name: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(
            model="tiny-tools", messages=[{"role": "user", "content": "hi"}], **kwargs
        )
    assert name in str(info.value.body) and info.value.body["param"] == name  # type: ignore[index]


def test_logit_bias_moves_the_choice_on_both_apis(http: httpx.Client, oai: openai.OpenAI) -> None:
    """OpenAI's logit_bias (token id -> -100..100, added to its logit) on /generate and the
    OpenAI routes: +100 makes greedy decoding pick that token; bad keys and values are 400s."""
    token = 300
    native = http.post(
        "/generate",
        json={
            "text": "def main():",
            "sampling_params": {"max_new_tokens": 5, "temperature": 0, "logit_bias": {"300": 100}},
            "return_logprob": True,
        },
    ).json()
    assert [t for _, t, _ in native["meta_info"]["output_token_logprobs"]] == [token] * 5
    out = oai.completions.create(
        model="tiny-tools", prompt="x = 1", max_tokens=3, temperature=0, logit_bias={"300": 100}
    )
    unbiased = oai.completions.create(
        model="tiny-tools", prompt="x = 1", max_tokens=3, temperature=0
    )
    assert out.choices[0].text != unbiased.choices[0].text
    for bias, words in (({"300": 101}, "[-100, 100]"), ({"99999999": 1}, "token ids in")):
        with pytest.raises(openai.BadRequestError, match=re.escape(words)):
            oai.chat.completions.create(
                model="tiny-tools",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=2,
                logit_bias=bias,
            )


def test_tool_choice_errors_name_the_problem(http: httpx.Client) -> None:
    base = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    named = {"type": "function", "function": {"name": "nope"}}
    assert_openai_400(
        http.post("/v1/chat/completions", json={**base, "tools": TOOLS, "tool_choice": named}),
        "nope",
    )
    assert_openai_400(
        http.post("/v1/chat/completions", json={**base, "tool_choice": "required"}), "needs tools"
    )


def test_separate_reasoning_without_a_reasoning_parser_is_a_400(http: httpx.Client) -> None:
    resp = http.post("/generate", json={"text": "x", "separate_reasoning": True})
    assert resp.status_code == 400 and "--reasoning-parser" in resp.json()["error"]["message"]


def test_the_fields_sglangs_router_adds_are_accepted(http: httpx.Client) -> None:
    """sglang-router forwards every /generate with these set (as seen through it)."""
    routed = {"model": "whatever", "background": False, "no_logs": False}
    routed |= {"return_bytes": False, "return_entropy": False}
    body = {"text": "def f():", "sampling_params": {"max_new_tokens": 2}}
    assert http.post("/generate", json={**body, **routed}).status_code == 200
    refused = http.post("/generate", json={**body, "background": True})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "background"


def test_every_table_field_at_what_it_accepts(http: httpx.Client) -> None:
    """Each field of generate_fields.FIELDS: a value it accepts goes through (one request with
    all of them, batch-shaped unset lists included); one it does not is a 400 naming it."""
    from radixserve.api.native.generate_fields import FIELDS, NO_OP, RANK_ZERO

    body = {"input_ids": [[5, 6], [7, 8]], "sampling_params": {"max_new_tokens": 2}}
    taken = {name: "anything" if t is NO_OP else 0 for name, t in FIELDS.items()}
    taken |= {"image_data": [None, None], "custom_logit_processor": [None, None]}
    assert http.post("/generate", json={**body, **taken}).status_code == 200
    for name, treatment in FIELDS.items():
        if treatment is NO_OP:
            continue
        value = 1 if treatment is RANK_ZERO else "x"
        error = assert_openai_400(http.post("/generate", json={**body, name: value}), name)
        assert error["param"] == name
        if treatment is RANK_ZERO:
            assert "each radixserve worker is one rank" in error["message"]


def test_extra_key_and_cache_salt_split_the_cache_per_item(http: httpx.Client) -> None:
    """SGLang's extra_key (and cache_salt), one or per batch item: a prompt cached under one
    key is a miss under another and a hit under the same."""
    prompt = [9, 10, 11, 12] * 8

    def cached(**fields: Any) -> list[int]:
        body = {"input_ids": [prompt, prompt], "sampling_params": {"max_new_tokens": 1}}
        out = http.post("/generate", json={**body, **fields})
        assert out.status_code == 200, out.text
        return [o["meta_info"]["cached_tokens"] for o in out.json()]

    cached(extra_key=["k1", "k2"])  # both keys now hold the prompt
    assert cached(extra_key="k3")[0] == 0  # a new key misses
    assert min(cached(extra_key=["k2", "k1"])) == len(prompt) - 1
    assert cached(extra_key="k1", cache_salt=["s", "s"])[0] == 0  # the salt splits further
    bad = http.post("/generate", json={"input_ids": [prompt], "extra_key": ["a", "b"]})
    assert_openai_400(bad, "extra_key")


def test_return_prompt_token_ids(http: httpx.Client) -> None:
    body = {"input_ids": [4, 5, 6], "sampling_params": {"max_new_tokens": 2}}
    out = http.post("/generate", json={**body, "return_prompt_token_ids": True}).json()
    assert out["prompt_token_ids"] == [4, 5, 6]
    assert "prompt_token_ids" not in http.post("/generate", json=body).json()
    with http.stream(
        "POST", "/generate", json={**body, "stream": True, "return_prompt_token_ids": True}
    ) as resp:
        events = [line for line in resp.iter_lines() if line.startswith("data: {")]
    assert events and all('"prompt_token_ids": [4, 5, 6]' in e for e in events)


def test_auto_truncate_gives_what_the_context_leaves(
    compat_server: Server, server: Server, http: httpx.Client
) -> None:
    """SGLang's ``--allow-auto-truncate`` (``compat_server`` runs with it): a request for more
    new tokens than the context leaves (agents' clients send 32k and more) gets what it
    leaves, through Anthropic's client and the chat route; without it (``server``) the same
    request is a 400, and a prompt past the context is refused either way."""
    import anthropic

    question: Any = [{"role": "user", "content": "Count."}]
    plain = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    model = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
    with pytest.raises(anthropic.BadRequestError, match="maximum context length"):
        plain.messages.create(model=model, messages=question, max_tokens=32000, timeout=60)
    claude = anthropic.Anthropic(base_url=compat_server.url, api_key="none", max_retries=0)
    with claude.messages.stream(  # as agents' clients send it (a non-streamed request for
        # this many tokens the client itself refuses)
        model="tiny-tools",
        messages=question,
        max_tokens=32000,
    ) as stream:
        msg = stream.get_final_message()
    used = msg.usage.input_tokens + msg.usage.output_tokens
    assert used == CONTEXT if msg.stop_reason == "max_tokens" else used < CONTEXT, msg
    # past the random model's EOS: exactly what the context leaves
    chat = {"model": "tiny-tools", "messages": question, "max_tokens": 5000, "ignore_eos": True}
    resp = http.post("/v1/chat/completions", json=chat, timeout=120)
    assert resp.status_code == 200, resp.text
    usage = resp.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == CONTEXT
    assert resp.json()["choices"][0]["finish_reason"] == "length"
    long = {"model": "tiny-tools", "prompt": "hi " * 2000, "max_tokens": 1}
    refused = http.post("/v1/completions", json=long)
    assert refused.status_code == 400 and "maximum context length" in refused.text
