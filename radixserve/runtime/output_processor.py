"""Turning sampled tokens into request state: stop conditions and ReqOutput messages."""

from __future__ import annotations

from typing import Any

from radixserve.runtime.io_struct import ReqOutput
from radixserve.runtime.stop_matcher import StopMatcher
from radixserve.runtime.stop_strings import match_stop_str
from radixserve.types import FinishKind, FinishReason, Req


def check_finished(req: Req, max_context_len: int, tokenizer: Any | None) -> FinishReason | None:
    """Why ``req`` stops after its last output token, or ``None``: the one judge of a request's
    end. Order: stop token, stop string (the text the client sees; needs a tokenizer, see
    ``stop_strings.py``), a terminated grammar (``stop``, matched ``None``), length. A stop
    string completed by the last allowed token is a stop string (its text is cut), not a
    length."""
    params = req.sampling_params
    if req.output_ids:
        last = req.output_ids[-1]
        if last in params.stop_token_ids:
            return FinishReason(FinishKind.STOP_TOKEN, last)
        if not params.ignore_eos and last in req.eos_token_ids:
            return FinishReason(FinishKind.STOP_TOKEN, last)
    if params.stop and tokenizer is not None:
        if req.stop_matcher is None:  # built once per request: the judge scans each tail once
            req.stop_matcher = StopMatcher(params.stop)
        stop = match_stop_str(
            tokenizer,
            req.origin_input_ids,
            req.output_ids,
            req.stop_matcher,
            params.skip_special_tokens,
        )
        if stop is not None:
            return FinishReason(FinishKind.STOP_STR, stop)
    if req.grammar is not None and req.output_ids and req.grammar.is_terminated():
        return FinishReason(FinishKind.STOP_TOKEN)  # the grammar is complete: nothing may follow
    if req.output_len >= params.max_new_tokens or req.seq_len >= max_context_len:
        return FinishReason(FinishKind.LENGTH)
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
        cached_tokens_tier=req.cached_tokens_tier,
    )
    if req.return_logprob and num_new_logprobs:
        out.new_logprobs = req.output_logprobs[-num_new_logprobs:]
        if req.top_logprobs_num:
            out.new_top_logprobs = req.output_top_logprobs[-num_new_logprobs:]
    return out
