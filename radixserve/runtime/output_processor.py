"""Turning sampled tokens into request state: stop conditions and ReqOutput messages."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from radixserve.runtime.grammar.jump_forward import jump_forward
from radixserve.runtime.io_struct import ReqOutput
from radixserve.runtime.stop_matcher import StopMatcher
from radixserve.runtime.stop_strings import match_stop_str
from radixserve.types import FinishKind, FinishReason, Req

if TYPE_CHECKING:
    from radixserve.runtime.model_worker import BatchResult


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
        spec_verify_ct=req.spec_verify_ct,
        spec_accepted_tokens=req.spec_accepted_tokens,
    )
    if req.return_logprob and num_new_logprobs:
        out.new_logprobs = req.output_logprobs[-num_new_logprobs:]
        if req.top_logprobs_num:
            out.new_top_logprobs = req.output_top_logprobs[-num_new_logprobs:]
    return out


def advance(
    req: Req,
    result: BatchResult,
    i: int,
    max_context_len: int,
    tokenizer: Any | None,
    enable_jump_forward: bool,
) -> tuple[ReqOutput, int]:
    """Row ``i`` of ``result`` applied to ``req``: its sampled token appended (its grammar
    accepts it; after a verify, each token it kept, up to one that ends it), its end judged,
    the tokens its grammar forces next appended (jump-forward). Returns the step's message
    and how many tokens were jumped.

    Everything here runs the request's own objects (grammar, stop matcher, tokenizer): an
    exception is that request's failure (``req.failure``, from the batch's mask, included),
    which the scheduler turns into that request's error."""
    if req.failure is not None:
        raise req.failure
    is_first = req.output_len == 0
    num_new = jumped = 0
    num_tokens = result.num_tokens(i) if req.max_new_tokens > 0 else 0
    for j in range(num_tokens):  # several after a verify: judged one by one, up to the end
        result.append_token(req, i, j)
        num_new += 1
        if req.grammar is not None:
            req.grammar.accept(req.output_ids[-1])
        req.finish_reason = check_finished(req, max_context_len, tokenizer)
        if req.finish_reason is not None:
            break
    if num_tokens == 0:
        req.finish_reason = check_finished(req, max_context_len, tokenizer)
    if req.finish_reason is None and enable_jump_forward and req.grammar:
        jumped = jump_forward(req, max_context_len)
        if jumped:
            num_new += jumped
            req.finish_reason = check_finished(req, max_context_len, tokenizer)
    out = make_output(req, req.output_ids[-num_new:] if num_new else [], num_new)
    if is_first and req.logprob_start_len >= 0:
        out.input_logprobs = list(req.input_logprobs)
        if req.top_logprobs_num:
            out.input_top_logprobs = list(req.input_top_logprobs)
    return out, jumped
