"""radixserve's speculative decoding beside llama.cpp's server's: same weights, same acceptance.

radixserve's side is ``spec_decode.py``'s: the model's real forward with the text forced by a
logit bias, so its accept length ``L`` (tokens per verify step, SGLang's definition, the model's
own token included) is the NGRAM drafter's against real text. llama-server has no per-position
logit bias, so its side compares the verification machinery at that same acceptance: on a GGUF
of the same weights, with ``--parallel BS`` and the same prompt token ids (each led by its own
token, as on radixserve's side), cached by a first request, it is timed generating the answer's
length

- plain;
- with speculation at ``--spec-synth-len L`` (drafted tokens kept with a fixed probability
  whatever the model says; ``spec_llama_side.py`` explains it and the drafters), drafting up
  to ``num_draft_tokens - 1`` tokens as radixserve's longest draft, per drafter of
  ``--llama-drafters``: ``model`` (a one-layer model of the same vocabulary, which always
  drafts; its decode's cost per step is printed), ``ngram-mod`` (llama.cpp's n-gram table) and
  ``ngram-cache`` (its lookup decoding), each given the plain run's output to draft, and
  ``ngram-simple`` (prompt lookup in the request's own tokens, which cannot be given it);
- with llama.cpp's own speculation on a request sent again (``--real-workloads``, default
  ``c``), no synthetic acceptance, for each of ngram-mod and ngram-cache among the drafters
  (those that keep what a request saw for the next): random weights, so its acceptance says how
  well the drafter replays a text seen once, nothing about real text.

Each llama.cpp speculative column comes with its measured accept length (from ``/metrics``).
Without ``--llama-server`` only radixserve's columns are printed.

    python benchmarks/spec_llamacpp.py --model-dir /tmp/radixserve-qwen25-0.5b \\
        --llama-server $LLAMA_CPP_DIR/build/bin/llama-server --batch-sizes 1,8 --out spec.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from llama_side import PAIRS
from llamacpp import convert, gguf_path
from spec_decode import add_arguments, cpu_summary, ensure_model, texts
from spec_decode import run as radixserve_run
from spec_llama_side import DRAFTERS, REAL_DRAFTERS, LlamaSpecRunner, write_draft_model

from radixserve.bench.models import BENCH_MODEL_LABELS, model_label
from radixserve.tokenizer_loader import load_tokenizer


def llama_version(binary: Path) -> str:
    lib = str(binary.resolve().parent)
    out = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, env={"LD_LIBRARY_PATH": lib}
    )
    return (out.stdout + out.stderr).strip().splitlines()[0] if out.stdout + out.stderr else ""


def command() -> str:
    """This run's command line, an absolute path by its last component (where this machine
    keeps a model or a binary says nothing to a reader)."""
    words = [Path(a).name if a.startswith("/") else a for a in sys.argv]
    return " ".join(["python", *words])


def header(drafters: list[str]) -> str:
    text = f"{'workload':<10}{'bs':>4}{'rs plain':>10}{'rs NGRAM':>10}{'speedup':>9}{'accept':>8}"
    if drafters:
        text += f"{'ll plain':>10}"
    for d in drafters:
        text += f"{'ll ' + d:>16}{'speedup':>9}{'acc':>6}"
    return text


def row_text(row: dict[str, Any], drafters: list[str]) -> str:
    """One row of the table, under :func:`header`'s columns ("-" where llama.cpp did not
    draft: radixserve drafted nothing to take the acceptance from)."""
    text = f"{row['workload']:<10}{row['bs']:>4}{row['rs_plain']:>10.1f}{row['rs_ngram']:>10.1f}"
    text += f"{row['rs_speedup']:>8.2f}x{row['rs_accept']:>8.2f}"
    if drafters:
        text += f"{row['llama_plain']:>10.1f}"
    for d in drafters:
        spec = row["llama_spec"].get(d)
        if spec is None:
            text += f"{'-':>16}{'-':>9}{'-':>6}"
        else:
            ratio = spec["tok_s"] / row["llama_plain"]
            text += f"{spec['tok_s']:>16.1f}{ratio:>8.2f}x{spec['accept']:>6.2f}"
    return text


def model_name(args: argparse.Namespace) -> str:
    """The model as the report names it: a bench model's label, else its shape (``--shape``:
    the random model ``ensure_model`` writes; the texts are forced, so weights never matter)."""
    label = model_label(str(args.model_dir))
    if label.endswith("random weights"):
        return label
    if args.tiny:
        return "a tiny model, random weights"
    key = args.shape.replace("qwen2.5-0.5b", "qwen25-05b")
    return BENCH_MODEL_LABELS.get(key, f"{args.shape}-shaped, random weights")


def llama_runner(args: argparse.Namespace) -> LlamaSpecRunner:
    """The GGUF of ``--model-dir`` (converted beside it unless ``--gguf``) and, for the
    ``model`` drafter, the draft model's, each converted once."""
    outtype = PAIRS.get(args.dtype)
    if outtype is None:
        raise SystemExit(f"--dtype {args.dtype}: no GGUF type pairs it ({sorted(PAIRS)})")
    gguf = args.gguf or gguf_path(args.model_dir, outtype)
    if not gguf.is_file():
        convert(args.model_dir, outtype, gguf, args.llama_cpp_dir)
    draft = None
    if "model" in args.llama_drafters:
        source = Path(args.llama_cpp_dir) if args.llama_cpp_dir else None
        draft = write_draft_model(args.model_dir, outtype, source)
    return LlamaSpecRunner(
        args.llama_server, gguf, draft, args.threads, args.num_draft_tokens - 1, args.slot_ctx
    )


def llama_columns(
    llama: LlamaSpecRunner, args: argparse.Namespace, row: dict[str, Any], prompt: list[int]
) -> list[dict[str, Any]]:
    """Fills ``row``'s llama.cpp columns; returns the real runs' figures (one per drafter of
    :data:`REAL_DRAFTERS` among ``--llama-drafters``) when the workload is one of
    ``--real-workloads``."""
    bs, n = row["bs"], row["tokens"]
    prompts = [[1000 + i, *prompt] for i in range(bs)]  # as radixserve's side
    row["llama_plain"], outs = llama.plain(prompts, n)
    row["llama_spec"] = {}
    for drafter in args.llama_drafters:
        accept = row["rs_accept"]
        row["llama_spec"][drafter] = (
            llama.synthetic(drafter, prompts, outs, accept) if accept else None
        )
    if "model" in args.llama_drafters:
        row["drafter_step_ms"] = llama.drafter_step_ms(prompts, n)
    if row["workload"] not in args.real_workloads:
        return []
    real, plain = [d for d in args.llama_drafters if d in REAL_DRAFTERS], row["llama_plain"]
    return [
        dict(llama.real(d, prompts, n), drafter=d, workload=row["workload"], bs=bs, plain=plain)
        for d in real
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--llama-server", type=Path, default=None, help="llama-server's binary")
    parser.add_argument("--gguf", type=Path, default=None, help="default: converted beside")
    parser.add_argument("--llama-cpp-dir", default=None, help="for converting (or $LLAMA_CPP_DIR)")
    parser.add_argument("--llama-build", default="", help="a label of the build, for the JSON")
    parser.add_argument("--llama-drafters", default=",".join(DRAFTERS), help=",".join(DRAFTERS))
    parser.add_argument("--threads", type=int, default=2, help="llama-server's -t and -tb")
    parser.add_argument("--slot-ctx", type=int, default=4096, help="each slot's context")
    parser.add_argument("--real-workloads", default="c", help="real drafts' runs ('' none)")
    parser.add_argument("--out", type=Path, default=None, help="the results as JSON")
    args = parser.parse_args()
    args.llama_drafters = [d for d in args.llama_drafters.split(",") if d]
    args.real_workloads = set(args.real_workloads.split(","))
    if args.num_draft_tokens < 2:
        raise SystemExit("--num-draft-tokens must be at least 2 (the last token and a draft)")
    if unknown := set(args.llama_drafters) - set(DRAFTERS):
        raise SystemExit(f"--llama-drafters: {sorted(unknown)} not among {DRAFTERS}")
    ensure_model(args.model_dir, args.shape, args.tiny)
    load_start = os.getloadavg()
    llama = llama_runner(args) if args.llama_server is not None else None
    drafters = args.llama_drafters if llama is not None else []
    tokenizer = load_tokenizer(str(args.model_dir))
    print("decode tokens/s, greedy; rs = radixserve, its text forced (spec_decode.py); ll =")
    print("llama-server at rs's accept length (synthetic), per drafter, 'acc' its measured one")
    print(header(drafters), flush=True)
    rows: list[dict[str, Any]] = []
    real: list[dict[str, Any]] = []
    for workload in args.workloads.split(","):
        prompt, answer = texts(tokenizer, workload, args.max_new_tokens)
        for bs in map(int, args.batch_sizes.split(",")):
            plain = radixserve_run(args, None, workload, bs)
            spec = radixserve_run(args, "NGRAM", workload, bs)
            row: dict[str, Any] = {"workload": workload, "bs": bs, "tokens": len(answer)}
            row.update(rs_plain=plain["tok_s"], rs_ngram=spec["tok_s"], rs_accept=spec["accept"])
            row["rs_speedup"] = spec["tok_s"] / plain["tok_s"]
            if llama is not None:
                real += llama_columns(llama, args, row, prompt)
            row["load_avg_1m"] = os.getloadavg()[0]  # how busy the machine was (1 minute)
            rows.append(row)
            print(row_text(row, drafters), flush=True)
    for row in rows:
        if "drafter_step_ms" in row:
            print(
                f"draft model's decode per verify step, {row['workload']} bs {row['bs']}: "
                f"{row['drafter_step_ms']:.1f} ms (the model's plain step: "
                f"{1000 * row['bs'] / row['llama_plain']:.1f} ms)"
            )
    for r in real:
        print(
            f"llama.cpp {r['drafter']}, real drafts of the random model's own text sent again, "
            f"workload {r['workload']} bs {r['bs']}: {r['tok_s']:.1f} tok/s, "
            f"{r['tok_s'] / r['plain']:.2f}x plain, accept length {r['accept']:.2f} "
            f"over {r['verify_steps']:.0f} verify steps"
        )
    if args.out is not None:
        report = {
            "date": time.strftime("%Y-%m-%d"),
            "cpu": cpu_summary(),
            "command": command(),
            "model": model_name(args),
            "dtype": args.dtype,
            "max_new_tokens": args.max_new_tokens,
            "num_draft_tokens": args.num_draft_tokens,
            "llama_build": args.llama_build,
            "llama_version": llama_version(args.llama_server) if llama else None,
            "llama_drafters": {d: llama.described(d) for d in drafters} if llama else {},
            "load_avg": {"start": load_start, "end": os.getloadavg()},
            "rows": rows,
            "llama_real": real,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
