"""The ideal cache ratio's time model, without a model: the prefill cost fit and the savings."""

from __future__ import annotations

import pytest

from radixserve.bench.prefill_cost import (
    calibration_lengths,
    fit_prefill_cost,
    merge_calibrations,
    saved_prefill_s,
)
from radixserve.bench.records import RequestRecord, summarize
from radixserve.bench.report import compute_ratios, ideal_ratio, ratios_text


def _cost(n: int, c0: float, a: float, b: float) -> float:
    return c0 + a * n + b * n * n


def test_calibration_lengths_span_an_eighth_to_the_longest_prefix() -> None:
    assert calibration_lengths(1800) == [225, 750, 1275, 1800]
    for longest in (0, 1, 31, 32, 33, 100, 4000):
        lengths = calibration_lengths(longest)
        assert len(set(lengths)) == len(lengths) == 4 and lengths == sorted(lengths)
        assert lengths[-1] == max(longest, 32) and lengths[0] == round(lengths[-1] / 8)


def test_fit_recovers_a_quadratic_cost() -> None:
    c0, a, b = 0.02, 1.2e-3, 0.9e-6
    lengths = calibration_lengths(1800)
    fit = fit_prefill_cost(lengths, [_cost(n, c0, a, b) for n in lengths])
    assert fit["fit"] == "quadratic"
    assert fit["c0_s"] == pytest.approx(c0, rel=1e-6)
    assert fit["a_s_per_token"] == pytest.approx(a, rel=1e-6)
    assert fit["b_s_per_token2"] == pytest.approx(b, rel=1e-6)


def test_merged_calibrations_keep_the_fastest_time_per_length() -> None:
    c0, a, b = 0.02, 1.2e-3, 0.9e-6
    lengths = calibration_lengths(1800)
    quiet = [_cost(n, c0, a, b) for n in lengths]
    # two calibrations, each slowed by interference at different lengths
    first = [t * (1.3 if i % 2 else 1.0) for i, t in enumerate(quiet)]
    second = [t * (1.0 if i % 2 else 1.2) for i, t in enumerate(quiet)]
    cals = [
        {"lengths": lengths, "best_s": ts, **fit_prefill_cost(lengths, ts)}
        for ts in (first, second)
    ]
    merged = merge_calibrations(cals)
    assert merged["lengths"] == lengths and merged["best_s"] == pytest.approx(quiet)
    assert merged["num_calibrations"] == 2 and merged["fit"] == "quadratic"
    assert merged["a_s_per_token"] == pytest.approx(a, rel=1e-6)
    assert merged["b_s_per_token2"] == pytest.approx(b, rel=1e-6)


def test_fit_falls_back_to_a_line_when_noise_bends_it_down() -> None:
    # linear cost plus noise that makes the quadratic term negative
    lengths = [100, 400, 700, 1000]
    times = [0.01 + 1e-3 * n for n in lengths]
    times[1] += 0.02
    times[2] += 0.02
    fit = fit_prefill_cost(lengths, times)
    assert fit["fit"] == "linear" and fit["b_s_per_token2"] == 0.0
    assert fit["a_s_per_token"] == pytest.approx(1e-3, rel=0.05)


def test_fit_falls_back_to_the_average_cost_when_the_line_is_flat() -> None:
    lengths = [32, 64, 96, 128]
    times = [0.50, 0.40, 0.45, 0.30]  # noise only: latency falling with length
    fit = fit_prefill_cost(lengths, times)
    assert fit["fit"] == "average"
    assert fit["a_s_per_token"] == pytest.approx(0.30 / 128)
    assert fit["b_s_per_token2"] == 0.0 and fit["c0_s"] == 0.0


def _records(prompts: list[list[int]]) -> list[RequestRecord]:
    return [
        RequestRecord(i, 0, p, [99], sent_s=float(i), done_s=i + 0.5, cached_tokens=0)
        for i, p in enumerate(prompts)
    ]


def test_ideal_ratio_charges_each_cached_prefix_its_own_prefill() -> None:
    system = list(range(1000, 1100))  # a 100-token shared prefix
    records = _records([system + [1, 2], system + [3, 4, 5], system[:40] + [6], [7, 8]])
    base = summarize("radixserve", records, wall_s=4.0, extra={"kind": "radixserve"})
    assert base["optimal_cached_per_request"] == [0, 100, 40, 0]
    assert base["optimal_cached_tokens"] == 140
    nocache = summarize("radixserve-no-cache", records, wall_s=10.0, extra={"kind": "no-cache"})
    calibration = {"fit": "quadratic", "c0_s": 0.5, "a_s_per_token": 0.01, "b_s_per_token2": 1e-4}
    # 0.01 * 100 + 1e-4 * 100^2 + 0.01 * 40 + 1e-4 * 40^2: c0 never counts
    expected_saved = 1.0 + 1.0 + 0.4 + 0.16
    assert saved_prefill_s(base["optimal_cached_per_request"], calibration) == pytest.approx(
        expected_saved
    )
    ideal = ideal_ratio(base, nocache, calibration)
    assert ideal["saved_prefill_s"] == pytest.approx(expected_saved)
    assert ideal["t_ideal_s"] == pytest.approx(10.0 - expected_saved)
    assert ideal["ideal_cache_ratio"] == pytest.approx(10.0 / (10.0 - expected_saved))
    assert ideal["cache_ratio"] == pytest.approx(2.5)
    assert ideal["cache_ratio_over_ideal"] == pytest.approx(2.5 * (10.0 - expected_saved) / 10.0)
    assert ideal["saved_s_per_cached_token"] == pytest.approx(expected_saved / 140)
    assert not ideal["is_clamped"]
    ratios = compute_ratios([base, nocache], calibration)
    assert ratios["ideal"] == ideal
    text = ratios_text(ratios)
    assert "cache ratio 2.50x vs ideal 1.34x (186% of ideal; t(n) = a n + b n^2" in text
    assert "a=10 ms/token, b=100 us/token^2, quadratic fit)" in text


def test_ideal_ratio_keeps_a_floor_when_the_savings_exceed_the_run() -> None:
    records = _records([[1, 2, 3, 4], [1, 2, 3, 4, 5]])
    base = summarize("radixserve", records, wall_s=1.0, extra={"kind": "radixserve"})
    nocache = summarize("radixserve-no-cache", records, wall_s=2.0, extra={"kind": "no-cache"})
    calibration = {"fit": "linear", "c0_s": 0.0, "a_s_per_token": 1.0, "b_s_per_token2": 0.0}
    ideal = ideal_ratio(base, nocache, calibration)
    assert ideal["saved_prefill_s"] == pytest.approx(4.0)  # 4 cached tokens at 1 s each
    assert ideal["is_clamped"] and ideal["t_ideal_s"] == pytest.approx(0.1)
    assert ideal["ideal_cache_ratio"] == pytest.approx(20.0)
    assert "clamped)" in ratios_text({"ideal": ideal})
