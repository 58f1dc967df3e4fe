"""``/v1/chat/completions``: the tokenizer's chat template, stream and non-stream.

Reasoning (``--reasoning-parser``, ``api/formats/reasoning.py``): the thinking comes back as
``message.reasoning_content`` (streamed as ``delta.reasoning_content``; with
``stream_reasoning: false`` in one delta once it ends), unless ``separate_reasoning`` is false
or the template's ``enable_thinking`` is false (qwen3). Tool calls are parsed from the answer
after the thinking, and ``response_format`` and a required or named tool call constrain only
the answer: their grammar starts after the ``</think>`` token. SGLang's own ``regex``,
``json_schema`` and ``ebnf`` fields constrain the whole output as written (thinking included).

Tools (``api/openai/chat_tools.py``): an output's tool calls come back as ``message.tool_calls`` with
``finish_reason`` ``tool_calls``. Streaming, per choice: a first chunk with ``delta.role``,
content chunks (text that may start a tool call is held back), one chunk per tool call (with
its ``index``, name and whole arguments), then one finish chunk with an empty delta and the
``finish_reason``; with ``stream_options.include_usage`` a last
chunk with empty ``choices`` and the usage; then ``data: [DONE]``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from radixserve.api.errors import APIError
from radixserve.api.formats.call_form import CallForm, CallForms
from radixserve.api.formats.reasoning import THINK_END, ReasoningParser, ReasoningStream
from radixserve.api.formats.tool_calls import detect_parser
from radixserve.api.openai.bodies import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatMessageOut,
    ChatStreamChoice,
    DeltaMessage,
    UsageInfo,
    dump,
)
from radixserve.api.openai.chat_tools import ToolPlan, ToolStream, plan_tools
from radixserve.api.openai.common import OpenAIServing, choice_logprob_slices, grammar_param
from radixserve.api.openai.protocol import ChatCompletionRequest
from radixserve.api.streaming import OpenRequests, collect_all, event_stream, open_requests, sse
from radixserve.config import ServerConfig
from radixserve.runtime.io_struct import GenerateRequest
from radixserve.server.result import RequestResult
from radixserve.server.tokenizer_manager import TokenizerManager


class ChatServing(OpenAIServing):
    def __init__(self, tm: TokenizerManager, config: ServerConfig) -> None:
        super().__init__(tm, config)
        template = getattr(tm.prompts.tokenizer, "chat_template", None)
        self.tool_call_parser = config.tool_call_parser or detect_parser(
            template if isinstance(template, str) else None
        )
        self.reasoning_parser = config.reasoning_parser
        ids = tm.prompts.tokenizer.encode(THINK_END, add_special_tokens=False)
        self.think_end_id = ids[0] if len(ids) == 1 else None  # where a grammar starts
        self._call_forms: CallForms | None = None  # learned at the first forced call

    def _thinks(self, body: ChatCompletionRequest) -> bool:
        """Whether the output starts with thinking that a reasoning parser separates."""
        if self.reasoning_parser is None:
            return False
        kwargs = body.chat_template_kwargs or {}
        return not (self.reasoning_parser == "qwen3" and kwargs.get("enable_thinking") is False)

    def _grammar_after(self, body: ChatCompletionRequest) -> int | None:
        """``response_format`` and tool grammars start after the thinking; raw ones do not."""
        raw = (body.regex, body.json_schema, body.ebnf)
        return self.think_end_id if self._thinks(body) and raw == (None, None, None) else None

    def reasoner(self, body: ChatCompletionRequest) -> ReasoningParser | None:
        if self.reasoning_parser is None or not (self._thinks(body) and body.separate_reasoning):
            return None
        return ReasoningParser.create(self.reasoning_parser)

    async def create(self, body: ChatCompletionRequest, raw: Request) -> Response:
        call = await self.open(body, raw)
        if body.stream:
            events = self._stream(call.base_id, body, call.plan, call.group, call.requests)
            return event_stream(call.group, events)
        results = await collect_all(call.group, call.requests)
        response = self.response(call.base_id, body, call.plan, call.requests, results)
        return JSONResponse(dump(response))

    async def open(
        self, body: ChatCompletionRequest, raw: Request, prompt: list[int] | None = None
    ) -> ChatCall:
        """The chat pipeline up to its running requests: the adapter, the bounds, the tools'
        plan, the prompt through the template (``prompt``: its ids, where a door rendered
        them already), the requests (each door that speaks chat in other words, such as
        Anthropic's Messages, converts its body and calls this)."""
        adapter = self.adapter_of(body, body.model)
        self.check_common(body, 1, "n")
        if body.max_tokens is not None and body.max_completion_tokens is not None:
            raise APIError("give max_completion_tokens or max_tokens, not both", param="max_tokens")
        max_tokens, param = body.max_completion_tokens, "max_completion_tokens"
        if max_tokens is None:
            max_tokens, param = body.max_tokens, "max_tokens"
        plan = self.plan(body, raw.state)
        if prompt is None:
            prompt = await self.render(body, plan)
        base_id = f"chatcmpl-{self.tm.new_rid()}"
        top = None
        if body.logprobs:
            top = body.top_logprobs or 0
        elif body.top_logprobs:
            raise APIError("top_logprobs needs logprobs=true", param="top_logprobs")
        requests = self.build_requests(
            base_id,
            [prompt],
            body,
            max_tokens,
            param,
            self.tm.validator.output_budget,  # no max_tokens: what context and pool allow
            top,
            prompt_param="messages",
            grammar=plan.grammar,
            grammar_after_token=self._grammar_after(body),
            state=raw.state,
            lora_name=adapter,
        )
        group = await open_requests(self.tm, requests, raw.is_disconnected)
        return ChatCall(base_id, plan, requests, group)

    def plan(self, body: ChatCompletionRequest, state: Any) -> ToolPlan:
        """The request's tools: what the template renders, the grammar, the parser (``state``:
        the caller's, as its guard left it; a form learned for one tenant is its own)."""
        scope = self.tenants.cache_scope(state)
        try:
            return plan_tools(body, self.tool_call_parser, lambda: self._call_form(body, scope))
        except ValueError as exc:
            where = "tool_choice" if body.tools else grammar_param(body)
            raise APIError(str(exc), param=where) from None

    def _call_form(self, body: ChatCompletionRequest, scope: str | None) -> CallForm | None:
        """The template's words for ``body``'s forced calls (None: the JSON array)."""
        if self._call_forms is None:
            prompts = self.tm.prompts
            specials = prompts.tokenizer.added_tokens_decoder.values()
            self._call_forms = CallForms(
                prompts.render_text,
                [prompts.decode_token(t) for t in self.tm.info.eos_token_ids],
                [t.content for t in specials if t.special],
            )
        form = self._call_forms.of(body.chat_template_kwargs, scope)
        if form is not None and self._grammar_after(body) is not None:
            form = form.after(THINK_END)  # its grammar starts after the thinking
        return form

    async def render(self, body: ChatCompletionRequest, plan: ToolPlan) -> list[int]:
        """The prompt's ids: the messages and tools through the chat template."""
        return await render_messages(self.tm, body, plan.tools, body.chat_template_kwargs)

    async def prompt_ids(self, body: ChatCompletionRequest, state: Any) -> list[int]:
        """The prompt's ids as :meth:`open` renders them, for the caller whose guard left
        ``state`` (a count, a truncation's try, a door's check before it runs)."""
        return await self.render(body, self.plan(body, state))

    def response(
        self,
        base_id: str,
        body: ChatCompletionRequest,
        plan: ToolPlan,
        requests: list[GenerateRequest],
        results: list[RequestResult],
    ) -> ChatCompletionResponse:
        """The whole answer: each choice's thinking, content and tool calls."""
        choices = []
        for i, r in enumerate(results):
            reasoner = self.reasoner(body)
            reasoning, text = (None, r.text) if reasoner is None else reasoner.parse(r.text)
            content, calls = plan.parse(text)
            message = ChatMessageOut(
                content=content,
                reasoning_content=reasoning,
                tool_calls=[plan.call_item(c) for c in calls] or None,
            )
            finish = self.finish_reason(r.finish_reason)
            choices.append(
                ChatChoice(
                    index=i,
                    message=message,
                    logprobs=self._logprobs(body, r, 0),
                    finish_reason="tool_calls" if calls else finish,
                )
            )
        return ChatCompletionResponse(
            id=base_id,
            model=self.served_name(requests),
            choices=choices,
            usage=self.usage(results, body.n),
        )

    def _logprobs(
        self, body: ChatCompletionRequest, result: RequestResult, start: int
    ) -> ChatLogprobs | None:
        if not body.logprobs:
            return None
        return self.chat_logprobs(**choice_logprob_slices(result, start))

    async def _stream(
        self,
        base_id: str,
        body: ChatCompletionRequest,
        plan: ToolPlan,
        group: OpenRequests,
        requests: list[GenerateRequest],
    ) -> AsyncIterator[str]:
        """OpenAI's chat chunks: the role, then thinking, content and tool calls as deltas,
        each choice's finish, the usage when asked."""
        chunk = _Chunker(base_id, self.created(), self.served_name(requests))
        results = [RequestResult(r) for r in requests]
        streams = [plan.stream() for _ in requests]
        split = [ReasoningStream(self.reasoner(body)) for _ in requests]
        for i in range(len(requests)):
            yield chunk(ChatStreamChoice(index=i, delta=DeltaMessage(role="assistant", content="")))
        async for i, out in group.events():
            start = len(results[i].output_ids)
            results[i].add(out)
            logprobs = self._logprobs(body, results[i], start)
            finish = self.finish_reason(out.output.finish_reason)
            _, answer = split[i].feed(out.text, final=finish is not None)
            thinking = split[i].take_thinking(body.stream_reasoning, finish is not None)
            if thinking:
                yield chunk(
                    ChatStreamChoice(index=i, delta=DeltaMessage(reasoning_content=thinking))
                )
            text = streams[i].feed(answer)
            if text or logprobs is not None:
                delta = DeltaMessage(content=text or None)
                yield chunk(ChatStreamChoice(index=i, delta=delta, logprobs=logprobs))
            if finish is not None:
                for event in self._finish(chunk, i, streams[i], finish):
                    yield event
        if body.include_usage:
            yield chunk(None, self.usage(results, body.n))

    @staticmethod
    def _finish(chunk: _Chunker, i: int, stream: ToolStream, finish: str) -> list[str]:
        """A choice's last chunks: the text held back, each tool call whole (OpenAI's delta
        shape), the finish reason."""
        text, calls = stream.finish()
        out = [chunk(ChatStreamChoice(index=i, delta=DeltaMessage(content=text)))] if text else []
        for k, call in enumerate(calls):
            delta = DeltaMessage(tool_calls=[stream.plan.call_item(call, k)])
            out.append(chunk(ChatStreamChoice(index=i, delta=delta)))
        reason = "tool_calls" if calls else finish
        out.append(chunk(ChatStreamChoice(index=i, delta=DeltaMessage(), finish_reason=reason)))
        return out


async def render_messages(
    tm: TokenizerManager,
    body: Any,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """The ids of ``body.messages`` (and ``tools``) through the chat template, as the chat route
    renders them; ``body`` has ``add_generation_prompt`` and ``continue_final_message``. A 400
    naming ``messages`` when the template refuses them."""
    try:
        return await tm.prompts.apply_chat_template(
            [m.to_template_dict() for m in body.messages],
            tools=tools,
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            **(template_kwargs or {}),
        )
    except ValueError as exc:
        raise APIError(str(exc), param="messages") from None
    except Exception as exc:  # a template that raises (e.g. a role order it rejects)
        raise APIError(f"the chat template failed: {exc}", param="messages") from None


@dataclass(frozen=True)
class ChatCall:
    """A chat request running: its id, its tools' plan, its requests and their group."""

    base_id: str
    plan: ToolPlan
    requests: list[GenerateRequest]
    group: OpenRequests


class _Chunker:
    """One stream's chunks: its id, creation time and model, OpenAI's unset delta fields left
    out."""

    def __init__(self, base_id: str, created: int, model: str) -> None:
        self.base_id, self.created, self.model = base_id, created, model

    def __call__(self, choice: ChatStreamChoice | None, usage: UsageInfo | None = None) -> str:
        data = ChatCompletionChunk(
            id=self.base_id,
            created=self.created,
            model=self.model,
            choices=[] if choice is None else [choice],
            usage=usage,
        )
        out = dump(data)
        for c in out["choices"]:
            c["delta"] = {k: v for k, v in c["delta"].items() if v is not None}
        return sse(out)
