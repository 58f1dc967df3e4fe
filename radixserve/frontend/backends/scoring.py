"""``select``'s scoring, shared by the backends: one prefill of the shared prefix, then one
prefill per choice on top of it, with prompt log-probabilities from the choice's first token.

Token boundaries. The backend tokenizes ``prefix + choice`` as a whole (what a model sees when
the choice is appended as text), and BPE may merge the prefix's last characters with the
choice's first ones, so the choice's tokens are those after the longest common token prefix of
``tokenize(prefix)`` and ``tokenize(prefix + choice)``; a merged boundary token counts as the
choice's. Every choice of one select is sent in one batch with the same ``logprob_start_len``
(the smallest of those boundaries), which caps the radix-cache match there (the logits that
predict the first scored token must be computed) and costs at most a token or two per choice.

Without a tokenizer (a remote server whose model files are not local) the boundary is unknown:
scoring starts at the prefix's last token, whose log-probability is the same for every choice
unless it merged; it shifts ``sum`` equally for all and ``token_length_normalized`` slightly.
"""

from __future__ import annotations

from typing import Any, Protocol

from radixserve.frontend.errors import BackendError
from radixserve.frontend.select_methods import ChoiceLogprobs

PromptInputs = list[list[int]] | list[str]


class PrefillClient(Protocol):
    """The two calls a backend implements for scoring."""

    @property
    def tokenizer(self) -> Any | None: ...

    def cache_prefix(self, prompt: str) -> dict[str, Any]: ...

    def prompt_logprobs(
        self, inputs: PromptInputs, start: int
    ) -> list[tuple[list[float], list[int], dict[str, Any]]]:
        """For each input (token ids or text), prefill without generating and return
        ``(logprobs, token_ids, meta_info)`` where ``logprobs[k]`` is log P(token_ids[k] |
        tokens before it), for prompt positions ``max(start, 1)`` to the end."""
        ...


def score_choices(client: PrefillClient, prefix: str, choices: list[str]) -> list[ChoiceLogprobs]:
    """Each choice's token log-probabilities after ``prefix`` (see the module docstring)."""
    if not prefix:
        raise ValueError("select needs some text before it to condition the choices on")
    prefix_meta = client.cache_prefix(prefix)  # computed once; every choice then hits it
    tokenizer = client.tokenizer
    if tokenizer is None:
        start = max(int(prefix_meta["prompt_tokens"]) - 1, 0)
        rows = client.prompt_logprobs([prefix + c for c in choices], start)
        return [
            ChoiceLogprobs(c, list(lps), list(ids), meta)
            for c, (lps, ids, meta) in zip(choices, rows, strict=True)
        ]
    prefix_ids = _encode(tokenizer, prefix)
    fulls = [_encode(tokenizer, prefix + c) for c in choices]
    # the first token of each choice; a choice's first token is never predicted from nothing
    boundaries = [max(min(_common_prefix_len(prefix_ids, ids), len(ids) - 1), 1) for ids in fulls]
    start = min(boundaries)
    rows = client.prompt_logprobs(fulls, start)
    out = []
    for choice, ids, boundary, (lps, _, meta) in zip(choices, fulls, boundaries, rows, strict=True):
        skip = boundary - max(start, 1)
        out.append(ChoiceLogprobs(choice, list(lps[skip:]), ids[boundary:], meta))
    return out


def prompt_logprob_rows(
    inputs: PromptInputs, outs: list[dict[str, Any]], start: int
) -> list[tuple[list[float], list[int], dict[str, Any]]]:
    """``prompt_logprobs``'s rows from the ``/generate`` results of ``inputs`` (the one parser
    of both backends: the Engine and the server answer in the same shape). ``meta_info``'s
    ``input_token_logprobs`` has one ``[logprob, token_id, text]`` per prompt token from
    ``start`` on; only the prompt's very first token has no logprob (None)."""
    by_ids = bool(inputs) and isinstance(inputs[0], list)
    first = max(start, 1)
    rows = []
    for item, out in zip(inputs, outs, strict=True):
        meta = out["meta_info"]
        entries = list(meta.get("input_token_logprobs") or [])[first - start :]
        if any(e[0] is None for e in entries) or (
            by_ids and [int(e[1]) for e in entries] != list(item)[first:]  # type: ignore[arg-type]
        ):
            raise BackendError(
                f"the input_token_logprobs for logprob_start_len={start} are not aligned "
                "with the prompt tokens (one logprob per token from that position)"
            )
        rows.append(([float(e[0]) for e in entries], [int(e[1]) for e in entries], meta))
    return rows


def _encode(tokenizer: Any, text: str) -> list[int]:
    """As the server tokenizes a ``text`` prompt (special tokens added as it adds them)."""
    return list(tokenizer.encode(text))


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
