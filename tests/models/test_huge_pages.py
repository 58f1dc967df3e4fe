from __future__ import annotations

import mmap
from pathlib import Path

import pytest
import torch
from torch import nn

from radixserve.models import huge_pages, loader
from radixserve.models.huge_pages import ALIGN, huge_page_buffer, move_to_huge_pages
from radixserve.models.loader import load_model

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_allowed() -> bool:
    """The kernel's THP mode is ``always`` or ``madvise`` (the selected one is bracketed)."""
    return THP_MODE.is_file() and "[never]" not in THP_MODE.read_text()


def smaps_field(address: int, field: str) -> str:
    """``field`` of the mapping of this process that holds ``address`` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:  # a mapping's header: start-end perms ...
            start, end = (int(v, 16) for v in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith(field + ":"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no {field} for {address:#x}")


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Parameter(torch.randn(10, 4), requires_grad=False)
        self.head = nn.Linear(4, 10)
        self.head.weight = self.embed  # tied: one Parameter in two modules
        self.register_buffer("table", torch.arange(7, dtype=torch.int8))
        self.register_buffer("absent", None)
        self.register_buffer("scales", torch.ones(6))
        self.view = nn.Parameter(self.scales[2:5], requires_grad=False)  # a part of "scales"


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no madvise(MADV_HUGEPAGE) here")
def test_tensors_move_with_values_ties_and_views_kept() -> None:
    model = Tied()
    before = {n: t.clone() for n, t in [*model.named_parameters(), *model.named_buffers()]}
    view_ptr = model.view.data_ptr()
    moved = move_to_huge_pages(model)
    if moved == 0:
        pytest.skip("this system refuses MADV_HUGEPAGE (THP not built in)")
    nbytes = [10 * 4 * 4, 10 * 4, 7]  # embed (once, though tied), bias, table; not scales
    assert moved == sum(-(-n // ALIGN) * ALIGN for n in nbytes)
    after = dict([*model.named_parameters(), *model.named_buffers()])
    assert after.keys() == before.keys()
    for name, t in before.items():
        assert torch.equal(after[name], t) and after[name].dtype == t.dtype, name
    assert model.head.weight is model.embed  # still tied
    storages = {t.untyped_storage().data_ptr() for t in (model.embed, model.head.bias, model.table)}
    assert len(storages) == 1  # one buffer
    assert model.absent is None
    assert model.view.data_ptr() == view_ptr  # a storage viewed in part stays, aliases kept
    model.scales[3] = 5.0
    assert model.view[1] == 5.0
    model.embed.add_(1.0)  # the copies are writable memory
    assert torch.equal(model.head.weight, before["embed"] + 1.0)


def test_refused_advice_leaves_the_model_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huge_pages, "huge_page_buffer", lambda nbytes: None)
    model = Tied()
    ptrs = [t.data_ptr() for t in model.parameters()]
    assert move_to_huge_pages(model) == 0
    assert [t.data_ptr() for t in model.parameters()] == ptrs


@pytest.mark.skipif(not thp_allowed(), reason="transparent huge pages are off (or absent) here")
def test_buffer_is_eligible_for_huge_pages() -> None:
    buffer = huge_page_buffer(8 << 20)
    assert buffer is not None and buffer.dtype == torch.uint8 and buffer.numel() == 8 << 20
    buffer.fill_(3)
    assert smaps_field(buffer.data_ptr(), "THPeligible") == "1"
    assert huge_page_buffer(0) is None


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_loaded_cpu_model_lives_in_one_buffer(
    tiny_model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, quantization: str | None
) -> None:
    src = tiny_model_dirs["qwen2"]  # tied embeddings, biases
    model, _ = load_model(src, "bfloat16", quantization=quantization)
    tensors = dict([*model.named_parameters(), *model.named_buffers()])
    if thp_allowed():  # (too small a model for a huge page: test_buffer_is_eligible... checks)
        assert len({t.untyped_storage().data_ptr() for t in tensors.values()}) == 1
    monkeypatch.setattr(loader, "move_to_huge_pages", lambda model: 0)
    plain, _ = load_model(src, "bfloat16", quantization=quantization)
    expected = dict([*plain.named_parameters(), *plain.named_buffers()])
    assert tensors.keys() == expected.keys()
    for name, t in expected.items():
        assert torch.equal(tensors[name], t), name
