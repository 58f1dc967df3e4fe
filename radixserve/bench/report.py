"""Ratios between the systems of one run, the ideal cache ratio, and the printed tables.

Ideal cache ratio: the no-cache run's wall time minus the prefill time an ideal cache saves.
It serves each prompt's prefix, so a request with an optimal cached prefix of c_i tokens saves
exactly the prefill of those c_i tokens on their own (its new tokens still attend over the whole
context, which the cached run pays too). The no-cache runtime's one-token latency is fitted as
t(n) = c0 + a*n + b*n^2 right after its run (:mod:`radixserve.bench.prefill_cost`)::

    T_ideal = T_nocache - sum_i (a * c_i + b * c_i^2)      (c0: per request, never saved)
    ideal_cache_ratio = T_nocache / T_ideal
    cache_ratio = T_nocache / T_radixserve          (= the throughput ratio: same trace)

Decode and everything else is assumed unchanged by the cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from radixserve.bench.prefill_cost import saved_prefill_s

CACHED_KINDS = ("radixserve", "data-parallel", "kv-tier", "unbounded")
TIME_MODEL = (
    "T_ideal = T_nocache - sum_i (a*c_i + b*c_i^2); c_i: request i's optimal cached prefix "
    "tokens; t(n) = c0 + a*n + b*n^2: least-squares fit of max_new_tokens=1 latency at 4 prompt "
    "lengths up to max c_i on the no-cache runtime, measured after each of its runs (fastest "
    "per length; c0, per request, is not saved); ideal_cache_ratio = T_nocache / T_ideal"
)


def compute_ratios(
    systems: list[dict[str, Any]], calibration: dict[str, Any] | None
) -> dict[str, Any]:
    cached_runs = [s for s in systems if s.get("kind") in CACHED_KINDS]
    if not cached_runs:
        return {}
    base = cached_runs[0]
    ratios: dict[str, Any] = {
        "throughput": {
            f"{base['name']} / {s['name']}": base["requests_per_s"] / s["requests_per_s"]
            for s in systems
            if s is not base and s["requests_per_s"] > 0
        },
        "hit_rate": {
            s["name"]: {
                "achieved": s["hit_rate"],
                "optimal": s["optimal_hit_rate"],
                "achieved_over_optimal": s["hit_rate_vs_optimal"],
            }
            for s in cached_runs
        },
    }
    nocache = next((s for s in systems if s.get("kind") == "no-cache"), None)
    if nocache is not None and calibration is not None:
        ratios["ideal"] = ideal_ratio(base, nocache, calibration)
    if tier := tier_recovery(systems):
        ratios["kv_tier"] = tier
    return ratios


def tier_recovery(systems: list[dict[str, Any]]) -> dict[str, Any] | None:
    """How much of the hit rate the unbounded pool gets the KV tier recovers over the same
    bounded pool without it: ``tier / unbounded`` and the share of the gap it closes."""
    by_kind = {s.get("kind"): s for s in reversed(systems)}  # the first of each kind
    bounded, tier = by_kind.get("radixserve"), by_kind.get("kv-tier")
    if bounded is None or tier is None:
        return None
    out: dict[str, Any] = {
        "bounded": bounded["name"],
        "tier": tier["name"],
        "max_total_tokens": tier.get("max_total_tokens"),
        "hit_rate_bounded": bounded["hit_rate"],
        "hit_rate_tier": tier["hit_rate"],
        "tier_hit_rate": tier.get("tier_hit_rate"),
        "prefill_tokens_bounded": bounded.get("prefill_tokens"),
        "prefill_tokens_tier": tier.get("prefill_tokens"),
        "throughput_tier_over_bounded": tier["requests_per_s"] / bounded["requests_per_s"],
    }
    unbounded = by_kind.get("unbounded")
    if unbounded is not None and unbounded["hit_rate"] and tier["hit_rate"] is not None:
        gap = unbounded["hit_rate"] - (bounded["hit_rate"] or 0.0)
        out.update(
            unbounded=unbounded["name"],
            hit_rate_unbounded=unbounded["hit_rate"],
            prefill_tokens_unbounded=unbounded.get("prefill_tokens"),
            tier_over_unbounded=tier["hit_rate"] / unbounded["hit_rate"],
            gap_closed=None if gap <= 0 else (tier["hit_rate"] - bounded["hit_rate"]) / gap,
            throughput_tier_over_unbounded=tier["requests_per_s"] / unbounded["requests_per_s"],
        )
    return out


def ideal_ratio(
    base: dict[str, Any], nocache: dict[str, Any], calibration: dict[str, Any]
) -> dict[str, Any]:
    t_nocache = nocache["wall_s"]
    saved_s = saved_prefill_s(base["optimal_cached_per_request"], calibration)
    # a noisy calibration can claim more prefill time than the run took: keep a floor
    t_ideal = max(t_nocache - saved_s, 0.05 * t_nocache)
    ideal = t_nocache / t_ideal
    achieved = t_nocache / base["wall_s"]
    return {
        "time_model": TIME_MODEL,
        "fit": calibration["fit"],
        "a_s_per_token": calibration["a_s_per_token"],
        "b_s_per_token2": calibration["b_s_per_token2"],
        "saved_prefill_s": saved_s,
        "saved_s_per_cached_token": saved_s / max(base["optimal_cached_tokens"], 1),
        "is_clamped": t_nocache - saved_s < 0.05 * t_nocache,
        "t_nocache_s": t_nocache,
        "t_ideal_s": t_ideal,
        "ideal_cache_ratio": ideal,
        "cache_ratio": achieved,
        "cache_ratio_over_ideal": achieved / ideal,
    }


def tier_table(systems: list[dict[str, Any]]) -> str:
    """Pool size, KV tier and where the hits came from, per radixserve system."""
    runs = [s for s in systems if s.get("kind") in CACHED_KINDS or s.get("kind") == "no-cache"]
    header = ("system", "pool", "tier", "hit", "optimal", "from tier", "prefill tok", "req/s")
    rows = [
        (
            s["name"],
            str(s.get("pool_tokens") or s.get("max_total_tokens") or "default"),
            _tier_text(s),
            _pct(s["hit_rate"]),
            _pct(s["optimal_hit_rate"]),
            _pct(s.get("tier_hit_rate")),
            "-" if s.get("prefill_tokens") is None else str(s["prefill_tokens"]),
            f"{s['requests_per_s']:.2f}",
        )
        for s in runs
    ]
    return format_table(header, rows)


def _tier_text(s: dict[str, Any]) -> str:
    if not s.get("kv_tier"):
        return "-"
    capacity = s.get("kv_tier_capacity_tokens")
    return s["kv_tier"] if capacity is None else f"{s['kv_tier']} {capacity}"


def _ms(d: dict[str, float] | None, key: str) -> str:
    return "-" if d is None else f"{d[key] * 1e3:.0f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def systems_table(systems: list[dict[str, Any]], extra: Sequence[tuple[str, str]] = ()) -> str:
    """The bench table; ``extra`` adds ``(header, key)`` columns (``-`` where a key is missing)."""
    header = (
        "system",
        "wall s",
        "req/s",
        "in tok/s",
        "out tok/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "lat p50 ms",
        "lat p99 ms",
        "hit",
        "optimal",
    )
    rows = [
        (
            s["name"],
            f"{s['wall_s']:.2f}",
            f"{s['requests_per_s']:.2f}",
            f"{s['input_tokens_per_s']:.0f}",
            f"{s['output_tokens_per_s']:.1f}",
            _ms(s["ttft_s"], "p50"),
            _ms(s["ttft_s"], "p99"),
            _ms(s["latency_s"], "p50"),
            _ms(s["latency_s"], "p99"),
            _pct(s["hit_rate"]),
            _pct(s["optimal_hit_rate"]),
            *(str(s.get(key, "-")) for _, key in extra),
        )
        for s in systems
    ]
    return format_table((*header, *(name for name, _ in extra)), rows)


def runs_text(systems: list[dict[str, Any]]) -> str:
    """With ``--repeat``: every run's wall time per system (the table shows the fastest)."""
    repeated = [s for s in systems if len(s.get("wall_runs_s", ())) > 1]
    if not repeated:
        return ""
    runs = "; ".join(
        f"{s['name']} " + ", ".join(f"{w:.2f}" for w in s["wall_runs_s"]) for s in repeated
    )
    return f"wall s is the fastest run of each system; all runs (s): {runs}"


def speculative_text(systems: list[dict[str, Any]]) -> str:
    """With ``--speculative-algorithm``: each radixserve system's accept length over its run."""
    lines = []
    for s in systems:
        spec = s.get("speculative")
        if spec is None:
            continue
        length = spec["accept_length"]
        lines.append(
            f"speculative decoding {s['name']}: accept length "
            f"{'-' if length is None else f'{length:.2f}'} tokens per drafted step "
            f"({spec['num_drafts']} drafts, {spec['num_accepted_tokens']} of "
            f"{spec['num_draft_tokens']} drafted tokens accepted)"
        )
    return "\n".join(lines)


def policy_table(systems: list[dict[str, Any]]) -> str:
    runs = [s for s in systems if s.get("kind") == "radixserve"]
    header = ("policy", "hit", "optimal", "req/s", "out tok/s", "TTFT p99 ms")
    rows = [
        (
            s["policy"],
            _pct(s["hit_rate"]),
            _pct(s["optimal_hit_rate"]),
            f"{s['requests_per_s']:.2f}",
            f"{s['output_tokens_per_s']:.1f}",
            _ms(s["ttft_s"], "p99"),
        )
        for s in runs
    ]
    return format_table(header, rows)


def data_parallel_table(systems: list[dict[str, Any]]) -> str:
    """Router policies side by side: hit rates and each worker's share of the requests."""
    runs = [s for s in systems if s.get("kind") == "data-parallel"]
    header = ("router policy", "hit", "optimal", "req/s", "TTFT p99 ms", "requests per worker")
    rows = [
        (
            s["router_policy"],
            _pct(s["hit_rate"]),
            _pct(s["optimal_hit_rate"]),
            f"{s['requests_per_s']:.2f}",
            _ms(s["ttft_s"], "p99"),
            " / ".join(_pct(x) for x in s.get("load_split", [])),
        )
        for s in runs
    ]
    return format_table(header, rows)


def ratios_text(ratios: dict[str, Any]) -> str:
    lines = [f"throughput {k}: {v:.2f}x" for k, v in ratios.get("throughput", {}).items()]
    for name, h in ratios.get("hit_rate", {}).items():
        over = h["achieved_over_optimal"]
        lines.append(
            f"hit rate {name}: {_pct(h['achieved'])} of prompt tokens, optimal "
            f"{_pct(h['optimal'])} ({'-' if over is None else f'{100 * over:.1f}%'} of optimal)"
        )
    tier = ratios.get("kv_tier")
    if tier:
        lines.append(
            f"kv tier: {tier['tier']} hits {_pct(tier['hit_rate_tier'])} "
            f"({_pct(tier['tier_hit_rate'])} from the tier) on a pool of "
            f"{tier['max_total_tokens'] or 'default'} tokens, {tier['bounded']} "
            f"{_pct(tier['hit_rate_bounded'])}; throughput "
            f"{tier['throughput_tier_over_bounded']:.2f}x"
        )
        if "hit_rate_unbounded" in tier:
            gap = tier["gap_closed"]
            lines.append(
                f"  the unbounded pool hits {_pct(tier['hit_rate_unbounded'])}: the tier "
                f"recovers {_pct(tier['tier_over_unbounded'])} of it "
                f"({'-' if gap is None else _pct(gap)} of the gap the bounded pool leaves)"
            )
    ideal = ratios.get("ideal")
    if ideal:
        lines.append(
            f"cache ratio {ideal['cache_ratio']:.2f}x vs ideal {ideal['ideal_cache_ratio']:.2f}x "
            f"({100 * ideal['cache_ratio_over_ideal']:.0f}% of ideal; t(n) = a n + b n^2, "
            f"a={ideal['a_s_per_token'] * 1e3:.3g} ms/token, "
            f"b={ideal['b_s_per_token2'] * 1e6:.3g} us/token^2, {ideal['fit']} fit"
            f"{', clamped' if ideal['is_clamped'] else ''})"
        )
        lines.append(f"  time model: {TIME_MODEL}")
    return "\n".join(lines)


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        first = f"{cells[0]:<{widths[0]}}"
        rest = [f"{c:>{w}}" for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest])

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in rows)])
