"""Accuracy cost of ``--quantization int8``: logits and greedy tokens against bf16 weights.

On the Qwen2.5-0.5B-shaped random model (see model_throughput.py): the bf16 model generates
``--tokens`` greedy tokens after a random prompt; the int8 model (and, for scale, the float32
one) is then fed the same tokens (teacher forcing), and each step's logits are compared with
bf16's: max and mean absolute difference, and the share of steps whose argmax agrees. The free
run of each side is compared too (tokens until the first divergence). Example::

    python benchmarks/int8_accuracy.py --tokens 256
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from model_throughput import OurSide

from radixserve.models.forward_batch import ForwardBatch


def logits_of(side: OurSide, prompt: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """Logits [len(tokens), vocab] after the prompt and after each of ``tokens[:-1]``."""
    n = prompt.shape[1]
    slots = 1 + torch.arange(n)
    side.req_to_token[0, :n] = slots.to(torch.int32)
    batch = ForwardBatch.extend(prompt.reshape(-1), [0], [0], [n], slots)
    rows = [side.runner.forward(batch).next_token_logits[0]]
    for i, tok in enumerate(tokens[:-1]):
        pos = n + i
        side.req_to_token[0, pos] = 1 + pos
        step = ForwardBatch.decode(torch.tensor([tok]), [0], [pos + 1], torch.tensor([1 + pos]))
        rows.append(side.runner.forward(step).next_token_logits[0])
    return torch.stack(rows)


def greedy(side: OurSide, prompt: torch.Tensor, steps: int) -> list[int]:
    tokens = [int(side.prefill(prompt)[0])]
    for i in range(steps - 1):
        tokens.append(int(side.decode(torch.tensor([tokens[-1]]), [prompt.shape[1] + i])[0]))
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", type=Path, default=Path("bench_out/qwen25_05b_shaped"))
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    if not (args.model_dir / "config.json").is_file():
        from radixserve.models.tiny import write_qwen25_05b_shaped

        write_qwen25_05b_shaped(args.model_dir)
    ctx = args.prompt_len + args.tokens + 8
    prompt = torch.randint(
        0, 1000, (1, args.prompt_len), generator=torch.Generator().manual_seed(0)
    )
    base = OurSide(args.model_dir, "bfloat16", 1, ctx, torch_linear=False)
    ref_tokens = greedy(base, prompt, args.tokens)
    ref = logits_of(base, prompt, ref_tokens)
    print(f"reference: bf16 weights, {args.tokens} greedy tokens; logit std {ref.std():.3f}")
    for config in ("bfloat16+int8", "float32"):
        side = OurSide(args.model_dir, config, 1, ctx, torch_linear=False)
        logits = logits_of(side, prompt, ref_tokens)
        diff = (logits - ref).abs()
        agree = (logits.argmax(-1) == ref.argmax(-1)).float().mean()
        free = greedy(side, prompt, args.tokens)
        pairs = enumerate(zip(free, ref_tokens, strict=True))
        same = next((i for i, (a, b) in pairs if a != b), len(free))
        print(
            f"{config:14s} vs bf16: logits max |diff| {diff.max():.4f}, mean {diff.mean():.5f}; "
            f"teacher-forced argmax agreement {agree:.1%}; free run identical for {same} tokens"
        )


if __name__ == "__main__":
    main()
