"""The /generate field table (``radixserve/api/native/generate_fields.py``) against its two other
copies: SGLang's own ``GenerateReqInput`` (the oracle: every field its clients, router or
gateway can send is implemented or in the table) and the "Fields" section of
docs/data_parallel.md."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from sglang_wheel import sglang_source

from radixserve.api.native.generate_fields import FIELDS, is_unset
from radixserve.api.native.protocol import GenerateReqInput

DOCS = Path(__file__).resolve().parents[2] / "docs" / "data_parallel.md"


def sglang_generate_fields() -> list[str]:
    """The fields of ``GenerateReqInput`` in SGLang's ``io_struct.py``, read from its wheel."""
    source = sglang_source("sglang/srt/managers/io_struct.py")
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == "GenerateReqInput":
            return [
                b.target.id
                for b in node.body
                if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name)
            ]
    raise AssertionError("no GenerateReqInput in SGLang's io_struct.py")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_field_of_sglangs_generate_is_implemented_or_in_the_table() -> None:
    theirs = sglang_generate_fields()
    assert len(theirs) > 60  # the parse found the class
    ours = set(GenerateReqInput.model_fields)
    missing = [f for f in theirs if f not in ours and f not in FIELDS]
    assert not missing, f"SGLang's fields neither implemented nor in the table: {missing}"
    implemented_and_tabled = ours & set(FIELDS)
    assert not implemented_and_tabled, implemented_and_tabled


def test_the_docs_table_is_the_code_table() -> None:
    rows = dict(re.findall(r"^\| `(\w+)` \| ([\w -]+) \|$", DOCS.read_text(), re.MULTILINE))
    assert rows == {name: t.name for name, t in FIELDS.items()}


@pytest.mark.parametrize(
    ("value", "unset"),
    [(None, True), (False, True), (0, True), ("", True), ([], True), ({}, True)]
    + [([None, False, 0], True), (True, False), (1, False), ("x", False), ([None, "x"], False)],
)
def test_what_counts_as_unset(value: object, unset: bool) -> None:
    assert is_unset(value) is unset
