"""Speculative decoding (NGRAM) against plain decoding, side by side in one run.

A random-weight model's greedy text is gibberish and often loops, so its acceptance would say
nothing. Here the model runs its real forward in full and a logit bias on each scored row makes
the chosen token the next token of a known real text: the cost is the model's, the acceptance
is the drafter's against real text. Every figure this prints is measured that way.

Workloads (the known text of each request is its prompt followed by its answer):

- ``a`` code edit: an old version of a real source file (this repository's, from git history)
  in the prompt, then the start of its next version; the answer is the rest of it;
- ``b`` multi-turn chat: a conversation over a document's paragraphs whose next answer quotes
  two of them and adds one the conversation has not seen (``docs/kv_tier.md``'s text);
- ``c`` sent again: a request whose answer the radix tree holds (run once, then timed again);
- ``d`` prose: a README's text, little repeated, as prompt and answer.

    python benchmarks/spec_decode.py --model-dir /tmp/radixserve-qwen25 --max-new-tokens 96
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from radixserve import Engine
from radixserve.models.checkpoint_shapes import write_checkpoint_shaped
from radixserve.models.tiny import train_tokenizer, write_qwen25_05b_shaped, write_tiny_model

ROOT = Path(__file__).resolve().parent.parent
EDITED = "radixserve/runtime/kv_manager.py"  # a file with many versions in history
BIAS = 50.0


def texts(tokenizer: Any, workload: str, max_new: int) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) of a workload."""
    encode = tokenizer.encode
    if workload == "a":
        old = _git("show", f"HEAD~40:{EDITED}")
        new = (ROOT / EDITED).read_text()
        # the file's first 1,200 tokens as they were, then its new version's first 300: the
        # answer continues the new version where the old one is in the prompt
        head = encode("Old version:\n") + encode(old)[:1200] + encode("\nNew version:\n")
        body = encode(new)
        return head + body[:300], body[300 : 300 + max_new]
    if workload == "b":
        paras = [p for p in (ROOT / "docs" / "kv_tier.md").read_text().split("\n\n") if len(p) > 80]
        notes = "\n\n".join(paras[:6])
        prompt = (
            f"User: my notes on the KV tier:\n\n{notes}\n\nAssistant: {paras[1]}\n\n"
            "User: quote what the notes say about eviction and loading back, then go on.\n\n"
            "Assistant: "
        )
        answer = f"{paras[3]}\n\n{paras[7]}\n\n{paras[2]}"
        return encode(prompt), encode(answer)[:max_new]
    if workload == "c":
        body = encode((ROOT / "docs" / "structure.md").read_text())
        return body[:600], body[600 : 600 + max_new]
    if workload == "d":
        body = encode((ROOT / "README.md").read_text())
        return body[:300], body[300 : 300 + max_new]
    raise ValueError(f"unknown workload {workload!r}")


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def force_text(engine: Engine, known: dict[int, list[int]]) -> None:
    """Bias each scored logits row toward the next token of its request's known text
    (``known``: prompt length -> prompt + answer; a request is found by its row)."""
    runner = engine.scheduler.worker.runner  # type: ignore[attr-defined]
    plain = runner.forward

    @torch.inference_mode()
    def forward(batch: Any) -> Any:
        out = plain(batch)
        logits = out.next_token_logits
        by_row = {
            r.req_pool_idx: known[r.prompt_len]
            for r in list(engine.scheduler.reqs.values())
            if r.req_pool_idx is not None
        }
        if logits.shape[0] == batch.num_tokens:  # decode or verify: every token scored
            rows = torch.repeat_interleave(batch.req_pool_indices, batch.extend_seq_lens)
            positions = batch.positions
        else:  # an extend: each request's last token
            rows, positions = batch.req_pool_indices, batch.seq_lens - 1
        scored, targets = [], []
        for i, (row, pos) in enumerate(zip(rows.tolist(), positions.tolist(), strict=True)):
            text = by_row.get(row)
            if text is not None and pos + 1 < len(text):
                scored.append(i)
                targets.append(text[pos + 1])
        if scored:
            idx = torch.tensor(scored)
            logits[idx, torch.tensor(targets)] = logits[idx].amax(dim=-1) + BIAS
        return out

    runner.forward = forward


def run(args: argparse.Namespace, spec: str | None, workload: str, bs: int) -> dict[str, float]:
    config = dict(
        dtype=args.dtype,
        device=args.device,
        max_total_tokens=32768,
        disable_overlap_schedule=True,
        speculative_algorithm=spec,
        speculative_num_draft_tokens=args.num_draft_tokens,
        cuda_graph_verify=args.cuda_graph_verify,
    )
    with Engine(str(args.model_dir), **config) as engine:
        prompt, answer = texts(engine.tokenizer, workload, args.max_new_tokens)
        # distinct requests of a batch: each prompt starts with its own token
        prompts = [[1000 + i, *prompt] for i in range(bs)]
        force_text(engine, {len(p): p + answer for p in prompts})
        params = {"max_new_tokens": len(answer), "temperature": 0.0, "ignore_eos": True}
        if workload == "c":  # the first time fills the tree with the answer
            engine.generate(input_ids=prompts, sampling_params=params)
        else:  # a warm-up that caches the prompts only
            engine.generate(input_ids=prompts, sampling_params=dict(params, max_new_tokens=1))
        before = engine.get_stats()
        start = time.perf_counter()
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        elapsed = time.perf_counter() - start
        assert all(o["output_ids"] == answer for o in outs), "the forced text was not followed"
        after = engine.get_stats()
    drafts = after["num_spec_drafts"] - before["num_spec_drafts"]
    accepted = after["num_spec_accepted_tokens"] - before["num_spec_accepted_tokens"]
    # SGLang's accept length: tokens a request got per verify step it drafted in
    accept = (drafts + accepted) / drafts if drafts else 0.0
    return {"tok_s": bs * len(answer) / elapsed, "accept": accept}


def ensure_model(model_dir: Path, shape: str, tiny: bool) -> None:
    """Writes a random model to ``model_dir`` unless it holds one: the tiny Qwen2 with
    ``tiny``, else ``shape`` (``qwen2.5-0.5b`` or a real checkpoint's shape)."""
    if (model_dir / "config.json").is_file():
        return
    if tiny:
        write_tiny_model(model_dir, "qwen2", tokenizer=train_tokenizer())
    elif shape == "qwen2.5-0.5b":
        write_qwen25_05b_shaped(model_dir)
    else:
        write_checkpoint_shaped(model_dir, shape)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The model, workload and decoding options (``spec_llamacpp.py`` takes them too)."""
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/radixserve-qwen25-0.5b"))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (FlashInfer, CUDA graphs)")
    parser.add_argument("--workloads", default="a,b,c,d")
    parser.add_argument("--batch-sizes", default="1")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--num-draft-tokens", type=int, default=8)
    parser.add_argument(
        "--shape",
        default="qwen2.5-0.5b",
        help="the random model written to --model-dir when it holds none: qwen2.5-0.5b, or a "
        "real checkpoint's shape with its real tokenizer (qwen3-1.7b, llama3.2-1b, ...)",
    )
    parser.add_argument("--tiny", action="store_true", help="a tiny model (a smoke run)")
    parser.add_argument(
        "--cuda-graph-verify",
        action="store_true",
        help="CUDA: verifies replayed from CUDA graphs (the server's --cuda-graph-verify)",
    )


def command(args: argparse.Namespace) -> str:
    """The command line, the paths of this machine left out: the model's directory is DIR, the
    JSON its file name."""
    out = " ".join(["python", *sys.argv]).replace(str(args.model_dir), "DIR")
    return out.replace(str(args.json), args.json.name) if args.json else out


def cpu_summary() -> str:
    """The CPU's model name and which of AVX2, AVX-512 and AMX it has."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    name = re.search(r"^model name\s*:\s*(.*)$", info, re.MULTILINE)
    found = re.search(r"^flags\s*:\s*(.*)$", info, re.MULTILINE)
    flags = set(found.group(1).split()) if found else set()
    isa = (("AVX2", "avx2"), ("AVX-512", "avx512f"), ("AMX", "amx_tile"))
    have = [label for label, flag in isa if flag in flags]
    return f"{name.group(1) if name else 'unknown CPU'} ({', '.join(have) or 'no AVX2'})"


def machine() -> str:
    """The GPU's name, or the CPU's (``cpu_summary``) and the torch threads."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"{cpu_summary()}, {torch.get_num_threads()} threads"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--json", type=Path, help="also write the rows and the run's facts here")
    args = parser.parse_args()
    ensure_model(args.model_dir, args.shape, args.tiny)
    report: dict[str, Any] = {
        "started_at": time.time(),
        "command": command(args),
        "machine": machine(),
        "shape": "tiny" if args.tiny else args.shape,
        "dtype": args.dtype,
        "device": args.device,
        "max_new_tokens": args.max_new_tokens,
        "num_draft_tokens": args.num_draft_tokens,
        "cuda_graph_verify": args.cuda_graph_verify,
        "rows": [],
    }
    print("tokens/s at greedy decoding, the text forced by a logit bias (see the module doc)")
    print(f"{'workload':<10}{'bs':>4}{'plain':>10}{'NGRAM':>10}{'speedup':>9}{'accept':>8}")
    for workload in args.workloads.split(","):
        for bs in map(int, args.batch_sizes.split(",")):
            plain = run(args, None, workload, bs)
            spec = run(args, "NGRAM", workload, bs)
            ratio = spec["tok_s"] / plain["tok_s"]
            print(
                f"{workload:<10}{bs:>4}{plain['tok_s']:>10.1f}{spec['tok_s']:>10.1f}"
                f"{ratio:>8.2f}x{spec['accept']:>8.2f}",
                flush=True,
            )
            row = {"workload": workload, "bs": bs, "plain_tok_s": plain["tok_s"]}
            report["rows"].append(dict(row, spec_tok_s=spec["tok_s"], accept=spec["accept"]))
            if args.json:  # after each row: a long run stopped early keeps what it measured
                args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
