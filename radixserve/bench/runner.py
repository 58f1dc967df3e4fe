"""Drive sessions through a :class:`Client` with P parallel workers, and time prefill alone.

Each worker takes the next session (in arrival order), waits for its arrival time, and runs its
turns one after another: turn t+1's prompt is turn t's prompt, its answer and the new user
message. Many workers: P clients (closed loop); arrival times: an open loop up to P in flight.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tqdm import tqdm

from radixserve.bench.clients import Client
from radixserve.bench.prefill_cost import calibration_lengths, fit_prefill_cost
from radixserve.bench.records import RequestRecord
from radixserve.bench.workload import Session, TokenSource, num_requests

STAT_KEYS = (
    "num_prefill_tokens",
    "num_cached_prompt_tokens",
    "num_cached_prompt_tokens_tier",
    "kv_tier_written_tokens",
    "kv_tier_loaded_tokens",
    "num_swapped_out_tokens",
    "num_generated_tokens",
    "num_retractions",
    "num_preemptions",
    "num_spec_drafts",
    "num_spec_draft_tokens",
    "num_spec_accepted_tokens",
    "num_prefill_batches",
    "num_decode_batches",
    "num_mixed_batches",
)
# one run: its records (in completion order), wall time and scheduler-counter deltas
Run = tuple[list[RequestRecord], float, dict[str, Any] | None]


def run_sessions(
    client: Client, sessions: list[Session], parallel: int, desc: str
) -> tuple[list[RequestRecord], float, dict[str, Any] | None]:
    """Returns the records (in completion order), the wall time and the scheduler-counter
    deltas over the run (None where the system has no counters)."""
    todo = sorted(sessions, key=lambda s: (s.arrival_s, s.sid))
    records: list[RequestRecord] = []
    lock = threading.Lock()
    bar = tqdm(total=num_requests(sessions), desc=desc, unit="req", leave=False, dynamic_ncols=True)
    before = client.stats()
    start = time.perf_counter()

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                session = todo.pop(0)
            delay = start + session.arrival_s - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            history = list(session.prefix_ids)
            for t, turn in enumerate(session.turns):
                prompt = history + turn.user_ids
                sent = time.perf_counter()
                out = client.generate(prompt, turn.answer_len)
                done = time.perf_counter()
                ids = out.output_ids if out.output_ids is not None else turn.fallback_answer_ids
                record = RequestRecord(
                    sid=session.sid,
                    turn=t,
                    prompt_ids=prompt,
                    output_ids=list(ids),
                    sent_s=sent - start,
                    done_s=done - start,
                    first_token_s=None
                    if out.first_token_at is None
                    else out.first_token_at - start,
                    cached_tokens=out.cached_tokens,
                    cached_tokens_tier=out.cached_tokens_tier,
                    num_output_tokens=out.num_output_tokens,
                )
                with lock:
                    records.append(record)
                bar.update(1)
                history = prompt + list(ids)

    try:
        with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(sessions)))) as pool:
            futures = [pool.submit(worker) for _ in range(max(1, min(parallel, len(sessions))))]
            for f in futures:
                f.result()
    finally:
        bar.close()
    wall = time.perf_counter() - start
    return records, wall, stats_delta(before, client.stats())


def host_load() -> dict[str, float]:
    # a busy host skews a system's numbers: the report keeps the load each one started at
    return {"loadavg_1m_at_start": os.getloadavg()[0]}


def fastest(
    repeat: int, run: Callable[[], Run], before: Callable[[], None]
) -> tuple[Run, list[float]]:
    """The fastest of ``repeat`` runs (``before`` runs ahead of each but the first), and every
    run's wall time."""
    best: Run | None = None
    walls: list[float] = []
    for i in range(repeat):
        if i:
            before()
        result = run()
        walls.append(result[1])
        if best is None or result[1] < best[1]:
            best = result
    assert best is not None
    return best, walls


def stats_delta(
    before: dict[str, Any] | None, after: dict[str, Any] | None
) -> dict[str, Any] | None:
    if before is None or after is None:
        return None
    delta: dict[str, Any] = {k: after.get(k, 0) - before.get(k, 0) for k in STAT_KEYS}
    total = delta["num_prefill_tokens"] + delta["num_cached_prompt_tokens"]
    delta["cache_hit_rate"] = delta["num_cached_prompt_tokens"] / total if total else 0.0
    return delta


def warmup(client: Client, src: TokenSource) -> None:
    """One short request, then an empty cache, so the run starts warm and cold-cached."""
    client.generate(src.ids(16), 2)
    client.flush()


def calibrate_prefill(client: Client, src: TokenSource, max_cached_len: int) -> dict[str, Any]:
    """The prefill cost t(n) = c0 + a*n + b*n^2 of this runtime: one-token requests at
    prompt lengths from about 1/8 of to the longest optimal cached prefix of the trace (best of
    2 each), fitted by least squares (:func:`fit_prefill_cost`)."""
    lengths = calibration_lengths(max_cached_len)
    best: list[float] = []
    for n in lengths:
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            client.generate(src.ids(n), 1)
            times.append(time.perf_counter() - t0)
        best.append(min(times))
    client.flush()
    return {"lengths": lengths, "best_s": best, **fit_prefill_cost(lengths, best)}
