"""One result shape for every caller: SGLang's ``/generate`` dict, built by the in-process
Engine and by the native HTTP route alike (the frontend parses one shape).

::

    {"text": str, "output_ids": [int],
     "meta_info": {"id", "finish_reason": None | {"type": "stop" | "length" | "abort",
                   "matched": int | str | None, "length" | "message"},
                   "prompt_tokens", "completion_tokens", "cached_tokens",
                   "cached_tokens_details": {"device": int, "host": int}, "e2e_latency",
                   "weight_version" (SGLang's label of the weights that answered),
                   with speculative decoding on: "spec_verify_ct", "spec_accepted_tokens",
                   with return_logprob:
                   "output_token_logprobs": [[logprob, token_id, text | None]],
                   "output_top_logprobs": [[[logprob, token_id, text | None]]],
                   with logprob_start_len >= 0:
                   "input_token_logprobs": [[logprob | None, token_id, text | None]],
                   with top_logprobs_num too:
                   "input_top_logprobs": [None | [[logprob, token_id, text | None]]]}}

A token's text is filled in only when the caller asks (``return_text_in_logprobs``).
``cached_tokens`` is the total; ``cached_tokens_details`` splits it as SGLang's hierarchical cache
does: ``device`` hit in the KV pool, ``host`` loaded back from the KV tier (host memory or a
file tier alike; ``docs/kv_tier.md``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from radixserve.runtime.io_struct import GenerateRequest, ReqOutput
from radixserve.server.io_struct import TextOutput
from radixserve.server.rid_scope import client_rid
from radixserve.types import FinishKind, FinishReason

TokenText = Callable[[int], str]


@dataclass(eq=False)
class RequestResult:
    """Everything one request produced so far (its text outputs, accumulated)."""

    request: GenerateRequest
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    input_logprobs: list[float] | None = None
    input_top_logprobs: list[list[tuple[int, float]]] | None = None
    last: ReqOutput | None = None

    def add(self, out: TextOutput) -> None:
        o = out.output
        self.text += out.text
        self.output_ids.extend(o.new_token_ids)
        self.logprobs.extend(o.new_logprobs)
        self.top_logprobs.extend(o.new_top_logprobs)
        if o.input_logprobs is not None:
            self.input_logprobs = list(o.input_logprobs)
        if o.input_top_logprobs is not None:
            self.input_top_logprobs = list(o.input_top_logprobs)
        self.last = o

    @property
    def finish_reason(self) -> FinishReason | None:
        return None if self.last is None else self.last.finish_reason

    @property
    def prompt_tokens(self) -> int:
        return len(self.request.input_ids)

    @property
    def completion_tokens(self) -> int:
        return 0 if self.last is None else self.last.completion_tokens

    @property
    def cached_tokens(self) -> int:
        return 0 if self.last is None else self.last.cached_tokens

    @property
    def cached_tokens_tier(self) -> int:
        return 0 if self.last is None else self.last.cached_tokens_tier


def generate_result(
    result: RequestResult,
    started: float,
    token_text: TokenText | None = None,
    delta: TextOutput | None = None,
    weight_version: str = "default",
) -> dict[str, Any]:
    """The ``/generate`` dict of ``result`` (``started``: ``time.monotonic()`` at arrival).
    With ``delta`` (the Engine's stream), ``text`` and ``output_ids`` are that output's new
    part only; ``meta_info`` is always the whole request's so far."""
    request = result.request
    meta: dict[str, Any] = {
        "id": client_rid(request.rid),
        "finish_reason": finish_reason_json(result.finish_reason, request),
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "cached_tokens": result.cached_tokens,
        "cached_tokens_details": {
            "device": result.cached_tokens - result.cached_tokens_tier,
            "host": result.cached_tokens_tier,
        },
        "e2e_latency": time.monotonic() - started,
        "weight_version": weight_version,
    }
    last = result.last
    if last is not None and last.spec_verify_ct is not None:  # speculation on (SGLang's keys)
        meta["spec_verify_ct"] = last.spec_verify_ct
        meta["spec_accepted_tokens"] = last.spec_accepted_tokens
    if request.return_logprob:

        def lp(logprob: float | None, token_id: int) -> list[Any]:
            return [logprob, token_id, None if token_text is None else token_text(token_id)]

        meta["output_token_logprobs"] = [
            lp(v, tid) for v, tid in zip(result.logprobs, result.output_ids, strict=False)
        ]
        meta["output_top_logprobs"] = [
            [lp(v, tid) for tid, v in top] for top in result.top_logprobs
        ]
        if request.logprob_start_len >= 0:
            meta["input_token_logprobs"] = [lp(v, tid) for v, tid in input_token_logprobs(result)]
            if request.top_logprobs_num:
                meta["input_top_logprobs"] = [
                    None if top is None else [lp(v, tid) for tid, v in top]
                    for top in input_top_logprobs(result)
                ]
    if delta is None:
        text, output_ids = result.text, list(result.output_ids)
    else:
        text, output_ids = delta.text, list(delta.output.new_token_ids)
    return {"text": text, "output_ids": output_ids, "meta_info": meta}


def input_token_logprobs(result: RequestResult) -> list[tuple[float | None, int]]:
    """(logprob, token id) of the prompt tokens from ``logprob_start_len`` on, each with
    log P(token | tokens before). The scheduler returns values for positions ``max(start, 1)
    ..``; the prompt's first token has no logprob, so with ``start == 0`` it comes with None
    (as in SGLang)."""
    prompt = result.request.input_ids
    start = result.request.logprob_start_len
    first = max(start, 1)
    values = result.input_logprobs or []
    out: list[tuple[float | None, int]] = [(None, prompt[0])] if start == 0 else []
    out += [(v, prompt[first + j]) for j, v in enumerate(values) if first + j < len(prompt)]
    return out


def input_top_logprobs(result: RequestResult) -> list[list[tuple[int, float]] | None]:
    """Beside :func:`input_token_logprobs`, one entry per prompt token: its position's top
    ``top_logprobs_num`` (token id, logprob), descending; None for the prompt's first token."""
    start = result.request.logprob_start_len
    first = max(start, 1)
    n = len(result.request.input_ids) - first
    tops = (result.input_top_logprobs or [])[:n]
    out: list[list[tuple[int, float]] | None] = [None] if start == 0 else []
    return out + list(tops)


def finish_reason_json(reason: FinishReason | None, request: GenerateRequest) -> Any:
    if reason is None:
        return None
    out: dict[str, Any] = {"type": reason.openai_reason, "matched": reason.matched}
    if reason.kind is FinishKind.LENGTH:
        out["length"] = request.sampling_params.max_new_tokens
    elif reason.kind is FinishKind.ABORT:
        out["message"] = reason.message
    return out
