"""``gen(regex=, json_schema=)``, ``gen_int`` and ``gen_string`` through both backends: the
in-process ``Runtime``, and ``RuntimeEndpoint`` against the real server."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from radixserve.frontend import (
    function,
    gen,
    gen_int,
    gen_string,
)
from radixserve.frontend.ir import REGEX_INT, REGEX_STR

pytest.importorskip("llguidance")

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "rank": {"type": "integer", "minimum": 1, "maximum": 99},
    },
    "required": ["city", "rank"],
    "additionalProperties": False,
}


@function
def profile(s: Any) -> None:
    s += "Age: " + gen_int("age", max_tokens=8) + "\n"
    s += "Name: " + gen_string("name", max_tokens=16) + "\n"
    s += "Code: " + gen("code", regex=r"[A-Z]{2}-[0-9]{3}") + "\n"
    s += "JSON: " + gen("obj", json_schema=SCHEMA, max_tokens=64, temperature=0)


def _check(state: Any) -> None:
    # max_tokens may cut a gen_int / gen_string: its text is then a prefix of a match
    assert re.fullmatch(r"[-+]?[0-9]*", state["age"]) and state["age"]
    assert re.fullmatch(r'"[^"\\\n]*"?', state["name"])
    assert state["code"] and re.fullmatch(r"[A-Z]{2}-[0-9]{3}", state["code"])
    obj = json.loads(state["obj"])
    assert set(obj) == {"city", "rank"} and isinstance(obj["rank"], int)


def test_constrained_gen_through_the_runtime(fe_runtime: Any) -> None:
    state = profile.run(backend=fe_runtime)
    _check(state)
    for name, pattern in (("age", REGEX_INT), ("name", REGEX_STR)):
        # within max_tokens the text is a prefix of a match, and a whole one when it stopped
        meta = state.get_meta_info(name)
        if meta["finish_reason"]["type"] == "stop":
            assert re.fullmatch(pattern, state[name]), (name, state[name])
    fe_runtime.engine.check_integrity()


def test_constrained_gen_through_the_endpoint(fe_endpoint: Any) -> None:
    """The real server's ``/generate`` takes the frontend's ``regex`` / ``json_schema`` keys."""
    state = profile.run(backend=fe_endpoint)
    _check(state)
    # SGLang's frontend sends a schema as a JSON string: so does ours
    assert gen("x", json_schema=SCHEMA).params.json_schema == json.dumps(SCHEMA)


def test_regex_and_json_schema_together_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="at most one"):
        gen("x", regex="a", json_schema="{}")
