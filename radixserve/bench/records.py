"""What a run measured, per request, and the summaries computed from it.

The optimal hit rate is the ceiling for any prefix cache on the requests actually sent: in send
order, each prompt's longest prefix shared with any earlier request's prompt + answer counts as
hit, an infinite cache never evicting. As in SGLang, at most ``prompt_len - 1`` prompt tokens
can hit (the last one is computed to get logits) and an answer's last token has no KV (it was
sampled, never fed), so a request leaves ``prompt + answer[:-1]`` behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(slots=True)
class RequestRecord:
    """One request; times in seconds from the start of the run (``None``: not measured)."""

    sid: int
    turn: int
    prompt_ids: list[int]
    output_ids: list[int]
    sent_s: float
    done_s: float | None  # None: not timed per request (the frontend driver)
    first_token_s: float | None = None
    cached_tokens: int | None = None  # reported by the system (meta_info / usage)
    cached_tokens_tier: int | None = None  # of those, loaded back from a KV tier
    num_output_tokens: int | None = None  # reported by the system (None: len(output_ids))

    @property
    def num_output(self) -> int:
        return len(self.output_ids) if self.num_output_tokens is None else self.num_output_tokens

    @property
    def latency_s(self) -> float | None:
        return None if self.done_s is None else self.done_s - self.sent_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.sent_s


class TokenTrie:
    """A plain token trie: ``match`` is read-only, ``insert`` adds a sequence."""

    def __init__(self) -> None:
        self.root: dict[int, Any] = {}

    def match(self, ids: list[int]) -> int:
        node, n = self.root, 0
        for tok in ids:
            nxt = node.get(tok)
            if nxt is None:
                break
            node, n = nxt, n + 1
        return n

    def insert(self, ids: list[int]) -> None:
        node = self.root
        for tok in ids:
            node = node.setdefault(tok, {})


def optimal_hits(records: list[RequestRecord]) -> list[int]:
    """Per record (in the given order), the prompt tokens an ideal cache would have served."""
    trie = TokenTrie()
    order = sorted(range(len(records)), key=lambda i: (records[i].sent_s, i))
    hits = [0] * len(records)
    for i in order:
        r = records[i]
        hits[i] = trie.match(r.prompt_ids[: len(r.prompt_ids) - 1])
        trie.insert(r.prompt_ids + r.output_ids[:-1])
    return hits


def percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    arr = np.asarray(values, dtype=np.float64)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"mean": float(arr.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def summarize(
    name: str, records: list[RequestRecord], wall_s: float, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The report entry of one system's run."""
    num_in = sum(len(r.prompt_ids) for r in records)
    num_out = sum(r.num_output for r in records)
    opt_per_request = optimal_hits(records)
    opt = sum(opt_per_request)
    reported = [r.cached_tokens for r in records]
    cached = None if any(c is None for c in reported) else sum(c or 0 for c in reported)
    stats = (extra or {}).get("server_stats")
    if cached is None and stats:  # no per-request counts: the scheduler's counters instead
        cached = int(stats["num_cached_prompt_tokens"])
    tier = _tier_cached(records, stats)
    ttfts = [t for r in records if (t := r.ttft_s) is not None]
    tpots = [
        (r.done_s - r.first_token_s) / (r.num_output - 1)
        for r in records
        if r.done_s is not None and r.first_token_s is not None and r.num_output > 1
    ]
    wall = max(wall_s, 1e-9)
    out: dict[str, Any] = {
        "name": name,
        "num_requests": len(records),
        "wall_s": wall_s,
        "requests_per_s": len(records) / wall,
        "input_tokens": num_in,
        "output_tokens": num_out,
        "input_tokens_per_s": num_in / wall,
        "output_tokens_per_s": num_out / wall,
        "ttft_s": percentiles(ttfts),
        "tpot_s": percentiles(tpots),
        "latency_s": percentiles([t for r in records if (t := r.latency_s) is not None]),
        "cached_tokens": cached,
        "hit_rate": None if cached is None else cached / max(num_in, 1),
        # the KV tier's part of the hits, and the prompt tokens the system computed (its
        # scheduler's count: misses, and what a retraction recomputed)
        "tier_cached_tokens": tier,
        "tier_hit_rate": None if tier is None else tier / max(num_in, 1),
        "prefill_tokens": None if not stats else int(stats["num_prefill_tokens"]),
        "optimal_cached_tokens": opt,
        "optimal_cached_per_request": opt_per_request,  # in the records' (completion) order
        "optimal_hit_rate": opt / max(num_in, 1),
    }
    out["hit_rate_vs_optimal"] = (
        None if cached is None or opt == 0 else out["hit_rate"] / out["optimal_hit_rate"]
    )
    out.update(extra or {})
    return out


def _tier_cached(records: list[RequestRecord], stats: dict[str, Any] | None) -> int | None:
    """Prompt tokens loaded back from a KV tier: per request where every one says, else the
    scheduler's counter (None where neither is known)."""
    reported = [r.cached_tokens_tier for r in records]
    if records and all(c is not None for c in reported):
        return sum(c or 0 for c in reported)
    if stats and "num_cached_prompt_tokens_tier" in stats:
        return int(stats["num_cached_prompt_tokens_tier"])
    return None


def speculative_summary(stats: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a run drafted, from its scheduler-counter deltas (``runner.STAT_KEYS``): drafts
    (one per request and verify step), draft and accepted tokens, and the accept length
    (tokens a request got per verify step it drafted in, SGLang's; None without a draft)."""
    if not stats or "num_spec_drafts" not in stats:
        return None
    drafts, accepted = int(stats["num_spec_drafts"]), int(stats["num_spec_accepted_tokens"])
    return {
        "num_drafts": drafts,
        "num_draft_tokens": int(stats["num_spec_draft_tokens"]),
        "num_accepted_tokens": accepted,
        "accept_length": 1 + accepted / drafts if drafts else None,
    }
