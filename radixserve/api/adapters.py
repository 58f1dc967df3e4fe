"""Which LoRA adapter a request names (``docs/lora.md``): ``lora_path`` on ``/generate``
(SGLang's field: a name, or one per batch item), ``model`` on the OpenAI routes (vLLM's
convention: the adapter's name, or SGLang's ``base:adapter``)."""

from __future__ import annotations

from radixserve.api.errors import APIError
from radixserve.server.tokenizer_manager import TokenizerManager


def check_adapter(tm: TokenizerManager, name: str | None) -> str | None:
    """``name`` if it is an adapter served (``None``: the base model); a 400 if not."""
    if name is not None and name not in tm.lora_adapters:
        known = ", ".join(sorted(tm.lora_adapters)) or "none"
        message = f"the LoRA adapter {name!r} is not loaded (loaded: {known})"
        raise APIError(message, 400, param="lora_path")
    return name


def adapter_of_model(
    tm: TokenizerManager, model: str, base_names: set[str], served_name: str
) -> str | None:
    """The adapter an OpenAI ``model`` names: an adapter's name, or ``BASE:ADAPTER`` (``BASE``
    any of ``base_names``); ``None`` for the base model itself; ``APIError`` 404 otherwise."""
    if model in base_names:
        return None
    base, sep, adapter = model.rpartition(":")
    name = adapter if sep and base in base_names else model
    if name in tm.lora_adapters:
        return name
    served = ", ".join(f"`{name}`" for name in [served_name, *sorted(tm.lora_adapters)])
    raise APIError(
        f"the model `{model}` does not exist; this server serves {served}",
        404,
        param="model",
        code="model_not_found",
    )
