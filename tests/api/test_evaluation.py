"""Evaluation routes against a real float32 server: the prompt's logprobs through
``/v1/completions`` ``echo`` (vLLM's shape) and ``/generate`` ``logprob_start_len: 0`` equal
transformers' log-softmax on the same weights, whether or not the prompt is already in the
radix cache; ``/tokenize`` and ``/detokenize`` round trip."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from serving_harness import Server, serving

pytestmark = pytest.mark.timeout(240)

ATOL = 2e-3  # float32 on both sides: only the order of the sums differs
PROMPT = "def fibonacci(n):\n    return n if n < 2 else"


@pytest.fixture(scope="module")
def eval_server(api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """float32, so its logprobs compare with transformers' within float32's tolerance."""
    log = tmp_path_factory.mktemp("eval-log") / "server.log"
    args = ["--model", str(api_model_dir), "--dtype", "float32", "--max-total-tokens", "8192"]
    with serving(args, log) as srv:
        yield srv


@pytest.fixture(scope="module")
def hf_model(api_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(api_model_dir, dtype=torch.float32).eval()


def hf_logprobs(model: Any, ids: list[int]) -> tuple[list[float], torch.Tensor]:
    """log P(ids[j] | ids[:j]) for j >= 1, and the whole log-softmax ``[len - 1, vocab]``."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logprobs.gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)
    return chosen.tolist(), logprobs


@pytest.fixture(scope="module")
def hf_tokenizer(api_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(api_model_dir)


def test_tokenize_detokenize_round_trip(eval_server: Server, hf_tokenizer: Any) -> None:
    """vLLM's and SGLang's shapes: the ids transformers' tokenizer gives, ``count``,
    ``max_model_len``; a batch of prompts; messages through the chat template; ``/detokenize``
    back to the text under both names; a token id past the vocabulary is a 400."""
    tok = hf_tokenizer
    with eval_server.client() as http:
        body = http.post("/tokenize", json={"prompt": PROMPT}).json()
        assert body["tokens"] == tok.encode(PROMPT) and body["count"] == len(body["tokens"])
        assert body["max_model_len"] == 1024
        batch = http.post("/tokenize", json={"prompt": [PROMPT, "x"]}).json()
        assert batch["tokens"] == [body["tokens"], tok.encode("x")]
        assert batch["count"] == [len(t) for t in batch["tokens"]]
        chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
        )
        assert chat.json()["tokens"] == tok.encode(rendered, add_special_tokens=False)
        back = http.post("/detokenize", json={"tokens": body["tokens"]}).json()
        assert back["prompt"] == back["text"] == tok.decode(body["tokens"]) == PROMPT
        bad = http.post("/detokenize", json={"tokens": [len(tok) + 5]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


@pytest.mark.parametrize("cached", [False, True], ids=["cold", "radix-hit"])
def test_completion_echo_logprobs_equal_transformers(
    eval_server: Server, hf_model: Any, hf_tokenizer: Any, cached: bool
) -> None:
    """``echo`` + ``logprobs: 2``: the prompt's tokens come first (the first with null logprob
    and top), each logprob transformers' within float32's tolerance, each top dict the token
    itself and the two best alternatives; then the completion's; ``text_offset`` from 0. With
    ``max_tokens: 0`` the prompt alone. A prompt already in the radix cache (``radix-hit``) gives
    the same values: the cached part is computed again."""
    prompt = PROMPT + (" cached" if cached else " cold")
    with eval_server.client() as http:
        ids = hf_tokenizer.encode(prompt)
        if cached:  # the prompt's KV into the tree first
            http.post("/v1/completions", json={"prompt": ids, "max_tokens": 2}).raise_for_status()
        want, full = hf_logprobs(hf_model, ids)
        body = {"prompt": prompt, "echo": True, "logprobs": 2, "temperature": 0}
        r = http.post("/v1/completions", json={**body, "max_tokens": 0})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        lp = choice["logprobs"]
        assert choice["text"] == prompt and len(lp["tokens"]) == len(ids)
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert lp["token_logprobs"][1:] == pytest.approx(want, abs=ATOL)
        for j, top in enumerate(lp["top_logprobs"][1:]):
            best = full[j].topk(2).values.tolist()
            assert len(top) <= 3 and lp["tokens"][j + 1] in top
            assert sorted(top.values(), reverse=True)[:2] == pytest.approx(best, abs=ATOL)
        offsets = [0]
        for token in lp["tokens"][:-1]:
            offsets.append(offsets[-1] + len(token))
        assert lp["text_offset"] == offsets

        r = http.post("/v1/completions", json={**body, "max_tokens": 3})
        choice = r.json()["choices"][0]
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(ids) + 3 and choice["text"].startswith(prompt)
        assert lp["token_logprobs"][1 : len(ids)] == pytest.approx(want, abs=ATOL)
        assert all(v is not None and v <= 0 for v in lp["token_logprobs"][len(ids) :])


def test_generate_prompt_logprobs_on_a_radix_hit(
    eval_server: Server, hf_model: Any, hf_tokenizer: Any
) -> None:
    """``/generate`` ``return_logprob`` with ``logprob_start_len: 0`` after the same prompt was
    served: every prompt token's logprob (the first None), transformers' values, and its top
    alternatives in ``input_top_logprobs``."""
    with eval_server.client() as http:
        ids = hf_tokenizer.encode(PROMPT + " again")
        want, full = hf_logprobs(hf_model, ids)
        gen = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        http.post("/generate", json=gen).raise_for_status()
        body = {**gen, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 1}
        meta = http.post("/generate", json=body).json()["meta_info"]
        entries = meta["input_token_logprobs"]
        assert [e[1] for e in entries] == ids and entries[0][0] is None
        assert [e[0] for e in entries[1:]] == pytest.approx(want, abs=ATOL)
        tops = meta["input_top_logprobs"]
        assert tops[0] is None and len(tops) == len(ids)
        assert [t[0][1] for t in tops[1:]] == full.argmax(-1).tolist()
