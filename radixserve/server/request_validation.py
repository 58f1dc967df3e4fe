"""RequestValidator: the checks a request passes before it reaches the scheduler, made once,
at the edge: by the HTTP process for the server, by ``Engine.generate`` in process (both give
the same errors).

Every failure is a ``ValueError`` whose message is shown to the client (HTTP 400). The
scheduler trusts what passed and checks only what it alone can see (``add_request``: a
duplicate rid, the KV pool's capacity); the sampler never validates.
"""

from __future__ import annotations

from radixserve.runtime.grammar import check_grammar
from radixserve.runtime.grammar.backend import CompileCache
from radixserve.runtime.io_struct import GenerateRequest, cache_scope
from radixserve.server.io_struct import SchedulerInfo
from radixserve.types import SamplingParams

MAX_TOP_LOGPROBS = 20
# what one request may carry: far past what any honest client sends, and small enough that no
# request's own work (stop strings decoded each step, a bias applied each step) slows others
MAX_STOP_TEXT_CHARS = 16384  # all of a request's stop strings together
MAX_STOP_STRING_CHARS = 512  # one stop string: each step decodes an output tail this long
MAX_LOGIT_BIAS = 2048  # entries of logit_bias (OpenAI documents 300)
MAX_STOP_TOKEN_IDS = 1024


class RequestValidator:
    """``num_text_tokens``: the tokenizer's size, where the model's vocabulary is padded past
    it (a logit bias may only name a token that is some text). ``auto_truncate`` (SGLang's
    ``--allow-auto-truncate``): a request asking for more new tokens than the context leaves
    gets what it leaves instead of a ``ValueError``."""

    def __init__(
        self,
        info: SchedulerInfo,
        default_max_new_tokens: int = 128,
        num_text_tokens: int | None = None,
        auto_truncate: bool = False,
    ) -> None:
        self.info = info
        self.auto_truncate = auto_truncate
        self.default_max_new_tokens = default_max_new_tokens
        self.num_text_tokens = min(info.vocab_size, num_text_tokens or info.vocab_size)
        self.grammars = CompileCache(check_grammar)  # keys already found valid, per scope

    def max_new_tokens_for(self, prompt_len: int, requested: int | None) -> int:
        """``requested``, or when ``None`` the default clipped to the context left."""
        if requested is not None:
            return requested
        return max(min(self.default_max_new_tokens, self.info.max_context_len - prompt_len), 0)

    def output_budget(self, prompt_len: int) -> int:
        """The most new tokens a request with a prompt of ``prompt_len`` tokens can be given:
        what the context leaves and the KV pool can hold (the scheduler refuses a request that
        could outgrow the pool). A chat request without ``max_tokens`` gets this."""
        fits = min(self.info.max_context_len, self.info.max_request_tokens)
        return max(fits - prompt_len, 0)

    def check_prompt(self, input_ids: list[int]) -> None:
        ctx = self.info.max_context_len
        if not input_ids:
            raise ValueError("the prompt is empty")
        if len(input_ids) >= ctx:
            raise ValueError(
                f"this model's maximum context length is {ctx} tokens; the prompt has "
                f"{len(input_ids)} tokens (it must leave room for at least one new token)"
            )
        vocab = self.info.vocab_size
        if any(
            not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab for t in input_ids
        ):
            raise ValueError(f"input ids must be integers in [0, {vocab})")

    def check_group(self, num_requests: int) -> None:
        """One HTTP request's (or call's) generations enter the queue together: more than the
        queue's bound could never be admitted (a 400 naming it, not a 429 retried forever)."""
        bound = self.info.max_queued_requests
        if bound is not None and num_requests > bound:
            raise ValueError(
                f"this request asks for {num_requests} generations; at most {bound} may wait "
                "in this server's queue (--max-queued-requests), so it could never be admitted"
            )

    def _check_carried(self, params: SamplingParams) -> None:
        """The bounds on what a request carries (stop strings, stop ids, logit bias)."""
        longest = max((len(s) for s in params.stop), default=0)
        if longest > MAX_STOP_STRING_CHARS:
            raise ValueError(
                f"a stop string holds {longest} characters; at most {MAX_STOP_STRING_CHARS}"
            )
        stop_chars = sum(len(s) for s in params.stop)
        if stop_chars > MAX_STOP_TEXT_CHARS:
            raise ValueError(
                f"the stop strings hold {stop_chars} characters; at most {MAX_STOP_TEXT_CHARS}"
            )
        if len(params.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(f"stop_token_ids has more than {MAX_STOP_TOKEN_IDS} ids")
        if any(t >= self.info.vocab_size for t in params.stop_token_ids):
            raise ValueError(f"stop_token_ids must be in [0, {self.info.vocab_size})")
        bias = params.logit_bias or {}
        if len(bias) > MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias has {len(bias)} entries; at most {MAX_LOGIT_BIAS}")
        if any(t >= self.num_text_tokens for t in bias):
            raise ValueError(
                f"logit_bias keys must be token ids in [0, {self.num_text_tokens}) (the "
                "tokenizer's ids)"
            )

    def check(self, request: GenerateRequest) -> GenerateRequest:
        """Validates ``request`` in place (sampling params normalised) and returns it."""
        self.check_prompt(request.input_ids)
        params: SamplingParams = request.sampling_params.validate()
        ctx = self.info.max_context_len
        prompt_len = len(request.input_ids)
        if prompt_len + params.max_new_tokens > ctx and self.auto_truncate:
            params.max_new_tokens = self.output_budget(prompt_len)
        if prompt_len + params.max_new_tokens > ctx:
            raise ValueError(
                f"this model's maximum context length is {ctx} tokens; the request asks for "
                f"{prompt_len} prompt tokens + {params.max_new_tokens} new tokens; lower the "
                f"maximum number of new tokens to at most {ctx - prompt_len}"
            )
        if request.top_logprobs_num < 0 or request.top_logprobs_num > MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]")
        if request.logprob_start_len >= prompt_len:
            raise ValueError(
                f"logprob_start_len {request.logprob_start_len} is not inside the prompt "
                f"of {prompt_len} tokens"
            )
        self._check_carried(params)
        if params.grammar_key is not None:
            # ValueError saying what is wrong
            self.grammars.get(params.grammar_key, cache_scope(request.extra_key))
        return request
