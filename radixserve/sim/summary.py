"""A simulated run's report entry, in the shape ``radixserve bench`` reports a system, and the
table (the bench's columns plus retractions and preemptions)."""

from __future__ import annotations

from typing import Any

import torch

from radixserve.bench.records import percentiles
from radixserve.bench.report import systems_table
from radixserve.radix import RadixCache
from radixserve.sim.simulation import SimRecord, SimResult


def optimal_hits(records: list[SimRecord]) -> list[int]:
    """``bench.records.optimal_hits`` over int32 arrays, on a radix tree (a dict trie of 100
    million tokens would not fit in memory): in send order, each prompt's longest prefix
    (at most ``prompt_len - 1`` tokens) shared with an earlier prompt + answer[:-1] under the
    same LoRA adapter (its own namespace, as in the runtime's cache)."""
    tree = RadixCache.create_simulated()
    zeros = torch.zeros(0, dtype=torch.int64)
    order = sorted(range(len(records)), key=lambda i: (records[i].sent_s, i))
    hits = [0] * len(records)
    for i in order:
        r = records[i]
        prompt = r.prompt_ids
        hits[i] = len(tree.match_prefix(prompt[: len(prompt) - 1], r.lora).indices)
        seq = prompt if len(r.output_ids) <= 1 else _concat(prompt, r.output_ids[:-1])
        if len(zeros) < len(seq):
            zeros = torch.zeros(2 * len(seq), dtype=torch.int64)
        tree.insert(seq, zeros[: len(seq)], r.lora)
    return hits


def _concat(prompt: Any, output: list[int]) -> Any:
    import numpy as np

    return np.concatenate([prompt, np.asarray(output, dtype=np.int32)])


def summarize(name: str, result: SimResult, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    records = result.records
    num_in = sum(len(r.prompt_ids) for r in records)
    num_out = sum(len(r.output_ids) for r in records)
    cached = sum(r.cached_tokens for r in records)
    opt = sum(optimal_hits(records))
    wall = max(result.wall_s, 1e-9)
    ttft = [r.first_token_s - r.sent_s for r in records if r.first_token_s is not None]
    lat = [r.done_s - r.sent_s for r in records if r.done_s is not None]
    out: dict[str, Any] = {
        "name": name,
        "kind": "sim",
        "num_requests": len(records),
        "wall_s": result.wall_s,
        "requests_per_s": len(records) / wall,
        "input_tokens": num_in,
        "output_tokens": num_out,
        "input_tokens_per_s": num_in / wall,
        "output_tokens_per_s": num_out / wall,
        "ttft_s": percentiles(ttft),
        "latency_s": percentiles(lat),
        "cached_tokens": cached,
        "hit_rate": cached / max(num_in, 1),
        "optimal_cached_tokens": opt,
        "optimal_hit_rate": opt / max(num_in, 1),
        "load_split": result.load_split,
        "num_steps": result.num_steps,
        **result.counters,
    }
    out.update(extra or {})
    return out


def sim_table(runs: list[dict[str, Any]]) -> str:
    """The bench table (``radixserve bench``'s columns) with retractions and preemptions."""
    return systems_table(
        runs, extra=(("retract", "num_retractions"), ("preempt", "num_preemptions"))
    )
