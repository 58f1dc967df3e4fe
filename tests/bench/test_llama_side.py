"""``benchmarks/llama_side.py``'s table math and ``--llama-gguf`` parsing (no llama.cpp needed:
nothing here starts a server or converts a model)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def llama_side(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # benchmarks/ import each other by name
    import llama_side

    return llama_side


def test_ratio_columns_pair_each_storage(llama_side: ModuleType) -> None:
    configs = ["bfloat16", "bfloat16+int8", "float32"]
    # sides: rs bf16, rs int8, rs fp32 | HF fp32, HF bf16 | llama q8_0, llama bf16
    values = [12.0, 24.0, 6.0, 4.0, 5.0, 20.0, 10.0]
    columns = llama_side.ratio_columns(configs, 2, ["q8_0", "bf16"])
    labels = [label for label, _, _ in columns]
    assert labels == [
        "rs bfloat16/best HF",
        "rs bfloat16+int8/best HF",
        "rs float32/best HF",
        "rs bfloat16/llama bf16",
        "rs bfloat16+int8/llama q8_0",
    ]  # no f32 GGUF side: no float32 pair
    cells = llama_side.ratio_cells(columns, values).split()
    assert cells == [f"{r:.2f}x" for r in (12 / 5, 24 / 5, 6 / 5, 12 / 10, 24 / 20)]
    header = llama_side.ratio_header(columns)
    assert len(header) == len(llama_side.ratio_cells(columns, values))  # each cell under its label


def test_ratio_columns_without_other_sides(llama_side: ModuleType) -> None:
    assert llama_side.ratio_columns(["bfloat16"], 0, []) == []
    assert llama_side.ratio_cells([], [1.0]) == ""


def test_parse_ggufs(llama_side: ModuleType) -> None:
    parsed = llama_side.parse_ggufs(["bf16", "q8_0=/x/m-q8.gguf"])
    assert parsed == {"bf16": None, "q8_0": Path("/x/m-q8.gguf")}
    with pytest.raises(SystemExit, match="q4_k"):
        llama_side.parse_ggufs(["q4_k=/x.gguf"])
