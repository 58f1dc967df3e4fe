"""Role markers for ``system/user/assistant``: the text a chat template puts around a message.

The markers are read off the model's own template: render a system, user and assistant message
with sentinel contents one at a time, and cut each new piece at its sentinel. That works for
templates that render a conversation as the concatenation of its messages (ChatML, Llama 3,
Mistral and most others). A template that does not (one that rejects a system message, or that
rewrites earlier turns) falls back to ChatML, which is also what a backend without a tokenizer
uses; the fallback is visible as ``ChatTemplate.source``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

_SENTINEL = "\x00RADIXSERVE-CONTENT-{}\x00"


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """``markers[role] = (prefix, suffix)`` wrapped around each message's content."""

    markers: dict[str, tuple[str, str]]
    source: str  # "tokenizer" or "chatml (fallback: ...)"

    def begin(self, role: str) -> str:
        return self._get(role)[0]

    def end(self, role: str) -> str:
        return self._get(role)[1]

    def _get(self, role: str) -> tuple[str, str]:
        if role not in self.markers:
            raise ValueError(f"the chat template has no role {role!r}")
        return self.markers[role]

    @classmethod
    def chatml(cls, reason: str = "") -> ChatTemplate:
        markers = {
            r: (f"<|im_start|>{r}\n", "<|im_end|>\n") for r in ("system", "user", "assistant")
        }
        return cls(markers, "chatml" + (f" (fallback: {reason})" if reason else ""))

    @classmethod
    def from_tokenizer(cls, tokenizer: Any | None) -> ChatTemplate:
        """The template of a Hugging Face tokenizer, or ChatML when it has none that we can
        cut into role markers."""
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            return cls.chatml("no tokenizer chat template")
        try:
            return cls(_markers_of(tokenizer), "tokenizer")
        except Exception as exc:  # any template failure means: use the fallback
            logger.warning("cannot derive role markers from the chat template (%s): ChatML", exc)
            return cls.chatml(str(exc))


def _markers_of(tokenizer: Any) -> dict[str, tuple[str, str]]:
    conversation = [
        {"role": role, "content": _SENTINEL.format(i)}
        for i, role in enumerate(("system", "user", "assistant"))
    ]
    markers: dict[str, tuple[str, str]] = {}
    rendered_before = ""
    for i, message in enumerate(conversation):
        rendered = tokenizer.apply_chat_template(
            conversation[: i + 1], tokenize=False, add_generation_prompt=False
        )
        if not rendered.startswith(rendered_before):
            raise ValueError("the template re-renders earlier messages")
        piece = rendered[len(rendered_before) :]
        prefix, sep, suffix = piece.partition(message["content"])
        if not sep:
            raise ValueError(f"the template drops the {message['role']} content")
        markers[message["role"]] = (prefix, suffix)
        rendered_before = rendered
    return markers
