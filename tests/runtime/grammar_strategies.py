"""Hypothesis strategies: small regexes and JSON schemas whose every match is finite (so a
constrained generation always completes within a few dozen tokens, but for
:func:`nested_repeats`, whose matches may be long) and which the tiny test tokenizer (a
byte-level BPE: every byte is a token) can express."""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

from radixserve.runtime.grammar.limits import MAX_REPEAT_COST, repeat_cost

_ATOMS = st.sampled_from(["a", "b", "x", "7", "-", "[a-c]", "[0-9]", "[xyz]", r"\.", " "])


@st.composite
def regexes(draw: st.DrawFn, depth: int = 2, atoms: st.SearchStrategy[str] = _ATOMS) -> str:
    """A regex over a few atoms: sequences, alternations, ``?`` and bounded repeats, within the
    edge's limit on bounded repeats (a longer one is refused at submission: see
    :func:`nested_repeats` for those)."""
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["atom", "atom", "alt", "rep", "opt"] if depth else ["atom"]))
        if kind == "atom":
            parts.append(draw(atoms))
        elif kind == "alt":
            a, b = draw(regexes(depth - 1, atoms)), draw(regexes(depth - 1, atoms))
            parts.append(f"({a}|{b})")
        elif kind == "rep":
            lo = draw(st.integers(0, 2))
            inner = draw(regexes(depth - 1, atoms))
            parts.append(f"({inner}){{{lo},{lo + draw(st.integers(0, 2))}}}")
        else:
            parts.append(f"({draw(regexes(depth - 1, atoms))})?")
    pattern = "".join(parts)
    re.compile(pattern)  # the generator's own check: a valid Python regex
    assume(repeat_cost(pattern) <= MAX_REPEAT_COST)
    return pattern


_REPEATED = st.sampled_from(["a", "[ab]", "(a|aa)", "(ab|a)", "a?", "[0-9]", " "])


@st.composite
def nested_repeats(draw: st.DrawFn, atoms: st.SearchStrategy[str] = _REPEATED) -> str:
    """Bounded repeats nested 2 to 4 deep, such as ``(((a{1,20}){1,20}){1,20}){1,20}``: what
    they expand to multiplies at each level, so a few are refused at submission (too complex
    for the grammar engine) and the rest must match."""
    pattern = draw(atoms)
    for _ in range(draw(st.integers(2, 4))):
        lo = draw(st.integers(0, 2))
        hi = draw(st.integers(max(lo, 1), 24))
        if draw(st.booleans()):
            pattern += draw(atoms)
        pattern = f"({pattern}){{{lo},{hi}}}"
    re.compile(pattern)
    return pattern


def _leaf() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 4)),
        st.builds(
            lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
            st.integers(-50, 50),
            st.integers(0, 500),
        ),
        st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.builds(
            lambda vs: {"enum": vs},
            st.lists(st.sampled_from(["red", "green", "blue", 3, True]), min_size=1, unique=True),
        ),
    )


def _object(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    names = st.sampled_from(["id", "name", "ok", "tags", "kind", "x", "value"])
    return st.dictionaries(names, children, min_size=1, max_size=4).map(
        lambda props: {
            "type": "object",
            "properties": props,
            "required": sorted(props),
            "additionalProperties": False,
        }
    )


def _array(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda item, lo, span: {
            "type": "array",
            "items": item,
            "minItems": lo,
            "maxItems": lo + span,
        },
        children,
        st.integers(0, 1),
        st.integers(0, 1),
    )


def json_schemas() -> st.SearchStrategy[dict[str, Any]]:
    """Objects of leaves, arrays and nested objects (depth <= 2), every property required."""
    nested = st.recursive(_leaf(), lambda inner: _array(inner) | _object(inner), max_leaves=4)
    return _object(nested)


def dumps(schema: dict[str, Any]) -> str:
    return json.dumps(schema)
