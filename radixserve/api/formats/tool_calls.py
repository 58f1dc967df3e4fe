"""Tool calls of the chat route: the constraint of ``tool_choice`` and the parsers of a model
family's tool-call text.

- ``required`` and a named function constrain the output, as SGLang does, to a JSON array of
  ``{"name": ..., "parameters": {...}}`` objects (:func:`tool_choice_schema`), which
  :func:`parse_constrained` reads back into calls.
- ``auto`` lets the model write its own format, which a :class:`ToolCallParser` reads:
  Qwen2.5/Qwen3 (``qwen25``, also ``qwen``: ``<tool_call>{"name", "arguments"}</tool_call>``,
  Hermes-style), Llama 3 (``llama3``: an optional ``<|python_tag|>`` then ``{"name",
  "parameters"}`` objects joined by ``;``) or Mistral (``mistral``: ``[TOOL_CALLS]`` then a
  JSON array of ``{"name", "arguments"}`` objects). The names are SGLang's.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

PARSERS = ("qwen25", "llama3", "mistral")
ALIASES = {"qwen": "qwen25"}  # SGLang accepts both names for the Qwen format
MARKERS = {"qwen25": "<tool_call>", "llama3": "<|python_tag|>", "mistral": "[TOOL_CALLS]"}


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON string, as OpenAI sends it

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        """The call as OpenAI's ``tool_calls`` item (with ``index`` in a stream delta)."""
        out: dict[str, Any] = {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return out if index is None else {"index": index, **out}


def _tool_item_schema(name: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string", "enum": [name]},
            "parameters": parameters or {"type": "object", "properties": {}},
        },
        "required": ["name", "parameters"],
        "additionalProperties": False,  # a call is its name and parameters, nothing else
    }


def tool_choice_schema(
    tools: list[tuple[str, dict[str, Any] | None]], named: str | None, parallel: bool
) -> dict[str, Any]:
    """The JSON schema of ``required`` (any of ``tools``) or of the function ``named``:
    an array of at least one call (exactly one when not ``parallel``)."""
    if named is not None:
        items = _tool_item_schema(named, dict(tools)[named])
    else:
        items = {"type": "object", "anyOf": [_tool_item_schema(n, p) for n, p in tools]}
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": items}
    if not parallel:
        schema["maxItems"] = 1
    defs: dict[str, Any] = {}
    for _, parameters in tools:
        for key, value in (parameters or {}).get("$defs", {}).items():
            if defs.setdefault(key, value) != value:
                raise ValueError(f"tools define `$defs.{key}` twice, differently")
    if defs:
        schema["$defs"] = defs
    return schema


def parse_constrained(text: str) -> list[ParsedCall] | None:
    """The calls of an output written under :func:`tool_choice_schema` (None: not that)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, list) or not data:
        return None
    calls = [_call_of(item, "parameters") for item in data]
    return None if any(c is None for c in calls) else calls  # type: ignore[return-value]


def _call_of(item: Any, *argument_keys: str) -> ParsedCall | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    for key in argument_keys:
        if key in item:
            args = item[key]
            return ParsedCall(item["name"], args if isinstance(args, str) else json.dumps(args))
    return ParsedCall(item["name"], "{}")


class ToolCallParser:
    """A model family's tool-call text: :meth:`parse` splits a whole output into content and
    calls; :meth:`start` says where the calls may begin, so a stream sends the content before
    it and holds the rest."""

    def __init__(self, kind: str) -> None:
        kind = ALIASES.get(kind, kind)
        if kind not in PARSERS:
            raise ValueError(f"tool_call_parser must be one of {', '.join(PARSERS)}")
        self.kind = kind
        self.marker = MARKERS[kind]

    def start(self, text: str) -> int | None:
        """The index where tool calls begin in ``text`` (None: not yet)."""
        at = text.find(self.marker)
        if at >= 0:
            return at
        if self.kind == "llama3" and text.lstrip().startswith("{"):
            return 0  # Llama 3 writes bare JSON calls
        return None

    def held_len(self, text: str) -> int:
        """How many trailing characters of ``text`` may yet become the start of a call (a
        stream holds them back): a proper prefix of the marker and, for Qwen, the whitespace
        before it; or Llama 3's leading space."""
        if self.kind == "llama3" and not text.strip():
            return len(text)
        held = 0
        for k in range(min(len(self.marker) - 1, len(text)), 0, -1):
            if self.marker.startswith(text[-k:]):
                held = k
                break
        if self.kind != "llama3":  # whitespace before a call is dropped (see parse): hold it
            body = text[: len(text) - held]
            held += len(body) - len(body.rstrip())
        return held

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        """``(content, calls)``; no calls (and all of ``text`` as content) if any call in it is
        malformed, so a model's bad JSON reaches the client as text, not as a broken call."""
        at = self.start(text)
        if at is None:
            return text, []
        body = text[at:]
        if self.kind == "qwen25":
            calls = self._qwen25(body)
        elif self.kind == "mistral":
            calls = self._mistral(body)
        else:
            calls = self._llama3(body)
        if not calls:
            return text, []
        return text[: self.content_end(text, at)], calls

    def content_end(self, text: str, at: int) -> int:
        """Where the content before calls starting at ``at`` ends: Qwen's whitespace before
        a call is not content."""
        return len(text[:at].rstrip()) if self.kind != "llama3" else at

    @staticmethod
    def _qwen25(text: str) -> list[ParsedCall]:
        bodies = re.findall(r"<tool_call>(.*?)(?:</tool_call>|$)", text, flags=re.DOTALL)
        calls = []
        for body in bodies:
            try:
                call = _call_of(json.loads(body.strip()), "arguments", "parameters")
            except json.JSONDecodeError:
                return []
            if call is None:
                return []
            calls.append(call)
        return calls

    @staticmethod
    def _mistral(text: str) -> list[ParsedCall]:
        try:
            data = json.loads(text[len("[TOOL_CALLS]") :].strip())
        except json.JSONDecodeError:
            return []
        items = data if isinstance(data, list) else [data]
        calls = [c for item in items if (c := _call_of(item, "arguments", "parameters"))]
        return calls if calls and len(calls) == len(items) else []

    @staticmethod
    def _llama3(text: str) -> list[ParsedCall]:
        text = text.replace("<|python_tag|>", "").strip()
        decoder = json.JSONDecoder()
        calls, pos = [], 0
        while pos < len(text):
            try:
                item, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError:
                return []
            call = _call_of(item, "parameters", "arguments")
            if call is None:
                return []
            calls.append(call)
            pos = end
            while pos < len(text) and text[pos] in " \n\t;":
                pos += 1
        return calls


def detect_parser(chat_template: str | None) -> str:
    """The tool-call format a chat template teaches its model (Hermes/Qwen by default)."""
    template = chat_template or ""
    if "<tool_call>" in template:
        return "qwen25"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or "<|start_header_id|>" in template:
        return "llama3"
    return "qwen25"
