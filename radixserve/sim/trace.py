"""Traces for the simulator: the bench shapes, SGLang's generated-shared-prefix, and JSONL.

A trace is a list of :class:`SimSession`: a prefix (shared, by reference, between sessions of a
group) and turns, each a user message and an output length. As in ``radixserve bench``, turn
``t + 1`` is sent when turn ``t``'s answer is complete (closed loop), its prompt being the
prefix, every earlier message and answer, and its own message. Token ids are int32 arrays.

JSONL (one request per line; each line is a one-turn session, sent at its ``arrival_s``)::

    {"arrival_s": 0.25, "input_ids": [101, 7, ...], "output_len": 32}
    {"arrival_s": 0.30, "prompt_len": 700, "prefix_group": 3, "prefix_len": 512, "output_len": 16}
    {"arrival_s": 0.35, "input_ids": [101, 7, ...], "output_len": 8, "lora": "sql"}

The second form gives lengths only: requests of one ``prefix_group`` share their first
``prefix_len`` tokens (the longest ``prefix_len`` the group uses, cut per request), the rest is
drawn at random, seeded by ``seed`` and the line number, so a replay is reproducible. A
``lora`` names the LoRA adapter a request runs under (the simulated scheduler serves every
name the trace uses): the radix cache splits by it, and ``max_loras_per_batch`` bounds a batch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from radixserve.bench.workload import Session, SharedPrefixSpec, draw_shared_prefix

EMPTY = np.zeros(0, dtype=np.int32)


@dataclass(frozen=True, slots=True)
class SimTurn:
    user_ids: np.ndarray  # int32
    output_len: int


@dataclass(frozen=True, slots=True)
class SimSession:
    sid: int
    prefix_ids: np.ndarray  # int32, possibly the same object as other sessions' prefix
    turns: tuple[SimTurn, ...]
    arrival_s: float = 0.0
    lora: str | None = None  # the LoRA adapter it runs under: its own radix-cache namespace


def from_bench_sessions(sessions: Iterable[Session]) -> list[SimSession]:
    """The bench's sessions as int32 arrays; equal prefixes become one shared array."""
    prefixes: dict[tuple[int, ...], np.ndarray] = {}
    # a list seen before (the shared-prefix generator hands a group one list): no re-hashing;
    # the list is kept alive beside its array so its id is not reused
    by_list: dict[int, tuple[list[int], np.ndarray]] = {}
    out = []
    for s in sessions:
        seen = by_list.get(id(s.prefix_ids))
        if seen is not None:
            prefix = seen[1]
        else:
            key = tuple(s.prefix_ids)
            if key not in prefixes:
                prefixes[key] = np.asarray(s.prefix_ids, dtype=np.int32)
            prefix = prefixes[key]
            by_list[id(s.prefix_ids)] = (s.prefix_ids, prefix)
        turns = tuple(
            SimTurn(np.asarray(t.user_ids, dtype=np.int32), t.answer_len) for t in s.turns
        )
        out.append(SimSession(s.sid, prefix, turns, s.arrival_s))
    return out


def shared_prefix_sessions(spec: SharedPrefixSpec, low: int, high: int) -> list[SimSession]:
    """``from_bench_sessions(make_shared_prefix(spec, low, high))``, built from the draws'
    arrays directly (no lists of millions of ints): the same sessions."""
    draw = draw_shared_prefix(spec, low, high)
    prefixes: dict[bytes, np.ndarray] = {}  # equal prefixes: one array, as from_bench_sessions
    groups = []
    for row in draw.systems.astype(np.int32):
        groups.append(prefixes.setdefault(row.tobytes(), row))
    questions = draw.questions.astype(np.int32)
    per_group, out_len = spec.prompts_per_group, spec.output_len
    return [
        SimSession(sid, groups[i // per_group], (SimTurn(questions[i], out_len),), t)
        for sid, (i, t) in enumerate(zip(draw.order, draw.arrivals, strict=True))
    ]


def num_requests(sessions: Iterable[SimSession]) -> int:
    return sum(len(s.turns) for s in sessions)


def num_prompt_tokens_lower_bound(sessions: Iterable[SimSession]) -> int:
    """Prompt tokens not counting earlier answers (those are known only after a run)."""
    total = 0
    for s in sessions:
        seen = len(s.prefix_ids)
        for t in s.turns:
            seen += len(t.user_ids)
            total += seen
    return total


# ---- JSONL ------------------------------------------------------------------------------------
def _field(line: dict[str, Any], name: str, kind: type, where: str) -> Any:
    if name not in line:
        raise ValueError(f"{where}: missing {name!r}")
    value = line[name]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{where}: {name!r} must be {kind.__name__}, got {value!r}")
    return value


def _parse_lines(lines: Iterable[str], source: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source}:{i}: not JSON ({exc.msg})") from None
        if not isinstance(line, dict):
            raise ValueError(f"{source}:{i}: a line must be a JSON object")
        yield i, line


def read_jsonl(
    stream: TextIO, seed: int = 0, token_range: tuple[int, int] = (3, 32000)
) -> list[SimSession]:
    """Parse a JSONL trace (see the module docstring); ``ValueError`` names the bad line."""
    source = getattr(stream, "name", "<trace>")
    parsed = list(_parse_lines(stream, source))
    group_len: dict[int, int] = {}
    for i, line in parsed:
        if "input_ids" not in line and "prefix_group" in line:
            g = _field(line, "prefix_group", int, f"{source}:{i}")
            group_len[g] = max(
                group_len.get(g, 0), _field(line, "prefix_len", int, f"{source}:{i}")
            )
    low, high = token_range
    groups = {
        g: np.random.default_rng((seed, 1, g)).integers(low, high, n, dtype=np.int32)
        for g, n in group_len.items()
    }
    sessions = []
    for sid, (i, line) in enumerate(parsed):
        where = f"{source}:{i}"
        arrival = _field(line, "arrival_s", float, where)
        output_len = _field(line, "output_len", int, where)
        if not arrival >= 0 or output_len < 1:
            raise ValueError(f"{where}: arrival_s must be >= 0 and output_len >= 1")
        if "input_ids" in line:
            ids = _field(line, "input_ids", list, where)
            if not ids or not all(isinstance(t, int) and 0 <= t < 2**31 for t in ids):
                raise ValueError(f"{where}: input_ids must be a non-empty list of token ids")
            prefix, user = EMPTY, np.asarray(ids, dtype=np.int32)
        else:
            prompt_len = _field(line, "prompt_len", int, where)
            g = line.get("prefix_group")
            plen = _field(line, "prefix_len", int, where) if g is not None else 0
            if not 0 <= plen < prompt_len:
                raise ValueError(f"{where}: need 0 <= prefix_len < prompt_len")
            prefix = groups[g][:plen] if g is not None else EMPTY
            rng = np.random.default_rng((seed, 2, i))
            user = rng.integers(low, high, prompt_len - plen, dtype=np.int32)
        lora = line.get("lora")
        if lora is not None and not isinstance(lora, str):
            raise ValueError(f"{where}: 'lora' must be an adapter's name (a string)")
        sessions.append(SimSession(sid, prefix, (SimTurn(user, output_len),), arrival, lora))
    return sessions


def write_jsonl(sessions: Iterable[SimSession], stream: TextIO) -> int:
    """Write one-turn sessions as ``input_ids`` lines (a multi-turn session's later prompts
    depend on its answers: refused). Returns the number of lines."""
    n = 0
    for s in sorted(sessions, key=lambda s: (s.arrival_s, s.sid)):
        if len(s.turns) != 1:
            raise ValueError(
                "JSONL holds one request per line: a multi-turn trace cannot be written"
            )
        turn = s.turns[0]
        ids = np.concatenate([s.prefix_ids, turn.user_ids]).tolist()
        line = {"arrival_s": s.arrival_s, "input_ids": ids, "output_len": turn.output_len}
        if s.lora is not None:
            line["lora"] = s.lora
        stream.write(json.dumps(line, separators=(",", ":")) + "\n")
        n += 1
    return n


def load_jsonl(
    path: str | Path, seed: int = 0, token_range: tuple[int, int] = (3, 32000)
) -> list[SimSession]:
    with open(path, encoding="utf-8") as f:
        return read_jsonl(f, seed, token_range)
