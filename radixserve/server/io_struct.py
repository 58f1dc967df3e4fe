"""Messages between the server's processes (HTTP, scheduler, detokenizer) beyond the
scheduler's own ``GenerateRequest`` and ``ReqOutput`` (``radixserve.runtime.io_struct``).

Small picklable dataclasses, sent over pyzmq IPC sockets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixserve.runtime.io_struct import GenerateRequest, ReqOutput
from radixserve.runtime.stop_strings import PROMPT_CONTEXT_TOKENS

if TYPE_CHECKING:  # a type only: the HTTP process reads these messages without the model code
    from radixserve.runtime.scheduler import Scheduler

#   HTTP --(GenerateRequest | AbortRequest | FlushCacheReq | GetServerInfoReq | GetCacheTreeReq
#           | UpdateLoraReq)-->
#       scheduler
#   scheduler --list[DetokenizeParams | ReqOutput | ReqError | RpcReply | SchedulerFatal]--> detok
#   detok --list[TextOutput | ReqError | RpcReply | SchedulerFatal]--> HTTP
#
# One zmq message per scheduler iteration carries a list, in order: a request's DetokenizeParams
# always comes before its first ReqOutput.


@dataclass(slots=True)
class AbortRequest:
    rid: str


@dataclass(slots=True)
class DetokenizeParams:
    """What the detokenizer needs to know about a request before its first output."""

    rid: str
    stop: list[str]
    skip_special_tokens: bool
    prompt_tail_ids: list[int]  # the last prompt tokens: context for the first output's text

    @classmethod
    def of(cls, request: GenerateRequest) -> DetokenizeParams:
        params = request.sampling_params
        tail = request.input_ids[-PROMPT_CONTEXT_TOKENS:]
        return cls(request.rid, list(params.stop), params.skip_special_tokens, tail)


@dataclass(slots=True)
class TextOutput:
    """A ``ReqOutput`` with its text: ``text`` is the new text since the previous TextOutput of
    the request (held-back partial characters and stop-string prefixes come later; a matched
    stop string and what follows it never)."""

    output: ReqOutput
    text: str


@dataclass(slots=True)
class ReqError:
    """The scheduler refused a request: ``add_request`` raised ``ValueError`` (HTTP 400), or
    failed unexpectedly (500)."""

    rid: str
    message: str
    status_code: int = 400


@dataclass(slots=True)
class FlushCacheReq:
    call_id: int


@dataclass(slots=True)
class UpdateLoraReq:
    """Load (``lora_path`` set) or unload (``None``) the LoRA adapter ``lora_name``; the
    reply's value is the adapters served afterwards (name -> directory), its error why not."""

    call_id: int
    lora_name: str
    lora_path: str | None = None
    pinned: bool = False  # never dropped from memory (--max-loaded-loras)


@dataclass(slots=True)
class GetServerInfoReq:
    """Ask for the scheduler's stats and, with ``check_integrity``, run its KV integrity check."""

    call_id: int
    check_integrity: bool = True


@dataclass(slots=True)
class GetCacheTreeReq:
    """Ask for a bounded picture of the radix tree (``radix/tree_summary.py``) and the stats."""

    call_id: int
    max_nodes: int
    full_keys: bool = False  # each node's whole run of tokens, not only its head


@dataclass(slots=True)
class PauseReq:
    """Pause the scheduler's steps (``mode``: ``runtime/pause.py``), or with ``mode`` None go on."""

    call_id: int
    mode: str | None


@dataclass(slots=True)
class UpdateWeightsReq:
    """Load the checkpoint in ``model_path`` (a local directory: the sender resolved a hub id)
    into the served model (``runtime/weight_update.py``)."""

    call_id: int
    model_path: str
    flush_cache: bool = True
    abort_all_requests: bool = False


@dataclass(slots=True)
class GetWeightsReq:
    """Ask for the first ``truncate_size`` rows of the checkpoint tensor ``name`` as served."""

    call_id: int
    name: str
    truncate_size: int = 100


ControlReq = (
    FlushCacheReq
    | GetServerInfoReq
    | GetCacheTreeReq
    | UpdateLoraReq
    | PauseReq
    | UpdateWeightsReq
    | GetWeightsReq
)
"""The calls the HTTP process makes of the scheduler, each answered by one :class:`RpcReply`."""


@dataclass(slots=True)
class RpcReply:
    call_id: int
    value: object = None
    error: str | None = None


@dataclass(slots=True)
class SchedulerFatal:
    """The scheduler loop crashed; the message (with traceback) is for the server's log."""

    message: str


@dataclass(frozen=True, slots=True)
class SchedulerInfo:
    """Sent once by the scheduler process when the model is loaded (the ready handshake)."""

    max_context_len: int
    max_total_tokens: int
    max_running_requests: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    max_request_tokens: int  # prompt + new tokens of one request: RequestLimits
    max_queued_requests: int | None = None  # --max-queued-requests

    @classmethod
    def of(cls, scheduler: Scheduler) -> SchedulerInfo:
        return cls(
            max_context_len=scheduler.max_context_len,
            max_total_tokens=int(scheduler.get_stats()["max_total_tokens"]),
            max_running_requests=scheduler.config.admission.max_running_requests,
            vocab_size=scheduler.worker.vocab_size,
            eos_token_ids=tuple(sorted(scheduler.eos_token_ids)),
            max_request_tokens=scheduler.limits.max_request_tokens,
            max_queued_requests=scheduler.config.admission.max_queued_requests,
        )
