"""Items as OpenAI lists them (with an id, a status, a message's content as parts), and its
cursor pages: a stored response's input items (``GET /v1/responses/{id}/input_items``, after
the items and output of what it was chained to) and a conversation's
(``GET /v1/conversations/{id}/items``).

OpenAI's ids are kept where the client gave them; the others are made here, once, when the
items are stored, so paging with ``after`` finds the same ids on every call.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import Query

from radixserve.api.errors import APIError
from radixserve.api.responses.render import new_id

_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "reasoning": "rs",
    "compaction": "cmp",
}


def input_items(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``input`` (a string, or items as ``protocol.ResponsesRequest`` took them) as listed."""
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    return [_listed(item) for item in items]


def _listed(item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type", "message")
    out = {**item, "type": kind, "id": item.get("id") or new_id(_PREFIX.get(kind, "item"))}
    if kind not in ("reasoning", "compaction"):
        out.setdefault("status", "completed")
    if kind == "message":
        part = "output_text" if item["role"] == "assistant" else "input_text"
        content = item.get("content", "")
        if isinstance(content, str):
            content = [{"type": part, "text": content}]
        if part == "output_text":
            content = [{"annotations": [], **p, "type": part} for p in content]
        out["content"] = content
    return out


def page(
    items: list[dict[str, Any]], after: str | None, limit: int, order: Literal["asc", "desc"]
) -> dict[str, Any]:
    """One page of OpenAI's cursor list: ``limit`` items after the one with id ``after``, in
    ``order`` (``desc``: the newest first)."""
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise APIError(f"no item {after!r} in this list", 404, param="after")
        start = ids.index(after) + 1
    data = ordered[start : start + limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + limit < len(ordered),
    }


class PageQuery:
    """OpenAI's cursor-list query, a route's dependency (``include`` is taken: there is nothing
    more to include here)."""

    def __init__(
        self,
        after: str | None = None,
        limit: int = Query(20, ge=1, le=100),
        order: Literal["asc", "desc"] = "desc",
        include: list[str] | None = Query(None),
    ) -> None:
        self.after, self.limit, self.order = after, limit, order

    def page(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        return page(items, self.after, self.limit, self.order)
