"""Anthropic's threads (``thread``, a beta): conversation state held by the server, so a client
sends only a turn's new messages.

``{"type": "create"}`` holds the conversation under the answer's ``id``: the request's messages
and the answer as the assistant's turn (its content blocks as they came back: thinking, text,
tool uses, a compaction). ``{"type": "continue", "previous_message_id": ...}`` renders that
held conversation, then the new messages, and holds the longer one under the new answer's id,
so a thread goes on turn after turn. ``system`` and ``tools`` are the request's own each turn,
as Anthropic's are (its state is the messages). The held conversation renders as the answer
came, so the next turn's prompt meets the previous turn's prompt and answer in the radix cache.

Each tenant's threads are its own (:class:`TenantStore`: another tenant's id is a 404 like an
unknown one), bounded as the Responses API's stored responses are (``--max-stored-responses``,
``--max-stored-bytes``). Over data-parallel workers an id names its worker, and a request that
continues another worker's thread is forwarded there (``api/responses/peers.py``).
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from radixserve.api.anthropic.protocol import Message, MessagesRequest
from radixserve.api.responses.store import REFERENCE_BYTES, TenantStore, json_bytes

_MESSAGES = TypeAdapter(list[Message])


class ThreadStore(TenantStore[list[Message]]):
    kind = "message"  # a 404 says: no message 'msg_...'


def resume(
    store: ThreadStore, tenant: str | None, body: MessagesRequest
) -> tuple[MessagesRequest, int]:
    """``body`` with the thread it continues before its messages, and how many messages that
    thread held (``body`` as it is and 0 without one); a 404 for a thread this tenant does
    not hold."""
    thread = body.thread
    if thread is None or thread.type != "continue":
        return body, 0
    held = store.find(tenant, thread.previous_message_id, "thread.previous_message_id")
    return body.model_copy(update={"messages": [*held, *body.messages]}), len(held)


def hold(
    store: ThreadStore,
    tenant: str | None,
    body: MessagesRequest,
    held: int,
    answer_id: str,
    content: list[dict[str, Any]],
) -> None:
    """Keep ``body``'s conversation (``held`` of its messages from its thread) and the
    answer's ``content`` under ``answer_id``, where ``body`` asks for a thread. The messages
    are shared with the thread they come from, so a turn counts the bytes of its own new
    messages and answer; a turn past the store's bounds is not kept (continuing from it is
    then a 404, as from one evicted)."""
    if body.thread is None:
        return
    turn = _MESSAGES.validate_python([{"role": "assistant", "content": content}])
    messages = [*body.messages, *turn]
    new = _MESSAGES.dump_python(messages[held:], mode="json", exclude_none=True)
    store.put(tenant, answer_id, messages, json_bytes(new) + REFERENCE_BYTES * len(messages))
