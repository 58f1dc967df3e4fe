"""A chat request's tools as one plan: what the template renders, what grammar constrains the
output, and how the output turns back into ``tool_calls`` (whole, or as a stream).

``tool_choice`` (default ``auto`` when ``tools`` are given):

- ``none``: the tools are not rendered (as SGLang); plain text;
- ``auto``: rendered; the model's own tool-call format is parsed (:class:`ToolCallParser`).
  With a ``strict`` or custom tool or an ``allowed_tools`` choice, the text stays free and
  each call, from the family's marker on, is kept to the allowed tools and the strict and
  custom ones' parameters (:meth:`CallForm.lazy_grammar`), where the template's calls begin
  with the marker;
- ``allowed_tools`` (OpenAI's): every tool rendered, so the prompt is the same whichever are
  allowed (a cache hit); ``required`` mode constrains the calls to the allowed ones, ``auto``
  mode is ``auto``, kept to them as above;
- ``required`` / a named function: rendered, and the output is constrained to the calls in
  the template's own words where the template has them (:class:`CallForm`: the next turn's
  prompt then matches the answer's cached tokens), else to a JSON array over the tools'
  parameters (:func:`tool_choice_schema`, as SGLang does); then parsed back.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixserve.api.formats import custom_tools
from radixserve.api.formats.call_form import CallForm
from radixserve.api.formats.tool_calls import (
    ParsedCall,
    ToolCallParser,
    parse_constrained,
    tool_choice_schema,
)
from radixserve.api.openai.protocol import (
    AllowedToolsChoice,
    ChatCompletionRequest,
    NamedToolChoice,
)
from radixserve.api.structured import grammar_fields, response_format_schema


@dataclass(slots=True)
class ToolPlan:
    tools: list[dict[str, Any]] | None  # what the chat template renders (None: no tools)
    grammar: dict[str, str]  # the SamplingParams grammar fields
    parser: ToolCallParser | None = None  # auto: the model family's format
    constrained: bool = False  # required / named: the output is only calls
    form: CallForm | None = None  # ... in the template's words (None: the schema's array)
    names: tuple[str, ...] = ()  # the functions a constrained output may call
    custom: frozenset[str] = frozenset()  # the custom tools' names (calls go back as custom)

    @property
    def parses_calls(self) -> bool:
        return self.constrained or self.parser is not None

    def call_item(self, call: ParsedCall, index: int | None = None) -> dict[str, Any]:
        """``call`` as a ``tool_calls`` item: a function's, or a custom tool's (its ``input``
        read from the arguments, ``api/formats/custom_tools.py``); ``index`` in a stream."""
        item = call.to_openai()
        if call.name in self.custom:
            item = custom_tools.chat_call(item["id"], call.name, call.arguments)
        return item if index is None else {"index": index, **item}

    def forced_calls(self, text: str) -> list[ParsedCall] | None:
        """The calls of a constrained output (None: not calls, e.g. cut by the length)."""
        if self.form is not None:
            return self.form.parse(text, self.names)
        return parse_constrained(text)

    def parse(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        """``(content, calls)`` of a whole output; content None when only calls came."""
        if self.constrained:
            calls = self.forced_calls(text)
            return (text, []) if calls is None else (None, calls)
        if self.parser is None:
            return text, []
        content, calls = self.parser.parse(text)
        return (content or None) if calls else content, calls

    def stream(self) -> ToolStream:
        return ToolStream(self)


@dataclass(slots=True)
class ToolStream:
    """One choice's stream: :meth:`feed` returns the content to send now and holds back what
    may be a tool call; :meth:`finish` parses what was held."""

    plan: ToolPlan
    pending: str = ""  # text not yet sent: a possible start of a call
    held: str = ""  # text from the start of the calls on
    started: bool = False

    def feed(self, text: str) -> str:
        if not self.plan.parses_calls:
            return text
        if self.plan.constrained or self.started:
            self.held += text
            return ""
        parser = self.plan.parser
        assert parser is not None
        self.pending += text
        at = parser.start(self.pending)
        if at is not None:
            at = parser.content_end(self.pending, at)  # as parse cuts the content
            out, self.held, self.pending, self.started = (
                self.pending[:at],
                self.pending[at:],
                "",
                True,
            )
            return out
        keep = parser.held_len(self.pending)
        out = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep :]
        return out

    def finish(self) -> tuple[str, list[ParsedCall]]:
        """``(content still to send, calls)`` at the end of the choice."""
        if self.plan.constrained:
            calls = self.plan.forced_calls(self.held)
            return (self.held, []) if calls is None else ("", calls)
        if not self.started:
            return self.pending, []
        assert self.plan.parser is not None
        content, calls = self.plan.parser.parse(self.held)
        if not calls:
            return self.pending + self.held, []
        return content, calls


def plan_tools(
    body: ChatCompletionRequest,
    parser_kind: str,
    call_form: Callable[[], CallForm | None] = lambda: None,
) -> ToolPlan:
    """The plan of ``body``'s tools; ``call_form``: the template's words for forced calls
    (None: the JSON array), asked for only when calls are forced. ``ValueError`` names what is
    wrong."""
    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none"):
            raise ValueError("tool_choice needs tools")
        return ToolPlan(None, body.grammar())
    names = [t.function.name for t in body.tools]
    if len(set(names)) != len(names):
        raise ValueError("tools: the function names must be distinct")
    choice = choice or "auto"
    if choice == "none":
        return ToolPlan(None, body.grammar())
    rendered = [t.model_dump(exclude_none=True) for t in body.tools]
    custom = frozenset(t.function.name for t in body.tools if t.custom)
    allowed = names
    if isinstance(choice, AllowedToolsChoice):  # every tool rendered, these callable
        allowed = choice.names()
        if unknown := sorted(set(allowed) - set(names)):
            raise ValueError(f"tool_choice allows {unknown}, which are not in tools")
        choice = "required" if choice.allowed_tools.mode == "required" else "auto"
    if choice == "auto":
        parser = ToolCallParser(parser_kind)
        grammar = body.grammar() or _enforced_auto(body, allowed, parser, call_form)
        return ToolPlan(rendered, grammar, parser=parser, custom=custom)
    constrained_by_body = response_format_schema(body.response_format) is not None
    if constrained_by_body or any(x is not None for x in (body.regex, body.json_schema, body.ebnf)):
        raise ValueError(
            "tool_choice required or a named function constrains the output itself: "
            "leave response_format, regex, json_schema and ebnf unset"
        )
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    if named is not None and named not in names:
        raise ValueError(f"tool_choice names the function `{named}`, which is not in tools")
    tools = [(t.function.name, t.function.parameters) for t in body.tools]
    tools = [(name, parameters) for name, parameters in tools if name in allowed]
    if (form := call_form()) is not None:
        grammar = grammar_fields(ebnf=form.grammar(tools, named, body.parallel_tool_calls))
        return ToolPlan(
            rendered, grammar, constrained=True, form=form, names=tuple(allowed), custom=custom
        )
    schema = tool_choice_schema(tools, named, body.parallel_tool_calls)
    grammar = grammar_fields(json_schema=json.dumps(schema))
    return ToolPlan(rendered, grammar, constrained=True, custom=custom)


def _enforced_auto(
    body: ChatCompletionRequest,
    allowed: list[str],
    parser: ToolCallParser,
    call_form: Callable[[], CallForm | None],
) -> dict[str, str]:
    """``auto``'s grammar where a call must be kept to what the client allowed: a strict
    tool's arguments to its parameters (a custom tool's too: its one ``input`` string, a regex
    format's pattern), an ``allowed_tools`` choice's calls to those tools.
    Free text, and each call, once the model writes its family's marker, in the template's
    words (:meth:`CallForm.lazy_grammar`). Empty where nothing is to be kept, where this
    build has no grammars, or where the template has no form or its calls do not begin with
    the marker: the output is then parsed as it comes."""
    tools = body.tools or []
    strict = any(t.function.strict or t.custom for t in tools)
    restricted = len(allowed) < len(tools)
    if not (strict or restricted) or importlib.util.find_spec("llguidance") is None:
        return {}
    form = call_form()
    if form is None:
        return {}
    kept = [
        (t.function.name, t.function.parameters if t.function.strict or t.custom else None)
        for t in tools
        if t.function.name in allowed
    ]
    lark = form.lazy_grammar(kept, parser.marker, body.parallel_tool_calls)
    return {} if lark is None else grammar_fields(ebnf=lark)
