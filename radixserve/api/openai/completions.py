"""``/v1/completions``: OpenAI's legacy completions, stream and non-stream.

Streaming sends one chunk per output of a choice with its new text; the last chunk of each
choice carries its ``finish_reason`` (exactly one finish chunk per choice); with
``stream_options.include_usage`` a last chunk with empty ``choices`` carries the usage; then
``data: [DONE]``.

``echo`` with ``logprobs`` returns the prompt's tokens before the completion's in one logprobs
object, as vLLM does: the prompt's first token with a None logprob and top, ``text_offset``
counted from the echoed prompt's start; ``max_tokens: 0`` returns the prompt alone. The prompt's
logprobs come from the prefill that serves the request (docs/design.md, section 4).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from radixserve.api.access.limits import num_prompts_of
from radixserve.api.errors import APIError
from radixserve.api.openai.bodies import (
    CompletionChoice,
    CompletionResponse,
    UsageInfo,
    dump,
)
from radixserve.api.openai.common import (
    OpenAIServing,
    choice_logprob_slices,
    prompt_logprob_slices,
)
from radixserve.api.openai.protocol import CompletionRequest
from radixserve.api.streaming import OpenRequests, collect_all, event_stream, open_requests, sse
from radixserve.runtime.io_struct import GenerateRequest
from radixserve.server.result import RequestResult

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions


class CompletionServing(OpenAIServing):
    async def create(self, body: CompletionRequest, raw: Request) -> Response:
        adapter = self.adapter_of(body, body.model)
        self.check_common(body, num_prompts_of(body.prompt), "prompt")
        if body.suffix:
            raise APIError("suffix is not supported", param="suffix")
        if body.best_of is not None and body.best_of != body.n:
            raise APIError("best_of must equal n (no server-side ranking)", param="best_of")
        try:
            prompts = await self._prompt_ids(body)
        except ValueError as exc:  # a text that cannot fit the context, refused untokenized
            raise APIError(str(exc), param="prompt") from None
        base_id = f"cmpl-{self.tm.new_rid()}"
        ctx = self.tm.info.max_context_len
        requests = self.build_requests(
            base_id,
            prompts,
            body,
            body.max_tokens,
            "max_tokens",
            lambda prompt_len: max(min(DEFAULT_MAX_TOKENS, ctx - prompt_len), 0),
            body.logprobs,
            state=raw.state,
            lora_name=adapter,
            logprob_start_len=0 if body.echo and body.logprobs is not None else -1,
        )
        echoes = [self.tm.prompts.decode(p) if body.echo else "" for p in prompts]
        group = await open_requests(self.tm, requests, raw.is_disconnected)
        if body.stream:
            return event_stream(group, self._stream(base_id, body, group, requests, echoes))
        results = await collect_all(group, requests)
        choices = []
        for index, result in enumerate(results):
            echo = echoes[index // body.n]
            logprobs = None
            if body.logprobs is not None:
                logprobs = self.completion_logprobs(
                    **_slices(result, 0, body.echo), text_offset=0 if body.echo else len(echo)
                )
            choices.append(
                CompletionChoice(
                    index=index,
                    text=echo + result.text,
                    logprobs=logprobs,
                    finish_reason=self.finish_reason(result.finish_reason),
                )
            )
        response = CompletionResponse(
            id=base_id,
            model=self.served_name(requests),
            choices=choices,
            usage=self.usage(results, body.n),
        )
        return JSONResponse(dump(response))

    async def _prompt_ids(self, body: CompletionRequest) -> list[list[int]]:
        prompt = body.prompt
        if isinstance(prompt, str):
            return [await self.tm.prompts.tokenize(prompt)]
        if not prompt:
            raise APIError("prompt must not be empty", param="prompt")
        if isinstance(prompt[0], int):
            return [list(prompt)]  # type: ignore[arg-type]
        if isinstance(prompt[0], str):
            return [await self.tm.prompts.tokenize(p) for p in prompt]  # type: ignore[arg-type]
        return [list(p) for p in prompt]  # type: ignore[arg-type]

    async def _stream(
        self,
        base_id: str,
        body: CompletionRequest,
        group: OpenRequests,
        requests: list[GenerateRequest],
        echoes: list[str],
    ) -> AsyncIterator[str]:
        """OpenAI's completion chunks: each choice's new text (its echo first), logprobs and
        finish; the usage when asked."""
        created, model = self.created(), self.served_name(requests)

        def chunk(choices: list[CompletionChoice], usage: UsageInfo | None = None) -> str:
            data = dump(
                CompletionResponse(
                    id=base_id, created=created, model=model, choices=choices, usage=usage
                )
            )
            if usage is None:
                del data["usage"]
            return sse(data)

        results = [RequestResult(r) for r in requests]
        sent_echo = [False] * len(requests)
        async for i, out in group.events():
            start = len(results[i].output_ids)
            results[i].add(out)
            text = out.text
            if not sent_echo[i]:
                text, sent_echo[i] = echoes[i // body.n] + text, True
            finish = self.finish_reason(out.output.finish_reason)
            if not text and finish is None and body.logprobs is None:
                continue
            logprobs = None
            if body.logprobs is not None:
                with_prompt = body.echo and start == 0
                offset = 0 if with_prompt else len(results[i].text) - len(out.text)
                if body.echo and not with_prompt:
                    offset += len(echoes[i // body.n])
                slices = _slices(results[i], start, with_prompt)
                logprobs = self.completion_logprobs(**slices, text_offset=offset)
            yield chunk(
                [CompletionChoice(index=i, text=text, logprobs=logprobs, finish_reason=finish)]
            )
        if body.include_usage:
            yield chunk([], self.usage(results, body.n))


def _slices(result: RequestResult, start: int, with_prompt: bool) -> dict[str, Any]:
    """The logprob lists of a choice's output from ``start`` on, its prompt's first when
    ``with_prompt`` (an echo)."""
    out = choice_logprob_slices(result, start)
    if not with_prompt:
        return out
    prompt = prompt_logprob_slices(result)
    return {key: prompt[key] + out[key] for key in ("ids", "lps", "tops")}
