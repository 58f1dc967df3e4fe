"""Sweeps: the cartesian product of ``--sweep key=v1,v2,...`` values, ``--dp-size`` and
``--router``, each run simulated on the same trace; and their PNG plot."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from radixserve.config import EngineConfig, SchedulerConstants
from radixserve.sim.router import ROUTER_POLICIES

# sweep key -> (EngineConfig's flat field name, parser)
ENGINE_KEYS: dict[str, tuple[str, type]] = {
    "kv_tokens": ("max_total_tokens", int),
    "policy": ("schedule_policy", str),
    "max_running": ("max_running_requests", int),
    "chunked_prefill_size": ("chunked_prefill_size", int),
    "page_size": ("page_size", int),
    "max_prefill_tokens": ("max_prefill_tokens", int),
}
SWEEP_KEYS = (*ENGINE_KEYS, "aging", "dp_size", "router")


def parse_sweep(text: str | None) -> dict[str, list[str]]:
    """``kv_tokens=4096,16384,policy=fcfs,lpm`` -> ``{"kv_tokens": [...], "policy": [...]}``:
    a comma item with ``=`` starts a key, the items after it are more of its values."""
    out: dict[str, list[str]] = {}
    if not text:
        return out
    key = None
    for item in text.split(","):
        if "=" in item:
            key, _, item = item.partition("=")
            if key not in SWEEP_KEYS:
                raise ValueError(f"unknown sweep key {key!r}; expected one of {SWEEP_KEYS}")
            if key in out:
                raise ValueError(f"sweep key {key!r} given twice")
            out[key] = []
        if key is None or not item:
            raise ValueError(f"bad --sweep {text!r}: expected key=v1,v2,key2=v3,...")
        out[key].append(item)
    return out


def apply(base: EngineConfig, point: dict[str, str]) -> EngineConfig:
    """``base`` with one sweep point's engine values (``aging``: ``aging_constants``)."""
    changes: dict[str, Any] = {}
    for key, value in point.items():
        if key in ENGINE_KEYS:
            field_name, kind = ENGINE_KEYS[key]
            try:
                changes[field_name] = kind(value)
            except ValueError:
                raise ValueError(f"sweep {key}={value!r}: expected {kind.__name__}") from None
        elif key == "aging":
            changes["constants"] = aging_constants(base.admission.constants, value)
    return base.replace(**changes)


PASS_AGING_BOUND = 8  # aging=passes: the bound in passes that benchmarks/README.md measures


def aging_constants(base: SchedulerConstants, value: str) -> SchedulerConstants:
    """``base`` with the anti-starvation aging of ``aging=VALUE``: ``on`` (the default, by
    admissions), ``off`` (SGLang's LPM and DFS-weight) or ``passes`` (by passes, 8:
    ``PASS_AGING_BOUND``)."""
    if value == "on":
        default = SchedulerConstants()
        return dataclasses.replace(
            base,
            max_skipped_passes=default.max_skipped_passes,
            aging_work_factor=default.aging_work_factor,
        )
    if value == "passes":
        return dataclasses.replace(base, max_skipped_passes=PASS_AGING_BOUND, aging_work_factor=0.0)
    if value == "off":
        return base.without_aging()
    raise ValueError(f"sweep aging={value!r}: expected on, off or passes")


def points(grid: dict[str, list[str]]) -> Iterator[dict[str, str]]:
    keys = list(grid)
    for values in itertools.product(*(grid[k] for k in keys)):
        yield dict(zip(keys, values, strict=True))


def check_routers(routers: list[str]) -> None:
    bad = [r for r in routers if r not in ROUTER_POLICIES]
    if bad:
        raise ValueError(f"unknown router policies {bad}; expected {ROUTER_POLICIES}")


def write_plot(runs: list[dict[str, Any]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    labels = [r["name"] for r in runs]
    x = np.arange(len(labels))
    panels = (
        ("requests/s", [r["requests_per_s"] for r in runs], None),
        (
            "hit rate %",
            [100 * r["hit_rate"] for r in runs],
            [100 * r["optimal_hit_rate"] for r in runs],
        ),
        ("TTFT p99 s", [r["ttft_s"]["p99"] if r["ttft_s"] else np.nan for r in runs], None),
        (
            "latency p99 s",
            [r["latency_s"]["p99"] if r["latency_s"] else np.nan for r in runs],
            None,
        ),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.6))
    for ax, (ylabel, values, optimal) in zip(axes, panels, strict=True):
        bars = ax.bar(x, values, 0.6, label="simulated")
        ax.bar_label(bars, fmt="%.3g", fontsize=6)
        if optimal is not None:
            ax.plot(x, optimal, "k_", markersize=18, label="optimal")
            ax.legend(fontsize=7)
        ax.set_xticks(x, labels, rotation=35, ha="right", fontsize=7)
        ax.set_ylabel(ylabel)
        ax.margins(y=0.15)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
