"""Accuracy cost of ``--quantization int8``: logits and greedy tokens against bf16 weights.

On the Qwen2.5-0.5B-shaped random model (see model_throughput.py): the bf16 model generates
``--tokens`` greedy tokens after a random prompt, keeping each step's logits; each ``--configs``
side (default: int8 weights) is then fed the same tokens (teacher forcing) and its logits are
compared with bf16's step by step: max and mean absolute difference, and the share of steps
whose greedy (argmax) token agrees. ``--free-run`` also lets each side generate on its own and
counts the tokens until the first divergence. ``--batch N`` runs each int8 side's steps on N
rows of the same tokens (the kernels quantize ``x`` per block of 32 at batch 1, per row above).
Example::

    python benchmarks/int8_accuracy.py --tokens 256 [--batch 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from model_throughput import OurSide

from radixserve.models.forward_batch import ForwardBatch


def run(
    side: OurSide, prompt: torch.Tensor, steps: int, forced: list[int] | None, batch: int = 1
) -> torch.Tensor:
    """Logits [steps, vocab] after the prompt and after each next token: ``forced``'s, or the
    greedy choice when ``forced`` is None. ``batch`` rows run the same tokens side by side (row r
    in KV slots from ``1 + r * side.ctx``), so each product has ``batch`` rows of x; row 0's
    logits are returned."""
    n = prompt.shape[1]
    rows = list(range(batch))
    slots = 1 + torch.arange(batch).view(batch, 1) * side.ctx + torch.arange(n)
    side.pool.write_spans(rows, [0] * batch, [n] * batch, slots.reshape(-1))
    extend = ForwardBatch.extend(
        prompt.repeat(batch, 1).reshape(-1), rows, [0] * batch, [n] * batch, slots.reshape(-1)
    )
    out = [side.runner.forward(extend).next_token_logits[0]]
    for i in range(steps - 1):
        tok = forced[i] if forced is not None else int(out[-1].argmax())
        pos = n + i
        slot = 1 + torch.arange(batch) * side.ctx + pos
        side.pool.write_spans(rows, [pos] * batch, [1] * batch, slot)
        step = ForwardBatch.decode(torch.full((batch,), tok), rows, [pos + 1] * batch, slot)
        out.append(side.runner.forward(step).next_token_logits[0])
    return torch.stack(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", type=Path, default=Path("bench_out/qwen25_05b_shaped"))
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--configs", nargs="+", default=["bfloat16+int8"])
    parser.add_argument("--free-run", action="store_true")
    parser.add_argument(
        "--batch", type=int, default=1, help="rows decoding the same tokens side by side"
    )
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    if not (args.model_dir / "config.json").is_file():
        from radixserve.models.tiny import write_qwen25_05b_shaped

        write_qwen25_05b_shaped(args.model_dir)
    ctx = args.prompt_len + args.tokens + 8
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 1000, (1, args.prompt_len), generator=gen)
    base = OurSide(args.model_dir, "bfloat16", 1, ctx, torch_linear=False)
    ref = run(base, prompt, args.tokens, None)
    tokens = ref.argmax(-1).tolist()
    del base
    print(f"reference: bf16 weights, {args.tokens} greedy tokens; logits std {ref.std():.3f}")
    for config in args.configs:
        side = OurSide(args.model_dir, config, args.batch, ctx, torch_linear=False)
        logits = run(side, prompt, args.tokens, tokens, args.batch)
        diff = (logits - ref).abs()
        agree = (logits.argmax(-1) == ref.argmax(-1)).float().mean()
        line = (
            f"{config} (batch {args.batch}) vs bf16 over {args.tokens} steps: logits max |diff|"
            f" {diff.max():.4f}, "
            f"mean {diff.mean():.5f}; greedy token agrees at {agree:.1%} of steps"
        )
        if args.free_run:
            free = run(side, prompt, args.tokens, None, args.batch).argmax(-1).tolist()
            same = next(
                (i for i, (a, b) in enumerate(zip(free, tokens, strict=True)) if a != b), len(free)
            )
            line += f"; free run identical for {same} tokens"
        print(line)


if __name__ == "__main__":
    main()
