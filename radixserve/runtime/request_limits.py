"""RequestLimits: what the scheduler alone can refuse of a request that passed the edge's checks
(``server/request_validation.py``): a full queue, a prompt longer than a request row, a request
the KV pool can never admit."""

from __future__ import annotations

from dataclasses import dataclass

from radixserve.runtime.io_struct import GenerateRequest, QueueFull


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_context_len: int  # a request row's length
    # prompt + new tokens of one request: what an empty pool admits (its capacity less a page
    # for rounding and the ignore_eos admission's reserve)
    max_request_tokens: int
    max_queued_requests: int | None  # None: no bound

    def check(self, request: GenerateRequest, num_waiting: int) -> None:
        """``QueueFull`` or ``ValueError`` saying why ``request`` cannot be queued."""
        bound = self.max_queued_requests
        if bound is not None and num_waiting >= bound:
            raise QueueFull(f"the request queue is full ({bound} waiting); retry later")
        prompt_len, ctx = len(request.input_ids), self.max_context_len
        if not 0 < prompt_len < ctx:
            raise ValueError(f"a prompt of {prompt_len} tokens does not fit a request row")
        need = prompt_len + min(request.sampling_params.max_new_tokens, ctx - prompt_len)
        if need > self.max_request_tokens:  # admission could never take it: it would wait forever
            raise ValueError(
                f"the request needs {need} KV slots; at most {self.max_request_tokens} fit"
            )
