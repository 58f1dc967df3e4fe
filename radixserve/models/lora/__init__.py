"""LoRA adapters over the decoder: PEFT's files read per merged projection (``adapter.py``),
and the adapters of one forward as segments of its rows (``batch.py``)."""

from radixserve.models.lora.adapter import LoraAdapter, LoraDelta, adapter_uid, load_adapter
from radixserve.models.lora.batch import LoraBatch, LoraSegment, LoraStack, LoraStacks

__all__ = [
    "LoraAdapter",
    "LoraBatch",
    "LoraDelta",
    "LoraSegment",
    "LoraStack",
    "LoraStacks",
    "adapter_uid",
    "load_adapter",
]
