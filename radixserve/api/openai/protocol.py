"""Request bodies of OpenAI's completions and chat completions, with SGLang's and vLLM's
extensions (``top_k``, ``min_p``, ``repetition_penalty``, ``ignore_eos``, ``regex``, ...).

Strict: an unknown field is a 400 naming it. OpenAI's and SGLang's fields that radixserve does
not implement are accepted at their default (null, false, ...) and refused with a 400 naming
them when set (``*_UNSUPPORTED``), never silently dropped. Fields that change nothing the
client can observe here (``user``, ``metadata``, ``prompt_cache_key``, ...) are accepted.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from radixserve.api.formats import custom_tools
from radixserve.api.native.protocol import TokenIdKey, refuse_set_fields, stop_list
from radixserve.api.structured import grammar_fields, json_schema_string, response_format_schema
from radixserve.types import SamplingParams


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False
    continuous_usage_stats: bool = False


class OpenAISamplingFields(BaseModel):
    """What completions and chat completions share."""

    # NaN, inf: 400s; strict types (no "yes" for a bool, no true for an int: see protocol.py)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

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
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True  # accepted, not used: fast tokenizers ignore it
    priority: int = 0
    response_format: dict[str, Any] | None = None
    regex: str | None = None
    json_schema: str | dict[str, Any] | None = None
    ebnf: str | None = None
    # accepted, nothing to do here
    user: str | None = None
    metadata: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    # vLLM's: a namespace of the prompt cache inside the caller's tenant (api/access/tenants.py)
    cache_salt: str | None = None
    # SGLang's: the LoRA adapter's name (as `model` may name it; api/operator/lora.py)
    lora_path: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    # prompt caching's and moderation's hints (every prompt is cached by prefix here)
    prompt_cache_retention: str | None = None
    prompt_cache_options: Any = None
    moderation: Any = None
    # a 400 when set (OPENAI_UNSUPPORTED)
    logit_bias: dict[TokenIdKey, float] | None = None  # token id (a string in JSON) -> bias
    store: bool | None = None
    min_tokens: int = 0
    no_stop_trim: bool = False
    stop_regex: str | list[str] | None = None
    session_params: dict[str, Any] | None = None
    return_hidden_states: bool = False
    custom_params: dict[str, Any] | None = None
    rid: str | None = None

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> OpenAISamplingFields:
        refuse_set_fields(self, OPENAI_UNSUPPORTED)
        return self

    def grammar(self) -> dict[str, str]:
        """The ``SamplingParams`` grammar fields of ``response_format`` / ``regex`` /
        ``json_schema`` / ``ebnf`` (at most one may constrain the output)."""
        from_format = response_format_schema(self.response_format)
        schema = json_schema_string(self.json_schema, "json_schema")
        if from_format is not None and schema is not None:
            raise ValueError("give response_format or json_schema, not both")
        return grammar_fields(self.regex, from_format or schema, self.ebnf)

    def to_sampling_params(
        self, max_new_tokens: int, grammar: dict[str, str] | None = None
    ) -> SamplingParams:
        """``grammar``: the grammar fields to use (None: :meth:`grammar`)."""
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            frequency_penalty=self.frequency_penalty or 0.0,
            presence_penalty=self.presence_penalty or 0.0,
            repetition_penalty=self.repetition_penalty,
            stop=stop_list(self.stop),
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            seed=self.seed,
            skip_special_tokens=self.skip_special_tokens,
            logit_bias=self.logit_bias,
            **(self.grammar() if grammar is None else grammar),  # type: ignore[arg-type]
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


OPENAI_UNSUPPORTED: dict[str, Any] = {
    "store": False,
    "min_tokens": 0,
    "no_stop_trim": False,
    "stop_regex": None,
    "session_params": None,
    "return_hidden_states": False,
    "custom_params": None,
    "rid": None,
}


class CompletionRequest(OpenAISamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    best_of: int | None = None
    suffix: str | None = None


# ---- chat ------------------------------------------------------------------------------------


class TextContentPart(BaseModel):
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    name: str
    arguments: str = "{}"  # a JSON string, as OpenAI sends it


class ToolCall(BaseModel):
    """A call in the history; a custom tool's (``{"type": "custom", "custom": {"name",
    "input"}}``) as the function call it was offered as and renders as."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall

    @model_validator(mode="before")
    @classmethod
    def _custom_as_function(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("type") != "custom":
            return data
        custom = data.get("custom")
        if not isinstance(custom, dict) or not all(
            isinstance(custom.get(k), str) for k in ("name", "input")
        ):
            raise ValueError("a custom tool call needs custom.name and custom.input")
        arguments = custom_tools.call_arguments(custom["input"])
        function = {"name": custom["name"], "arguments": arguments}
        return {"id": data.get("id"), "type": "function", "function": function}


class ChatMessage(BaseModel):
    """One message of the history; an assistant's ``tool_calls`` and a ``tool`` message's
    result are kept, so an agent's next turn renders the same prefix (and hits the cache).
    The fields the official client echoes back from a response are accepted when empty."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: Any = None
    function_call: Any = None
    reasoning_content: str | None = None

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> ChatMessage:
        refuse_set_fields(self, MESSAGE_UNSUPPORTED, "messages")
        return self

    def to_template_dict(self) -> dict[str, Any]:
        """The message as chat templates read it: content a string, tool-call arguments an
        object (as HF templates expect; a string that is no JSON stays a string)."""
        if isinstance(self.content, list):
            content = "".join(part.text for part in self.content)
        else:
            content = self.content or ""
        out: dict[str, Any] = {"role": self.role, "content": content}
        if self.name is not None:
            out["name"] = self.name
        if self.reasoning_content is not None:  # templates that render past thinking read it
            out["reasoning_content"] = self.reasoning_content
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": _json_or_text(call.function.arguments),
                    },
                }
                for call in self.tool_calls
            ]
        return out


MESSAGE_UNSUPPORTED: dict[str, Any] = {
    "refusal": None,
    "annotations": None,
    "audio": None,
    "function_call": None,
}


class FunctionDefinition(BaseModel):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    """A function tool, or a custom one (``{"type": "custom", "custom": {...}}``) as the
    function of one string parameter it is offered as (``api/formats/custom_tools.py``):
    ``custom`` marks it, so its calls go back as custom tool calls."""

    type: Literal["function"] = "function"
    function: FunctionDefinition
    custom: bool = Field(False, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _custom_as_function(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("type") != "custom":
            return {k: v for k, v in data.items() if k != "custom"}  # set by a custom tool only
        offered = custom_tools.as_function(custom_tools.from_chat(data))
        function = {k: offered[k] for k in ("name", "description", "parameters") if k in offered}
        return {"type": "function", "function": function, "custom": True}


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    """A named tool; a custom one (``{"type": "custom", "custom": {"name"}}``) by its name."""

    type: Literal["function"] = "function"
    function: NamedFunction

    @model_validator(mode="before")
    @classmethod
    def _custom_by_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") == "custom":
            custom = data.get("custom")
            if not (isinstance(custom, dict) and isinstance(custom.get("name"), str)):
                raise ValueError("a custom tool choice needs custom.name")
            return {"type": "function", "function": {"name": custom["name"]}}
        return data


class AllowedTools(BaseModel):
    mode: Literal["auto", "required"]
    tools: list[NamedToolChoice] = Field(min_length=1)


class AllowedToolsChoice(BaseModel):
    """OpenAI's ``allowed_tools``: every tool is rendered (the prompt stays the same, a cache
    hit, while the choice changes) and only these may be called (``chat_tools.py``)."""

    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools

    def names(self) -> list[str]:
        return [t.function.name for t in self.allowed_tools.tools]


class ChatCompletionRequest(OpenAISamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: (
        Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice | None
    ) = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    # SGLang's and vLLM's: the template's generation prompt, or the last assistant message
    # continued (at most one of the two)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # with --reasoning-parser: the thinking as reasoning_content (SGLang's fields)
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    # the template's reasoning_effort (gpt-oss's) and enable_thinking (false for "none":
    # Qwen3's and other hybrid templates'); chat_template_kwargs given beside it win
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    # a 400 when set (CHAT_UNSUPPORTED)
    functions: list[Any] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    function_call: Any = None
    # accepted without effect: a hint at the answer's length (as the Responses API's
    # text.verbosity)
    verbosity: Literal["low", "medium", "high"] | None = None

    @model_validator(mode="after")
    def _refuse_unsupported_chat(self) -> ChatCompletionRequest:
        if self.modalities == ["text"]:
            self.modalities = None  # what the default is
        refuse_set_fields(self, CHAT_UNSUPPORTED)
        if self.reasoning_effort is not None:
            thinking = thinking_kwargs(self.reasoning_effort != "none", self.reasoning_effort)
            self.chat_template_kwargs = {**thinking, **(self.chat_template_kwargs or {})}
        if self.continue_final_message:
            if self.add_generation_prompt:
                raise ValueError(
                    "continue_final_message continues the last message: "
                    "set add_generation_prompt to false"
                )
            if self.messages[-1].role != "assistant":
                raise ValueError("continue_final_message needs an assistant message last")
        return self


def thinking_kwargs(enabled: bool, effort: str | None = None) -> dict[str, Any]:
    """The chat template's kwargs for a client's reasoning switch: ``enable_thinking`` (Qwen3
    and other hybrid templates) and, where given, ``reasoning_effort`` (gpt-oss); a template
    that reads neither renders as before."""
    kwargs: dict[str, Any] = {"enable_thinking": enabled}
    if effort is not None:
        kwargs["reasoning_effort"] = effort
    return kwargs


CHAT_UNSUPPORTED: dict[str, Any] = {
    "functions": None,
    "modalities": None,
    "audio": None,
    "prediction": None,
    "web_search_options": None,
    "function_call": None,
}


def _json_or_text(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
