"""One PNG per run: throughput, hit rate (achieved vs optimal) and latency, per system."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (after selecting the Agg backend)
import numpy as np  # noqa: E402

from radixserve.bench.models import model_label  # noqa: E402


def _bars(ax: Any, labels: list[str], series: dict[str, list[float]], ylabel: str) -> None:
    x = np.arange(len(labels))
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        bars = ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=name)
        ax.bar_label(bars, fmt="%.3g", fontsize=6)
    ax.set_xticks(x, labels, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.margins(y=0.18)  # room for the labels above the bars
    if len(series) > 1:
        ax.legend(fontsize=7)


def _s(d: dict[str, float] | None, key: str) -> float:
    return float("nan") if d is None else d[key]  # NaN: no bar (not measured)


def write_plot(report: dict[str, Any], path: Path) -> None:
    """Writes ``report``'s (a ``radixserve bench`` JSON's content) PNG to ``path``; it needs
    nothing but the report, so a committed JSON can be plotted again."""
    systems = report["systems"]
    labels = [s["name"] for s in systems]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    _bars(axes[0], labels, {"requests/s": [s["requests_per_s"] for s in systems]}, "requests/s")
    base = systems[0]["requests_per_s"]
    for i, s in enumerate(systems[1:], start=1):
        axes[0].annotate(
            f"ratio {base / s['requests_per_s']:.2f}x" if s["requests_per_s"] else "",
            (i, s["requests_per_s"]),
            xytext=(0, 12),
            textcoords="offset points",
            ha="center",
            fontsize=7,
        )
    axes[0].set_title(f"throughput, same trace (ratio: {systems[0]['name']} / this)", fontsize=9)
    hits = {
        "achieved": [100 * (s["hit_rate"] or 0.0) for s in systems],
        "optimal": [100 * s["optimal_hit_rate"] for s in systems],
    }
    if any(s.get("kv_tier") for s in systems):  # the part of the hits a KV tier served
        hits["from the KV tier"] = [100 * (s.get("tier_hit_rate") or 0.0) for s in systems]
    _bars(axes[1], labels, hits, "% of prompt tokens")
    axes[1].set_title("prefix cache hit rate")
    _bars(
        axes[2],
        labels,
        {
            "TTFT p50": [_s(s["ttft_s"], "p50") for s in systems],
            "TTFT p99": [_s(s["ttft_s"], "p99") for s in systems],
            "latency p50": [_s(s["latency_s"], "p50") for s in systems],
            "latency p99": [_s(s["latency_s"], "p99") for s in systems],
        },
        "seconds (log scale)",
    )
    axes[2].set_yscale("log")
    axes[2].set_title("TTFT and request latency (HF: no TTFT)")
    model = model_label(report["model"])  # its shape or name, never a path of this machine
    fig.suptitle(f"{report['benchmark']}: {report['shape_text']}\nmodel: {model}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
