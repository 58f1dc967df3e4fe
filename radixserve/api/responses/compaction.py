"""OpenAI's compaction (``POST /v1/responses/compact``, what the Agents SDK's
``OpenAIResponsesCompactionSession`` calls as a session grows): a conversation becomes its
user messages and one ``compaction`` item, which later requests send in place of the rest.

The model itself writes the compaction (``api/summary.py``), at most a quarter of the context
unless ``max_output_tokens`` says otherwise. OpenAI's item holds encrypted content that only
its service reads; this server's holds the summary, encoded (:func:`item`), and reads back
only its own (:func:`summary_of`): sent back, the item renders as a user message that gives
the summary (:func:`message`).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from radixserve.api import summary

ASK = {"type": "message", **summary.ask()}  # the summary request's last input item
DEFAULT_THRESHOLD = 0.8  # of the context: a create's compact_threshold where it sets none
_MARK = "radixserve-compaction-v1:"  # what begins the content of an item this server made


def item(text: str, item_id: str) -> dict[str, Any]:
    """The ``compaction`` item holding the summary ``text``."""
    encoded = base64.urlsafe_b64encode(text.encode()).decode()
    return {"type": "compaction", "id": item_id, "encrypted_content": _MARK + encoded}


def summary_of(compaction: dict[str, Any]) -> str:
    """The summary a ``compaction`` item holds; ``ValueError`` for an item this server did not
    make (OpenAI's content is encrypted for its service alone)."""
    content = compaction.get("encrypted_content")
    if not isinstance(content, str) or not content.startswith(_MARK):
        raise ValueError(
            "a compaction item's encrypted_content can be read only by the server that made "
            "it; this one was not made here"
        )
    try:
        return base64.urlsafe_b64decode(content.removeprefix(_MARK)).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise ValueError("a compaction item's encrypted_content is damaged") from None


def message(compaction: dict[str, Any]) -> dict[str, Any]:
    """A ``compaction`` item as the chat message it renders as."""
    return summary.told(summary_of(compaction))


def user_messages(given: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The user messages of ``given`` items: what a compacted conversation keeps beside its
    compaction item, as OpenAI's does."""
    return [i for i in given if i.get("type", "message") == "message" and i.get("role") == "user"]


def window(given: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What of ``given`` items renders: from the last ``compaction`` item on, and the user
    messages before it (the rest is what it holds, whether or not a client dropped it)."""
    last = max((i for i, item in enumerate(given) if item.get("type") == "compaction"), default=-1)
    return given if last < 0 else [*user_messages(given[:last]), *given[last:]]
