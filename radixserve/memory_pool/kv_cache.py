"""KVCache: the per-layer K and V buffers that the token slots index into."""

from __future__ import annotations

import torch


def kv_bytes_per_token(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """Bytes of K plus V that one token occupies across all layers."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * num_kv_heads * head_dim * elem


def num_slots_for_budget(
    budget_bytes: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    page_size: int = 1,
) -> int:
    """How many token slots fit in ``budget_bytes``, rounded down to whole pages.

    Slot 0 is reserved for padding, so the usable capacity is one less than the result.
    """
    per_token = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype)
    slots = budget_bytes // per_token
    slots = (slots // page_size) * page_size
    if slots <= page_size:
        raise ValueError(
            f"a KV budget of {budget_bytes} bytes holds no usable page ({per_token} bytes per token)"
        )
    return int(slots)


class KVCache:
    """``k_buffer[layer]`` and ``v_buffer[layer]``, each ``[num_slots, num_kv_heads, head_dim]``.

    Slot 0 is the padding slot: writes to it are harmless and reads of it are masked out.
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_slots, num_kv_heads, head_dim)
        self.k_buffer = [
            torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)
        ]
        self.v_buffer = [
            torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)
        ]

    def set_kv(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``k``/``v`` ``[num_tokens, num_kv_heads, head_dim]`` at ``slots`` ``[num_tokens]``."""
        self.k_buffer[layer][slots] = k.to(self.dtype)
        self.v_buffer[layer][slots] = v.to(self.dtype)

    def get_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole K and V buffers of ``layer``, each ``[num_slots, num_kv_heads, head_dim]``."""
        return self.k_buffer[layer], self.v_buffer[layer]
