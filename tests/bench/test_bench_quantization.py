"""``radixserve bench multiturn --quantization int8``: the radixserve systems run int8 weights
(what the Engine and the server say they built), and the HF baselines, which have none, are
refused. Never a speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixserve.bench.cli import main


@pytest.fixture(autouse=True)
def _bench_models_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXSERVE_DEFAULT_MODEL_DIR", str(tmp_path / "models" / "default"))


def _systems(out: Path, stem: str) -> dict[str, dict]:
    report = json.loads((out / f"{stem}.json").read_text())
    assert report["options"]["quantization"] == "int8"
    return {s["name"]: s for s in report["systems"]}


@pytest.mark.timeout(600)
def test_multiturn_quick_int8_engine(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["multiturn", "--quick", "--quantization", "int8", "--baselines", "no-cache"]
    assert main([*args, "--out", str(out), "--name", "q"]) == 0
    systems = _systems(out, "q")
    assert list(systems) == ["radixserve", "radixserve-no-cache"]
    for s in systems.values():  # the Engine's own config: it loaded int8 weights
        assert s["quantization"] == "int8"
    assert systems["radixserve"]["hit_rate"] > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_multiturn_quick_int8_over_http(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["multiturn", "--quick", "--quantization", "int8", "--baselines", "none"]
    assert main([*args, "--backend", "http", "--out", str(out), "--name", "qh"]) == 0
    rs = _systems(out, "qh")["radixserve"]
    assert rs["server"]["quantization"] == rs["quantization"] == "int8"  # /get_server_info


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ([], "HF baselines"),  # multiturn's default baselines include hf and hf-kv
        (["--baselines", "no-cache,hf-kv"], "HF baselines"),
        (["--baselines", "none", "--backend", "http", "--url", "http://127.0.0.1:1"], "--url"),
    ],
)
def test_int8_options_refused(
    args: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["multiturn", "--quick", "--quantization", "int8", *args]) == 2
    err = capsys.readouterr().err
    assert "radixserve bench:" in err and why in err
