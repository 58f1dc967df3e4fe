"""The one place a front door's generations become scheduler requests.

Every door (SGLang's ``/generate``, the OpenAI routes, the gRPC service, and any protocol added
later) maps its body onto :class:`Generation` s, one per scheduler request, and hands them to
:meth:`RequestBuilder.build` with the caller (what the guard left in ``request.state``, or the
gRPC :class:`~radixserve.api.grpc.auth.Caller`). There, once, for every door:

- the server's bounds on one call (``--max-batch-sub-requests``, ``--max-stop-strings``;
  :meth:`RequestBuilder.check_size` lets a door refuse before it tokenizes anything);
- the adapter, which must be served;
- the rid: the client's (checked) or one made here, scoped to the caller's tenant
  (``server/rid_scope.py``), distinct within the call;
- the prompt-cache namespace: the caller's tenant, then SGLang's ``extra_key`` and the
  ``cache_salt``;
- every check of ``RequestValidator`` (context, sampling parameters, grammar, logit bias, ...).

Failures are ``ValueError`` naming what is wrong (or an ``APIError`` for an adapter not
served); each door renders them in its protocol's error shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixserve.api.access.limits import check_stop_strings, check_sub_requests
from radixserve.api.access.tenants import Tenants
from radixserve.api.adapters import check_adapter
from radixserve.config import ServerConfig
from radixserve.runtime.io_struct import GenerateRequest
from radixserve.server.rid_scope import check_client_rid, scoped_rid
from radixserve.server.tokenizer_manager import TokenizerManager
from radixserve.types import SamplingParams


@dataclass
class Generation:
    """One generation a door asks for: a prompt's ids and how to continue it."""

    input_ids: list[int]
    params: SamplingParams
    rid: str | None = None  # the client's own; None: one is made
    lora: str | None = None  # the adapter's name; None: the base model
    extra_key: str | None = None  # SGLang's extra_key (a cache namespace of the client's)
    cache_salt: str | None = None
    priority: int = 0
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1


class RequestBuilder:
    def __init__(self, tm: TokenizerManager, tenants: Tenants, config: ServerConfig) -> None:
        self.tm = tm
        self.tenants = tenants
        self.config = config

    def check_size(
        self,
        num_prompts: int,
        n: int,
        stop: str | list[str] | None,
        param: str,
    ) -> None:
        """The bounds a door checks before tokenizing: prompts x n generations, stop strings."""
        check_sub_requests(num_prompts, n, self.config.max_batch_sub_requests, param)
        check_stop_strings(stop, self.config.max_stop_strings)

    def build(self, caller: Any, generations: list[Generation]) -> list[GenerateRequest]:
        """The scheduler requests of one call, in order (see the module doc)."""
        if not generations:
            raise ValueError("the batch is empty")
        self.check_size(len(generations), 1, None, "n")
        scope = self.tenants.scope(caller)
        requests = []
        for g in generations:
            check_stop_strings(g.params.stop, self.config.max_stop_strings)
            rid = check_client_rid(g.rid) if g.rid is not None else self.tm.new_rid()
            request = GenerateRequest(
                rid=scoped_rid(scope, rid),
                input_ids=g.input_ids,
                sampling_params=g.params,
                priority=g.priority,
                extra_key=self.tenants.namespace(caller, g.cache_salt, g.extra_key),
                return_logprob=g.return_logprob,
                top_logprobs_num=g.top_logprobs_num if g.return_logprob else 0,
                logprob_start_len=g.logprob_start_len if g.return_logprob else -1,
                lora_name=check_adapter(self.tm, g.lora),
            )
            requests.append(self.tm.validator.check(request))
        if len({r.rid for r in requests}) != len(requests):
            raise ValueError("the rids of a batch must be distinct")
        self.tm.validator.check_group(len(requests))
        return requests
