"""``benchmarks/device_gpu.sh --device cpu``: the GPU run's script, every stage, on this CPU.

GPU minutes are scarce: this proves the script (its stages, the `gpu` tests on the CPU, the
benchmarks' calls, the files it leaves for the next session) before one is spent on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def dry_run(tmp_path: Path, *stages: str) -> Path:
    """``device_gpu.sh --device cpu [stages]``; returns its $OUT after checking it exited 0."""
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "PY": sys.executable,
        "BENCH_DIR": str(tmp_path / "models"),
    }
    proc = subprocess.run(
        ["bash", "benchmarks/device_gpu.sh", "--device", "cpu", *stages],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return out


@pytest.mark.bench  # a benchmark script's run, with the others in `make test-bench`
@pytest.mark.timeout(60)
def test_the_script_runs_its_stages_in_order(tmp_path: Path) -> None:
    """The quick stages in the default suite (the whole dry run is slow: make test-slow)."""
    out = dry_run(tmp_path, "info", "jit", "split")
    log = (out / "run.log").read_text()
    assert log.index("=== info") < log.index("=== jit") and "info: exit 0" in log
    assert "jit: exit 0" in log and "heads 32/8, head_dim 128" in log  # every attention shape
    # the prefill split's rows: both sides timed, the same logits within bf16's rounding
    rows = json.loads((out / "split-tiny.json").read_text())["rows"]
    assert [r["row"].split()[0] for r in rows] == ["scratch", "on", "4x(48"]
    assert all(set(r["tokens_per_s"]) == {"ragged", "paged"} for r in rows)
    assert rows[0]["max_logit_diff"] == 0.0  # from scratch: no merge, the same sums
    assert all(r["max_logit_diff"] < 0.5 for r in rows)


@pytest.mark.bench
@pytest.mark.timeout(180)
def test_the_spec_stages_write_their_rows(tmp_path: Path) -> None:
    """Speculative decoding's two stages: verifies eager, and replayed from CUDA graphs
    (``--cuda-graph-verify``: on the CPU there are none, so the same path runs)."""
    out = dry_run(tmp_path, "spec", "specgraph")
    log = (out / "run.log").read_text()
    assert "spec: exit 0" in log and "specgraph: exit 0" in log
    for name in ("spec.txt", "spec-graph.txt"):
        rows = [line.split() for line in (out / name).read_text().splitlines()]
        assert [r[:2] for r in rows if r and r[0] in "cd"] == [["c", "1"], ["d", "1"]], rows


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_dry_run_writes_every_file(tmp_path: Path) -> None:
    out = dry_run(tmp_path)
    log = (out / "run.log").read_text()
    for stage in ("install", "info", "jit", "tests", "split", "idle", "bench"):
        assert f"{stage}: exit 0" in log, log[-3000:]

    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    assert counts["failures"] == counts["errors"] == 0, counts
    assert counts["tests"] - counts["skipped"] >= 15, counts  # parity x12, stress, sampling, tier

    idle = json.loads((out / "idle.json").read_text())["rows"]
    assert {(r["batch"], r["overlap"], r["launch"], r["sync"]) for r in idle} >= {
        (64, False, "thread", False),
        (64, True, "thread", True),
        (64, True, "thread", False),
        (64, True, "stream", False),
    }
    assert all(0.0 <= r["idle"] < 1.0 and r["cpu_ms_per_step"] > 0 for r in idle)
    overlap = json.loads((out / "overlap-tiny.json").read_text())["rows"]
    assert {(r["batch"], r["overlap"]) for r in overlap} == {
        (b, o) for b in (1, 8) for o in ("off", "thread", "stream")
    }
    assert all(r["step_ms"] > 0 for r in overlap)

    rows = json.loads((out / "throughput-tiny.json").read_text())["rows"]
    decode = [r for r in rows if r["row"].startswith("decode")]
    assert len(decode) == 2 and all(
        set(r["tokens_per_s"]) == {"rs bfloat16", "HF bfloat16"} for r in decode
    )
    assert all(0 < f < 1 for r in decode for f in r["bound_fraction"].values())

    bench = json.loads((out / "bench" / "multiturn.json").read_text())
    assert bench["options"]["device"] == "cpu"
    assert {s["name"] for s in bench["systems"]} == {"radixserve", "radixserve-no-cache"}


@pytest.mark.timeout(60)
def test_profile_sorts_the_h200s_kernels_by_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """``profile_decode.by_kind`` on kernel names the H200's profile of the 8B shape printed."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    monkeypatch.syspath_prepend(str(REPO / "benchmarks" / "gpu"))
    from profile_decode import by_kind

    kernels = [
        ("nvjet_sm90_tst_128x8_64x12_2x1_v_bz_TNT", 3.0),
        ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>", 0.5),
        ("void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0>", 1.0),
        ("void flashinfer::BatchPrefillWithPagedKVCacheKernel<flashinfer::KernelTraits>", 0.5),
        ("void flashinfer::PersistentVariableLengthMergeStatesKernel<8u, 16u>", 0.25),
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>", 0.75),
        ("void at::native::index_elementwise_kernel<128, 4>", 0.5),
        ("void at::native::vectorized_elementwise_kernel<8, at::native::silu>", 0.125),
    ]
    assert by_kind(kernels) == {
        "GEMM": 3.5,
        "attention": 1.5,
        "norm": 0.75,
        "index (KV writes, gathers)": 0.5,
        "attention merge": 0.25,
        "other": 0.125,
    }
