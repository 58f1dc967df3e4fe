"""SGLang's native ``/generate``: text or input_ids, one prompt or a batch, stream or not.

As in SGLang, a streamed event carries the text and output ids generated *so far* (cumulative),
and a batch stream tags each event with its ``index``. ``meta_info`` has ``id``,
``prompt_tokens``, ``completion_tokens``, ``cached_tokens`` (split in ``cached_tokens_details``:
``device`` and ``host``, the KV tier's part), ``finish_reason`` (``{"type":
"stop" | "length" | "abort", "matched": ...}``) and, with ``return_logprob``, lists of
``[logprob, token_id, text or None]``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from radixserve.api.access.limits import num_prompts_of
from radixserve.api.formats.reasoning import ReasoningParser, ReasoningStream
from radixserve.api.native.protocol import GenerateReqInput, NativeSamplingParams
from radixserve.api.request_builder import Generation, RequestBuilder
from radixserve.api.streaming import (
    OpenRequests,
    collect_all,
    event_stream,
    open_requests,
    sse,
)
from radixserve.runtime.io_struct import GenerateRequest
from radixserve.server.result import RequestResult, generate_result

T = TypeVar("T")


class NativeServing:
    def __init__(self, builder: RequestBuilder, reasoning_parser: str | None = None) -> None:
        self.tm = builder.tm
        self.builder = builder
        self.reasoning_parser = reasoning_parser

    async def generate(self, body: GenerateReqInput, raw: Request) -> Response:
        if body.separate_reasoning and self.reasoning_parser is None:
            raise ValueError("separate_reasoning needs a server started with --reasoning-parser")
        requests, is_batch = await self.build_requests(body, raw.state)
        started = time.monotonic()
        group = await open_requests(self.tm, requests, raw.is_disconnected)
        shape = _Shape(body.return_text_in_logprobs, body.return_prompt_token_ids)
        if body.stream:
            events = self._stream(
                group, requests, is_batch, shape, started, body.separate_reasoning
            )
            return event_stream(group, events)
        results = await collect_all(group, requests)
        outs = [self.result_dict(r, shape, started) for r in results]
        if body.separate_reasoning:
            for out in outs:
                out["reasoning_text"], out["text"] = self._reasoner().parse(out["text"])
        return JSONResponse(outs if is_batch else outs[0])

    def _reasoner(self) -> ReasoningParser:
        assert self.reasoning_parser is not None
        return ReasoningParser.create(self.reasoning_parser)

    async def build_requests(
        self, body: GenerateReqInput, state: Any = None
    ) -> tuple[list[GenerateRequest], bool]:
        """The batch's requests (``state``: what the guard left on the request)."""
        if (body.text is None) == (body.input_ids is None):
            raise ValueError("give exactly one of text and input_ids")
        prompt = body.text if body.text is not None else body.input_ids
        all_params = body.sampling_params
        for sp in all_params if isinstance(all_params, list) else [all_params]:
            self.builder.check_size(1, 1, sp.stop if sp else None, "text")
        self.builder.check_size(num_prompts_of(prompt), 1, None, "text")
        if body.text is not None:
            is_batch = isinstance(body.text, list)
            texts = body.text if isinstance(body.text, list) else [body.text]
            ids_list = [await self.tm.prompts.tokenize(t) for t in texts]
        else:
            ids = body.input_ids or []
            is_batch = bool(ids) and isinstance(ids[0], list)
            ids_list = [list(x) for x in ids] if is_batch else [list(ids)]  # type: ignore[arg-type]
        if isinstance(body.rid, str) and is_batch:
            raise ValueError("rid must be a list of the batch's length for a batch")
        return self.builder.build(state, self._generations(body, ids_list)), is_batch

    def _generations(self, body: GenerateReqInput, ids_list: list[list[int]]) -> list[Generation]:
        n = len(ids_list)
        params = _per_item(body.sampling_params, n, "sampling_params")
        logprob = _per_item(body.return_logprob, n, "return_logprob")
        starts = _per_item(body.logprob_start_len, n, "logprob_start_len")
        tops = _per_item(body.top_logprobs_num, n, "top_logprobs_num")
        prios = _per_item(body.priority, n, "priority")
        rids = _per_item(body.rid, n, "rid") if body.rid is not None else [None] * n
        names = _per_item(body.lora_path, n, "lora_path")  # per item: a name or None
        keys = _per_item(body.extra_key, n, "extra_key")
        salts = _per_item(body.cache_salt, n, "cache_salt")
        out = []
        for i, ids in enumerate(ids_list):
            sp = params[i] or NativeSamplingParams.model_validate({})
            max_new = self.tm.validator.max_new_tokens_for(len(ids), sp.max_new_tokens)
            out.append(
                Generation(
                    ids,
                    sp.to_sampling_params(max_new),
                    rid=rids[i],
                    lora=names[i],
                    extra_key=keys[i],
                    cache_salt=salts[i],
                    priority=prios[i] or 0,
                    return_logprob=bool(logprob[i]),
                    top_logprobs_num=tops[i] or 0,
                    logprob_start_len=_or(starts[i], -1),
                )
            )
        return out

    async def _stream(
        self,
        group: OpenRequests,
        requests: list[GenerateRequest],
        is_batch: bool,
        shape: _Shape,
        started: float,
        separate_reasoning: bool,
    ) -> AsyncIterator[str]:
        """SGLang's events: each the choice's text and ids so far (cumulative)."""
        results = [RequestResult(r) for r in requests]
        parser = self._reasoner if separate_reasoning else lambda: None
        split = [ReasoningStream(parser()) for _ in requests]
        async for i, out in group.events():
            results[i].add(out)
            event = self.result_dict(results[i], shape, started)
            if separate_reasoning:
                split[i].feed(out.text, final=out.output.finish_reason is not None)
                thinking = split[i].reasoning if split[i].had_thinking else None
                event["reasoning_text"], event["text"] = thinking, split[i].answer
            if is_batch:
                event["index"] = i
            yield sse(event)

    def result_dict(self, result: RequestResult, shape: _Shape, started: float) -> dict[str, Any]:
        token_text = self.tm.prompts.decode_token if shape.text_in_logprobs else None
        out = generate_result(result, started, token_text, weight_version=self.tm.weight_version)
        if shape.prompt_token_ids:
            out["prompt_token_ids"] = list(result.request.input_ids)
        return out


@dataclass(frozen=True, slots=True)
class _Shape:
    """What a result carries beyond the defaults."""

    text_in_logprobs: bool  # return_text_in_logprobs
    prompt_token_ids: bool  # return_prompt_token_ids


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _per_item(value: T | list[T] | list[T | None] | None, n: int, name: str) -> list[T | None]:
    if isinstance(value, list):
        if len(value) != n:
            raise ValueError(f"{name} has {len(value)} items; the batch has {n} prompts")
        return list(value)
    return [value] * n
