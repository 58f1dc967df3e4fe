"""The fewest middle turns of a conversation dropped so that what is left fits: OpenAI's
``truncation: auto`` (``api/responses/truncation.py``), and the summary of a conversation past
the context (``api/summary.py``).

Kept: the messages up to the first user message (the system's and the task) and the latest
turns, a turn starting at a user or an assistant message (so a tool's result stays with its
call); the last turn is never dropped. The search is a binary one over where the kept turns
start (dropping more only shortens), each try rendered by the caller.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
TURN_ROLES = ("user", "assistant")  # where a turn may start: a tool result stays with its call


def _role(message: Any) -> str:
    return str(message["role"] if isinstance(message, dict) else message.role)


async def fewest_dropped(
    messages: Sequence[Any], attempt: Callable[[list[Any]], Awaitable[tuple[bool, T]]]
) -> T:
    """What ``attempt`` made of ``messages`` with the fewest middle turns dropped where
    ``attempt(kept)`` says they fit (``(fits, made)``; it is first tried on the whole, the
    very list); of the whole where even the last turn alone does not fit (to be refused with
    its length as any other)."""
    whole = list(messages)
    fits, found = await attempt(whole)
    if fits:
        return found
    roles = [_role(m) for m in whole]
    first = next((i for i, role in enumerate(roles) if role == "user"), len(whole))
    head = first + 1  # the leading system messages and the first user message (the task)
    starts = [i for i in range(head + 1, len(whole)) if roles[i] in TURN_ROLES]
    low, high = 0, len(starts) - 1
    while low <= high:
        mid = (low + high) // 2
        fits, made = await attempt([*whole[:head], *whole[starts[mid] :]])
        if fits:
            found, high = made, mid - 1
        else:
            low = mid + 1
    return found
