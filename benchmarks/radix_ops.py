"""Replay a multi-turn-chat trace through RadixCache: match, lock, insert, unlock, evict.

Prints operations per second and matched tokens per second, side by side with the same tree
using a per-token Python comparison loop (SGLang's ``_key_match_page_size1`` shape), so the
effect of the vectorised key comparison is measured in one run.

    python benchmarks/radix_ops.py --conversations 2000 --turns 8
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np
import torch

from radixserve.radix import RadixCache


class PythonLoopRadixCache(RadixCache):
    """The same tree, comparing keys token by token in Python (the baseline)."""

    def _common_len(self, a: np.ndarray, b: np.ndarray) -> int:
        a_list, b_list = a.tolist(), b.tolist()
        i = 0
        for x, y in zip(a_list, b_list, strict=False):
            if x != y:
                break
            i += 1
        return i - i % self.page_size


def make_trace(args: argparse.Namespace) -> list[tuple[np.ndarray, int]]:
    """One entry per turn in arrival order: (prompt + answer tokens, prompt length)."""
    rng = random.Random(args.seed)
    systems = [
        [rng.randrange(32000) for _ in range(args.system_len)] for _ in range(args.num_systems)
    ]
    histories = [list(rng.choice(systems)) for _ in range(args.conversations)]
    order: list[tuple[np.ndarray, int]] = []
    for _ in range(args.turns):
        for conv in rng.sample(range(args.conversations), args.conversations):
            history = histories[conv]
            history.extend(rng.randrange(32000) for _ in range(rng.randint(*args.question_len)))
            prompt_len = len(history)
            history.extend(rng.randrange(32000) for _ in range(rng.randint(*args.answer_len)))
            order.append((np.asarray(history, dtype=np.int32), prompt_len))
    return order


def replay(
    tree: RadixCache, trace: list[tuple[np.ndarray, int]], capacity: int
) -> tuple[int, int, float]:
    """Returns (operations, matched tokens, seconds)."""
    next_slot = 1
    ops = matched = 0
    start = time.perf_counter()
    for key, prompt_len in trace:
        result = tree.match_prefix(key[: prompt_len - 1])
        tree.inc_lock_ref(result.last_node)
        matched += len(result.indices)
        overflow = tree.total_size() + len(key) - capacity
        if overflow > 0:
            tree.evict(overflow)
            ops += 1
        num_new = len(key) - len(result.indices)
        value = torch.cat([result.indices, torch.arange(next_slot, next_slot + num_new)])
        next_slot += num_new
        tree.insert(key, value)
        tree.dec_lock_ref(result.last_node)
        ops += 4
    return ops, matched, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--num-systems", type=int, default=16)
    parser.add_argument("--system-len", type=int, default=512)
    parser.add_argument("--question-len", type=int, nargs=2, default=(32, 128))
    parser.add_argument("--answer-len", type=int, nargs=2, default=(32, 256))
    parser.add_argument("--capacity", type=int, default=2_000_000, help="tokens the tree may hold")
    parser.add_argument("--page-size", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    trace = make_trace(args)
    print(f"trace: {len(trace)} turns, {sum(len(k) for k, _ in trace):,} tokens")
    rows = []
    for name, cls in (
        ("radixserve (numpy compare)", RadixCache),
        ("per-token Python loop", PythonLoopRadixCache),
    ):
        tree = cls(args.page_size)
        ops, matched, secs = replay(tree, trace, args.capacity)
        tree.check_integrity(unique_values=False)
        rows.append((name, ops / secs, matched / secs, secs))
    print(f"{'tree':<28}{'ops/s':>12}{'matched tok/s':>16}{'seconds':>10}")
    for name, ops_s, tok_s, secs in rows:
        print(f"{name:<28}{ops_s:>12,.0f}{tok_s:>16,.0f}{secs:>10.2f}")
    print(f"speed-up of the vectorised compare: {rows[0][1] / rows[1][1]:.2f}x")


if __name__ == "__main__":
    main()
