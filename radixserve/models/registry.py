"""Model registry: ``architectures[0]`` of ``config.json`` -> the class that runs it."""

from __future__ import annotations

from radixserve.models.decoder import DecoderForCausalLM

# every supported family differs only by ModelConfig flags, so they share one class
MODEL_REGISTRY: dict[str, type[DecoderForCausalLM]] = {
    "LlamaForCausalLM": DecoderForCausalLM,
    "MistralForCausalLM": DecoderForCausalLM,
    "Qwen2ForCausalLM": DecoderForCausalLM,
    "Qwen3ForCausalLM": DecoderForCausalLM,
}


def get_model_class(architecture: str) -> type[DecoderForCausalLM]:
    """The class for ``architecture``; ``ValueError`` naming the supported ones otherwise."""
    try:
        return MODEL_REGISTRY[architecture]
    except KeyError:
        supported = ", ".join(sorted(MODEL_REGISTRY))
        raise ValueError(
            f"unsupported architecture {architecture!r}; supported: {supported}"
        ) from None
