"""Output text for the in-process Engine: incremental decoding and SGLang-shaped result dicts."""

from __future__ import annotations

from typing import Any

from radixserve.runtime.io_struct import GenerateRequest, ReqOutput
from radixserve.server.detokenizer import INIT_CONTEXT_TOKENS, Detokenizer
from radixserve.server.io_struct import DetokenizeParams
from radixserve.types import FinishKind, FinishReason


class IncrementalText:
    """Accumulates a request's outputs; ``add`` returns the text that became final.

    Text comes from the server's :class:`Detokenizer` (incomplete UTF-8 held back, a matched
    stop string and everything after it trimmed). ``stopped_early`` is set when the text hit a
    stop string that the scheduler has not acted on yet: the caller aborts the request.
    """

    def __init__(self, tokenizer: Any | None, request: GenerateRequest) -> None:
        self.rid = request.rid
        self.output_ids: list[int] = []
        self.text = ""
        self.finish_reason: FinishReason | None = None
        self.stopped_early = False
        self.logprobs: list[tuple[float, int]] = []
        self.top_logprobs: list[list[tuple[int, float]]] = []
        self.input_logprobs: list[float] | None = None
        self._detok = Detokenizer(tokenizer) if tokenizer is not None else None
        if self._detok is not None:
            params = request.sampling_params
            tail = request.input_ids[-INIT_CONTEXT_TOKENS:]
            self._detok.register(
                DetokenizeParams(request.rid, params.stop, params.skip_special_tokens, tail)
            )

    def add(self, out: ReqOutput) -> str:
        self.output_ids.extend(out.new_token_ids)
        self.logprobs.extend(zip(out.new_logprobs, out.new_token_ids, strict=False))
        self.top_logprobs.extend(out.new_top_logprobs)
        if out.input_logprobs is not None:
            self.input_logprobs = out.input_logprobs
        self.finish_reason = out.finish_reason
        if self._detok is None:
            return ""
        text_out = self._detok.process(out)
        if text_out is None:
            return ""
        self.text += text_out.text
        if text_out.stopped_early or text_out.output.finish_reason is not None:
            self.finish_reason = text_out.output.finish_reason
            self.stopped_early = text_out.stopped_early
        return text_out.text


def output_dict(text: IncrementalText, out: ReqOutput, delta: str | None = None) -> dict[str, Any]:
    """SGLang's ``/generate`` result: text, output_ids, meta_info."""
    reason = text.finish_reason
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
