"""Plain records shared by every layer: sampling parameters, requests, their states.

``Req`` lives here (not in ``runtime/``) because the policy layer, which sits below the
runtime, orders and admits requests. It holds no tensors of the model and no pool objects,
only the indices the scheduler hands it.
"""

from __future__ import annotations

import enum
import itertools
import math
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_rid_counter = itertools.count()
# below this a temperature is greedy (SGLang's _SAMPLING_EPS): logits / 1e-45 overflow to inf
GREEDY_TEMPERATURE = 1e-5
_FLOAT_PARAMS = (
    "temperature",
    "top_p",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
)

_GRAMMAR_PARAMS = ("regex", "json_schema", "ebnf")


def new_rid() -> str:
    return f"req-{next(_rid_counter)}-{time.monotonic_ns() % 1_000_000_000:09d}"


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling parameters, with OpenAI/SGLang names and defaults.

    ``validate()`` raises ``ValueError`` for bad values; the API maps it to HTTP 400.
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    skip_special_tokens: bool = True
    # structured output: at most one; ``json_schema`` is a JSON string here (the API serializes
    # an object), ``ebnf`` a Lark/EBNF grammar (see docs/structured_output.md)
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    # the grammar constrains only what follows this token (the end of a reasoning block,
    # ``</think>``): before it the output is free, so structured output never binds thinking
    grammar_after_token: int | None = None
    # token id -> added to its logit before sampling (OpenAI's logit_bias, -100 to 100)
    logit_bias: dict[int, float] | None = None

    def validate(self) -> SamplingParams:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 0:
            raise ValueError(
                f"max_new_tokens must be a non-negative integer, got {self.max_new_tokens!r}"
            )
        for name in _FLOAT_PARAMS:
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.temperature < GREEDY_TEMPERATURE:  # 1/temperature would overflow: greedy
            self.temperature = 0.0
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disabled) or >= 1, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not -2 <= self.frequency_penalty <= 2:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if not -2 <= self.presence_penalty <= 2:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not 0 < self.repetition_penalty <= 2:
            raise ValueError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop must be a non-empty string or a list of non-empty strings")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be non-negative integers")
        constraints = [n for n in _GRAMMAR_PARAMS if getattr(self, n) is not None]
        if len(constraints) > 1:
            raise ValueError(f"give at most one of regex, json_schema and ebnf, got {constraints}")
        for name in constraints:
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string")
        for token, bias in (self.logit_bias or {}).items():
            if not isinstance(token, int) or token < 0:
                raise ValueError(f"logit_bias keys are token ids, got {token!r}")
            if not (isinstance(bias, int | float) and -100 <= bias <= 100):
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias!r}")
        after = self.grammar_after_token
        if after is not None and (not isinstance(after, int) or after < 0 or not constraints):
            raise ValueError("grammar_after_token is a token id, and needs a grammar")
        return self

    @property
    def grammar_key(self) -> tuple[str, str] | None:
        """``(kind, source)`` of the request's grammar (the compile cache's key), or ``None``."""
        for name in _GRAMMAR_PARAMS:
            value = getattr(self, name)
            if value is not None:
                return name, value
        return None

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


class FinishKind(enum.Enum):
    STOP_TOKEN = "stop"  # EOS or a stop token id
    STOP_STR = "stop_str"
    LENGTH = "length"
    ABORT = "abort"


@dataclass(frozen=True, slots=True)
class FinishReason:
    kind: FinishKind
    matched: int | str | None = None  # the stop token id or stop string that matched
    message: str = ""  # why, for aborts and errors

    @property
    def openai_reason(self) -> str:
        """The OpenAI ``finish_reason``: ``stop``, ``length`` or ``abort``."""
        if self.kind in (FinishKind.STOP_TOKEN, FinishKind.STOP_STR):
            return "stop"
        return self.kind.value


@dataclass(eq=False)
class Req:
    """One generation request and its place in the KV memory.

    Token spans (one vocabulary everywhere):
      ``prompt_len``  = len(origin_input_ids)
      ``output_len``  = len(output_ids)
      ``seq_len``     = prompt_len + output_len
      ``prefix_len``  = len(prefix_indices): tokens whose KV the request shares with the tree
                        (the cache hit, plus what earlier chunks computed and cached)
      ``kv_len``      = tokens that have a KV slot in the request's ``req_to_token`` row
      ``extend_len``  = tokens computed in an EXTEND step (the admission plan's, not a field)

    The KV fields (``req_pool_idx``, ``prefix_indices``, ``last_node``, ``kv_len``,
    ``swap_node``) are written by ``runtime.KVManager`` alone; everyone else reads them. ``fill_ids`` is an int32 view of
    prompt plus output (no copy), so the radix tree takes it as a key without converting.
    """

    rid: str
    origin_input_ids: Sequence[int]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    priority: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    extra_key: str | None = None  # its radix-cache namespace (its adapter's, then the caller's)
    lora_id: str | None = None  # the uid of its LoRA adapter (None: the base model)
    arrival_processed_tokens: int = 0  # prompt tokens the scheduler had computed at its arrival
    eos_token_ids: frozenset[int] = frozenset()
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1  # >= 0: also return logprobs of prompt tokens from here on

    output_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None

    # KV bookkeeping, written by the KVManager only
    req_pool_idx: int | None = None
    prefix_indices: Any = None  # torch int64 tensor of KV slots of the matched/computed prefix
    last_node: Any = None  # the radix node that prefix_indices ends at (locked while running)
    kv_len: int = 0  # row[:kv_len] holds slots; row[prefix_len:kv_len] are the request's own
    # a swapped-out request's lock on its KV in the tier (preemption_mode="swap"), dropped when
    # it is admitted again (docs/kv_tier.md)
    swap_node: Any = None
    cached_tokens: int = 0  # prompt tokens served from the cache, summed over (re)admissions
    cached_tokens_tier: int = 0  # the part of cached_tokens loaded back from the KV tier
    num_preemptions: int = 0
    num_retractions: int = 0
    skipped_passes: int = 0  # passes it was passed over by a cache-aware policy (aging)
    stop_matcher: Any = field(default=None, repr=False)  # its stop strings' automaton (judge)
    # its grammar's matcher state (runtime.grammar.ReqGrammar), when the request is constrained
    grammar: Any = field(default=None, repr=False)
    # an exception one of its own objects raised outside the scheduler's result step (its
    # grammar filling the batch's mask): the scheduler ends it with an error at its next result
    failure: Exception | None = field(default=None, repr=False)

    # speculative decoding (docs/speculative.md): its drafter's state (``spec.DraftLength``), its
    # verify steps (None: speculation off) and the drafted tokens they accepted
    spec_state: Any = field(default=None, repr=False)
    spec_verify_ct: int | None = None
    spec_accepted_tokens: int = 0

    # outputs for logprobs
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    input_logprobs: list[float] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)

    # prompt + output as int32, grown by doubling: fill_ids is a view of its first seq_len
    _tokens: np.ndarray = field(init=False, repr=False)
    _num_tokens: int = field(init=False, repr=False, default=0)

    def __post_init__(self) -> None:
        self._sync_tokens()

    def append_output(self, token: int) -> None:
        """Add one generated token (to ``output_ids`` and to ``fill_ids``)."""
        self.output_ids.append(token)
        n = self._num_tokens
        if n != self.seq_len - 1:  # output_ids was changed by hand: rebuild
            self._sync_tokens()
            return
        if n == len(self._tokens):
            grown = np.empty(2 * n, dtype=np.int32)
            grown[:n] = self._tokens
            self._tokens = grown
        self._tokens[n] = token
        self._num_tokens = n + 1

    @property
    def prompt_len(self) -> int:
        return len(self.origin_input_ids)

    @property
    def output_len(self) -> int:
        return len(self.output_ids)

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def prefix_len(self) -> int:
        indices = self.prefix_indices  # a tensor: shape[0] is several times cheaper than len()
        return 0 if indices is None else int(indices.shape[0])

    @property
    def fill_ids(self) -> np.ndarray:
        """Every token whose KV the request needs: prompt plus output so far (int32, a view)."""
        if self._num_tokens != self.seq_len:
            self._sync_tokens()
        return self._tokens[: self._num_tokens]

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def max_new_tokens(self) -> int:
        return self.sampling_params.max_new_tokens

    def remaining_new_tokens(self) -> int:
        return max(self.sampling_params.max_new_tokens - len(self.output_ids), 0)

    def _sync_tokens(self) -> None:
        n = self.seq_len
        tokens = np.empty(max(2 * n, 16), dtype=np.int32)
        tokens[: self.prompt_len] = _as_int32(self.origin_input_ids)
        tokens[self.prompt_len : n] = _as_int32(self.output_ids)
        self._tokens, self._num_tokens = tokens, n


def _as_int32(ids: Sequence[int]) -> np.ndarray:
    """Token ids as int32: a list through ``struct`` (3x faster than numpy's per-item checks),
    anything else (or ids out of the int32 range) through ``np.asarray``."""
    if isinstance(ids, list):
        try:
            return np.frombuffer(struct.pack(f"{len(ids)}i", *ids), dtype=np.int32)
        except struct.error:
            pass
    return np.asarray(ids, dtype=np.int32)
