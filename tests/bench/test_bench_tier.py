"""``radixserve bench multiturn --quick --max-total-tokens N --kv-tier file``: the tier system
runs beside the bounded and the unbounded pool on the same trace and reports where its hits
came from. Never a speed (timings on a shared machine mean nothing here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixserve.bench.cli import main
from radixserve.bench.models import ensure_bench_model, token_range
from radixserve.bench.workload import MultiTurnSpec, make_multiturn, trace_tokens

POOL = 180  # about a third of the trace below: every conversation's last turn still fits


@pytest.fixture(autouse=True)
def _bench_models_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXSERVE_DEFAULT_MODEL_DIR", str(tmp_path / "models" / "default"))


@pytest.mark.timeout(600)
def test_multiturn_quick_tier_on_off_unbounded(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["multiturn", "--quick", "--conversations", "6", "--max-total-tokens", str(POOL)]
    args += ["--kv-tier", "file", "--baselines", "unbounded", "--out", str(out), "--name", "tier"]
    assert main(args) == 0
    report = json.loads((out / "tier.json").read_text())
    systems = {s["name"]: s for s in report["systems"]}
    assert list(systems) == ["radixserve", "radixserve+tier", "radixserve-unbounded"]
    spec = MultiTurnSpec(6, 3, (16, 32), (4, 8), 4)
    sessions = make_multiturn(spec, *token_range(str(ensure_bench_model("tiny"))))
    assert report["trace_tokens"] == trace_tokens(sessions) > 2 * POOL
    bounded, tier, unbounded = (
        systems[n] for n in ("radixserve", "radixserve+tier", "radixserve-unbounded")
    )
    assert bounded["max_total_tokens"] == tier["max_total_tokens"] == POOL
    assert unbounded["max_total_tokens"] is None and tier["kv_tier"] == "file"
    assert bounded["pool_tokens"] == tier["pool_tokens"] == POOL < unbounded["pool_tokens"]
    assert tier["kv_tier_capacity_tokens"] >= 2 * POOL  # the runtime's default: two pools
    # an unbounded pool never evicts: it hits the optimal, the bounded one evicts and misses
    assert unbounded["hit_rate"] == unbounded["optimal_hit_rate"]
    assert bounded["hit_rate"] < unbounded["hit_rate"]
    # the tier serves a part of the hits, and the bounded pool's misses come back from it
    assert 0 < tier["tier_cached_tokens"] <= tier["cached_tokens"]
    assert tier["tier_cached_tokens"] == tier["server_stats"]["num_cached_prompt_tokens_tier"]
    assert tier["hit_rate"] > bounded["hit_rate"]
    assert bounded["tier_cached_tokens"] == unbounded["tier_cached_tokens"] == 0
    # the scheduler computed what was not cached (plus what a retraction recomputed)
    for s in (bounded, tier, unbounded):
        assert s["prefill_tokens"] >= s["input_tokens"] - s["cached_tokens"]
    assert tier["prefill_tokens"] < bounded["prefill_tokens"]
    recovery = report["ratios"]["kv_tier"]
    assert recovery["hit_rate_tier"] == tier["hit_rate"]
    assert recovery["tier_over_unbounded"] == tier["hit_rate"] / unbounded["hit_rate"]
    assert 0 < recovery["gap_closed"] <= 1


@pytest.mark.parametrize(
    "args",
    [
        ["--kv-tier-size", "1MB"],  # a size with no tier
        ["--baselines", "unbounded"],  # the reference of a bounded pool, with none
        ["--kv-tier", "file", "--backend", "http", "--url", "http://127.0.0.1:1"],
    ],
)
def test_tier_options_refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["multiturn", "--quick", *args]) == 2
    assert "radixserve bench:" in capsys.readouterr().err
