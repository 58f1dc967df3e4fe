"""Every script in ``benchmarks/`` run once on its smallest workload, so none rots unnoticed
(`make test-bench`; a script once called a model writer with a keyword it lacked, and nothing
ran it until a benchmark session did).

Each script runs as its README says, ``python benchmarks/<script> ARGS`` (``bash`` for the
``.sh``), in a subprocess from the repository root with this interpreter, on the tiny random
Llama of ``tiny_llama_dir`` where it takes a model, one repetition, the smallest batch and
the shortest lengths; it must exit 0, print no traceback, print the rows named in
:data:`EXPECTED` and write the files named in :data:`OUTPUT_FILES`. Never a speed: timings on a
shared machine mean nothing here. A new script in ``benchmarks/`` fails
:func:`test_every_script_has_a_smoke_entry` until it has an entry here.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest

from radixserve.models.kernels import _ext

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
SUBPROCESS_TIMEOUT_S = 240

pytestmark = [pytest.mark.bench, pytest.mark.timeout(SUBPROCESS_TIMEOUT_S + 60)]

# Placeholders in the arguments and environments below: {model} the tiny model's directory,
# {out} the test's tmp_path, {repo} this checkout, {url} a `radixserve serve` on the tiny model
# (started for the test).
SCRIPT_ARGS: dict[str, list[str]] = {
    "gemm_bench.py": ["--rounds", "1", "--ms", "16"],
    # the weights are Qwen2.5-0.5B's, fixed: no compile, no fp32 or decode-pass tables; the int8
    # table (with one extra variant's route) is what device_cpu.sh's `ab` stage runs
    "gemv_bench.py": [
        *("--rounds", "1", "--ms", "1", "--no-compile", "--no-fp32", "--no-decode"),
        *("--int8", "--variants", "avx2"),
    ],
    # the tiny model's layer shapes, one copy, one round; every tile, and each again with x in L1
    "gemv_tiles.py": [
        *("--model-dir", "{model}", "--ms", "2", "--layers", "1", "--rounds", "1"),
        *("--shared-x", "--json", "{out}/tiles.json"),
    ],
    "int8_accuracy.py": [
        "--model-dir",
        "{model}",
        "--prompt-len",
        "4",
        "--tokens",
        "2",
        "--batch",
        "2",
    ],
    # llama.cpp's sources (convert_hf_to_gguf.py) and its llama-server binary are not on this
    # machine and every sub-command needs one of them: --help only
    "llamacpp.py": ["--help"],
    "agent_trace.py": [
        *("--url", "{url}", "--agents", "1", "--turns", "2", "--json", "{out}/agent.json"),
    ],
    "load.py": [
        *("--url", "{url}", "--clients", "1", "--seconds", "1", "--json", "{out}/load.json"),
        *("--health-p99-ms", "60000"),  # a busy machine must not fail the smoke run
    ],
    # no llama.cpp side (--llama-gguf needs llama-server); one radixserve side in float32 and one
    # with int8 weights, one HF side
    "prompt_logprobs.py": [
        "--prompt-len",
        "16",
        "--repeats",
        "1",
        "--hidden-size",
        "64",
        "--num-layers",
        "1",
    ],
    "model_throughput.py": [
        # +avx2: a side held to a lower kernel variant (every x86 CPU of the project runs it)
        *("--model-dir", "{model}", "--configs", "float32", "bfloat16+int8+avx2"),
        *("--hf-dtypes", "float32", "--batch-sizes", "1", "--prompt-len", "8"),
        *("--context-len", "8", "--decode-steps", "1", "--reps", "1", "--bandwidth-mib", "16"),
        *("--json", "{out}/throughput.json"),
    ],
    "lora_throughput.py": [
        *("--model-dir", "{model}", "--adapter-dir", "{out}", "--rank", "4", "--adapters", "1"),
        *("2", "--batch-sizes", "2", "--context-len", "8", "--decode-steps", "1"),
        *("--prefill-batch", "2", "--prompt-len", "8", "--reps", "1"),
    ],
    "sim_policies.py": [
        *("--requests", "60", "--systems", "fcfs,lpm+age=0+wage=0,hrrn+il", "--groups", "4"),
        *("--prefix", "64", "--cold-len", "64", "--long-len", "256", "--clients", "8"),
        *("--kv-tokens", "2048", "--rate", "20"),  # the pressure trace open loop
    ],
    "forward_phases.py": [
        *("--json", "{out}/phases.json", "--", "bench", "multiturn", "--quick", "--model"),
        *("{model}", "--baselines", "none", "--conversations", "2", "--turns", "2"),
        *("--out", "{out}/bench", "--name", "mt"),
    ],
    "multiturn_chat.py": [
        *("--quick", "--model", "{model}", "--baselines", "none"),
        *("--conversations", "2", "--turns", "2", "--out", "{out}/bench", "--name", "mt"),
    ],
    # the tree at HEAD as "before": any checkout has it (the default revision needs full history)
    "radix_ops.py": [
        *("--rev", "HEAD", "--conversations", "2", "--turns", "2", "--num-systems", "1"),
        *("--system-len", "8", "--question-len", "2", "4", "--answer-len", "2", "4"),
        *("--capacity", "64", "--repeat", "1", "--events"),
    ],
    "scheduler_idle.py": [
        *("--shapes", "qwen25-0.5b", "--batches", "1", "--context", "8", "--steps", "2"),
        *("--warmup", "1", "--json", "{out}/idle.json"),
    ],
    # its own tiny model (written to a temp dir); --compare-rev (a git worktree) is not run
    "scheduler_overhead.py": ["--batch", "1", "--steps", "2", "--prompt-len", "8"],
    "shared_prefix.py": [
        *("--quick", "--model", "{model}", "--baselines", "none"),
        *("--groups", "1", "--prompts-per-group", "2", "--out", "{out}/bench", "--name", "sp"),
    ],
    "sim_speed.py": [
        "--requests",
        "20",
        "--groups",
        "2",
        "--kv-tokens",
        "4096",
        "--max-running",
        "4",
    ],
    "sim_starvation.py": [
        *("--hot", "20", "--cold", "2", "--hot-prefix", "32", "--clients", "4"),
        *("--kv-tokens", "2048"),
    ],
    "sim_vs_real.py": ["--model", "{model}", "--shapes", "a"],
    "spec_decode.py": [
        *("--model-dir", "{model}", "--dtype", "float32", "--workloads", "b,c,d"),
        *("--max-new-tokens", "12"),
    ],
    # no llama-server on this machine: radixserve's columns only
    "spec_llamacpp.py": [
        *("--model-dir", "{model}", "--dtype", "float32", "--workloads", "c"),
        *("--max-new-tokens", "8", "--out", "{out}/spec.json"),
    ],
    # --max-new-tokens stays at its default: every constrained output must be whole JSON
    "structured.py": ["--model", "{model}", "--batch-size", "1"],
    # an A/A run: this tree against itself (a second tree would build the kernels again)
    "kernel_ab.py": [
        *("--model-dir", "{model}", "--before", "{repo}", "--configs", "float32"),
        *("--ctx", "8", "--steps", "1", "--rounds", "2", "--prefill-lens", "8"),
    ],
    "tp_throughput.py": [
        *("--model-dir", "{model}", "--dtype", "float32", "--prompt-len", "8"),
        *("--batch-sizes", "1", "--decode-steps", "2", "--reps", "1"),
    ],
    # `info` and `bench` (model_throughput.py with the script's own flags); `ab` is gemv_bench.py
    # with the flags of its entry above, and `test` is the test suite itself
    "device_cpu.sh": ["info", "bench"],
}

# Environment variables per script (on top of this process's environment), placeholders as above.
SCRIPT_ENV: dict[str, dict[str, str]] = {
    "device_cpu.sh": {
        "OUT": "{out}/device_out",
        "MODEL": "{model}",
        "PY": sys.executable,
        "BATCHES": "1",
        "REPS": "1",
    },
}

# Modules the scripts import, with no entry point of their own.
HELPERS = {"llama_side.py", "git_revision.py", "spec_llama_side.py"}

# Scripts whose smoke run lives in another test module.
COVERED_ELSEWHERE = {
    "device_gpu.sh": "tests/bench/test_device_gpu_dry_run.py",
    "tables.py": "tests/bench/test_tables.py",
}

# Patterns (re.MULTILINE) the script's output must match: rows it prints once it did its work.
EXPECTED: dict[str, list[str]] = {
    "sim_policies.py": [
        r"^pressure: 60 requests, KV 2048",
        r"^long: 60 requests, KV 65536",
        r"^hrrn\+il\s+\d+\.\d\s+\d+\s+\d\.\d\d\s+\d",
    ],
    "lora_throughput.py": [
        r"^prefill 2x8\s+\d",
        r"^decode b=2 ctx=8\s+\d",
        r"^lora x2\s+\d+\.\d%\s+\d+\.\d%",
    ],
    "gemm_bench.py": [r"^\s*M\s+shape\s+torch fp32", r"^\s*16\s+layer\s+\d"],
    "gemv_bench.py": [
        r"^lm_head 151936x896 bf16: GB/s",
        r"^96 x 4864x896 int8: GB/s",
        r"^M=1\s+\d",
    ],
    "gemv_tiles.py": [
        r"^kernel variant \w+",
        r"^\s+2\s+\S+/x-in-L1(\s+\d+\.\d){5}$",
        r"^M=2: best ",
    ],
    "int8_accuracy.py": [
        r"bfloat16\+int8 \(batch 2\) vs bf16 over 2 steps: .* greedy token agrees at"
    ],
    "llamacpp.py": [r"\{convert,serve,check\}"],
    "agent_trace.py": [
        r"^chat\s+\d+\s+\d\.\d{3}\s+\d\.\d{3}",
        *(
            rf"^{route}\s+\d+\s+\d\.\d{{3}}"
            for route in ("responses", "conversation", "items", "messages", "thread")
        ),
    ],
    "load.py": [r"^requests\s+[1-9]", r"^errors\s+0$", r"^integrity_ok\s+True$"],
    "prompt_logprobs.py": [r"hit \+ prompt logprobs:\s+\d"],
    "model_throughput.py": [r"^prefill 8 tok\s+\d", r"^decode b=1 ctx=8\s+\d", r"bandwidth bound"],
    "kernel_ab.py": [
        r"A/A run",
        r"^float32 prefill 8\s+tok/s before\s+\d[\d.]* after\s+\d",
        r"^float32 b=1\s+tok/s before\s+\d[\d.]* after\s+\d",
    ],
    "forward_phases.py": [
        r"^radixserve\s+\d",
        r"^forwards over [\d.]+ s: prefill [\d.]+ s \(\d+ tokens, [\d.]+ tok/s\), decode [\d.]+ s",
        r"^  prefill  rows\s+1\s+tokens\s+\d+",
        r"^  decode   batch\s+2\s+steps\s+\d+",
    ],
    "multiturn_chat.py": [r"^radixserve\s+\d", r"^hit rate radixserve: "],
    "radix_ops.py": [
        r"^matched lengths identical in all runs",
        r"^after\s+int32\s+[\d,]+",
        r"^KV events on / off, int32 keys: [\d.]+x",
    ],
    "scheduler_idle.py": [
        r"sched CPU",
        r"^qwen25-0\.5b\s+1\s+0\.50\s+thread\s+\d",
        r"\s+stream\s+\d",
    ],
    "scheduler_overhead.py": [r"^\s*current: step\s+[\d.]+ ms .* overlap step\s+[\d.]+ ms"],
    "shared_prefix.py": [r"^radixserve\s+\d", r"^hit rate radixserve: "],
    "sim_speed.py": [r"^20 requests, ", r"^sim fcfs\s+\d"],
    "sim_starvation.py": [r"cold TTFT p99", r"^dfs-weight\s+on\s+\d"],
    "sim_vs_real.py": [r"^shape a: wall real [\d.]+ s, sim [\d.]+ s", r"^sim \(a\)\s+\d"],
    "spec_decode.py": [
        r"^b\s+1\s+[\d.]+",
        r"^c\s+1\s+[\d.]+\s+[\d.]+\s+[\d.]+x",
        r"^d\s+1\s+[\d.]+",
    ],
    "spec_llamacpp.py": [
        r"^workload\s+bs\s+rs plain\s+rs NGRAM\s+speedup\s+accept$",
        r"^c\s+1\s+[\d.]+\s+[\d.]+\s+[\d.]+x\s+[\d.]+$",
    ],
    "structured.py": [
        r"^json, jump-forward\s+decode steps\s+\d+",
        r"^unconstrained\s+decode steps\s+\d+",
        r"^mask per step at batch 1: ",
    ],
    "tp_throughput.py": [r"^decode bs=1 ms/step\s+[\d.]+\s+[\d.]+", r"all-gather \[1, \d+\]"],
    "device_cpu.sh": [r"^=== bench ", r"^decode b=1 ctx=512\s+\d", r"^=== done "],
}

# Files (under the test's tmp_path) the script must leave, non-empty; JSON must parse.
OUTPUT_FILES: dict[str, list[str]] = {
    "gemv_tiles.py": ["tiles.json"],
    "agent_trace.py": ["agent.json"],
    "load.py": ["load.json"],
    "model_throughput.py": ["throughput.json"],
    "forward_phases.py": ["phases.json", "bench/mt.json"],
    "multiturn_chat.py": ["bench/mt.json", "bench/mt.png"],
    "scheduler_idle.py": ["idle.json"],
    "shared_prefix.py": ["bench/sp.json", "bench/sp.png"],
    "spec_llamacpp.py": ["spec.json"],
    "device_cpu.sh": ["device_out/info.log", "device_out/bench.log"],
}


def script_files() -> set[str]:
    return {p.name for p in BENCHMARKS.iterdir() if p.suffix in (".py", ".sh") and p.is_file()}


def test_every_script_has_a_smoke_entry() -> None:
    """Each script in benchmarks/ is run here, or is a helper, or is run by another test."""
    entries = [set(SCRIPT_ARGS), HELPERS, set(COVERED_ELSEWHERE)]
    assert sum(map(len, entries)) == len(set().union(*entries)), "a script is listed twice"
    files = script_files()
    missing = files - set().union(*entries)
    assert not missing, f"add a smoke entry to SCRIPT_ARGS (or HELPERS) for {sorted(missing)}"
    stale = set().union(*entries) - files
    assert not stale, f"no such script in benchmarks/: {sorted(stale)}"
    for name in HELPERS:
        assert "__main__" not in (BENCHMARKS / name).read_text(), f"{name} has an entry point"
    for name in SCRIPT_ARGS:
        text = (BENCHMARKS / name).read_text()
        assert name.endswith(".sh") or 'if __name__ == "__main__"' in text, name
    for table in (EXPECTED, OUTPUT_FILES, SCRIPT_ENV):
        assert set(table) <= set(SCRIPT_ARGS)
    assert set(EXPECTED) == set(SCRIPT_ARGS), "every smoke run checks what it printed"


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``cmd`` in its own process group, killed whole (with any children) at the timeout."""
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{cmd[1]} ran past {SUBPROCESS_TIMEOUT_S} s:\n{out[-4000:]}\n{err[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.parametrize("script", sorted(SCRIPT_ARGS))
def test_script_runs(script: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    with ExitStack() as stack:
        values = {"out": str(tmp_path), "repo": str(REPO)}
        templates = [*SCRIPT_ARGS[script], *SCRIPT_ENV.get(script, {}).values()]
        if any("{model}" in t or "{url}" in t for t in templates):
            values["model"] = str(request.getfixturevalue("tiny_llama_dir"))
        if any("{url}" in t for t in templates):
            harness = str(REPO / "tests" / "api")  # the servers' harness, as tests/reliability
            if harness not in sys.path:
                sys.path.insert(0, harness)
            from serving_harness import serving

            server = stack.enter_context(
                serving(["--model", values["model"]], tmp_path / "server.log")
            )
            values["url"] = server.url
        args = [a.format(**values) for a in SCRIPT_ARGS[script]]
        env = {
            **os.environ,
            **{k: v.format(**values) for k, v in SCRIPT_ENV.get(script, {}).items()},
        }
        # benchmarks/ import each other by name (python puts the script's directory first; the
        # processes they start need it too)
        path = [str(BENCHMARKS), str(REPO), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, path))
        env["PYTHONUNBUFFERED"] = "1"
        runner = ["bash"] if script.endswith(".sh") else [sys.executable]
        proc = _run([*runner, str(BENCHMARKS / script), *args], env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, (
        f"exit {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    assert "Traceback" not in output, output[-6000:]
    for pattern in EXPECTED[script]:
        assert re.search(pattern, proc.stdout, re.MULTILINE), (
            f"no {pattern!r} in:\n{proc.stdout[-4000:]}"
        )
    for name in OUTPUT_FILES.get(script, []):
        path = tmp_path / name
        assert path.is_file() and path.stat().st_size > 0, f"{script} wrote no {name}"
        if path.suffix == ".json":
            json.loads(path.read_text())


def test_gemv_tiles_packed_checks_against_the_production_tile(tiny_llama_dir: Path) -> None:
    """``gemv_tiles.py --packed --prefill``: the weights packed by blocks of 16 rows, checked
    against the production tile's output at an M each packed tile divides and one none does
    but P8x1/P4x1 (3), then as a prefill GEMM beside torch's."""
    if not {"avx512_bf16", "amx_bf16"} & _ext.cpu_flags():
        pytest.skip("the packed tiles are VDPBF16PS: this CPU has no AVX512-BF16")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCHMARKS), str(REPO)])}
    args = ["--model-dir", str(tiny_llama_dir), "--ms", "3", "8", "--layers", "1"]
    args += ["--rounds", "1", "--packed", "--prefill", "24"]
    proc = _run([sys.executable, str(BENCHMARKS / "gemv_tiles.py"), *args], env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert re.search(r"^\s+3\s+P4x1(\s+\d+\.\d){5}$", proc.stdout, re.M)
    assert re.search(r"^\s+8\s+P3x8(\s+\d+\.\d){5}$", proc.stdout, re.M)
    assert re.search(r"^\s+24\s+torch(\s+\d+){5}$", proc.stdout, re.M)


def test_kernel_ab_compares_int8_routes(tiny_llama_dir: Path) -> None:
    """``kernel_ab.py --int8-max-m LO HI``: this tree's extension on both sides, the skinny GEMM's
    int8 rows capped at LO and HI (how the routing constants are measured)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCHMARKS), str(REPO)])}
    args = ["--model-dir", str(tiny_llama_dir), "--int8-max-m", "1", "8"]
    args += ["--configs", "float32+int8", "--batch-sizes", "2", "--ctx", "8", "--steps", "1"]
    proc = _run([sys.executable, str(BENCHMARKS / "kernel_ab.py"), *args, "--rounds", "2"], env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "int8_max_m before 1, after 8" in proc.stdout
    assert re.search(r"^float32\+int8 b=2\s+tok/s before\s+\d[\d.]* after\s+\d", proc.stdout, re.M)


def test_kernel_ab_swaps_the_attention_backends_kernel(
    tiny_model_dirs: dict[str, Path],
) -> None:
    """``kernel_ab.use(module=...)`` reaches the attention kernel a ``CpuKernelBackend`` took at
    its start, not only the ``CpuKernels`` the layers call: a prefill (and any layer off the
    one-call decode path) runs attention through the backend's kernel, so without it an A/B of
    ``--prefill-lens`` would time one side's attention twice."""
    script = """
import gc, sys, types
from pathlib import Path
import torch
import kernel_ab
from model_throughput import OurSide
from radixserve.models.attention.cpu_kernel import CpuKernelBackend
from radixserve.models.kernels import CpuKernels

side = OurSide(Path(sys.argv[1]), "float32", 1, 16, False)
real = next(o.module for o in gc.get_objects() if type(o) is CpuKernels and o.module is not None)
calls = []

def counted(*args):
    calls.append(1)
    return real.extend_attention(*args)

stand_in = types.SimpleNamespace(**{n: getattr(real, n) for n in dir(real) if not n.startswith("__")})
stand_in.extend_attention = counted
kernel_ab.use(module=stand_in)
side.prefill(torch.randint(3, 100, (1, 8)))
backends = sum(1 for o in gc.get_objects() if type(o) is CpuKernelBackend)
print("attention calls", len(calls), "backends", backends)
assert len(calls) > 0, "the backend kept the kernel it took at its start"
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCHMARKS), str(REPO)])}
    cmd = [sys.executable, "-c", script, str(tiny_model_dirs["qwen3"])]
    proc = _run(cmd, env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert re.search(r"^attention calls [1-9]\d* backends 1$", proc.stdout, re.M), proc.stdout
