"""LoraBatch against a naive reference: each row's projection plus its own adapter's delta,
computed one row at a time, for batches in both ways (segments and stacked) and every layout of
adapters over the rows (contiguous, scattered, base rows between)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.models.kernels import TORCH_ONLY
from radixserve.models.lora import LoraAdapter, LoraBatch, LoraDelta, LoraStacks
from radixserve.models.lora.batch import STACK_MAX_TOKENS

IN, OUT, LAYERS = 24, 40, 2


def adapter(uid: str, rank: int, projections: tuple[str, ...], seed: int) -> LoraAdapter:
    gen = torch.Generator().manual_seed(seed)
    layers = tuple(
        {
            p: LoraDelta(
                torch.randn(rank, IN, generator=gen, dtype=torch.float64),
                torch.randn(OUT, rank, generator=gen, dtype=torch.float64),
            )
            for p in projections
        }
        for _ in range(LAYERS)
    )
    return LoraAdapter(uid, uid, rank, layers, torch.device("cpu"))


ADAPTERS = [
    adapter("a", 4, ("qkv_proj", "down_proj"), 1),
    adapter("b", 8, ("qkv_proj",), 2),
    adapter("c", 2, ("down_proj", "o_proj"), 3),
]


def reference(
    x: torch.Tensor, rows: list[LoraAdapter | None], layer: int, proj: str
) -> torch.Tensor:
    y = torch.zeros(x.shape[0], OUT, dtype=x.dtype)
    for i, a in enumerate(rows):
        delta = None if a is None else a.layers[layer].get(proj)
        if delta is not None:
            y[i] = (x[i] @ delta.a.t()) @ delta.b.t()
    return y


@settings(max_examples=60, deadline=None)
@given(
    picks=st.lists(st.integers(-1, len(ADAPTERS) - 1), min_size=1, max_size=6),
    counts=st.lists(st.integers(1, 30), min_size=6, max_size=6),
    stacked=st.booleans(),
)
def test_every_row_gets_its_own_adapters_delta(picks, counts, stacked) -> None:
    adapters = [None if p < 0 else ADAPTERS[p] for p in picks]
    counts = counts[: len(picks)]
    stacks = LoraStacks() if stacked else None
    batch = LoraBatch.build(adapters, counts, torch.device("cpu"), stacks)
    if all(a is None for a in adapters):
        assert batch is None
        return
    assert batch is not None
    rows = [a for a, n in zip(adapters, counts, strict=True) for _ in range(n)]
    uses_stack = batch.stack is not None
    assert uses_stack == (
        stacked and len(rows) <= STACK_MAX_TOKENS and not _one_slice(adapters, counts)
    )
    x = torch.randn(len(rows), IN, dtype=torch.float64)
    for layer in range(LAYERS):
        for proj in ("qkv_proj", "o_proj", "down_proj", "gate_up_proj"):
            base = torch.randn(len(rows), OUT, dtype=torch.float64)
            y = base.clone()
            batch.add(layer, proj, x, y, TORCH_ONLY)
            torch.testing.assert_close(y, base + reference(x, rows, layer, proj))


def _one_slice(adapters: list[LoraAdapter | None], counts: list[int]) -> bool:
    """One adapter whose requests sit side by side (the segment path without any gather)."""
    used = [i for i, a in enumerate(adapters) if a is not None]
    return len({adapters[i].uid for i in used}) == 1 and used == list(range(used[0], used[-1] + 1))  # type: ignore[union-attr]


def test_a_stack_is_kept_while_the_adapters_stay_the_same() -> None:
    stacks = LoraStacks(size=2)
    rows = [ADAPTERS[0], None, ADAPTERS[1], ADAPTERS[0]]
    first = LoraBatch.build(rows, [1] * 4, torch.device("cpu"), stacks)
    again = LoraBatch.build(rows, [1] * 4, torch.device("cpu"), stacks)
    assert first is not None and again is not None and first.stack is again.stack
    LoraBatch.build([ADAPTERS[2], None, ADAPTERS[2]], [1, 1, 1], torch.device("cpu"), stacks)
    LoraBatch.build([ADAPTERS[1], ADAPTERS[2]], [1, 1], torch.device("cpu"), stacks)
    later = LoraBatch.build(rows, [1] * 4, torch.device("cpu"), stacks)
    assert later is not None and later.stack is not first.stack  # dropped: an LRU of 2
