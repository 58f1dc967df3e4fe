"""Turning sampled tokens into request state: stop conditions and ReqOutput messages."""

from __future__ import annotations

from typing import Any

from radixserve.runtime.io_struct import ReqOutput
from radixserve.types import FinishKind, FinishReason, Req

STOP_STR_LOOKBACK_TOKENS = 16


def check_finished(req: Req, max_context_len: int, tokenizer: Any | None) -> FinishReason | None:
    """Why ``req`` stops after its last output token, or ``None``. Order: stop token, length,
    stop string (seen in the decoded tail, which needs a tokenizer)."""
    params = req.sampling_params
    if req.output_ids:
        last = req.output_ids[-1]
        if last in params.stop_token_ids:
            return FinishReason(FinishKind.STOP_TOKEN, last)
        if not params.ignore_eos and last in req.eos_token_ids:
            return FinishReason(FinishKind.STOP_TOKEN, last)
    if req.output_len >= params.max_new_tokens or req.seq_len >= max_context_len:
        return FinishReason(FinishKind.LENGTH)
    if params.stop and tokenizer is not None and req.output_ids:
        tail = tokenizer.decode(
            req.output_ids[-STOP_STR_LOOKBACK_TOKENS:], skip_special_tokens=False
        )
        for stop in params.stop:
            if stop in tail:
                return FinishReason(FinishKind.STOP_STR, stop)
    return None


def make_output(req: Req, new_token_ids: list[int], num_new_logprobs: int = 0) -> ReqOutput:
    """The message for one step of ``req``: its new tokens (and their logprobs when asked)."""
    out = ReqOutput(
        rid=req.rid,
        new_token_ids=new_token_ids,
        finish_reason=req.finish_reason,
        prompt_tokens=req.prompt_len,
        completion_tokens=req.output_len,
        cached_tokens=req.cached_tokens,
    )
    if req.return_logprob and num_new_logprobs:
        out.new_logprobs = req.output_logprobs[-num_new_logprobs:]
        if req.top_logprobs_num:
            out.new_top_logprobs = req.output_top_logprobs[-num_new_logprobs:]
    return out
