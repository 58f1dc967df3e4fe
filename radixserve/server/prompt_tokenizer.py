"""PromptTokenizer: the HTTP process's text <-> token ids (prompts, chat templates, logprobs).

Large texts are tokenized in a worker thread so the event loop keeps serving other requests
while a megabyte of prompt is split.
"""

from __future__ import annotations

import asyncio
from typing import Any

LARGE_TEXT_CHARS = 16384


class PromptTokenizer:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def from_pretrained(cls, path: str) -> PromptTokenizer:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(path))

    async def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of ``text`` (with the tokenizer's BOS etc. when ``add_special_tokens``)."""
        if len(text) > LARGE_TEXT_CHARS:
            return await asyncio.to_thread(self._encode, text, add_special_tokens)
        return self._encode(text, add_special_tokens)

    async def apply_chat_template(self, messages: list[dict[str, Any]]) -> list[int]:
        """The prompt ids of ``messages`` through the tokenizer's chat template, with the
        assistant generation prompt appended. ``ValueError`` if the model has no template."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("this model has no chat template; use /v1/completions")
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        # the template writes any BOS itself: no special tokens on top
        return await self.tokenize(str(text), add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def decode_token(self, token_id: int) -> str:
        return self.decode([token_id])

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))
