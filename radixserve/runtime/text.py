"""Output text for the in-process Engine: incremental decoding and SGLang-shaped result dicts."""

from __future__ import annotations

from typing import Any

from radixserve.runtime.io_struct import ReqOutput
from radixserve.types import FinishKind, FinishReason, SamplingParams


class IncrementalText:
    """Accumulates a request's outputs; ``add`` returns the text that became final.

    Text ending in an incomplete UTF-8 sequence (U+FFFD) is held back until the next token
    completes it; a matched stop string and everything after it is trimmed.
    """

    def __init__(self, tokenizer: Any | None, params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.params = params
        self.output_ids: list[int] = []
        self.text = ""
        self.sent = 0
        self.finish_reason: FinishReason | None = None
        self.logprobs: list[tuple[float, int]] = []
        self.top_logprobs: list[list[tuple[int, float]]] = []
        self.input_logprobs: list[float] | None = None
        self.last: ReqOutput | None = None

    def add(self, out: ReqOutput) -> str:
        self.output_ids.extend(out.new_token_ids)
        self.logprobs.extend(zip(out.new_logprobs, out.new_token_ids, strict=False))
        self.top_logprobs.extend(out.new_top_logprobs)
        if out.input_logprobs is not None:
            self.input_logprobs = out.input_logprobs
        self.finish_reason = out.finish_reason
        self.last = out
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(
            self.output_ids, skip_special_tokens=self.params.skip_special_tokens
        )
        final = out.finish_reason is not None
        cut = _stop_cut(text, self.params.stop)
        if cut is not None:
            text = text[:cut]
        elif not final:
            # keep back a possible stop-string prefix and an incomplete character
            text = text.rstrip("\ufffd")
            hold = max((len(s) - 1 for s in self.params.stop), default=0)
            text = text[: max(len(text) - hold, self.sent)]
        self.text = text
        delta, self.sent = text[self.sent :], max(len(text), self.sent)
        return delta


def _stop_cut(text: str, stops: list[str]) -> int | None:
    positions = [text.find(s) for s in stops if s in text]
    return min(positions) if positions else None


def output_dict(text: IncrementalText, out: ReqOutput, delta: str | None = None) -> dict[str, Any]:
    """SGLang's ``/generate`` result: text, output_ids, meta_info."""
    reason = out.finish_reason
    meta: dict[str, Any] = {
        "id": out.rid,
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": out.completion_tokens,
        "cached_tokens": out.cached_tokens,
        "finish_reason": None if reason is None else _finish_dict(reason),
    }
    if text.logprobs:
        meta["output_token_logprobs"] = [(lp, tid, None) for lp, tid in text.logprobs]
        if text.top_logprobs:
            meta["output_top_logprobs"] = text.top_logprobs
    if text.input_logprobs is not None:
        meta["input_token_logprobs"] = text.input_logprobs
    return {
        "text": text.text if delta is None else delta,
        "output_ids": list(text.output_ids) if delta is None else list(out.new_token_ids),
        "meta_info": meta,
    }


def _finish_dict(reason: FinishReason) -> dict[str, Any]:
    out: dict[str, Any] = {"type": reason.openai_reason, "matched": reason.matched}
    if reason.kind is FinishKind.ABORT:
        out["message"] = reason.message
    return out
