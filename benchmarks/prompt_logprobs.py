"""What prompt logprobs cost on a radix hit: the cached part is computed again.

A request for prompt logprobs from position 0 (``/v1/completions`` ``echo`` + ``logprobs``,
``/generate`` ``logprob_start_len: 0``) matches no prefix (``policy/prefix_match.py``), so its
prefill computes every prompt token and runs the lm_head over each. This times, on the
in-process Engine over a tiny random model, one request of ``--prompt-len`` tokens and one
output token: cold, the same prompt again (a radix hit: one token computed), and the same
prompt again with prompt logprobs (the whole prompt computed, with logprobs). The median of
``--repeats`` runs each.

    python benchmarks/prompt_logprobs.py [--prompt-len 1024] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

from radixserve.models.tiny import train_tokenizer, write_tiny_model
from radixserve.server.engine import Engine


def _time(engine: Engine, ids: list[int], **kwargs: Any) -> float:
    start = time.perf_counter()
    engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1}, **kwargs)
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--num-layers", type=int, default=8)
    args = parser.parse_args()
    tokenizer = train_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_model(
            tmp,
            num_layers=args.num_layers,
            hidden_size=args.hidden_size,
            intermediate_size=args.hidden_size * 3,
            max_position_embeddings=args.prompt_len * 2,
            tokenizer=tokenizer,
        )
        rows: dict[str, list[float]] = {"cold": [], "radix hit": [], "hit + prompt logprobs": []}
        with Engine(str(path), max_context_len=args.prompt_len * 2) as engine:
            for r in range(args.repeats):
                ids = [(7 * r + 13 * i) % 2000 + 3 for i in range(args.prompt_len)]
                rows["cold"].append(_time(engine, ids))
                rows["radix hit"].append(_time(engine, ids))
                rows["hit + prompt logprobs"].append(
                    _time(engine, ids, return_logprob=True, logprob_start_len=0)
                )
    print(f"prompt {args.prompt_len} tokens, 1 output token, median of {args.repeats} (ms)")
    for name, times in rows.items():
        print(f"{name:>24}: {statistics.median(times):8.1f}")


if __name__ == "__main__":
    main()
