"""OpenAI's custom tools (``type: "custom"``): a tool whose call carries one raw string, its
``input``, free text or text in a grammar (``format``: ``text``, or ``grammar`` with a ``lark``
or ``regex`` definition), such as the Agents SDK's ``CustomTool`` and its ``apply_patch``. The
Responses API gives them flat (``{"type": "custom", "name", "format": {"type": "grammar",
"syntax", "definition"}}``); the chat route nests them (``{"type": "custom", "custom": {"name",
"format": {"type": "grammar", "grammar": {"syntax", "definition"}}}}``, calls as ``{"type":
"custom", "custom": {"name", "input"}}``): :func:`from_chat` reads the chat shape as the flat
one, :func:`chat_call` writes a call back in it.

The models this server runs were trained to call functions with JSON arguments, so a custom
tool is offered to the chat template as a function of one string parameter, ``input``, whose
description says what the text is (a grammar's definition included), and a call of it is read
back as a ``custom_tool_call`` whose ``input`` is that string. Sent back, the call renders as
that function's call again (a radix hit of what the model wrote), its
``custom_tool_call_output`` as the tool's message. A call is kept to that one parameter, and
a regex format's string matches it whole (JSON Schema's ``pattern``, anchored), forced or in
``auto`` mode (``api/openai/chat_tools.py``). A Lark grammar is described to the model and not
enforced: it speaks of the raw text, and the call's text is a JSON string, escaped.
"""

from __future__ import annotations

import json
import re
from typing import Any

INPUT = "input"  # the one parameter a custom tool is offered with
SYNTAXES = ("lark", "regex")


def check(tool: dict[str, Any]) -> None:
    """``ValueError`` naming what is wrong with a custom tool's fields."""
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise ValueError("a custom tool needs a name")
    fmt = tool.get("format") or {"type": "text"}
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "grammar"):
        raise ValueError(f"custom tool {tool['name']!r}: format must be text or grammar")
    if fmt["type"] == "grammar":
        if fmt.get("syntax") not in SYNTAXES or not isinstance(fmt.get("definition"), str):
            raise ValueError(
                f"custom tool {tool['name']!r}: a grammar format needs a syntax (lark or "
                "regex) and a definition"
            )
        if fmt["syntax"] == "regex":
            try:
                re.compile(fmt["definition"])
            except re.error as exc:
                raise ValueError(f"custom tool {tool['name']!r}: invalid regex: {exc}") from None


def as_function(tool: dict[str, Any]) -> dict[str, Any]:
    """A custom tool as the function tool the template is offered (``custom`` marks it)."""
    fmt = tool.get("format") or {"type": "text"}
    prop: dict[str, Any] = {"type": "string"}
    if fmt["type"] == "text":
        prop["description"] = "The tool's input, as free text."
    elif fmt["syntax"] == "regex":
        prop["description"] = f"The tool's input: text matching the regex {fmt['definition']}"
        prop["pattern"] = f"^(?:{fmt['definition']})$"
    else:
        prop["description"] = f"The tool's input: text in this Lark grammar:\n{fmt['definition']}"
    parameters = {
        "type": "object",
        "properties": {INPUT: prop},
        "required": [INPUT],
        "additionalProperties": False,
    }
    function = {"type": "function", "name": tool["name"], "parameters": parameters}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {**function, "custom": True}


def call_input(arguments: str) -> str:
    """A call's ``input`` from the JSON arguments the model wrote: its ``input`` string, or
    the arguments as written where the model wrote something else."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get(INPUT), str):
        return str(parsed[INPUT])
    return arguments


def call_arguments(text: str) -> str:
    """A ``custom_tool_call``'s ``input`` as the function call's arguments it renders as."""
    return json.dumps({INPUT: text}, ensure_ascii=False)


def from_chat(tool: dict[str, Any]) -> dict[str, Any]:
    """A chat route's custom tool in the Responses API's flat shape (``ValueError`` naming what
    is wrong)."""
    custom = tool.get("custom")
    if not isinstance(custom, dict):
        raise ValueError("a custom tool needs its fields under custom")
    flat: dict[str, Any] = {"type": "custom", **{k: v for k, v in custom.items() if k != "format"}}
    fmt = custom.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        grammar = fmt.get("grammar")
        fmt = {"type": "grammar", **(grammar if isinstance(grammar, dict) else {})}
    if fmt is not None:
        flat["format"] = fmt
    check(flat)
    return flat


def chat_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """A call of a custom tool as the chat route's ``tool_calls`` item."""
    return {
        "id": call_id,
        "type": "custom",
        "custom": {"name": name, "input": call_input(arguments)},
    }
