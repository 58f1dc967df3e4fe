"""PromptTokenizer: the HTTP process's text <-> token ids (prompts, chat templates, logprobs).

Large texts are tokenized in a worker thread so the event loop keeps serving other requests
while a megabyte of prompt is split. A text that cannot fit the context is refused by its
length in characters, before it is tokenized, where the tokenizer makes that decisive: a
byte-level BPE with no normalizer never drops a byte, and each token covers at most as many
characters as its own byte string (the longest in the vocabulary), so a text of ``c``
characters has at least ``c / longest`` tokens.

Chat prompts: the text of the request (messages, tools, ``chat_template_kwargs``) is text.
Special-token text in it (``<|im_end|>``) is tokenized as the plain text it spells, while the
template's own special tokens stay special (:class:`ContentGuard`), unless the server allows
special tokens in content (``--allow-special-tokens-in-content``: transformers' behaviour).
"""

from __future__ import annotations

import asyncio
from typing import Any

from radixserve.server.content_guard import ContentGuard
from radixserve.tokenizer_loader import load_tokenizer

LARGE_TEXT_CHARS = 16384


class PromptTokenizer:
    """``max_context_len``: texts that must tokenize to at least this many tokens are refused
    (``ValueError``) without tokenizing; None: no such check. ``allow_special_tokens_in_content``:
    chat prompts are tokenized as one rendered text, so special-token text in a message
    becomes the special token."""

    def __init__(
        self,
        tokenizer: Any,
        max_context_len: int | None = None,
        allow_special_tokens_in_content: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_context_len = max_context_len
        self.max_chars_per_token = _max_chars_per_token(tokenizer)
        self.content_guard = None if allow_special_tokens_in_content else ContentGuard(tokenizer)

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        max_context_len: int | None = None,
        allow_special_tokens_in_content: bool = False,
    ) -> PromptTokenizer:
        tokenizer = load_tokenizer(path)
        return cls(tokenizer, max_context_len, allow_special_tokens_in_content)

    async def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of ``text`` (with the tokenizer's BOS etc. when ``add_special_tokens``)."""
        self._check_length(len(text))
        if len(text) > LARGE_TEXT_CHARS:
            return await asyncio.to_thread(self._encode, text, add_special_tokens)
        return self._encode(text, add_special_tokens)

    async def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **template_kwargs: Any,
    ) -> list[int]:
        """The prompt ids of ``messages`` (and ``tools``, OpenAI's tool definitions) through
        the tokenizer's chat template, with the assistant generation prompt appended (or the
        last message left open, ``continue_final_message``), as transformers'
        ``apply_chat_template`` renders and tokenizes them, except that special-token text in
        the request is plain text (module docstring); ``template_kwargs`` go to the template
        (``chat_template_kwargs``). ``ValueError`` if the model has no template."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("this model has no chat template; use /v1/completions")
        for owned in ("add_generation_prompt", "continue_final_message", "tokenize"):
            template_kwargs.pop(owned, None)  # the request's own fields say these
        guard = self.content_guard
        request = (messages, tools, template_kwargs)
        guarded = False  # the request spells a special token: the guard tokenizes it
        if guard is not None:
            request, guarded = guard.escape(request)
        text = self._render(*request, add_generation_prompt, continue_final_message)
        if guard is None or not guarded:
            # the template writes any BOS itself: no special tokens on top
            return await self.tokenize(text, add_special_tokens=False)
        text, num_chars = guard.restore(text)
        self._check_length(num_chars)
        return await asyncio.to_thread(guard.encode, text)  # its first call copies the tokenizer

    def render_text(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        **template_kwargs: Any,
    ) -> str:
        """The chat template's text of ``messages`` (untokenized; no guard: for text the server
        writes itself, as ``call_form.py``'s probes)."""
        for owned in ("add_generation_prompt", "continue_final_message", "tokenize"):
            template_kwargs.pop(owned, None)
        return self._render(messages, tools, template_kwargs, add_generation_prompt, False)

    def _render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any],
        add_generation_prompt: bool,
        continue_final_message: bool,
    ) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tokenize=False,
                **template_kwargs,
            )
        )

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def decode_token(self, token_id: int) -> str:
        return self.decode([token_id])

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def _check_length(self, num_chars: int) -> None:
        ctx, per_token = self.max_context_len, self.max_chars_per_token
        if ctx is None or per_token is None:
            return
        min_tokens = -(-num_chars // per_token)
        if min_tokens >= ctx:
            raise ValueError(
                f"this model's maximum context length is {ctx} tokens; the prompt has "
                f"{num_chars} characters, so at least {min_tokens} tokens"
            )


def _max_chars_per_token(tokenizer: Any) -> int | None:
    """The most characters one token can cover, where that is certain: a fast byte-level
    tokenizer without a normalizer (None otherwise)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.normalizer is not None:
        return None
    if "ByteLevel" not in repr(backend.pre_tokenizer):
        return None
    vocab = tokenizer.get_vocab()
    # byte-level keys spell one byte per character; added tokens are the literal text they match
    return max((len(token) for token in vocab), default=0) or None
