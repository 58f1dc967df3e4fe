"""LoraBatch: the adapters of one forward, as segments of its token rows.

The base projections run once over the whole batch (their weights streamed once); each adapter
then adds its low-rank delta to the rows of its requests only: ``y[rows] += (x[rows] @ a.T) @
b.T``, two small products per adapter and projection, never a merged weight. Rows of requests
without an adapter are left alone. An adapter whose requests sit side by side in the batch is a
slice of rows (an in-place ``addmm_``); one whose requests are scattered is an index list (a
gather and an ``index_add_``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixserve.models.lora.adapter import LoraAdapter


@dataclass(frozen=True, slots=True)
class LoraSegment:
    adapter: LoraAdapter
    rows: slice | torch.Tensor  # the token rows of its requests: a slice, or int64 indices


class LoraBatch:
    """Per adapter of the batch, the token rows it applies to."""

    __slots__ = ("segments",)

    def __init__(self, segments: list[LoraSegment]) -> None:
        self.segments = segments

    @classmethod
    def build(
        cls,
        adapters: Sequence[LoraAdapter | None],
        token_counts: Sequence[int],
        device: torch.device,
    ) -> LoraBatch | None:
        """``adapters[i]`` (``None``: the base model) applies to request ``i``'s
        ``token_counts[i]`` consecutive rows. ``None`` when no request has an adapter."""
        spans: dict[str, tuple[LoraAdapter, list[tuple[int, int]]]] = {}
        start = 0
        for adapter, n in zip(adapters, token_counts, strict=True):
            if adapter is not None:
                runs = spans.setdefault(adapter.uid, (adapter, []))[1]
                if runs and runs[-1][1] == start:
                    runs[-1] = (runs[-1][0], start + n)  # adjoins the previous request's rows
                else:
                    runs.append((start, start + n))
            start += n
        if not spans:
            return None
        segments = []
        for adapter, runs in spans.values():
            if len(runs) == 1:
                rows: slice | torch.Tensor = slice(*runs[0])
            else:
                rows = torch.cat([torch.arange(a, b, dtype=torch.int64) for a, b in runs])
                rows = rows.to(device)
            segments.append(LoraSegment(adapter, rows))
        return cls(segments)

    @property
    def uids(self) -> list[str]:
        return [s.adapter.uid for s in self.segments]

    def add(self, layer_id: int, proj: str, x: torch.Tensor, y: torch.Tensor) -> None:
        """``y`` ``[num_tokens, out]`` (the base projection of ``x`` ``[num_tokens, in]``)
        gains each adapter's delta of ``proj`` in layer ``layer_id`` on its rows, in place."""
        x = x.reshape(x.shape[0], -1)
        for segment in self.segments:
            delta = segment.adapter.layers[layer_id].get(proj)
            if delta is None:
                continue
            rows = segment.rows
            if isinstance(rows, slice):
                y[rows].addmm_(x[rows] @ delta.a.t(), delta.b.t())
            else:
                y.index_add_(0, rows, (x.index_select(0, rows) @ delta.a.t()) @ delta.b.t())
