"""A scripted backend for the language tests: no model, every call recorded."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from radixserve.frontend.backends.base import GenChunk
from radixserve.frontend.chat_template import ChatTemplate
from radixserve.frontend.select_methods import ChoiceLogprobs


class FakeBackend:
    """``generate`` answers ``replies[i]`` for the i-th call (or ``"gen{i}"``); ``select`` scores
    ``choice_logprobs[choice]`` (default: one token of logprob -len(choice)); ``fail_on`` makes
    that kind of call raise."""

    def __init__(
        self,
        replies: list[str] | None = None,
        choice_logprobs: dict[str, list[float]] | None = None,
        fail_on: str | None = None,
    ) -> None:
        self.replies = list(replies or [])
        self.choice_logprobs = choice_logprobs or {}
        self.fail_on = fail_on
        self.calls: list[tuple[str, str, Any]] = []
        self.loras: list[str | None] = []  # the adapter of each generate call
        self._lock = threading.Lock()
        self._chat = ChatTemplate.chatml()

    @property
    def chat_template(self) -> ChatTemplate:
        return self._chat

    def _record(self, kind: str, prompt: str, extra: Any) -> int:
        if self.fail_on == kind:
            raise ConnectionError(f"scripted {kind} failure")
        with self._lock:
            self.calls.append((kind, prompt, extra))
            return sum(1 for c in self.calls if c[0] in ("generate", "stream")) - 1

    def _reply(self, i: int) -> str:
        return self.replies[i] if i < len(self.replies) else f"gen{i}"

    def generate(
        self, prompt: str, sampling_params: dict[str, Any], lora: str | None = None
    ) -> GenChunk:
        i = self._record("generate", prompt, sampling_params)
        self.loras.append(lora)
        return GenChunk(self._reply(i), {"finish_reason": {"type": "length"}})

    def generate_stream(
        self, prompt: str, sampling_params: dict[str, Any], lora: str | None = None
    ) -> Iterator[GenChunk]:
        i = self._record("stream", prompt, sampling_params)
        self.loras.append(lora)
        text = self._reply(i)
        for k, ch in enumerate(text):
            last = k == len(text) - 1
            yield GenChunk(ch, {"finish_reason": {"type": "length"} if last else None})

    def cache_prefix(self, prompt: str) -> dict[str, Any]:
        self._record("cache_prefix", prompt, None)
        return {"prompt_tokens": len(prompt)}

    def score_choices(self, prefix: str, choices: list[str]) -> list[ChoiceLogprobs]:
        self._record("select", prefix, list(choices))
        return [
            ChoiceLogprobs(c, self.choice_logprobs.get(c, [-float(len(c))]), [], {})
            for c in choices
        ]

    def get_stats(self) -> dict[str, Any]:
        return {}

    def flush_cache(self) -> bool:
        return True

    def check_alive(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def prompts(self, kind: str) -> list[str]:
        return [p for k, p, _ in self.calls if k == kind]
