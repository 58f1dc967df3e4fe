"""What a grammar may ask of the grammar engine, checked at the edge before any matcher exists.

llguidance builds its lexer lazily, a little per token, within a budget per step (its
``step_lexer_fuel``, raised in ``llguidance_backend.py``); a grammar that outgrows it leaves
the matcher in an error state mid-generation. Two shapes outgrow it that no compile step
notices:

- bounded repeats that can split their text more than one way: nested ones
  (``(((a{1,20}){1,20}){1,20}){1,20}``: every level multiplies the states the lexer derives),
  and repeats of alternatives (``(\\s|  ){1,1000}``), worst over whitespace, which real
  vocabularies write up to 128 characters a token. :func:`repeat_cost` estimates the states;
  a regex (or a schema's ``pattern``, or a ``/regex/`` of a Lark grammar) over
  :data:`MAX_REPEAT_COST` is refused. A repeat of one character or class
  (``[a-z]{1,5000}``) costs nothing;
- JSON nested deeper than :data:`MAX_JSON_DEPTH` levels (a schema), which llguidance's reader
  refuses, and Python's ``json`` module answers with ``RecursionError`` long before 3,000.

Both are refused with a ``ValueError`` that names the limit (HTTP 400).
"""

from __future__ import annotations

import json
import re
from typing import Any

# Random nested repeats walked over Qwen3's and Llama 3's vocabularies and the tiny byte-level
# one at llguidance_backend's lexer budget: none of cost up to 800 exceeded it, the cheapest
# that did cost 801 (repeats of \s, over Llama 3's whitespace tokens). Half of that, for margin.
MAX_REPEAT_COST = 400
MAX_JSON_DEPTH = 128  # llguidance's JSON reader nests no deeper

_COUNTED = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_BRACED_ESCAPES = frozenset("pPxuU")  # \p{Greek}, \x{1F600}: the braces belong to the escape


def repeat_cost(pattern: str) -> int:
    """The largest cost of a counted repeat (``{n}``, ``{m,n}``, ``{m,}``) in ``pattern``: the
    size of what it expands to (its atoms times the upper counts around them, ``{m,}`` counted
    as ``m``) times the number of counted repeats in its chain (itself and those inside it).
    A repeat of one character or class costs nothing (nothing in it can be split two ways).

    A scan of the regex's text (llguidance's syntax: Rust's ``regex``), not a parser: it needs
    no valid regex, and where it cannot tell (a ``{`` that is no count) it counts an atom."""
    # one frame per open group: [weight of its closed items, deepest chain in them, last item]
    # where an item is (weight, chain): its atoms times its counts, its counted repeats nested
    stack: list[list[Any]] = [[0, 0, None]]
    worst = 0
    i, n = 0, len(pattern)
    while i < n:
        c, frame = pattern[i], stack[-1]
        if c == "{" and (m := _COUNTED.match(pattern, i)) is not None:
            if frame[2] is not None:
                weight, chain = frame[2]
                frame[2] = (weight * max(int(m.group(2) or m.group(1)), 1), chain + 1)
                if chain or weight > 1:
                    worst = max(worst, frame[2][0] * frame[2][1])
            i = m.end()
            continue
        if c in "*+?":  # unbounded or optional: what it repeats, once
            i += 1
            continue
        _close(frame)
        if c == "(":
            stack.append([0, 0, None])
            i = _skip_group_prefix(pattern, i + 1)
        elif c == ")" and len(stack) > 1:
            stack.pop()
            stack[-1][2] = (frame[0], frame[1])
            i += 1
        elif c == "|":
            i += 1
        else:
            frame[2] = (1, 0)
            i = _skip_atom(pattern, i)
    return worst


def _skip_atom(pattern: str, i: int) -> int:
    """The index after the atom at ``pattern[i]``: an escape, a class or one character."""
    if pattern[i] == "\\":
        return _skip_escape(pattern, i)
    if pattern[i] == "[":
        return _skip_class(pattern, i)
    return i + 1


def _skip_group_prefix(pattern: str, i: int) -> int:
    """The index after a group's ``?P<name>``, ``?<name>``, ``?:`` or flags (``?i:``, or
    ``?i`` whose group is empty), which ``pattern[i]`` may start; ``i`` if none."""
    if not pattern.startswith("?", i):
        return i
    if pattern.startswith(("?P<", "?<"), i):
        end = pattern.find(">", i)
        return len(pattern) if end < 0 else end + 1
    i += 1
    while i < len(pattern) and pattern[i] not in ":)":
        i += 1
    return i + 1 if pattern.startswith(":", i) else i


def _close(frame: list[Any]) -> None:
    """Add the frame's last item to its closed ones."""
    if frame[2] is not None:
        frame[0] += frame[2][0]
        frame[1] = max(frame[1], frame[2][1])
        frame[2] = None


def _skip_escape(pattern: str, i: int) -> int:
    """The index after the escape at ``pattern[i]`` (a backslash)."""
    if i + 2 < len(pattern) and pattern[i + 1] in _BRACED_ESCAPES and pattern[i + 2] == "{":
        end = pattern.find("}", i + 3)
        return len(pattern) if end < 0 else end + 1
    return i + 2


def _skip_class(pattern: str, i: int) -> int:
    """The index after the character class opening at ``pattern[i]`` (classes may nest:
    ``[a-z&&[^aeiou]]``, ``[[:alpha:]]``; a ``]`` right after ``[`` or ``[^`` is literal)."""
    depth, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i = _skip_escape(pattern, i)
            continue
        if c == "[":
            depth += 1
            i += 1
            if i < n and pattern[i] == "^":
                i += 1
            if i < n and pattern[i] == "]":
                i += 1
            continue
        if c == "]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


def check_regex_repeats(pattern: str, what: str = "regex") -> None:
    """``ValueError`` naming the limit if ``pattern``'s bounded repeats cost too much."""
    cost = repeat_cost(pattern)
    if cost > MAX_REPEAT_COST:
        raise ValueError(
            f"{what} is too complex for the grammar engine: its bounded repeats expand to "
            f"about {cost} (atoms times counts, times the repeats nested), over the limit of "
            f"{MAX_REPEAT_COST}. Use smaller counts, fewer nested repeats, or * and + (the "
            "length can be bounded with max_new_tokens)"
        )


def lark_regexes(source: str) -> list[str]:
    """The ``/regex/`` literals of a Lark grammar (outside its ``"strings"`` and ``//``
    comments)."""
    found, i, n = [], 0, len(source)
    while i < n:
        c = source[i]
        if source.startswith("//", i):
            end = source.find("\n", i)
            i = n if end < 0 else end
        elif c in '"/':
            j = i + 1
            while j < n and source[j] != c:
                j += 2 if source[j] == "\\" else 1
            if c == "/":
                found.append(source[i + 1 : j])
            i = j + 1
        else:
            i += 1
    return found


def json_depth(value: Any) -> int:
    """How deeply ``value`` nests JSON objects and arrays (a scalar: 0), walked without
    recursion, so any depth is measured."""
    depth = 0
    todo: list[tuple[Any, int]] = [(value, 0)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        depth = max(depth, level + 1)
        todo.extend((child, level + 1) for child in children)
    return depth


def parse_json_schema(source: str) -> Any:
    """``source`` parsed: a JSON object or boolean no deeper than :data:`MAX_JSON_DEPTH`;
    ``ValueError`` naming the problem otherwise."""
    try:
        schema = json.loads(source)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid json_schema: not JSON ({exc})") from None
    except RecursionError:
        raise ValueError(too_deep("json_schema")) from None
    if not isinstance(schema, dict | bool):
        raise ValueError("invalid json_schema: a schema is a JSON object or a boolean")
    check_json_depth(schema, "json_schema")
    return schema


def schema_patterns(schema: Any) -> list[str]:
    """Every string under a ``pattern`` key of ``schema`` (a regex a string must match),
    walked without recursion."""
    found, todo = [], [schema]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            if isinstance(item.get("pattern"), str):
                found.append(item["pattern"])
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return found


def check_json_depth(value: Any, what: str) -> None:
    if json_depth(value) > MAX_JSON_DEPTH:
        raise ValueError(too_deep(what))


def too_deep(what: str) -> str:
    return f"{what} nests objects and arrays deeper than the limit of {MAX_JSON_DEPTH} levels"
