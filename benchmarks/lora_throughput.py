"""LoRA serving cost: many adapters in one batch against the base model alone and against one
adapter merged into the weights; and multi-turn chat with each conversation on its own adapter.

1. **Model execution** (``ModelRunner``, driven as ``model_throughput.py`` drives it, on the
   same random model of Qwen2.5-0.5B's shape): decode tokens/s at each ``--batch-sizes`` and
   prefill tokens/s of ``--prefill-batch`` prompts of ``--prompt-len`` tokens, for

   - ``base``: no adapter;
   - ``merged``: one adapter merged into the weights (PEFT's ``merge_and_unload``, a second
     checkpoint): serving one fine-tune without LoRA, the same work as the base;
   - ``lora xK`` for each ``--adapters`` K: the batch's requests under K distinct random
     adapters of rank ``--rank`` on all seven projections, assigned round-robin (so each
     adapter's rows are scattered through the batch, as a scheduler's batch has them).

   Sides run interleaved repetition by repetition; each cell is the median (min-max) over
   ``--reps``, and the last columns are each side's ratio to ``base``.
2. **Multi-turn chat** (the ``Engine``, shape (a) of ``radixserve bench multiturn``: 8
   conversations x 4 turns, 64-token user turns, 32-token answers), each round of turns sent
   as one batch, conversation ``i`` under adapter ``i % K``: the cache hit rate (prompt tokens
   served from the cache) against the optimal one *per namespace* (a trie per adapter: KV
   computed under one adapter is never another's), and the run's time, beside the base model
   alone. ``--system-len`` adds a system prompt every conversation shares, which namespacing
   must compute once per adapter.

Example (what benchmarks/README.md reports)::

    python benchmarks/lora_throughput.py --batch-sizes 8 32 --adapters 1 4 8 --reps 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from model_throughput import CELL, OurSide, synchronize

from radixserve.bench.records import RequestRecord, optimal_hits
from radixserve.bench.workload import MultiTurnSpec, make_multiturn
from radixserve.models.lora import LoraAdapter, LoraBatch, LoraStacks
from radixserve.models.tiny import write_qwen25_05b_shaped
from radixserve.models.tiny_lora import write_merged, write_tiny_lora

Side = tuple[str, OurSide, list[LoraAdapter | None]]  # name, runner, adapter of each row slot


def write_adapters(model_dir: Path, root: Path, count: int, rank: int) -> list[Path]:
    """``count`` random rank-``rank`` adapters of ``model_dir`` in ``root`` (written once)."""
    from transformers import AutoModelForCausalLM

    dirs = [root / f"{model_dir.name}-lora-r{rank}-{i}" for i in range(count)]
    missing = [d for d in dirs if not (d / "adapter_model.safetensors").is_file()]
    if missing:
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        for d in missing:
            # std: a delta of about the weights' own size over 896 columns (rank 16)
            write_tiny_lora(base, d, r=rank, lora_alpha=2 * rank, seed=dirs.index(d), std=0.02)
    return dirs


def round_robin(adapters: list[LoraAdapter], k: int, rows: int) -> list[LoraAdapter | None]:
    return [adapters[i % k] for i in range(rows)]


def runner_rows(args: argparse.Namespace, model_dir: Path, adapter_dirs: list[Path]) -> None:
    max_bs = max(max(args.batch_sizes, default=1), args.prefill_batch)
    ctx = max(args.context_len + (args.reps + 2) * args.decode_steps, args.prompt_len) + 8
    base = OurSide(model_dir, args.dtype, max_bs, ctx, torch_linear=False)
    merged_dir = adapter_dirs[0].parent / f"{model_dir.name}-merged-r{args.rank}"
    if not (merged_dir / "config.json").is_file():
        write_merged(model_dir, adapter_dirs[0], merged_dir)
    merged = OurSide(merged_dir, args.dtype, max_bs, ctx, torch_linear=False)
    adapters = [base.runner.load_lora(str(d)) for d in adapter_dirs]
    mb = sum(a.nbytes for a in adapters) / len(adapters) / 1e6
    print(f"{len(adapters)} adapters of rank {args.rank} on every projection, {mb:.1f} MB each")
    sides: list[Side] = [("base", base, [None] * max_bs), ("merged", merged, [None] * max_bs)]
    sides += [(f"lora x{k}", base, round_robin(adapters, k, max_bs)) for k in args.adapters]
    names = "".join(f"{name:>{CELL}s}" for name, _, _ in sides)
    ratios = "".join(f"{name + '/base':>14s}" for name, _, _ in sides[1:])
    print(f"{'tokens/s: median (min-max)':26s}{names}{ratios}")
    gen = torch.Generator().manual_seed(0)
    vocab = base.runner.vocab_size

    stacks = LoraStacks(size=len(sides))  # what a LoraManager keeps (one set per side here)

    def lora_of(rows: list[LoraAdapter | None], counts: list[int]) -> LoraBatch | None:
        return LoraBatch.build(rows, counts, base.runner.device, stacks)

    def report(label: str, samples: list[list[float]]) -> None:
        med = [statistics.median(s) for s in samples]
        cells = "".join(
            f"{m:.1f} ({min(s):.0f}-{max(s):.0f})".rjust(CELL)
            for m, s in zip(med, samples, strict=True)
        )
        print(f"{label:26s}{cells}" + "".join(f"{m / med[0]:14.2f}" for m in med[1:]))

    prompts = torch.randint(0, vocab, (args.prefill_batch, args.prompt_len), generator=gen)
    counts = [args.prompt_len] * args.prefill_batch
    times: list[list[float]] = [[] for _ in sides]
    for rep in range(args.reps + 1):  # the first is a warm-up
        for i, (_, side, rows) in enumerate(sides):
            lora = lora_of(rows[: args.prefill_batch], counts)
            synchronize()
            start = time.perf_counter()
            side.prefill(prompts, lora)
            synchronize()
            if rep:
                times[i].append(time.perf_counter() - start)
    tokens = args.prefill_batch * args.prompt_len
    report(
        f"prefill {args.prefill_batch}x{args.prompt_len}",
        [[tokens / t for t in ts] for ts in times],
    )

    for bs in args.batch_sizes:
        prompts = torch.randint(0, vocab, (bs, args.context_len), generator=gen)
        state: list[tuple[torch.Tensor, list[int]]] = []
        loras = [lora_of(rows[:bs], [1] * bs) for _, _, rows in sides]
        for _, side, rows in sides:
            prefill_lora = lora_of(rows[:bs], [args.context_len] * bs)
            state.append((side.prefill(prompts, prefill_lora), [args.context_len] * bs))
        times = [[] for _ in sides]
        for rep in range(args.reps + 1):
            for i, (_, side, _) in enumerate(sides):
                tok, lens = state[i]
                synchronize()
                start = time.perf_counter()
                for _ in range(args.decode_steps):
                    tok = side.decode(tok, lens, loras[i])
                    lens = [n + 1 for n in lens]
                synchronize()
                state[i] = (tok, lens)
                if rep:
                    times[i].append((time.perf_counter() - start) / args.decode_steps)
        report(f"decode b={bs} ctx={args.context_len}", [[bs / t for t in ts] for ts in times])


def multiturn_rows(args: argparse.Namespace, model_dir: Path, adapter_dirs: list[Path]) -> None:
    from radixserve import Engine

    spec = MultiTurnSpec(system_len=args.system_len, seed=0)
    print(
        f"\nmulti-turn chat, shape (a): {spec.num_conversations} conversations x "
        f"{spec.num_turns} turns, user {spec.user_len[0]}, answers {spec.answer_len[0]}, "
        f"system prompt {spec.system_len}; conversation i under adapter i % K"
    )
    print(f"{'':12s}{'hit rate':>10s}{'optimal':>10s}{'time s':>10s}{'tokens/s':>10s}")
    lora_paths = {f"a{i}": str(d) for i, d in enumerate(adapter_dirs)}
    for k in [0, *args.adapters]:
        with Engine(str(model_dir), dtype=args.dtype, lora_paths=lora_paths) as engine:
            vocab = engine.scheduler.worker.vocab_size
            sessions = make_multiturn(spec, 5, vocab - 1)
            names = [f"a{s.sid % k}" if k else None for s in sessions]
            histories = [list(s.prefix_ids) for s in sessions]
            records: list[list[RequestRecord]] = [[] for _ in range(max(k, 1))]
            start = time.perf_counter()
            for turn in range(spec.num_turns):
                prompts = [
                    h + s.turns[turn].user_ids for h, s in zip(histories, sessions, strict=True)
                ]
                params = [{"max_new_tokens": s.turns[turn].answer_len, "ignore_eos": True,
                           "temperature": 0.0} for s in sessions]  # fmt: skip
                outs: Any = engine.generate(
                    input_ids=prompts, sampling_params=params, lora_path=names
                )
                for s, p, out in zip(sessions, prompts, outs, strict=True):
                    rec = RequestRecord(s.sid, turn, p, out["output_ids"], float(turn), None)
                    rec.cached_tokens = out["meta_info"]["cached_tokens"]
                    records[s.sid % max(k, 1)].append(rec)
                    histories[s.sid] = p + out["output_ids"]
            elapsed = time.perf_counter() - start
            engine.check_integrity()
        flat = [r for group in records for r in group]
        prompt_tokens = sum(len(r.prompt_ids) for r in flat)
        hits = sum(r.cached_tokens or 0 for r in flat)
        optimal = sum(sum(optimal_hits(group)) for group in records)
        generated = sum(len(r.output_ids) for r in flat)
        label = f"lora x{k}" if k else "base"
        print(
            f"{label:12s}{hits / prompt_tokens:10.1%}{optimal / prompt_tokens:10.1%}"
            f"{elapsed:10.1f}{generated / elapsed:10.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--model-dir", type=Path, default=Path("bench_out/qwen25_05b_shaped"))
    add("--dtype", default="bfloat16", help="of the base, the merged model and the adapters")
    add("--rank", type=int, default=16)
    add("--adapter-dir", type=Path, default=None, help="default: beside --model-dir")
    add("--adapters", type=int, nargs="+", default=[1, 4, 8], help="distinct adapters per batch")
    add("--batch-sizes", type=int, nargs="*", default=[8, 32])
    add("--context-len", type=int, default=256)
    add("--decode-steps", type=int, default=8)
    add("--prefill-batch", type=int, default=4)
    add("--prompt-len", type=int, default=256)
    add("--reps", type=int, default=3)
    add("--system-len", type=int, default=0, help="a system prompt every conversation shares")
    add("--skip", choices=["runner", "multiturn"], default=None)
    add("--threads", type=int, default=None)
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    if args.threads:
        torch.set_num_threads(args.threads)
    if not (args.model_dir / "config.json").is_file():
        write_qwen25_05b_shaped(args.model_dir)
    root = args.adapter_dir or args.model_dir.parent
    adapter_dirs = write_adapters(args.model_dir, root, max(args.adapters), args.rank)
    print(f"model {args.model_dir}, {args.dtype}, {torch.get_num_threads()} threads")
    if args.skip != "runner":
        runner_rows(args, args.model_dir, adapter_dirs)
    if args.skip != "multiturn":
        multiturn_rows(args, args.model_dir, adapter_dirs)


if __name__ == "__main__":
    main()
