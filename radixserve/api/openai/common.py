"""What the OpenAI routes share: model names, request building, usage and logprob formats.

Each choice is one scheduler request (``n`` choices of a prompt are ``n`` requests with the
same prompt: the radix cache shares their prefix). Usage counts each prompt once:
``prompt_tokens`` and ``cached_tokens`` come from a prompt's first choice, ``completion_tokens``
sums every choice, ``total_tokens`` = prompt + completion.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from radixserve.api.access.tenants import Tenants
from radixserve.api.adapters import adapter_of_model, check_adapter
from radixserve.api.errors import APIError
from radixserve.api.openai.bodies import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
    UsageInfo,
)
from radixserve.api.openai.protocol import OpenAISamplingFields
from radixserve.api.request_builder import Generation, RequestBuilder
from radixserve.config import ServerConfig
from radixserve.runtime.io_struct import GenerateRequest
from radixserve.server.result import RequestResult, input_token_logprobs, input_top_logprobs
from radixserve.server.tokenizer_manager import TokenizerManager
from radixserve.types import FinishReason


class OpenAIServing:
    """Base of the completions and chat servings: holds the tokenizer manager and the names."""

    def __init__(self, tm: TokenizerManager, config: ServerConfig) -> None:
        self.tm = tm
        self.tenants = Tenants.of(config)
        self.builder = RequestBuilder(tm, self.tenants, config)
        self.model_name = config.model_name
        path = config.engine.model_path or ""
        self.accepted_names = {
            self.model_name,
            path,
            os.path.normpath(path),
            os.path.basename(os.path.normpath(path)),
        }

    def adapter_of(self, body: OpenAISamplingFields, model: str | None) -> str | None:
        """The LoRA adapter a request runs under: the one ``model`` names (``None``, the field
        left out, means the base model, as in vLLM; 404 for a model not served), or SGLang's
        ``lora_path`` field (400 if the two name different adapters)."""
        names, served = self.accepted_names, self.model_name
        adapter = None if model is None else adapter_of_model(self.tm, model, names, served)
        if body.lora_path is None:
            return adapter
        if adapter not in (None, body.lora_path):
            raise APIError("model and lora_path name different adapters", param="lora_path")
        return check_adapter(self.tm, body.lora_path)

    def served_name(self, requests: list[GenerateRequest]) -> str:
        """A response's ``model``: its adapter's name, or the served model's (vLLM's)."""
        return requests[0].lora_name or self.model_name

    def check_common(self, body: OpenAISamplingFields, num_prompts: int, prompt_param: str) -> None:
        """What both routes refuse before any tokenizing: requests past the server's bounds
        (prompts x n, stop strings)."""
        self.builder.check_size(num_prompts, body.n, body.stop, prompt_param)

    def build_requests(
        self,
        base_id: str,
        prompts: list[list[int]],
        body: OpenAISamplingFields,
        max_tokens: int | None,
        max_tokens_param: str,
        default_max_tokens: Callable[[int], int],
        top_logprobs: int | None,
        prompt_param: str = "prompt",
        grammar: dict[str, str] | None = None,
        grammar_after_token: int | None = None,
        state: Any = None,
        lora_name: str | None = None,
        logprob_start_len: int = -1,
    ) -> list[GenerateRequest]:
        """``n`` requests per prompt, choice index ``i * n + j``; ``top_logprobs`` None: no
        logprobs; ``logprob_start_len`` 0: the prompt's logprobs too; ``grammar``: the output's constraint (None: the body's own, e.g.
        ``response_format``), which starts after ``grammar_after_token`` when given (the end of
        the thinking); ``state``: the caller (what the guard left). Raises APIError (400) for a
        bad value, naming the field."""
        if max_tokens is not None and max_tokens < 0:
            raise APIError(f"{max_tokens_param} must be >= 0", param=max_tokens_param)
        if grammar is None:
            try:
                grammar = body.grammar()
            except ValueError as exc:
                raise APIError(str(exc), param=grammar_param(body)) from None
        generations = []
        for i, ids in enumerate(prompts):
            max_new = max_tokens if max_tokens is not None else default_max_tokens(len(ids))
            for j in range(body.n):
                params = body.to_sampling_params(max_new, grammar)
                if body.seed is not None:  # n seeded choices must still differ
                    params.seed = body.seed + j
                if grammar:
                    params.grammar_after_token = grammar_after_token
                generations.append(
                    Generation(
                        ids,
                        params,
                        rid=f"{base_id}-{i * body.n + j}",
                        lora=lora_name,
                        cache_salt=body.cache_salt,
                        priority=body.priority,
                        return_logprob=top_logprobs is not None,
                        top_logprobs_num=top_logprobs or 0,
                        logprob_start_len=logprob_start_len,
                    )
                )
        try:
            return self.builder.build(state, generations)
        except ValueError as exc:
            param = _param_of(str(exc), max_tokens_param, prompt_param)
            if param is None and grammar:  # a grammar the engine cannot compile
                param = grammar_param(body)
            raise APIError(str(exc), param=param) from None

    @staticmethod
    def usage(results: list[RequestResult], n: int) -> UsageInfo:
        firsts = results[::n]
        return UsageInfo.of(
            prompt_tokens=sum(r.prompt_tokens for r in firsts),
            completion_tokens=sum(r.completion_tokens for r in results),
            cached_tokens=sum(r.cached_tokens for r in firsts),
        )

    @staticmethod
    def finish_reason(reason: FinishReason | None) -> str | None:
        return None if reason is None else reason.openai_reason

    @staticmethod
    def created() -> int:
        return int(time.time())

    # ---- logprobs ---------------------------------------------------------------------------
    def chat_logprobs(
        self, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]]
    ) -> ChatLogprobs:
        content = []
        for k, (tid, lp) in enumerate(zip(ids, lps, strict=False)):
            token = self.tm.prompts.decode_token(tid)
            top = tops[k] if k < len(tops) else []
            content.append(
                ChatTokenLogprob(
                    token=token,
                    logprob=lp,
                    bytes=list(token.encode("utf-8")),
                    top_logprobs=[self._top(t, v) for t, v in top],
                )
            )
        return ChatLogprobs(content=content)

    def _top(self, token_id: int, logprob: float) -> TopLogprob:
        token = self.tm.prompts.decode_token(token_id)
        return TopLogprob(token=token, logprob=logprob, bytes=list(token.encode("utf-8")))

    def completion_logprobs(
        self,
        ids: list[int],
        lps: list[float | None],
        tops: list[list[tuple[int, float]] | None],
        text_offset: int,
    ) -> CompletionLogprobs:
        """vLLM's legacy logprobs: per token its text, logprob and ``{text: logprob}`` of the
        token itself then the top alternatives (so up to ``logprobs + 1`` entries, as OpenAI
        documents); a token with no logprob (an echoed prompt's first) has None for both."""
        out = CompletionLogprobs()
        for k, (tid, lp) in enumerate(zip(ids, lps, strict=False)):
            token = self.tm.prompts.decode_token(tid)
            out.tokens.append(token)
            out.token_logprobs.append(lp)
            if lp is None:
                out.top_logprobs.append(None)
            else:
                top: dict[str, float] = {token: lp}
                for t, v in (tops[k] if k < len(tops) else None) or []:
                    top.setdefault(self.tm.prompts.decode_token(t), v)
                out.top_logprobs.append(top)
            out.text_offset.append(text_offset)
            text_offset += len(token)
        return out


def _param_of(message: str, max_tokens_param: str, prompt_param: str) -> str | None:
    """The request field a validation message is about (OpenAI's ``param``)."""
    for key, param in (
        ("the prompt", prompt_param),
        ("input ids", prompt_param),
        ("max_new_tokens", max_tokens_param),
        ("maximum context length", max_tokens_param),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("min_p", "min_p"),
        ("penalty", None),
        ("stop", "stop"),
    ):
        if key in message:
            return param
    return None


def grammar_param(body: OpenAISamplingFields) -> str | None:
    """The field a body's grammar comes from (the ``param`` of its 400)."""
    for name in ("response_format", "json_schema", "regex", "ebnf"):
        if getattr(body, name) is not None:
            return name
    return None


def prompt_logprob_slices(result: RequestResult) -> dict[str, Any]:
    """The logprob lists of ``result``'s prompt (asked with ``logprob_start_len`` 0), in the
    shape of :func:`choice_logprob_slices`."""
    entries = input_token_logprobs(result)
    tops = input_top_logprobs(result) if result.request.top_logprobs_num else []
    tops += [None] * (len(entries) - len(tops))  # aligned with the output's that follow
    return {
        "ids": [tid for _, tid in entries],
        "lps": [v for v, _ in entries],
        "tops": tops,
    }


def choice_logprob_slices(result: RequestResult, start: int) -> dict[str, Any]:
    """The logprob lists of ``result`` from output position ``start`` on."""
    return {
        "ids": result.output_ids[start:],
        "lps": result.logprobs[start:],
        "tops": result.top_logprobs[start:],
    }
