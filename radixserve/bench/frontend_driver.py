"""The sessions as frontend programs over ``RuntimeEndpoint`` (SGLang's multi_turn_chat shape).

Each session is one ``@function`` program: the prefix, then per turn ``s += user_text`` and
``s += gen(f"answer_{t}", max_tokens=..., ignore_eos=True)``, run by P worker threads (like
``run_batch``, but honouring arrival times and timing each turn from the program).

Text, not token ids, crosses the API here: the user messages are the trace's ids decoded, and
the server tokenizes the prompt text. Prompt tokens and cached tokens per request are the
server's own (``get_meta_info``); the records rebuild the prompt ids with the same tokenizer,
so the optimal hit rate is computed on what the server saw, up to tokenization at the answer
boundaries (a random model's answers may not survive a decode/encode round trip). No TTFT: the
frontend's ``gen`` is not streamed here.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tqdm import tqdm

from radixserve.bench.clients import HttpClient
from radixserve.bench.records import RequestRecord
from radixserve.bench.runner import stats_delta
from radixserve.bench.workload import Session, num_requests


def _program() -> Any:
    from radixserve.frontend import function, gen

    @function
    def conversation(
        s: Any, prefix: str, turns: list[tuple[str, int]], times: list[tuple[float, float]]
    ) -> None:
        if prefix:
            s += prefix
        for t, (user, answer_len) in enumerate(turns):
            sent = time.perf_counter()
            s += user
            s += gen(f"answer_{t}", max_tokens=answer_len, ignore_eos=True, temperature=0.0)
            s.sync()
            times.append((sent, time.perf_counter()))

    return conversation


def run_frontend(
    url: str, model_path: str, sessions: list[Session], parallel: int, desc: str
) -> tuple[list[RequestRecord], float, dict[str, Any] | None]:
    from transformers import AutoTokenizer

    from radixserve.frontend import RuntimeEndpoint

    tok = AutoTokenizer.from_pretrained(model_path)
    program = _program()
    backend = RuntimeEndpoint(url)
    todo = sorted(sessions, key=lambda s: (s.arrival_s, s.sid))
    records: list[RequestRecord] = []
    lock = threading.Lock()
    bar = tqdm(total=num_requests(sessions), desc=desc, unit="req", leave=False)
    stats = HttpClient(url)
    before = stats.stats()
    start = time.perf_counter()

    def run_one(session: Session) -> None:
        delay = start + session.arrival_s - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        prefix = str(tok.decode(session.prefix_ids))
        turns = [(str(tok.decode(t.user_ids)), t.answer_len) for t in session.turns]
        times: list[tuple[float, float]] = []
        state = program.run(prefix=prefix, turns=turns, times=times, backend=backend)
        text = prefix
        out: list[RequestRecord] = []
        for t, (user, _) in enumerate(turns):
            text += user
            answer, meta = state[f"answer_{t}"], state.get_meta_info(f"answer_{t}")
            out.append(
                RequestRecord(
                    sid=session.sid,
                    turn=t,
                    prompt_ids=tok.encode(text, add_special_tokens=False),
                    output_ids=tok.encode(answer, add_special_tokens=False),
                    sent_s=times[t][0] - start,
                    done_s=times[t][1] - start,
                    cached_tokens=meta.get("cached_tokens"),
                    cached_tokens_tier=(meta.get("cached_tokens_details") or {}).get("host"),
                    num_output_tokens=meta.get("completion_tokens"),
                )
            )
            text += answer
        with lock:
            records.extend(out)
        bar.update(len(out))

    try:
        with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(todo)))) as pool:
            for future in [pool.submit(run_one, s) for s in todo]:
                future.result()
        wall = time.perf_counter() - start
        delta = stats_delta(before, stats.stats())
    finally:
        bar.close()
        stats.close()
    return records, wall, delta
