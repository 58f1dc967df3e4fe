"""Request bodies of SGLang's native ``/generate`` (OpenAI's: :mod:`radixserve.api.openai.protocol`).

Strict: an unknown field is a 400 naming it, never silently dropped; SGLang's fields that
radixserve does not implement are accepted at their default and refused when set (for
``/generate``, the table of :mod:`radixserve.api.native.generate_fields`). Types are
strict too (pydantic's strict mode): ``true`` is no token id, ``"yes"`` no boolean, ``"1"`` no
number (an integer is a float). Bad types and missing fields (and NaN or infinite floats)
surface as FastAPI validation errors, which
:mod:`radixserve.api.errors` turns into 400s in OpenAI's error shape. Range checks of sampling values live in
``SamplingParams.validate`` (one place for the native and the OpenAI routes).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, Strict, model_validator

from radixserve.api.native.generate_fields import UnsupportedField, take_fields
from radixserve.api.structured import grammar_fields, json_schema_string
from radixserve.types import SamplingParams

# a token id as a JSON object key: a string of digits ("logit_bias": {"123": -5})
TokenIdKey = Annotated[int, Strict(False)]

# ---- native (SGLang) -----------------------------------------------------------------------


class NativeSamplingParams(BaseModel):
    """SGLang's ``sampling_params``; ``max_new_tokens`` None: the server default (128),
    clipped to the context left.

    Strict as SGLang is: an unknown key is a 400 naming it. Every key SGLang's clients send
    is known; those radixserve does not implement (:data:`NATIVE_UNSUPPORTED`) are accepted
    at their default (null, false, ...) and refused with a 400 naming them when set."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    max_new_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = Field(None, validation_alias=AliasChoices("seed", "sampling_seed"))
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True  # accepted, not used: fast tokenizers ignore it
    regex: str | None = None
    json_schema: str | dict[str, Any] | None = None
    ebnf: str | None = None
    # known to SGLang, not implemented here: a 400 when set (see NATIVE_UNSUPPORTED)
    n: int = 1
    min_new_tokens: int = 0
    no_stop_trim: bool = False
    structural_tag: str | dict[str, Any] | None = None
    stop_regex: str | list[str] | None = None
    custom_params: dict[str, Any] | None = None
    logit_bias: dict[TokenIdKey, float] | None = None  # token id (a string in JSON) -> bias
    stream_interval: int | None = None
    lora_path: str | None = None
    return_hidden_states: bool = False
    dtype: str | None = None

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> NativeSamplingParams:
        refuse_set_fields(self, NATIVE_UNSUPPORTED)
        return self

    def to_sampling_params(self, max_new_tokens: int) -> SamplingParams:
        grammar = grammar_fields(
            self.regex, json_schema_string(self.json_schema, "json_schema"), self.ebnf
        )
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            repetition_penalty=self.repetition_penalty,
            stop=stop_list(self.stop),
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            seed=self.seed,
            skip_special_tokens=self.skip_special_tokens,
            logit_bias=self.logit_bias,
            **grammar,  # type: ignore[arg-type]
        )


NATIVE_UNSUPPORTED: dict[str, Any] = {
    "n": 1,
    "min_new_tokens": 0,
    "no_stop_trim": False,
    "structural_tag": None,
    "stop_regex": None,
    "custom_params": None,
    "stream_interval": None,
    "lora_path": None,
    "return_hidden_states": False,
    "dtype": None,
}


def refuse_set_fields(model: BaseModel, defaults: dict[str, Any], where: str = "") -> None:
    """:class:`UnsupportedField` naming every field of ``defaults`` that ``model`` sets to anything but
    its default (an empty list or dict counts as unset)."""
    set_fields = [
        name
        for name, default in defaults.items()
        if (value := getattr(model, name)) != default and value not in ([], {}, None)
    ]
    if set_fields:
        names = ", ".join(set_fields)
        verb, it = ("is", "it") if len(set_fields) == 1 else ("are", "them")
        prefix = f"{where}: " if where else ""
        raise UnsupportedField(
            f"{prefix}{names} {verb} not supported by radixserve (leave {it} unset)", set_fields[0]
        )


class GenerateReqInput(BaseModel):
    """``/generate``: ``text`` or ``input_ids``, one prompt or a batch; per-item fields may be
    lists of the batch's length. Strict: an unknown field is a 400. The other fields of SGLang's
    ``GenerateReqInput`` (what its clients, router and gateway send) are taken, checked and
    dropped before validation by :func:`~radixserve.api.native.generate_fields.take_fields`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: NativeSamplingParams | list[NativeSamplingParams] | None = None
    stream: bool = False
    return_logprob: bool | list[bool] | None = False
    logprob_start_len: int | list[int] | None = -1
    top_logprobs_num: int | list[int] | None = 0
    return_text_in_logprobs: bool = False
    # the prompt's token ids in each result ("prompt_token_ids", SGLang's key)
    return_prompt_token_ids: bool = False
    rid: str | list[str] | None = None
    priority: int | list[int] | None = None
    log_metrics: bool = True  # accepted: every request is counted
    # the name of a loaded LoRA adapter, or one (or None: the base) per batch item
    lora_path: str | list[str | None] | None = None
    # with --reasoning-parser: the thinking as "reasoning_text", the answer as "text"
    separate_reasoning: bool = False
    # namespaces of the prompt cache inside the caller's tenant (api/access/tenants.py), one or one per
    # batch item: SGLang's extra_key and vLLM's (and now SGLang's) cache_salt
    extra_key: str | list[str | None] | None = None
    cache_salt: str | list[str | None] | None = None

    @model_validator(mode="before")
    @classmethod
    def _take_sglang_fields(cls, data: Any) -> Any:
        return take_fields(dict(data) if isinstance(data, dict) else data)

    @model_validator(mode="after")
    def _normalise(self) -> GenerateReqInput:
        if isinstance(self.lora_path, list) and not any(self.lora_path):
            self.lora_path = None  # SGLang's clients send [None] * batch
        return self


class AbortReqInput(BaseModel):
    rid: str = ""
    abort_all: bool = False


def stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)
