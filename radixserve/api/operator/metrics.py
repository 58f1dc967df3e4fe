"""Prometheus metrics of the server (``/metrics``), with SGLang's names under ``radixserve:``.

Latencies are measured in the HTTP process as outputs arrive (:meth:`ServingMetrics.on_output`,
the tokenizer manager's observer); scheduler-side numbers (running and waiting requests, KV
token usage, cache hit rate, retractions, preemptions, the KV tier's figures) come from the
scheduler's stats, fetched when ``/metrics`` is scraped. Each server has its own registry.

The KV tier (``docs/kv_tier.md``) uses SGLang's hierarchical-cache names, whichever store backs
it (host memory or a file): ``hicache_host_total_tokens`` / ``hicache_host_used_tokens``
(gauges), ``hicache_backup_tokens_total`` (pool -> tier writes), ``load_back_tokens_total``
(tier -> pool), and radixserve's own ``swapped_out_tokens_total`` (swap preemption) and
``cached_tokens_host_total`` (the tier's part of ``cached_tokens_total``, as in ``meta_info``'s
``cached_tokens_details.host``; 0 without a tier). Without a tier the others are not exported.

Speculative decoding (``docs/speculative.md``): SGLang's gauge ``spec_accept_length`` (tokens a
request got per verify step it drafted in, since the start; 0 before any draft or with
speculation off, as SGLang exports it whatever runs), and, only on a server that drafts, vLLM's
counters ``spec_decode_num_drafts_total``, ``spec_decode_num_draft_tokens_total``,
``spec_decode_num_accepted_tokens_total`` and ``spec_decode_num_accepted_tokens_per_pos_total``
(by 0-based draft ``position``, each position a draft has reached). All are the scheduler's, so
the operator's only: a tenant's registry never has them.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from radixserve.server.io_struct import TextOutput
from radixserve.server.request_state import ReqState

PREFIX = "radixserve:"
THROUGHPUT_WINDOW_S = 10.0
USAGE_FIELDS = (
    "num_finished_reqs",
    "num_prompt_tokens",
    "num_cached_tokens",
    "num_generated_tokens",
)
LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip


class SchedulerStatsCollector:
    """Exposes the last scheduler stats snapshot; empty until the first scrape succeeds."""

    def __init__(
        self, labels: dict[str, str], throughput: ThroughputWindow, speculative: bool = False
    ) -> None:
        self.labels = labels
        self.stats: dict[str, Any] = {}
        self.throughput = throughput
        self.speculative = speculative  # the server drafts: vLLM's spec counters are exported

    def collect(self) -> Iterator[Metric]:
        names = list(self.labels)
        values = list(self.labels.values())
        gauge = GaugeMetricFamily(
            f"{PREFIX}gen_throughput", "Generated tokens per second (last 10 s)", labels=names
        )
        gauge.add_metric(values, self.throughput.rate())
        yield gauge
        for key, entry in GAUGES.items():
            if key in self.stats:
                name, doc = (key, entry) if isinstance(entry, str) else entry
                g = GaugeMetricFamily(f"{PREFIX}{name}", doc, labels=names)
                g.add_metric(values, float(self.stats[key]))
                yield g
        counters = {**COUNTERS, **SPEC_COUNTERS} if self.speculative else COUNTERS
        for key, (name, doc) in counters.items():
            if key in self.stats:
                c = CounterMetricFamily(f"{PREFIX}{name}", doc, labels=names)
                c.add_metric(values, float(self.stats[key]))
                yield c
        if self.speculative and "spec_accepted_per_position" in self.stats:
            c = CounterMetricFamily(
                f"{PREFIX}spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position",
                labels=[*names, "position"],
            )
            for pos, n in enumerate(self.stats["spec_accepted_per_position"]):
                c.add_metric([*values, str(pos)], float(n))
            yield c


# the scheduler's figures -> a gauge (named as the key, or (SGLang's name, help)), a counter
# ((name, help)); vLLM's speculative decoding counters on a server that drafts
GAUGES: dict[str, Any] = {
    "num_running_reqs": "Requests in the running batch",
    "num_waiting_reqs": "Requests waiting to be admitted",
    "token_usage": "Fraction of KV slots held by requests (not evictable)",
    "cache_hit_rate": "Prompt tokens served from the prefix cache / all prompt tokens",
    "max_total_tokens": "KV slots in the pool",
    "num_cached_tokens_in_tree": "Tokens held by the radix cache",
    "kv_tier_capacity_tokens": (
        "hicache_host_total_tokens",
        "KV tier capacity in tokens (host memory or file)",
    ),
    "kv_tier_used_tokens": (
        "hicache_host_used_tokens",
        "Tokens with a copy in the KV tier",
    ),
    "avg_spec_accept_length": (
        "spec_accept_length",
        "Tokens a request got per verify step it drafted in (accepted drafts + 1)",
    ),
}
COUNTERS: dict[str, Any] = {
    "num_retractions": ("num_retracted_reqs", "Requests retracted in decode (no memory)"),
    "num_preemptions": ("num_preempted_reqs", "Requests preempted by priority"),
    "kv_tier_written_tokens": (
        "hicache_backup_tokens",
        "Tokens written from the KV pool to the KV tier",
    ),
    "kv_tier_loaded_tokens": ("load_back_tokens", "Tokens loaded back from the KV tier"),
    "kv_tier_corrupt_pages": (
        "kv_tier_corrupt_pages",
        "Pages of a file KV tier that failed their checksum (dropped, computed again)",
    ),
    "num_swapped_out_tokens": (
        "swapped_out_tokens",
        "Tokens of preempted or retracted requests swapped out to the KV tier",
    ),
}
SPEC_COUNTERS = {
    "num_spec_drafts": ("spec_decode_num_drafts", "Drafts verified (one per request and step)"),
    "num_spec_draft_tokens": ("spec_decode_num_draft_tokens", "Draft tokens verified"),
    "num_spec_accepted_tokens": ("spec_decode_num_accepted_tokens", "Draft tokens accepted"),
}


class ThroughputWindow:
    def __init__(self, window_s: float = THROUGHPUT_WINDOW_S) -> None:
        self.window_s = window_s
        self.events: collections.deque[tuple[float, int]] = collections.deque()
        self.started = time.monotonic()

    def add(self, now: float, num_tokens: int) -> None:
        self.events.append((now, num_tokens))
        self._trim(now)

    def rate(self) -> float:
        now = time.monotonic()
        self._trim(now)
        span = min(self.window_s, max(now - self.started, 1e-3))
        return sum(n for _, n in self.events) / span

    def _trim(self, now: float) -> None:
        while self.events and self.events[0][0] < now - self.window_s:
            self.events.popleft()


class ServingMetrics:
    """The server's metrics; an ``OutputObserver`` of the tokenizer manager."""

    def __init__(self, model_name: str, speculative: bool = False) -> None:
        """``speculative``: the server drafts (its scheduler's spec counters are exported)."""
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name}
        self.labels = labels
        names = list(labels)
        self.throughput = ThroughputWindow()
        self.scheduler_stats = SchedulerStatsCollector(labels, self.throughput, speculative)
        self.registry.register(self.scheduler_stats)  # type: ignore[arg-type]

        def histogram(name: str, doc: str) -> Any:
            h = Histogram(
                PREFIX + name, doc, names, registry=self.registry, buckets=LATENCY_BUCKETS
            )
            return h.labels(**labels)

        def counter(name: str, doc: str) -> Any:
            return Counter(PREFIX + name, doc, names, registry=self.registry).labels(**labels)

        self.ttft = histogram("time_to_first_token_seconds", "Time to the first token")
        self.itl = histogram("inter_token_latency_seconds", "Time between output tokens")
        self.e2e = histogram("e2e_request_latency_seconds", "Request latency, end to end")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = counter("generation_tokens", "Generated tokens")
        self.cached_tokens = counter("cached_tokens", "Prompt tokens served from the cache")
        self.cached_tokens_host = counter(
            "cached_tokens_host", "Prompt tokens served from the cache by loading back the KV tier"
        )
        self.totals: collections.Counter[str] = collections.Counter(dict.fromkeys(USAGE_FIELDS, 0))
        self._requests = Counter(
            PREFIX + "num_requests",
            "Finished requests by finish reason",
            [*names, "finish_reason"],
            registry=self.registry,
        )

    def on_output(self, state: ReqState, out: TextOutput, now: float) -> None:
        n = len(out.output.new_token_ids)
        self.totals["num_generated_tokens"] += n
        if n:
            if state.first_output_time is None:
                self.ttft.observe(now - state.created)
            elif state.last_output_time is not None:
                per_token = (now - state.last_output_time) / n
                for _ in range(n):
                    self.itl.observe(per_token)
            self.generation_tokens.inc(n)
            self.throughput.add(now, n)
        reason = out.output.finish_reason
        if reason is not None:
            self.e2e.observe(now - state.created)
            self.prompt_tokens.inc(out.output.prompt_tokens)
            self.cached_tokens.inc(out.output.cached_tokens)
            self.cached_tokens_host.inc(out.output.cached_tokens_tier)
            self._requests.labels(**self.labels, finish_reason=reason.openai_reason).inc()
            self.totals["num_finished_reqs"] += 1
            self.totals["num_prompt_tokens"] += out.output.prompt_tokens
            self.totals["num_cached_tokens"] += out.output.cached_tokens

    def usage(self) -> dict[str, Any]:
        """The requests counted here: finished requests, their prompt, cached and generated
        tokens, the share of prompt tokens the cache served, generated tokens per second."""
        totals = dict(self.totals)
        prompt = totals["num_prompt_tokens"]
        hit_rate = totals["num_cached_tokens"] / prompt if prompt else 0.0
        return {**totals, "cache_hit_rate": hit_rate, "gen_throughput": self.throughput.rate()}

    def update_scheduler_stats(self, stats: dict[str, Any]) -> None:
        self.scheduler_stats.stats = dict(stats)

    def render(self) -> bytes:
        return generate_latest(self.registry)
