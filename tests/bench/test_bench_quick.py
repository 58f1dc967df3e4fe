"""``radixserve bench ... --quick`` end to end on a tiny model: the report's shape, the files it
writes, and that the cache hits. Never a speed (timings on a shared machine mean nothing here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixserve.bench.cli import main
from radixserve.bench.workload import MultiTurnSpec, make_multiturn

SYSTEM_KEYS = {
    "name",
    "wall_s",
    "requests_per_s",
    "input_tokens_per_s",
    "output_tokens_per_s",
    "ttft_s",
    "latency_s",
    "hit_rate",
    "optimal_hit_rate",
}


@pytest.fixture(autouse=True)
def _bench_models_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the bench model cache lives beside the default model's directory
    monkeypatch.setenv("RADIXSERVE_DEFAULT_MODEL_DIR", str(tmp_path / "models" / "default"))


def _report(out: Path, stem: str) -> dict:
    assert (out / f"{stem}.png").stat().st_size > 10_000
    return json.loads((out / f"{stem}.json").read_text())


@pytest.mark.timeout(600)
def test_multiturn_quick_with_all_baselines(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["multiturn", "--quick", "--repeat", "2", "--out", str(out), "--name", "mt"]
    assert main(args) == 0
    report = _report(out, "mt")
    names = [s["name"] for s in report["systems"]]
    assert names == ["radixserve", "radixserve-no-cache", "hf-recompute", "hf-kv-carried"]
    for system in report["systems"]:
        assert SYSTEM_KEYS <= system.keys()
        assert system["num_requests"] == report["num_requests"] == 12
    rs, nocache = report["systems"][0], report["systems"][1]
    assert rs["hit_rate"] > 0 and rs["optimal_hit_rate"] > 0
    assert nocache["hit_rate"] == 0
    assert rs["ttft_s"]["p99"] > 0
    # the same trace everywhere: same request and token counts
    assert len({(s["input_tokens"], s["output_tokens"]) for s in report["systems"]}) == 1
    ratios = report["ratios"]
    assert "radixserve / hf-recompute" in ratios["throughput"]
    assert report["calibration"]["num_calibrations"] == 2  # one after each no-cache run
    _check_ideal_ratio(report, _own_history_hits(report))


def _own_history_hits(report: dict) -> list[int]:
    """Each request's optimal cached prefix, from the trace's token counts alone: nothing for a
    conversation's first turn, and for every later turn the previous prompt and answer but the
    answer's last token (sampled, never fed). The answers are exactly their trace lengths
    (``ignore_eos``); the seeded trace's conversations begin with distinct tokens, so no request
    shares a prefix with another conversation."""
    shape = {k: tuple(v) if isinstance(v, list) else v for k, v in report["shape"].items()}
    sessions = make_multiturn(MultiTurnSpec(**shape), *report["options"]["token_range"])
    assert not any(s.prefix_ids for s in sessions)  # no system prompt in this shape
    assert len({s.turns[0].user_ids[0] for s in sessions}) == len(sessions)
    hits = []
    for s in sessions:
        prompt_len = 0
        for t, turn in enumerate(s.turns):
            if t:
                hits.append(prompt_len + s.turns[t - 1].answer_len - 1)
                prompt_len += s.turns[t - 1].answer_len
            else:
                hits.append(0)
            prompt_len += len(turn.user_ids)
    return hits


def _check_ideal_ratio(report: dict, hits: list[int]) -> None:
    """The ideal cache ratio is the report's documented time model applied to this trace:
    T_nocache / max(T_nocache - sum(a*c + b*c^2), 0.05 * T_nocache) over the requests' optimal
    cached prefixes c, with the no-cache run's wall time and the calibration's fit."""
    rs, nocache = report["systems"][0], report["systems"][1]
    assert sorted(rs["optimal_cached_per_request"]) == sorted(hits)  # records: completion order
    assert rs["optimal_cached_tokens"] == sum(hits)
    cal = report["calibration"]
    assert cal["lengths"][-1] == max(hits)  # the fit reaches the longest cached prefix
    a, b = cal["a_s_per_token"], cal["b_s_per_token2"]
    assert a > 0 and b >= 0
    saved = sum(a * c + b * c * c for c in hits)
    t_nocache = nocache["wall_s"]
    assert t_nocache == min(nocache["wall_runs_s"])
    ideal = report["ratios"]["ideal"]
    assert ideal["t_nocache_s"] == t_nocache
    assert ideal["saved_prefill_s"] == pytest.approx(saved, rel=1e-9)
    want = t_nocache / max(t_nocache - saved, 0.05 * t_nocache)
    assert ideal["ideal_cache_ratio"] == pytest.approx(want, rel=1e-9)
    assert 1.0 < ideal["ideal_cache_ratio"] <= 20.0  # some prefix is cached; the floor's bound
    assert ideal["cache_ratio"] == pytest.approx(t_nocache / rs["wall_s"], rel=1e-9)


@pytest.mark.timeout(600)
def test_shared_prefix_quick_policy_sweep(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["shared-prefix", "--quick", "--policy", "fcfs,lpm", "--baselines", "none"]
    args += ["--repeat", "2"]
    assert main([*args, "--request-rate", "50", "--out", str(out), "--name", "sp"]) == 0
    report = _report(out, "sp")
    assert [s["policy"] for s in report["systems"]] == ["fcfs", "lpm"]
    for s in report["systems"]:
        assert 0 < s["hit_rate"] <= s["optimal_hit_rate"]  # the cache was flushed between runs
        assert len(s["wall_runs_s"]) == 2 and s["wall_s"] == min(s["wall_runs_s"])


@pytest.mark.timeout(300)
def test_quick_with_speculative_decoding_records_the_accept_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Identical prompts one after another, so each after the first can draft its answer from
    the one before; whether the engine drafts at all is its cost model's call (measured at
    start: load-dependent), so the figures are checked against the run's counters."""
    out = tmp_path / "out"
    args = ["shared-prefix", "--quick", "--baselines", "none", "--out", str(out), "--name", "sp"]
    args += ["--question-len", "0", "--max-concurrency", "1", "--output-len", "16"]
    args += ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4"]
    assert main(args) == 0
    rs = _report(out, "sp")["systems"][0]
    assert rs["server"]["speculative_algorithm"] == "NGRAM"  # what the engine runs
    assert rs["server"]["speculative_num_draft_tokens"] == 4
    spec, stats = rs["speculative"], rs["server_stats"]
    assert spec["num_drafts"] == stats["num_spec_drafts"]  # the run's own counters
    assert spec["num_accepted_tokens"] == stats["num_spec_accepted_tokens"]
    assert 0 <= spec["num_accepted_tokens"] <= spec["num_draft_tokens"] <= 3 * spec["num_drafts"]
    if spec["num_drafts"]:
        assert spec["accept_length"] == 1 + spec["num_accepted_tokens"] / spec["num_drafts"]
        assert f"accept length {spec['accept_length']:.2f}" in capsys.readouterr().out
    else:
        assert spec["accept_length"] is None
    assert main(["shared-prefix", "--quick", "--baselines", "none", "--out", str(out)]) == 0
    assert _report(out, "shared-prefix-quick")["systems"][0]["speculative"] is None  # flag off


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_multiturn_quick_over_http(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["multiturn", "--quick", "--backend", "http", "--baselines", "no-cache"]
    assert main([*args, "--out", str(out), "--name", "http"]) == 0
    report = _report(out, "http")
    rs = report["systems"][0]
    assert rs["hit_rate"] > 0 and rs["server"]["schedule_policy"] == "fcfs"
    assert report["systems"][1]["server"]["disable_radix_cache"] is True


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_multiturn_quick_through_the_frontend(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["multiturn", "--quick", "--backend", "frontend", "--baselines", "none"]
    assert main([*args, "--out", str(out), "--name", "fe"]) == 0
    rs = _report(out, "fe")["systems"][0]
    # text crosses the API: the answers' re-tokenization can cost a few hits, never most
    assert rs["hit_rate"] > 0.5 * rs["optimal_hit_rate"] > 0
    assert rs["server_stats"]["num_cached_prompt_tokens"] == rs["cached_tokens"]
