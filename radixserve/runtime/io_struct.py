"""Messages between the scheduler and its clients (the Engine, the zmq server processes).

Small picklable dataclasses: the server sends them over pyzmq IPC sockets, the in-process
Engine hands them over directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixserve.types import FinishReason, SamplingParams


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


@dataclass(slots=True)
class AbortRequest:
    rid: str


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
    cached_tokens: int
    new_logprobs: list[float] = field(default_factory=list)
    new_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    input_logprobs: list[float] | None = None  # prompt-token logprobs, in the first output only


# ---- server mode: messages between the HTTP, scheduler and detokenizer processes -------------
#
#   HTTP --(GenerateRequest | AbortRequest | FlushCacheReq | GetServerInfoReq)--> scheduler
#   scheduler --list[DetokenizeParams | ReqOutput | ReqError | RpcReply | SchedulerFatal]--> detok
#   detok --list[TextOutput | ReqError | RpcReply | SchedulerFatal]--> HTTP
#
# One zmq message per scheduler iteration carries a list, in order: a request's DetokenizeParams
# always comes before its first ReqOutput.


@dataclass(slots=True)
class DetokenizeParams:
    """What the detokenizer needs to know about a request before its first output."""

    rid: str
    stop: list[str]
    skip_special_tokens: bool
    prompt_tail_ids: list[int]  # the last prompt tokens: context for the first output's text


@dataclass(slots=True)
class TextOutput:
    """A ``ReqOutput`` with its text: ``text`` is the new text since the previous TextOutput of
    the request (held-back partial characters and stop-string prefixes come later).

    ``stopped_early``: the detokenizer saw a stop string that the scheduler had not seen (its
    ``output.finish_reason`` is then STOP_STR while the scheduler still runs the request): the
    receiver aborts it in the scheduler. Later outputs of the rid are dropped.
    """

    output: ReqOutput
    text: str
    stopped_early: bool = False


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
class GetServerInfoReq:
    """Ask for the scheduler's stats and, with ``check_integrity``, run its KV integrity check."""

    call_id: int
    check_integrity: bool = True


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
