"""``radixserve sim`` end to end: a sweep prints the table and writes its JSON and PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixserve.cli import main


def test_sim_run_sweep_writes_table_json_and_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "sim",
            "run",
            "--trace",
            "shared-prefix",
            "--groups",
            "2",
            "--prompts-per-group",
            "6",
            "--system-len",
            "128",
            "--question-len",
            "16",
            "--output-len",
            "4",
            "--cost",
            "tiny-cpu",
            "--sweep",
            "kv_tokens=400,4000,policy=fcfs,lpm",
            "--dp-size",
            "1,2",
            "--router",
            "cache_aware",
            "--check-integrity-every",
            "1",
            "--out",
            str(tmp_path),
            "--name",
            "t",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "TTFT p99 ms" in out and "retract" in out and "optimal" in out
    report = json.loads((tmp_path / "t.json").read_text())
    # 2 kv sizes x 2 policies x (dp 1 and 2)
    assert len(report["runs"]) == 8
    assert all(r["num_requests"] == 12 for r in report["runs"])
    assert (tmp_path / "t.png").stat().st_size > 10_000


def test_sim_export_then_replay_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.jsonl"
    assert (
        main(
            [
                "sim",
                "export",
                "--trace",
                "shared-prefix",
                "--groups",
                "2",
                "--prompts-per-group",
                "3",
                "--out",
                str(trace),
            ]
        )
        == 0
    )
    assert len(trace.read_text().splitlines()) == 6
    assert (
        main(
            [
                "sim",
                "run",
                "--trace",
                "jsonl",
                "--trace-file",
                str(trace),
                "--cost",
                "h100",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert "adaptive" in capsys.readouterr().out  # the server's default policy


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--sweep", "kv_tokens"], "bad --sweep"),
        (["--sweep", "colour=red"], "unknown sweep key"),
        (["--router", "nearest"], "unknown router policies"),
        (["--cost", "nope"], "no cost model file"),
        (["--trace", "jsonl"], "--trace-file"),
        (["--sweep", "aging=sometimes"], "expected on, off or passes"),
    ],
)
def test_bad_sim_flags_exit_2(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "sim",
                "run",
                "--groups",
                "1",
                "--prompts-per-group",
                "1",
                "--out",
                str(tmp_path),
                *extra,
            ]
        )
        == 2
    )
    assert message in capsys.readouterr().err


def test_aging_sweep_values() -> None:
    """``aging=``: on (the default, by admissions), off (SGLang's orders), passes (by 8 passes)."""
    from radixserve.config import SchedulerConstants
    from radixserve.sim.sweep import aging_constants

    base = SchedulerConstants(lpm_fallback_queue_len=7)
    on, off = aging_constants(base, "on"), aging_constants(base, "off")
    passes = aging_constants(base, "passes")
    assert (on.max_skipped_passes, on.aging_work_factor) == (
        0,
        SchedulerConstants().aging_work_factor,
    )
    assert (off.max_skipped_passes, off.aging_work_factor) == (0, 0.0)
    assert (passes.max_skipped_passes, passes.aging_work_factor) == (8, 0.0)
    assert {c.lpm_fallback_queue_len for c in (on, off, passes)} == {7}
