"""The fuzzing harness: schemathesis generates requests from the server's own ``/openapi.json``
(valid ones and, for bodies, invalid ones); the server must answer every one without a 5xx, with a
status code the document declares."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from serving_harness import Server

pytestmark = pytest.mark.timeout(400)  # the first test here may start the guarded server


def fuzz(server: Server, examples: int, budget_s: float) -> list[str]:
    """Up to ``examples`` cases per operation and generation mode, within ``budget_s``
    (later cases are skipped once it is spent); the problems found."""
    spec = httpx.get(server.url + "/openapi.json", headers=server.headers, timeout=30).json()
    schema = schemathesis.openapi.from_dict(spec)
    problems: list[str] = []
    deadline = time.monotonic() + budget_s
    num_ops = 0
    for result in schema.get_all_operations():
        op = result.ok()
        num_ops += 1
        modes = [GenerationMode.POSITIVE]
        if op.method.upper() == "POST":
            modes.append(GenerationMode.NEGATIVE)
        for mode in modes:
            try:
                _fuzz_operation(server, op, mode, examples, deadline, problems)
            except Unsatisfiable:  # no invalid input exists (an operation without a body)
                assert mode is GenerationMode.NEGATIVE, op.label
    assert num_ops >= 10, spec["paths"].keys()
    return problems


def _fuzz_operation(
    server: Server, op: Any, mode: GenerationMode, examples: int, deadline: float, out: list[str]
) -> None:
    declared = {str(code) for code in op.definition.raw["responses"]}

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=op.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        if time.monotonic() > deadline:
            return
        resp = case.call(base_url=server.url, headers=server.headers, timeout=60)
        status = resp.status_code
        if status >= 500 or str(status) not in declared:
            body = case.body if not isinstance(case.body, bytes) else case.body[:200]
            out.append(f"{op.label} {mode.value}: {status} for {body!r}: {resp.text[:300]}")

    run()


# slow: a server of its own and about 11 s of fuzzing; .ci/run runs it after the default suite
@pytest.mark.slow
def test_fuzzing_the_spec_finds_no_5xx(guarded: Server) -> None:
    problems = fuzz(guarded, examples=12, budget_s=150)
    assert not problems, "\n".join(problems[:10])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fuzzing_the_spec_longer(guarded: Server) -> None:
    problems = fuzz(guarded, examples=100, budget_s=600)
    assert not problems, "\n".join(problems[:10])
