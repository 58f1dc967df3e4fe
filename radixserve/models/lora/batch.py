"""LoraBatch: the adapters of one forward, applied beside the base projections.

The base projections run once over the whole batch (their weights streamed once); each adapter
then adds its low-rank delta ``(x @ a.T) @ b.T`` to the rows of its requests only, never as a
merged weight. Rows of requests without an adapter are left alone. Two ways, by batch shape:

- **Segments** (an extend of many tokens): per adapter, its rows (a slice when its requests sit
  side by side, else an index list), two small products each. The work is each adapter's own.
- **Stacked** (a decode, or any batch of at most :data:`STACK_MAX_TOKENS` rows with more than
  one adapter or scattered rows): the batch's adapters stacked once (``LoraStacks`` keeps the
  stack while the set of adapters stays the same, as a decode's does step after step), so each
  projection is two products over every row, ``t = x @ A_all.T``, ``t *= mask`` (each row keeps
  only its own adapter's columns), ``y += t @ B_all.T``, whatever the number of adapters: on a
  CPU a small product costs its call more than its work, and per-adapter products, gathers and
  scatters cost ~8x the time at 8 adapters (``benchmarks/lora_throughput.py``).

The products go through the model's :class:`CpuKernels` (``linear``), as the base's do.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixserve.models.lora.adapter import LoraAdapter

if TYPE_CHECKING:
    from radixserve.models.kernels import CpuKernels

# a batch of more rows computes each adapter's rows apart (a stacked product would do the
# low-rank work of every adapter on every row)
STACK_MAX_TOKENS = 64
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class LoraSegment:
    adapter: LoraAdapter
    rows: slice | torch.Tensor  # the token rows of its requests: a slice, or int64 indices


@dataclass(frozen=True, slots=True)
class StackedDelta:
    """Several adapters' deltas of one projection: ``owner[c]`` is the adapter (its index in
    the stack) whose rank column ``c`` is."""

    a: torch.Tensor  # [columns, in]
    b: torch.Tensor  # [out, columns]
    owner: torch.Tensor  # [columns] int64


class LoraStack:
    """The deltas of a tuple of adapters, stacked per layer and projection."""

    def __init__(self, adapters: Sequence[LoraAdapter]) -> None:
        owners: dict[tuple[int, ...], torch.Tensor] = {}  # shared: one mask per owner a forward
        self.layers: list[dict[str, StackedDelta]] = []
        for layer in range(len(adapters[0].layers)):
            stacked = {}
            for proj in PROJECTIONS:
                parts = [(i, a.layers[layer].get(proj)) for i, a in enumerate(adapters)]
                present = [(i, d) for i, d in parts if d is not None]
                if not present:
                    continue
                counts = tuple(d.a.shape[0] if d is not None else 0 for _, d in parts)
                if counts not in owners:
                    owners[counts] = torch.repeat_interleave(
                        torch.arange(len(counts)), torch.tensor(counts)
                    ).to(present[0][1].a.device)
                stacked[proj] = StackedDelta(
                    torch.cat([d.a for _, d in present]),
                    torch.cat([d.b for _, d in present], dim=1).contiguous(),
                    owners[counts],
                )
            self.layers.append(stacked)


class LoraStacks:
    """The last few :class:`LoraStack` built, by their adapters (an LRU of ``size``)."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._stacks: OrderedDict[tuple[str, ...], LoraStack] = OrderedDict()

    def get(self, adapters: Sequence[LoraAdapter]) -> LoraStack:
        key = tuple(a.uid for a in adapters)
        stack = self._stacks.get(key)
        if stack is None:
            stack = self._stacks[key] = LoraStack(adapters)
            while len(self._stacks) > self.size:
                self._stacks.popitem(last=False)
        self._stacks.move_to_end(key)
        return stack

    def clear(self) -> None:
        self._stacks.clear()


class LoraBatch:
    """The adapters of one forward: :meth:`add` applies them to a projection's output."""

    __slots__ = ("_masks", "row_owner", "segments", "stack")

    def __init__(
        self,
        segments: list[LoraSegment],
        stack: LoraStack | None = None,
        row_owner: torch.Tensor | None = None,
    ) -> None:
        self.segments = segments
        self.stack = stack
        self.row_owner = row_owner  # [num_tokens] int64: a row's adapter in the stack, or -1
        self._masks: dict[int, torch.Tensor] = {}  # id(owner) -> [num_tokens, columns]

    @classmethod
    def build(
        cls,
        adapters: Sequence[LoraAdapter | None],
        token_counts: Sequence[int],
        device: torch.device,
        stacks: LoraStacks | None = None,
    ) -> LoraBatch | None:
        """``adapters[i]`` (``None``: the base model) applies to request ``i``'s
        ``token_counts[i]`` consecutive rows. ``None`` when no request has an adapter.
        ``stacks``: where stacked batches keep their stacks (none: never stacked)."""
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
        one_slice = len(spans) == 1 and len(next(iter(spans.values()))[1]) == 1
        if stacks is not None and start <= STACK_MAX_TOKENS and not one_slice:
            members = [adapter for adapter, _ in spans.values()]
            index = {a.uid: i for i, a in enumerate(members)}
            owner = [
                -1 if a is None else index[a.uid]
                for a, n in zip(adapters, token_counts, strict=True)
                for _ in range(n)
            ]
            row_owner = torch.tensor(owner, dtype=torch.int64, device=device)
            return cls([], stacks.get(members), row_owner)
        segments = []
        for adapter, runs in spans.values():
            if len(runs) == 1:
                rows: slice | torch.Tensor = slice(*runs[0])
            else:
                rows = torch.cat([torch.arange(a, b, dtype=torch.int64) for a, b in runs])
                rows = rows.to(device)
            segments.append(LoraSegment(adapter, rows))
        return cls(segments)

    def add(
        self, layer_id: int, proj: str, x: torch.Tensor, y: torch.Tensor, kernels: CpuKernels
    ) -> None:
        """``y`` ``[num_tokens, out]`` (the base projection of ``x`` ``[num_tokens, in]``)
        gains each adapter's delta of ``proj`` in layer ``layer_id`` on its rows, in place."""
        x = x.reshape(x.shape[0], -1)
        if self.stack is not None:
            stacked = self.stack.layers[layer_id].get(proj)
            if stacked is not None:
                t = kernels.linear(x, stacked.a).mul_(self._mask(stacked.owner, t_dtype=x.dtype))
                y.add_(kernels.linear(t, stacked.b))
            return
        for segment in self.segments:
            delta = segment.adapter.layers[layer_id].get(proj)
            if delta is None:
                continue
            rows = segment.rows
            if isinstance(rows, slice):  # accumulated in the product: y is large here
                y[rows].addmm_(kernels.linear(x[rows], delta.a), delta.b.t())
            else:
                t = kernels.linear(kernels.linear(x.index_select(0, rows), delta.a), delta.b)
                y.index_add_(0, rows, t)

    def _mask(self, owner: torch.Tensor, t_dtype: torch.dtype) -> torch.Tensor:
        mask = self._masks.get(id(owner))
        if mask is None:
            assert self.row_owner is not None
            mask = (self.row_owner[:, None] == owner[None, :]).to(t_dtype)
            self._masks[id(owner)] = mask
        return mask
