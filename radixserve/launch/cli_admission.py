"""``serve``'s flags of scheduling (SGLang's names): the waiting queue's order, chunked prefill
and its interleaving, the running and queued bounds, priorities, preemption; they build the
``AdmissionConfig``."""

from __future__ import annotations

import argparse

from radixserve.config import PREEMPTION_MODES, SCHEDULE_POLICIES, AdmissionConfig
from radixserve.launch.cli_parts import part_from_args

_DEFAULTS = AdmissionConfig()


def add_admission_flags(serve: argparse.ArgumentParser) -> None:
    add = serve.add_argument
    add(
        "--schedule-policy",
        choices=SCHEDULE_POLICIES,
        default=_DEFAULTS.schedule_policy,
        help="waiting-queue order: fcfs, lof (longest output first), random; cache-aware lpm "
        "(longest prefix match), dfs-weight, hrrn (highest response ratio: work done since "
        "a request arrived over its uncached tokens) and adaptive (lpm while the queue does not "
        "fit in the pool, fcfs while it does)",
    )
    add(
        "--chunked-prefill-size",
        type=int,
        default=_DEFAULTS.chunked_prefill_size,
        help="most prompt tokens one prefill step computes per request; <= 0 disables chunking",
    )
    add(
        "--disable-prefill-interleaving",
        action="store_true",
        help="let a long prompt's continuing chunk take the whole chunk budget (by default it is "
        "cut so whole short prompts queued behind it run in the same step, keeping at least "
        "--prefill-interleaving-min-continuation-tokens, default half the chunk)",
    )
    add("--enable-prefill-interleaving", action="store_true", help="the default; for SGLang's")
    add(
        "--enable-mixed-chunk",
        action="store_true",
        help="a prefill step also computes the running requests' next tokens (SGLang's flag)",
    )
    add("--prefill-interleaving-min-continuation-tokens", type=int, default=None)
    add(
        "--max-running-requests",
        type=int,
        default=_DEFAULTS.max_running_requests,
        help="most requests in the running batch",
    )
    add(
        "--max-queued-requests",
        type=int,
        default=None,
        help="most requests waiting to run; beyond it a new one gets 429 with Retry-After "
        "(default: no bound)",
    )
    add(
        "--preemption-mode",
        choices=PREEMPTION_MODES,
        default=_DEFAULTS.preemption_mode,
        help="a preempted or retracted request's KV: cached and recomputed where evicted, or "
        "swapped to the tier and back (needs a tier)",
    )
    add(
        "--enable-priority-scheduling",
        action="store_true",
        help="order by the requests' priority first (and preempt for much higher priority)",
    )


def admission_part(args: argparse.Namespace) -> AdmissionConfig:
    """The part of these flags (interleaving is on unless --disable-prefill-interleaving)."""
    interleave = not args.disable_prefill_interleaving
    return part_from_args(AdmissionConfig, args, enable_prefill_interleaving=interleave)
