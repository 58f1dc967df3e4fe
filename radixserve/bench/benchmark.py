"""One benchmark run end to end: sessions -> every system -> ratios -> table, JSON and PNG."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from radixserve.bench.models import model_label
from radixserve.bench.report import (
    compute_ratios,
    data_parallel_table,
    policy_table,
    ratios_text,
    runs_text,
    speculative_text,
    systems_table,
    tier_table,
)
from radixserve.bench.systems import BenchOptions, run_all
from radixserve.bench.workload import (
    MultiTurnSpec,
    SharedPrefixSpec,
    make_multiturn,
    make_shared_prefix,
    num_requests,
    trace_tokens,
)


def shape_text(spec: MultiTurnSpec | SharedPrefixSpec) -> str:
    def rng(r: tuple[int, int]) -> str:
        return str(r[0]) if r[0] == r[1] else f"{r[0]}-{r[1]}"

    if isinstance(spec, MultiTurnSpec):
        system = f", system prompt {spec.system_len}" if spec.system_len else ""
        return (
            f"{spec.num_conversations} conversations x {spec.num_turns} turns, user "
            f"{rng(spec.user_len)} tokens, answers {rng(spec.answer_len)} tokens, "
            f"{spec.parallel} parallel clients{system}"
        )
    rate = "all at once" if spec.request_rate == float("inf") else f"{spec.request_rate} req/s"
    return (
        f"{spec.num_groups} groups x {spec.prompts_per_group} prompts, system prompt "
        f"{spec.system_len}, question {spec.question_len}, output {spec.output_len}, {rate}"
    )


def run_benchmark(
    spec: MultiTurnSpec | SharedPrefixSpec, opts: BenchOptions, out_dir: Path, run_name: str
) -> dict[str, Any]:
    """Runs it, prints the tables, writes ``<out_dir>/<run_name>.json`` and ``.png``; returns
    the report (the JSON's content)."""
    if isinstance(spec, MultiTurnSpec):
        benchmark, sessions = "multiturn", make_multiturn(spec, *opts.token_range, opts.corpus)
    else:
        benchmark, sessions = (
            "shared-prefix",
            make_shared_prefix(spec, *opts.token_range, opts.corpus),
        )
    trace = trace_tokens(sessions)
    print(
        f"{benchmark}: {shape_text(spec)}; {num_requests(sessions)} requests, "
        f"{trace} distinct tokens",
        flush=True,
    )
    started, load_before = time.time(), os.getloadavg()
    result = run_all(opts, sessions)
    systems, calibration = result["systems"], result["calibration"]
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out_dir / f"{run_name}.json", out_dir / f"{run_name}.png"
    report: dict[str, Any] = {
        "benchmark": benchmark,
        "shape": _jsonable(dataclasses.asdict(spec)),
        "shape_text": shape_text(spec),
        "model": model_label(opts.model_path),
        "options": _jsonable(_options(opts)),
        "num_requests": num_requests(sessions),
        "trace_tokens": trace,
        "started_at": started,
        "duration_s": time.time() - started,
        "host": {
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            # a busy host skews every number: compare only runs taken at low load
            "loadavg_1m_before_after": [load_before[0], os.getloadavg()[0]],
        },
        "systems": systems,
        "calibration": calibration,
        "ratios": compute_ratios(systems, calibration),
        "files": {"json": json_path.name, "png": png_path.name},
    }
    # a report names the model by its shape or name, never by where this machine keeps it
    report = _replace_strings(report, opts.model_path, report["model"])
    print()
    print(systems_table(systems))
    if runs := runs_text(systems):
        print(runs)
    if drafted := speculative_text(systems):
        print(drafted)
    if len(opts.policies) > 1:
        print()
        print(policy_table(systems))
    if opts.dp_size > 1:
        print()
        print(data_parallel_table(systems))
    if opts.kv_tier is not None or opts.max_total_tokens is not None:
        print()
        print(tier_table(systems))
    print()
    print(ratios_text(report["ratios"]))
    json_path.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    from radixserve.bench.plot import write_plot

    write_plot(report, png_path)
    print(f"\nwrote {json_path} and {png_path}")
    return report


def _options(opts: BenchOptions) -> dict[str, Any]:
    """The options as recorded: the text prompts' corpus by its size, not its ids."""
    out = {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts) if f.name != "corpus"}
    out["prompts"] = "random ids" if opts.corpus is None else f"text ({len(opts.corpus)} ids)"
    return out


def _replace_strings(value: Any, old: str, new: str) -> Any:
    """``value`` with every string (dict keys too) equal to ``old`` replaced by ``new``."""
    if isinstance(value, dict):
        return {
            _replace_strings(k, old, new): _replace_strings(v, old, new) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_replace_strings(v, old, new) for v in value]
    return new if value == old else value


def _jsonable(value: Any) -> Any:
    """Dataclass dicts as JSON: tuples as lists, an infinite rate as the string "inf"."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and value == float("inf"):
        return "inf"
    return value
