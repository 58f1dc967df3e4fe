"""The chat template's own words for a tool call, learned by rendering it, so that a forced call
(``tool_choice`` ``required`` or a named function) is written as the template will render it
back on the next turn: that turn's prompt then matches the answer's cached tokens (a radix hit)
where a call written in other words (:func:`tool_calls.tool_choice_schema`'s JSON array) misses
from its first token. The model also writes its calls as it was trained to.

:func:`learn_form` renders a probe conversation three ways (the prompt with the generation
prompt; then with an assistant turn of one call, and of two calls, whose names and arguments are
sentinels) and reads off the pieces: the text before a call's name (``head``), between its name
and its arguments (``middle``), between two calls (``joiner``; none where the template renders
one call a turn), after the last call up to the end of the turn (``tail``), and how the
template's ``tojson`` separates keys and items. A template whose turn does not extend its
generation prompt, spells a special token in those pieces (no grammar text writes one), or
renders the arguments otherwise has no form: the JSON array stays.

:class:`CallForm` makes the grammar (lark, with each tool's parameters as ``%json``, written
with the template's separators) and reads an output of it back into calls.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from radixserve.api.formats.tool_calls import ParsedCall
from radixserve.runtime.grammar.limits import check_json_depth, check_regex_repeats, schema_patterns

NAMES = ("fn_probe_alpha", "fn_probe_beta")
ARGUMENTS = {"zq_probe": 7, "aq_probe": 8}  # not in sorted order: a template that sorts has none
_ARGS_TEXT = re.compile(r'\{"zq_probe"(?P<key>\s*:\s*)7(?P<item>\s*,\s*)"aq_probe"(?P=key)8\}')
Render = Callable[[list[dict[str, Any]], list[dict[str, Any]], bool], str]


@dataclass(frozen=True, slots=True)
class CallForm:
    head: str  # after the generation prompt, before the first call's name
    middle: str  # between a name and its arguments
    joiner: str | None  # between a call's arguments and the next's name (None: one a turn)
    tail: str  # after the last call's arguments, up to the end of the turn
    key_separator: str
    item_separator: str
    skip: int = 0  # how much of the head comes before the grammar's start (:meth:`after`)

    def after(self, marker: str) -> CallForm:
        """The form whose grammar starts after ``marker`` in its head (a grammar that starts
        after the thinking: the head's own empty thinking is not written again)."""
        at = self.head.rfind(marker)
        return self if at < 0 else replace(self, skip=at + len(marker))

    def grammar(
        self, tools: Sequence[tuple[str, dict[str, Any] | None]], named: str | None, parallel: bool
    ) -> str:
        """The lark grammar of one call of ``named`` (or of any of ``tools``), or of one or more
        when ``parallel`` and the template renders more than one a turn. ``ValueError`` for a
        schema past the grammar engine's limits, or one it cannot take, naming its tool."""
        rules = self._calls([(n, p) for n, p in tools if named is None or n == named])
        calls = "call"
        if parallel and self.joiner is not None:
            calls = f"call ({_literal(self.joiner)} call)*"
        head = _literal(self.head[self.skip :])
        start = " ".join(x for x in (head, calls, _literal(self.tail)) if x)
        return "\n".join([f"start: {start}", *rules]) + "\n"

    def lazy_grammar(
        self, tools: Sequence[tuple[str, dict[str, Any] | None]], trigger: str, parallel: bool
    ) -> str | None:
        """The lark grammar of free text in which a call, once ``trigger`` is written (the
        model family's marker, where the head holds it), goes on in the template's words as a
        call of one of ``tools`` (parameters None: any object) up to its tail; after it more
        text and calls when ``parallel``, else the end. None where the head lacks ``trigger``.
        ``ValueError`` as :meth:`grammar`."""
        at = self.head.find(trigger)
        if at < 0:
            return None
        rules = self._calls(tools)
        rest = _literal(self.head[at + len(trigger) :])
        tag = " ".join(x for x in ("trigger", rest, "call", _literal(self.tail)) if x)
        lines = [
            "%llguidance {}",
            # one call: then the end (a newline at most before it; llguidance ends a call
            # whose tail closes on an added token only through a lexeme after it)
            "start: (tag)* TEXT" if parallel else "start: TEXT | tag END",
            f"tag: {tag}",
            # lazy: the trigger ends the text where it first appears, so a call cannot hide
            # inside free text
            f"trigger[lazy]: TEXT {_literal(trigger)}",
            "TEXT: /(.|\\n)*/",
            "END: /\\n?/",
            *rules,
        ]
        return "\n".join(lines) + "\n"

    def _calls(self, tools: Sequence[tuple[str, dict[str, Any] | None]]) -> list[str]:
        """The ``call`` rule over ``tools`` and a rule per tool: its name, then its arguments
        under its parameters' schema, written with the template's separators."""
        options = {
            "whitespace_flexible": False,
            "key_separator": self.key_separator,
            "item_separator": self.item_separator,
        }
        from radixserve.runtime.grammar.factory import check_grammar

        rules, choices = [], []
        for k, (name, parameters) in enumerate(tools):
            schema = dict(parameters or {"type": "object", "properties": {}})
            check_json_depth(schema, f"the parameters of `{name}`")
            for pattern in schema_patterns(schema):
                check_regex_repeats(pattern, "a pattern of a tool's parameters")
            try:  # a schema the grammar engine cannot take, named (0.2 ms a schema)
                check_grammar(("json_schema", json.dumps(schema)))
            except ValueError as exc:
                raise ValueError(f"the parameters of `{name}`: {exc}") from None
            schema["x-guidance"] = options
            rules.append(f"call_{k}: {_literal(name + self.middle)} args_{k}")
            rules.append(f"args_{k}: %json {json.dumps(schema)}")
            choices.append(f"call_{k}")
        return ["call: " + " | ".join(choices), *rules]

    def parse(self, text: str, names: Sequence[str]) -> list[ParsedCall] | None:
        """The calls of an output written under :meth:`grammar` (None: not that, e.g. cut by
        the length limit). The output may begin anywhere in the head (a reasoning parser takes
        what comes before the thinking's end)."""
        by_length = sorted(names, key=len, reverse=True)
        pos = self._first_call(text, by_length)
        if pos is None:
            return None
        decoder, calls = json.JSONDecoder(), []
        while True:
            name = next((n for n in by_length if text.startswith(n + self.middle, pos)), None)
            if name is None:
                return None
            start = pos + len(name) + len(self.middle)
            try:
                _, pos = decoder.raw_decode(text, start)
            except json.JSONDecodeError:
                return None
            calls.append(ParsedCall(name, text[start:pos]))  # the arguments as written
            if text.startswith(self.tail, pos) and not text[pos + len(self.tail) :].strip():
                return calls
            if self.joiner is None or not text.startswith(self.joiner, pos):
                return None
            pos += len(self.joiner)

    def _first_call(self, text: str, names: Sequence[str]) -> int | None:
        for at in range(min(len(self.head), len(text)) + 1):
            if self.head.endswith(text[:at]) and any(
                text.startswith(n + self.middle, at) for n in names
            ):
                return at
        return None


def learn_form(
    render: Render, end_texts: Sequence[str], special_texts: Sequence[str]
) -> CallForm | None:
    """The form of the template behind ``render(messages, tools, add_generation_prompt)`` (the
    rendered text), or None where it has none (module docstring). ``end_texts``: the model's
    end-of-turn tokens' texts (the form ends before the first); ``special_texts``: the special
    tokens' texts, which no piece may hold."""
    tools = [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in NAMES
    ]
    user = [{"role": "user", "content": "What is the probe?"}]
    try:
        prompt = render(user, tools, True)
        one = render([*user, _turn(NAMES[:1])], tools, False)
    except Exception:  # a template that cannot render a call: it has no form
        return None
    pieces = _pieces(prompt, one, NAMES[0])
    if pieces is None:
        return None
    head, middle, args, rest = pieces
    found = _ARGS_TEXT.fullmatch(args)
    end = min((at for e in end_texts if e and (at := rest.find(e)) >= 0), default=-1)
    if found is None or end < 0:
        return None
    tail = rest[:end]
    joiner = _joiner(
        render, user, tools, prompt, head + NAMES[0] + middle + args, middle, args, rest
    )
    form = CallForm(head, middle, joiner, tail, found["key"], found["item"])
    texts = (head, middle, joiner or "", tail)
    if any(s and s in t for s in special_texts for t in texts) or not middle:
        return None
    return form


def _turn(names: Sequence[str]) -> dict[str, Any]:
    calls = [
        {
            "id": f"call_probe{k}",
            "type": "function",
            "function": {"name": n, "arguments": ARGUMENTS},
        }
        for k, n in enumerate(names)
    ]
    return {"role": "assistant", "content": "", "tool_calls": calls}


def _pieces(prompt: str, turn: str, name: str) -> tuple[str, str, str, str] | None:
    """``(head, middle, arguments' text, rest)`` of a turn of one call of ``name``."""
    out = turn[len(prompt) :]
    if not turn.startswith(prompt) or out.count(name) != 1:
        return None
    at = out.find(name)
    args_at = out.find('{"zq_probe"', at)
    if args_at < 0:
        return None
    found = _ARGS_TEXT.match(out, args_at)
    if found is None:
        return None
    return out[:at], out[at + len(name) : args_at], found.group(0), out[found.end() :]


def _joiner(
    render: Render,
    user: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    prompt: str,
    first: str,
    middle: str,
    args: str,
    rest: str,
) -> str | None:
    """What comes between two calls, where the template renders two a turn as one and then
    the other (None otherwise)."""
    try:
        two = render([*user, _turn(NAMES)], tools, False)
    except Exception:  # a template of one call a turn (Llama 3.1's raises)
        return None
    out = two[len(prompt) :] if two.startswith(prompt) else ""
    second = NAMES[1] + middle + args + rest
    if not (out.startswith(first) and out.endswith(second)):
        return None
    joiner = out[len(first) : len(out) - len(second)]
    return joiner or None


def _literal(text: str) -> str:
    """``text`` as a lark string literal (nothing for no text)."""
    return json.dumps(text, ensure_ascii=False) if text else ""


class CallForms:
    """Each template's form, learned at its first forced call and kept: one per set of
    ``chat_template_kwargs`` (they may change what the template writes), at most
    ``max_entries`` of them in each cache scope (a tenant's: ``runtime/io_struct.py``), each
    scope learning its own, so that how long its first forced call took tells a tenant
    nothing of the others'."""

    def __init__(
        self,
        render_text: Callable[..., str],
        end_texts: Sequence[str],
        special_texts: Sequence[str],
        max_entries: int = 64,
    ) -> None:
        self._render_text = render_text
        self._end, self._special = tuple(end_texts), tuple(special_texts)
        self._scopes: dict[str | None, dict[str, CallForm | None]] = {}
        self.max_entries = max_entries

    def of(
        self, template_kwargs: dict[str, Any] | None, scope: str | None = None
    ) -> CallForm | None:
        kwargs = template_kwargs or {}
        key = json.dumps(kwargs, sort_keys=True, default=str)
        forms = self._scopes.setdefault(scope, {})
        if key not in forms:
            if len(forms) >= self.max_entries:
                forms.pop(next(iter(forms)))

            def render(messages: Any, tools: Any, add_generation_prompt: bool) -> str:
                return self._render_text(messages, tools, add_generation_prompt, **kwargs)

            forms[key] = learn_form(render, self._end, self._special)
        return forms[key]
