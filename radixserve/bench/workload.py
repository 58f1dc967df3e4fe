"""Synthetic workloads as token ids: multi-turn chat and shared-prefix groups.

Both are lists of :class:`Session`: a fixed prefix (a system prompt, or nothing) followed by
turns, each a user message and an answer of a known length. Turn ``t``'s prompt is the prefix,
every earlier user message and answer, and user message ``t``; the answers are whatever the
system under test generates (``ignore_eos``, so their lengths are exact). Token ids are drawn
uniformly from ``[low, high)``, the tokenizer's ordinary (non-special) ids, or, given a
``corpus`` (real text through the model's tokenizer), as windows of it at random offsets: the
same lengths and cache structure, prompts a real tokenizer wrote.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np

# below this many ids, moving the generator's state to numpy and back costs more than it saves
_BLOCK_MIN = 256


@dataclass(frozen=True, slots=True)
class Turn:
    user_ids: list[int]
    answer_len: int
    # appended instead of the answer when a system returns no output ids (a plain OpenAI server)
    fallback_answer_ids: list[int]


@dataclass(frozen=True, slots=True)
class Session:
    """One conversation (or one request, for shared-prefix): run its turns in order."""

    sid: int
    prefix_ids: list[int]
    turns: list[Turn]
    arrival_s: float = 0.0  # offset from the start of the run when it may begin


@dataclass(frozen=True, slots=True)
class MultiTurnSpec:
    """SGLang's ``benchmark/multi_turn_chat`` shape."""

    num_conversations: int = 8
    num_turns: int = 4
    user_len: tuple[int, int] = (64, 64)  # inclusive range
    answer_len: tuple[int, int] = (32, 32)
    parallel: int = 8
    system_len: int = 0  # a system prompt shared by all conversations (0: none, like SGLang)
    seed: int = 0


@dataclass(frozen=True, slots=True)
class SharedPrefixSpec:
    """SGLang's ``generated-shared-prefix`` shape, with Poisson arrivals (``rate`` inf: all at
    once)."""

    num_groups: int = 4
    prompts_per_group: int = 8
    system_len: int = 512
    question_len: int = 64
    output_len: int = 16
    request_rate: float = float("inf")
    max_concurrency: int = 64
    seed: int = 0


class TokenSource:
    """Seeded random token ids in ``[low, high)``."""

    def __init__(self, low: int, high: int, seed: int) -> None:
        if not 0 <= low < high:
            raise ValueError(f"bad token id range [{low}, {high})")
        self.low, self.high = low, high
        self.rng = random.Random(seed)

    def ids(self, n: int) -> list[int]:
        if n >= _BLOCK_MIN:
            return randrange_block(self.rng, self.low, self.high, n).tolist()
        return [self.rng.randrange(self.low, self.high) for _ in range(n)]

    def block(self, n: int) -> np.ndarray:
        """``ids(n)`` as an int64 array (what a block of per-token draws gives)."""
        return randrange_block(self.rng, self.low, self.high, n)

    def length(self, bounds: tuple[int, int]) -> int:
        lo, hi = bounds
        if not 1 <= lo <= hi:
            raise ValueError(f"bad length range {bounds}")
        return self.rng.randint(lo, hi)


class TextSource(TokenSource):
    """Seeded windows of ``corpus`` (a tokenized text), each at a random offset (wrapping).

    It draws what a :class:`TokenSource` of the same range would, and takes each window's
    offset from those numbers, so a text trace has exactly the lengths, answers' lengths,
    order and arrivals of the random trace of the same seed."""

    def __init__(self, low: int, high: int, seed: int, corpus: np.ndarray) -> None:
        if len(corpus) == 0:
            raise ValueError("an empty corpus")
        super().__init__(low, high, seed)
        self.corpus = corpus

    def ids(self, n: int) -> list[int]:
        return self.block(n).tolist()

    def block(self, n: int) -> np.ndarray:
        drawn = super().block(n)
        start = int(drawn.sum()) % len(self.corpus)
        return np.take(self.corpus, np.arange(start, start + n), mode="wrap").astype(np.int64)


def token_source(low: int, high: int, seed: int, corpus: np.ndarray | None = None) -> TokenSource:
    return TokenSource(low, high, seed) if corpus is None else TextSource(low, high, seed, corpus)


def randrange_block(rng: random.Random, low: int, high: int, n: int) -> np.ndarray:
    """``[rng.randrange(low, high) for _ in range(n)]`` as an int64 array, the same numbers at
    numpy speed, leaving ``rng`` where those calls would have.

    CPython draws ``randrange`` by rejection: ``k = width.bit_length()`` bits, the top ``k`` of
    one 32-bit Mersenne Twister output (for ``k <= 32``), redrawn while ``>= width``. numpy's
    ``MT19937`` is the same generator, so it takes over ``rng``'s state, yields the raw
    outputs, and hands the state back. Widths over 32 bits take the plain loop.
    ``tests/bench/test_workload.py`` checks it against ``randrange`` itself."""
    width = high - low
    if width < 1:
        raise ValueError(f"empty range [{low}, {high})")
    k = width.bit_length()
    if k > 32:
        return np.array([rng.randrange(low, high) for _ in range(n)], dtype=np.int64)
    version, internal, gauss = rng.getstate()
    bitgen = np.random.MT19937()
    bitgen.state = {
        "bit_generator": "MT19937",
        "state": {"key": np.array(internal[:-1], dtype=np.uint32), "pos": internal[-1]},
    }
    parts, need = [], n
    while need:  # each round draws exactly one output per id still owed: none is wasted
        raw = bitgen.random_raw(need) >> np.uint64(32 - k)
        kept = raw[raw < width]
        parts.append(kept)
        need -= len(kept)
    state = bitgen.state["state"]
    rng.setstate((version, (*state["key"].tolist(), int(state["pos"])), gauss))
    out = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)
    return out + low


def make_multiturn(
    spec: MultiTurnSpec, low: int, high: int, corpus: np.ndarray | None = None
) -> list[Session]:
    src = token_source(low, high, spec.seed, corpus)
    system = src.ids(spec.system_len)
    sessions = []
    for sid in range(spec.num_conversations):
        turns = []
        for _ in range(spec.num_turns):
            user = src.ids(src.length(spec.user_len))
            answer_len = src.length(spec.answer_len)
            turns.append(Turn(user, answer_len, src.ids(answer_len)))
        sessions.append(Session(sid, list(system), turns))
    return sessions


@dataclass(frozen=True, slots=True)
class SharedPrefixDraw:
    """The random numbers of a shared-prefix trace, as arrays (the simulator builds its sessions
    from them without a round trip through lists). Request ``i`` belongs to group
    ``i // prompts_per_group``; session ``sid`` is request ``order[sid]``."""

    systems: np.ndarray  # [num_groups, system_len] int64
    questions: np.ndarray  # [num_requests, question_len] int64
    answers: np.ndarray  # [num_requests, output_len] int64: the fallback answers
    order: list[int]
    arrivals: list[float]  # per session


def draw_shared_prefix(
    spec: SharedPrefixSpec, low: int, high: int, corpus: np.ndarray | None = None
) -> SharedPrefixDraw:
    """The draws of :func:`make_shared_prefix`, in its order: every system prompt, then per
    request its question and its fallback answer (one block draw), the shuffle, the arrivals."""
    src = token_source(low, high, spec.seed, corpus)
    sys_len, q_len, a_len = spec.system_len, spec.question_len, spec.output_len
    num = spec.num_groups * spec.prompts_per_group
    ids = src.block(spec.num_groups * sys_len + num * (q_len + a_len))
    systems = ids[: spec.num_groups * sys_len].reshape(spec.num_groups, sys_len)
    per_req = ids[spec.num_groups * sys_len :].reshape(num, q_len + a_len)
    order = list(range(num))
    src.rng.shuffle(order)  # the permutation shuffling the requests themselves would give
    arrivals, t = [], 0.0
    for _ in range(num):
        arrivals.append(t)
        if spec.request_rate != float("inf"):
            t += src.rng.expovariate(spec.request_rate)
    return SharedPrefixDraw(systems, per_req[:, :q_len], per_req[:, q_len:], order, arrivals)


def make_shared_prefix(
    spec: SharedPrefixSpec, low: int, high: int, corpus: np.ndarray | None = None
) -> list[Session]:
    """Group-major order (all of group 0, then group 1, ...), shuffled like SGLang's, with
    Poisson arrival offsets at ``request_rate`` requests/s."""
    draw = draw_shared_prefix(spec, low, high, corpus)
    systems = draw.systems.tolist()
    questions, answers = draw.questions.tolist(), draw.answers.tolist()
    per_group = spec.prompts_per_group
    return [
        # a group's sessions share one prefix list (read only; a client copies it)
        Session(sid, systems[i // per_group], [Turn(questions[i], spec.output_len, answers[i])], t)
        for sid, (i, t) in enumerate(zip(draw.order, draw.arrivals, strict=True))
    ]


def num_requests(sessions: list[Session]) -> int:
    return sum(len(s.turns) for s in sessions)


def trace_tokens(sessions: list[Session]) -> int:
    """The trace's distinct tokens, what a cache that never evicts holds at its end: each
    distinct prefix once, every user message and answer (at its trace length). Size a pool as a
    share of this (``--max-total-tokens``) to see eviction at work."""
    prefixes = {tuple(s.prefix_ids) for s in sessions}
    turns = sum(len(t.user_ids) + t.answer_len for s in sessions for t in s.turns)
    return sum(len(p) for p in prefixes) + turns


# the default shapes; flags override any field
MULTITURN_SHAPES: dict[str, dict[str, Any]] = {
    # chat-like: 64-token user turns, 32-token answers
    "a": dict(conversations=8, turns=4, user_len=(64, 64), answer_len=(32, 32), parallel=8),
    # SGLang's multi_turn_chat defaults (short answers: prefill dominates), fewer conversations
    "b": dict(conversations=4, turns=4, user_len=(256, 512), answer_len=(4, 8), parallel=4),
    "quick": dict(conversations=4, turns=3, user_len=(16, 32), answer_len=(4, 8), parallel=4),
}
SHARED_PREFIX_SHAPES: dict[str, dict[str, Any]] = {
    "default": dict(groups=4, prompts_per_group=8, system_len=512, question_len=64, output_len=16),
    "quick": dict(groups=2, prompts_per_group=4, system_len=64, question_len=16, output_len=4),
}
