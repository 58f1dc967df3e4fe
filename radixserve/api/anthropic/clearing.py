"""The clearing edits of ``context_management`` (``api/anthropic/edits.py``), applied to a
conversation before it is rendered, as Anthropic applies them before the prompt reaches the
model: the client keeps the whole history and sends it each turn.

- ``clear_thinking_20251015`` drops the thinking blocks of the older assistant turns;
- ``clear_tool_uses_20250919``, past its trigger, replaces the results of the older tool uses
  (oldest first, all but the last ``keep``) with :data:`PLACEHOLDER`, and their inputs with
  ``{}`` where ``clear_tool_inputs`` says so.

Each edit applies to what the edit before it left, and only where it clears something (and at
least ``clear_at_least`` tokens); the response's ``context_management.applied_edits`` names
each that did, with the tool uses or thinking turns it cleared and the prompt tokens that
saved, measured by rendering the conversation before and after. A clearing rewrites the
prompt from the first result it clears on, so the radix cache holds only the part before it:
``clear_at_least`` keeps a clearing worth what it costs, as on Anthropic's side.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from radixserve.api.anthropic.edits import Clearing, ClearThinking, ClearToolUses
from radixserve.api.anthropic.protocol import (
    Message,
    MessagesRequest,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

PLACEHOLDER = "[This tool result was cleared to save context.]"

Count = Callable[[MessagesRequest], Awaitable[list[int]]]


@dataclass
class Edited:
    """A request after its clearing edits: the body to run, what was applied, and the prompt's
    ids (None: no clearing edit was given, so nothing was rendered)."""

    body: MessagesRequest
    applied: list[dict[str, Any]] = field(default_factory=list)
    prompt: list[int] | None = None
    original_tokens: int | None = None


async def apply(body: MessagesRequest, count: Count) -> Edited:
    """``body`` with its clearing edits applied in order (``count``: the prompt ids of a body,
    as the door renders it)."""
    edits = body.context_management.clearing() if body.context_management else []
    if not edits:
        return Edited(body)
    prompt = await count(body)
    original = len(prompt)
    applied: list[dict[str, Any]] = []
    for edit in edits:
        at_least = None  # the tokens a clearing must save to be applied (None: any number)
        if isinstance(edit, ClearToolUses):
            if not edit.triggered(len(prompt), len(_tool_uses(body.messages))):
                continue
            at_least = edit.clear_at_least
        messages, cleared = clear(edit, body.messages)
        if not cleared:
            continue
        candidate = body.model_copy(update={"messages": messages})
        ids = await count(candidate)
        saved = len(prompt) - len(ids)
        if at_least is not None and saved < at_least.value:
            continue
        body, prompt = candidate, ids
        applied.append(_report(edit, cleared, saved))
    return Edited(body, applied, prompt, original)


def clear(edit: Clearing, messages: list[Message]) -> tuple[list[Message], int]:
    """``messages`` with ``edit``'s clearing done, and how many tool uses or thinking turns
    it cleared."""
    if isinstance(edit, ClearThinking):
        return clear_thinking(messages, edit.turns_kept())
    return clear_tool_uses(messages, edit)


def clear_thinking(messages: list[Message], kept: int | None) -> tuple[list[Message], int]:
    """The thinking blocks of all but the last ``kept`` assistant turns dropped (None: none
    dropped), and how many turns lost some."""
    turns = [i for i, message in enumerate(messages) if message.role == "assistant"]
    older = set(turns[: max(len(turns) - kept, 0)]) if kept is not None else set()
    out, cleared = [], 0
    for i, message in enumerate(messages):
        if i in older and isinstance(message.content, list):
            content = [b for b in message.content if not isinstance(b, ThinkingBlock)]
            if len(content) < len(message.content):
                message = message.model_copy(update={"content": content})
                cleared += 1
        out.append(message)
    return out, cleared


def clear_tool_uses(messages: list[Message], edit: ClearToolUses) -> tuple[list[Message], int]:
    """The results (and, as ``edit`` says, the inputs) of all but the last ``keep`` tool uses
    cleared, but those of ``exclude_tools``; and how many uses had something cleared."""
    uses = _tool_uses(messages)
    older = uses[: max(len(uses) - edit.keep.value, 0)]
    excluded = set(edit.exclude_tools or ())
    names = {use.id: use.name for use in older if use.name not in excluded}
    touched: set[str] = set()
    out = []
    for message in messages:
        if isinstance(message.content, list):
            content = [_cleared(block, names, edit, touched) for block in message.content]
            if any(new is not old for new, old in zip(content, message.content, strict=True)):
                message = message.model_copy(update={"content": content})
        out.append(message)
    return out, len(touched)


def _cleared(block: Any, names: dict[str, str], edit: ClearToolUses, touched: set[str]) -> Any:
    """``block`` with its part cleared where it is a use (or the result of one) in ``names``."""
    if isinstance(block, ToolResultBlock) and block.tool_use_id in names:
        if block.content != PLACEHOLDER:
            touched.add(block.tool_use_id)
            return block.model_copy(update={"content": PLACEHOLDER})
    if isinstance(block, ToolUseBlock) and block.id in names and edit.clears_input(block.name):
        if block.input:
            touched.add(block.id)
            return block.model_copy(update={"input": {}})
    return block


def _tool_uses(messages: list[Message]) -> list[ToolUseBlock]:
    return [
        block
        for message in messages
        if message.role == "assistant" and isinstance(message.content, list)
        for block in message.content
        if isinstance(block, ToolUseBlock)
    ]


def _report(edit: Clearing, cleared: int, saved: int) -> dict[str, Any]:
    """One of ``applied_edits``, as Anthropic's response names it."""
    what = "cleared_thinking_turns" if isinstance(edit, ClearThinking) else "cleared_tool_uses"
    return {"type": edit.type, what: cleared, "cleared_input_tokens": max(saved, 0)}
