"""Request bodies: SGLang's native ``/generate`` and OpenAI's completions and chat completions.

Unknown top-level fields are ignored (as OpenAI-compatible servers do); native
``sampling_params`` are strict (an unknown key is a 400, never silently dropped). Bad types and
missing fields (and NaN or infinite floats) surface as FastAPI validation errors, which :mod:`radixserve.api.errors` turns
into 400s in OpenAI's error shape. Range checks of sampling values live in
``SamplingParams.validate`` (one place for the native and the OpenAI routes).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from radixserve.types import SamplingParams

# ---- native (SGLang) -----------------------------------------------------------------------


class NativeSamplingParams(BaseModel):
    """SGLang's ``sampling_params``; ``max_new_tokens`` None: the server default (128),
    clipped to the context left."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

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
    n: Literal[1] = 1
    min_new_tokens: Literal[0] = 0
    no_stop_trim: Literal[False] = False
    spaces_between_special_tokens: bool = True  # accepted, not used

    def to_sampling_params(self, max_new_tokens: int) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            repetition_penalty=self.repetition_penalty,
            stop=_stop_list(self.stop),
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            seed=self.seed,
            skip_special_tokens=self.skip_special_tokens,
        )


class GenerateReqInput(BaseModel):
    """``/generate``: ``text`` or ``input_ids``, one prompt or a batch; per-item fields may be
    lists of the batch's length."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: NativeSamplingParams | list[NativeSamplingParams] | None = None
    stream: bool = False
    return_logprob: bool | list[bool] = False
    logprob_start_len: int | list[int] = -1
    top_logprobs_num: int | list[int] = 0
    return_text_in_logprobs: bool = False
    rid: str | list[str] | None = None
    priority: int | list[int] | None = None


class AbortReqInput(BaseModel):
    rid: str = ""
    abort_all: bool = False


# ---- OpenAI --------------------------------------------------------------------------------


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class OpenAISamplingFields(BaseModel):
    """What completions and chat completions share, with vLLM/SGLang-style extensions
    (``top_k``, ``min_p``, ``repetition_penalty``, ``ignore_eos``, ``stop_token_ids``, ...)."""

    model_config = ConfigDict(allow_inf_nan=False)  # NaN and inf are 400s, never sampled with

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = Field(1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    priority: int = 0

    def to_sampling_params(self, max_new_tokens: int) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            frequency_penalty=self.frequency_penalty or 0.0,
            presence_penalty=self.presence_penalty or 0.0,
            repetition_penalty=self.repetition_penalty,
            stop=_stop_list(self.stop),
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            seed=self.seed,
            skip_special_tokens=self.skip_special_tokens,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(OpenAISamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    best_of: int | None = None
    suffix: str | None = None


class TextContentPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None

    def to_template_dict(self) -> dict[str, Any]:
        """The message as chat templates read it: content always a string."""
        if isinstance(self.content, list):
            content = "".join(part.text for part in self.content)
        else:
            content = self.content or ""
        out: dict[str, Any] = {"role": self.role, "content": content}
        if self.name is not None:
            out["name"] = self.name
        return out


class ChatCompletionRequest(OpenAISamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)


def _stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)
