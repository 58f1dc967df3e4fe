"""Where a `radixserve bench` run's time goes: every forward of the model timed, by phase.

    python benchmarks/forward_phases.py [--json phases.json] -- bench multiturn --shape a \
        --model qwen3-1.7b --baselines none --threads 2 [--quantization int8]

Runs ``radixserve`` with the arguments after ``--`` (the engine backend: its scheduler runs in
a spawned child process) with ``ModelRunner.forward`` timed in every process that loads the
model: a ``sitecustomize.py`` first on ``PYTHONPATH`` wraps it as the runner's module is first
imported, and appends one line per forward (kind, rows, tokens computed, start and end) to a
file per process. Then prints, over all forwards (the engine's warm-up ones included, a few
short prefills before the first request): the prefills (each with its rows, tokens, seconds and
tokens/s, and their sum), the decode steps by batch size (count, median ms, sum), and the time
between forwards (the scheduler, sampling, the clients), so a run's wall time splits into what
the model computes and what surrounds it. The bench's own table prints as usual.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SHIM = """
import os, sys, time
_OUT = os.environ["RADIXSERVE_FORWARD_PHASES"]


def _wrap(mr):
    forward = mr.ModelRunner.forward
    log = open(f"{_OUT}.{os.getpid()}", "a", buffering=1)

    def timed(self, batch):
        t0 = time.time()
        out = forward(self, batch)
        t1 = time.time()
        rows = len(batch.seq_lens_list)
        kind = "decode" if batch.is_decode else ("verify" if batch.is_verify else "prefill")
        tokens = rows if batch.is_decode else sum(batch.extend_seq_lens_list)
        log.write(f"{kind} {rows} {tokens} {t0:.6f} {t1:.6f}\\n")
        return out

    mr.ModelRunner.forward = timed


class _Hook:
    def find_spec(self, name, path, target=None):
        if name != "radixserve.runtime.model_worker":
            return None
        sys.meta_path.remove(self)
        from radixserve.runtime import model_runner
        _wrap(model_runner)
        return None


sys.meta_path.insert(0, _Hook())
"""


def load(prefix: Path) -> list[tuple[str, int, int, float, float]]:
    rows = []
    for path in prefix.parent.glob(prefix.name + ".*"):
        for line in path.read_text().splitlines():
            kind, n, tokens, t0, t1 = line.split()
            rows.append((kind, int(n), int(tokens), float(t0), float(t1)))
    return sorted(rows, key=lambda r: r[3])


def summarize(rows: list[tuple[str, int, int, float, float]]) -> dict:
    if not rows:
        raise SystemExit("no forward was timed: was the engine backend used?")
    span = rows[-1][4] - rows[0][3]
    busy = sum(t1 - t0 for *_, t0, t1 in rows)
    prefills = [
        {"rows": n, "tokens": tok, "s": t1 - t0, "tok_s": tok / (t1 - t0)}
        for kind, n, tok, t0, t1 in rows
        if kind == "prefill"
    ]
    by_batch: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    for kind, n, _, t0, t1 in rows:
        if kind != "prefill":  # decode steps, and speculative decoding's verify forwards
            by_batch[kind, n].append(t1 - t0)
    decode = {
        f"{kind} {b}": {"steps": len(v), "median_ms": 1000 * statistics.median(v), "s": sum(v)}
        for (kind, b), v in sorted(by_batch.items())
    }
    return {
        "span_s": span,
        "forward_s": busy,
        "between_s": span - busy,
        "prefill_s": sum(p["s"] for p in prefills),
        "prefill_tokens": sum(p["tokens"] for p in prefills),
        "decode_s": sum(d["s"] for d in decode.values()),
        "prefills": prefills,
        "decode_by_batch": decode,
    }


def report(s: dict) -> None:
    print(
        f"\nforwards over {s['span_s']:.2f} s: prefill {s['prefill_s']:.2f} s "
        f"({s['prefill_tokens']} tokens, {s['prefill_tokens'] / max(s['prefill_s'], 1e-9):.1f} "
        f"tok/s), decode {s['decode_s']:.2f} s, between forwards {s['between_s']:.2f} s"
    )
    for p in s["prefills"]:
        print(
            f"  prefill  rows {p['rows']:3d}  tokens {p['tokens']:5d}  {p['s']:7.2f} s"
            f"  {p['tok_s']:7.1f} tok/s"
        )
    for key, d in s["decode_by_batch"].items():
        kind, b = key.split()
        print(
            f"  {kind:8s} batch {int(b):3d}  steps {d['steps']:4d}  median {d['median_ms']:7.1f} ms"
            f"  {d['s']:7.2f} s"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write the split here")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then radixserve's arguments")
    opts = parser.parse_args()
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    if not args:
        parser.error("give radixserve's arguments after --, e.g. -- bench multiturn --quick")
    with tempfile.TemporaryDirectory(prefix="forward-phases-") as tmp:
        shim = Path(tmp) / "shim"
        shim.mkdir()
        (shim / "sitecustomize.py").write_text(SHIM)
        prefix = Path(tmp) / "forwards"
        env = dict(os.environ, RADIXSERVE_FORWARD_PHASES=str(prefix))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shim), env.get("PYTHONPATH")]))
        code = subprocess.call([sys.executable, "-m", "radixserve", *args], env=env)
        if code != 0:
            return code
        summary = summarize(load(prefix))
    report(summary)
    if opts.json:
        opts.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
