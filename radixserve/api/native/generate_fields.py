"""The fields of SGLang's ``GenerateReqInput`` that ``/generate`` takes without a behaviour of
its own: what SGLang's clients, router and gateway send.

:class:`~radixserve.api.native.protocol.GenerateReqInput` declares the fields radixserve implements.
Every other field of SGLang's ``GenerateReqInput`` (as of sglang 0.5.23) is in
:data:`FIELDS`, with what a request may send in it:

- ``no-op``: anything. It is routing or observability metadata that a single worker has no use
  for, for example the router's ``routing_key`` or a gateway's ``received_time``.
- ``rank 0``: unset or 0. A radixserve worker is one data-parallel rank.
- ``unset``: its default. Such a field asks for something radixserve does not do:
  multimodal inputs, disaggregation, hidden states, sessions. Any other value is a 400 naming
  the field.

"Unset" means None, False, 0, "", [] or {}, or a list (one value per batch item) of those;
SGLang's clients send ``[None] * batch`` for a field that nobody set. The same table is the
"Fields" section of docs/data_parallel.md (a test holds the two and SGLang's source together).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def is_unset(value: Any) -> bool:
    if isinstance(value, list):
        return all(is_unset(v) for v in value)
    return value is None or value is False or value in (0, "") or value == {}


def _rank_zero(value: Any) -> bool:
    if isinstance(value, list):
        return all(_rank_zero(v) for v in value)
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value == 0)


@dataclass(frozen=True, slots=True)
class Treatment:
    name: str  # as the docs' table writes it
    accepts: Callable[[Any], bool]


NO_OP = Treatment("no-op", lambda value: True)
RANK_ZERO = Treatment("rank 0", _rank_zero)
UNSET = Treatment("unset", is_unset)

FIELDS: dict[str, Treatment] = {
    # routing and observability metadata: a router's or gateway's, never a worker's business
    "model": NO_OP,  # one model is served, whatever it names
    "no_logs": NO_OP,  # nothing is logged per request but metrics
    "routing_key": NO_OP,
    "conversation_id": NO_OP,
    "custom_labels": NO_OP,  # metrics are not labelled per request
    "external_trace_header": NO_OP,  # no tracing
    "received_time": NO_OP,
    "http_worker_ipc": NO_OP,
    # which data-parallel rank inside one server: a worker is one
    "data_parallel_rank": RANK_ZERO,
    "routed_dp_rank": RANK_ZERO,
    "disagg_prefill_dp_rank": RANK_ZERO,
    # asks for what radixserve does not do
    "session_id": UNSET,
    "session_params": UNSET,
    "input_embeds": UNSET,
    "image_data": UNSET,
    "video_data": UNSET,
    "audio_data": UNSET,
    "mm_hashes": UNSET,
    "mm_content_hashes": UNSET,
    "use_audio_in_video": UNSET,
    "video_config": UNSET,
    "images_config": UNSET,
    "mm_processor_kwargs": UNSET,
    "max_dynamic_patch": UNSET,
    "min_dynamic_patch": UNSET,
    "image_max_dynamic_patch": UNSET,
    "video_max_dynamic_patch": UNSET,
    "modalities": UNSET,
    "encoder_urls": UNSET,
    "need_wait_for_mm_inputs": UNSET,
    "num_items_assigned": UNSET,
    "watermark": UNSET,
    "token_ids_logprob": UNSET,
    "return_sampling_mask": UNSET,
    "sampling_logprobs_mode": UNSET,
    "return_flat_raw_top_logprobs": UNSET,
    "return_flat_raw_output_top_logprobs": UNSET,
    "return_flat_raw_top_logprobs_b64": UNSET,
    "return_hidden_states": UNSET,
    "return_routed_experts": UNSET,
    "routed_experts_start_len": UNSET,
    "return_indexer_topk": UNSET,
    "return_bytes": UNSET,
    "return_entropy": UNSET,
    "lora_id": UNSET,  # adapters go by name (lora_path)
    "custom_logit_processor": UNSET,
    "positional_embed_overrides": UNSET,
    "bootstrap_host": UNSET,
    "bootstrap_port": UNSET,
    "bootstrap_room": UNSET,
    "bootstrap_pair_key": UNSET,
    "decode_tp_size": UNSET,
    "background": UNSET,  # SGLang's asynchronous mode; routers send false
    "require_reasoning": UNSET,
    "max_thinking_tokens": UNSET,
    "multi_item_delimiter_indices": UNSET,
    "token_indices_to_pool": UNSET,
    "kv_hints": UNSET,
}


def take_fields(data: Any) -> Any:
    """``data`` (a request body, before validation) without the fields of :data:`FIELDS`; a
    value one of them does not accept is a :class:`ValueError` whose ``param`` names it."""
    if not isinstance(data, dict):
        return data
    for name in [n for n in data if n in FIELDS]:
        treatment = FIELDS[name]
        if not treatment.accepts(data[name]):
            raise UnsupportedField(_refusal(name, treatment), name)
        del data[name]
    return data


def _refusal(name: str, treatment: Treatment) -> str:
    if treatment is RANK_ZERO:
        return f"/generate: {name} must be 0 or unset (each radixserve worker is one rank)"
    return f"/generate: {name} is not supported by radixserve (leave it unset)"


class UnsupportedField(ValueError):
    """A field radixserve knows but does not implement, set: ``param`` names it (the 400's
    ``param``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param
