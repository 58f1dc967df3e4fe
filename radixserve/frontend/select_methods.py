"""How ``select`` turns each choice's token log-probabilities into a score: pure functions in a
registry, and the decision (highest score, first on ties)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

ScoreFn = Callable[[Sequence[float]], float]


def token_length_normalized(logprobs: Sequence[float]) -> float:
    """Mean log-probability per token: choices of different token lengths compete fairly."""
    return sum(logprobs) / len(logprobs) if logprobs else float("-inf")


def total_logprob(logprobs: Sequence[float]) -> float:
    """log P(choice | prefix): favours short choices."""
    return sum(logprobs) if logprobs else float("-inf")


SELECT_METHODS: dict[str, ScoreFn] = {
    "token_length_normalized": token_length_normalized,
    "sum": total_logprob,
}


@dataclass(frozen=True, slots=True)
class ChoiceLogprobs:
    """One choice's scored tokens: ``logprobs[i]`` is log P(token_ids[i] | everything before).

    ``token_ids`` is empty when the backend scored text it could not tokenize itself.
    """

    choice: str
    logprobs: list[float]
    token_ids: list[int]
    meta_info: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SelectResult:
    decision: str
    index: int
    scores: list[float]
    choices: list[ChoiceLogprobs]

    def meta_info(self) -> dict[str, Any]:
        """What ``state.get_meta_info(name)`` returns for a select."""
        return {
            "decision": self.decision,
            "index": self.index,
            "scores": list(self.scores),
            "choice_token_logprobs": [c.logprobs for c in self.choices],
            "choice_token_ids": [c.token_ids for c in self.choices],
            "cached_tokens": [c.meta_info.get("cached_tokens") for c in self.choices],
            "prompt_tokens": [c.meta_info.get("prompt_tokens") for c in self.choices],
        }


def decide(scored: list[ChoiceLogprobs], method: str | ScoreFn) -> SelectResult:
    """The choice with the highest score under ``method`` (the first one on ties)."""
    fn = SELECT_METHODS[method] if isinstance(method, str) else method
    scores = [float(fn(c.logprobs)) for c in scored]
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))
    return SelectResult(scored[best].choice, best, scores, scored)
