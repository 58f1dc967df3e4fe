"""The scheduler's own input and output: a tokenized request in, new tokens out.

Small picklable dataclasses: the server sends them over pyzmq IPC sockets (its other messages
are in ``radixserve.server.io_struct``), the in-process Engine hands them over directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any

from radixserve.types import FinishReason, Req, SamplingParams

# a radix-cache namespace's first part names its tenant (``api/access/tenants.py`` writes it)
TENANT_PART = "tenant:"


def cache_scope(namespace: str | None) -> str | None:
    """Whose caches a request in the radix-cache ``namespace`` may hit, and whose it may time:
    its tenant's part of the namespace (``None``: no tenant, or tenants sharing the cache). A
    compiled grammar, a learned template form, is cached per scope."""
    if namespace is None or not namespace.startswith(TENANT_PART):
        return None
    return namespace.split("|", 1)[0]


class QueueFull(ValueError):
    """``Scheduler.add_request``: ``max_queued_requests`` requests already wait; try later."""


@dataclass(slots=True)
class GenerateRequest:
    """A tokenized request for the scheduler."""

    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    priority: int = 0
    extra_key: str | None = None
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1  # >= 0: also return logprobs of prompt tokens from this index
    lora_name: str | None = None  # the LoRA adapter it runs under (None: the base model)

    def to_req(
        self,
        arrival_time: float,
        eos_token_ids: frozenset[int],
        grammar: Any,
        lora_id: str | None,
        namespace: str | None,
    ) -> Req:
        """The scheduler's record of this request: queued at ``arrival_time`` under adapter
        ``lora_id`` in the radix-cache ``namespace`` (``runtime/lora_manager.py``)."""
        return Req(
            rid=self.rid,
            origin_input_ids=list(self.input_ids),
            sampling_params=self.sampling_params,
            priority=self.priority,
            arrival_time=arrival_time,
            extra_key=namespace,
            lora_id=lora_id,
            eos_token_ids=eos_token_ids,
            return_logprob=self.return_logprob,
            top_logprobs_num=self.top_logprobs_num,
            logprob_start_len=self.logprob_start_len,
            grammar=grammar,
        )


@dataclass(slots=True)
class ReqOutput:
    """What one scheduler step produced for one request: new tokens since the last output.

    ``finish_reason`` is set on the last output of a request (and only there).
    """

    rid: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens served from the cache (pool and tier), all admissions
    new_logprobs: list[float] = field(default_factory=list)
    new_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    input_logprobs: list[float] | None = None  # prompt-token logprobs, in the first output only
    # beside them, each position's top alternatives (token id, logprob), when asked
    input_top_logprobs: list[list[tuple[int, float]]] | None = None
    cached_tokens_tier: int = 0  # the part of ``cached_tokens`` loaded back from the KV tier
    # speculative decoding (SGLang's meta_info): verify steps it drafted in (None: speculation
    # off) and the drafted tokens they accepted, all steps so far
    spec_verify_ct: int | None = None
    spec_accepted_tokens: int = 0

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled as the constructor's arguments: one message per running request per step
        goes to the detokenizer, and a slotted dataclass's default pickling (its state as a
        dict) takes about twice as long (``benchmarks/scheduler_idle.py``)."""
        return ReqOutput, _req_output_fields(self)


_req_output_fields = attrgetter(*(f.name for f in fields(ReqOutput)))
