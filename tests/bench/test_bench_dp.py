"""``radixserve bench multiturn --dp-size 2``: router policies side by side (slow: it starts
two data-parallel servers, each with two workers and sglang-router)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixserve.bench.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_router_policies_side_by_side(tmp_path: Path) -> None:
    pytest.importorskip("sglang_router", reason="needs radixserve[router] (sglang-router)")
    args = ["multiturn", "--quick", "--backend", "http", "--dp-size", "2", "--baselines", "none"]
    assert main([*args, "--out", str(tmp_path), "--name", "dp"]) == 0
    report = json.loads((tmp_path / "dp.json").read_text())
    systems = {s["router_policy"]: s for s in report["systems"]}
    assert set(systems) == {"cache_aware", "round_robin"}
    for s in systems.values():
        assert s["kind"] == "data-parallel" and s["dp_size"] == 2
        assert len(s["load_split"]) == 2 and abs(sum(s["load_split"]) - 1) < 1e-9
    # turns of a conversation follow their prefix under cache_aware, not under round_robin
    assert systems["cache_aware"]["hit_rate"] >= systems["round_robin"]["hit_rate"]
    assert systems["cache_aware"]["hit_rate_vs_optimal"] > 0.95
