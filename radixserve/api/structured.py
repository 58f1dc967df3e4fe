"""Structured-output fields of a request, as the HTTP routes hand them to ``SamplingParams``.

SGLang's clients send ``regex``, ``json_schema`` (a JSON string, or here also an object) and
``ebnf``; the OpenAI routes send ``response_format``. All end in the same three fields of
``SamplingParams`` (``regex``, ``json_schema`` as a JSON string, ``ebnf``), which the grammar
engine compiles and ``server/request_validation.py`` checks (a bad regex or schema is a
``ValueError`` there, so a 400).

:func:`grammar_fields` is the one place that names those fields: a build whose
``SamplingParams`` lacks them answers a set one with a 400 instead of a crash.
"""

from __future__ import annotations

import json
from typing import Any

from radixserve.runtime.grammar.limits import check_json_depth, too_deep
from radixserve.types import SamplingParams

GRAMMAR_FIELDS = ("regex", "json_schema", "ebnf")
JSON_OBJECT_SCHEMA = '{"type": "object"}'  # SGLang's json_object: any JSON object


def json_schema_string(schema: str | dict[str, Any] | None, param: str) -> str | None:
    """A schema as the JSON string ``SamplingParams`` takes; ``ValueError`` if it is no JSON
    or nests deeper than the grammar engine reads (``MAX_JSON_DEPTH``)."""
    if schema is None:
        return None
    if isinstance(schema, dict):
        return _dumps(schema, param)
    try:
        parsed = json.loads(schema)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{param} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError(too_deep(param)) from None
    check_json_depth(parsed, param)
    return schema


def _dumps(schema: dict[str, Any], param: str) -> str:
    check_json_depth(schema, param)  # before json.dumps, which recurses
    return json.dumps(schema)


def grammar_fields(
    regex: str | None = None, json_schema: str | None = None, ebnf: str | None = None
) -> dict[str, str]:
    """The ``SamplingParams`` keyword arguments of a request's grammar (empty: none).
    ``ValueError`` if more than one is given, or if this build has no structured output."""
    given = {
        k: v
        for k, v in (("regex", regex), ("json_schema", json_schema), ("ebnf", ebnf))
        if v is not None
    }
    if len(given) > 1:
        raise ValueError(f"give at most one of regex, json_schema and ebnf (got {sorted(given)})")
    missing = [k for k in given if k not in SamplingParams.__dataclass_fields__]
    if missing:
        raise ValueError(f"{missing[0]} is not supported by this build (no structured output)")
    return given


def response_format_schema(response_format: dict[str, Any] | None) -> str | None:
    """OpenAI's ``response_format`` as a JSON-schema string (None: free text).

    ``text``: None; ``json_object``: any JSON object (as SGLang); ``json_schema``: its
    ``json_schema.schema``. ``ValueError`` names what is wrong."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT_SCHEMA
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):
            raise ValueError("response_format.json_schema must be an object with a `schema`")
        schema = spec.get("schema", spec.get("schema_"))
        if schema is None:
            return JSON_OBJECT_SCHEMA  # OpenAI allows a schema-less json_schema format
        if not isinstance(schema, dict):
            raise ValueError("response_format.json_schema.schema must be a JSON object")
        return _dumps(schema, "response_format.json_schema.schema")
    raise ValueError(f"response_format.type must be text, json_object or json_schema, got {kind!r}")
