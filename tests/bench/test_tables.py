"""The results page (``benchmarks/README.md``) against the committed results it quotes.

Each generated table sits between ``<!-- table: NAME -->`` and ``<!-- /table -->``;
``benchmarks/tables.py`` renders it from its JSON. A figure edited by hand, or a JSON replaced
without ``python benchmarks/tables.py --write``, fails here. The committed JSON and the reports
``radixserve bench`` writes name a model by its shape, never by a path on the machine that ran it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType

import pytest

from radixserve.bench.models import bench_model_root, model_label

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "benchmarks" / "README.md"


@pytest.fixture
def tables(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # run as a script there
    import tables

    return tables


def test_every_table_on_the_page_is_what_its_json_gives(tables: ModuleType) -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert tables.stale_blocks(page) == [], "run: python benchmarks/tables.py --write"
    assert set(tables.blocks(page)) == set(tables.TABLES), "each table once on the page"


def test_a_figure_edited_by_hand_is_found(tables: ModuleType) -> None:
    page = PAGE.read_text(encoding="utf-8")
    body = tables.blocks(page)["llama-cpp"]
    edited = page.replace(body, body.replace("1.84x", "1.94x", 1))
    assert edited != page
    assert tables.stale_blocks(edited) == ["llama-cpp"]
    assert tables.stale_blocks(tables.render_page(edited)) == []


def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_the_page_opens_with_where_radixserve_stands_and_each_row_links_a_section() -> None:
    page = PAGE.read_text(encoding="utf-8")
    headings = re.findall(r"^#{2,4} (.+)$", page, re.MULTILINE)
    assert headings[0] == "Where radixserve stands"
    anchors = {_anchor(h) for h in headings}
    top = page.split("\n## ")[1]  # the section under the first heading
    rows = [line for line in top.splitlines() if line.startswith("| ") and "](#" in line]
    assert len(rows) >= 10
    for row in rows:
        for link in re.findall(r"\]\(#([^)]+)\)", row):
            assert link in anchors, f"no section #{link}: {row}"


def test_links_between_the_docs_find_their_file_and_section() -> None:
    """Every relative link of README.md, docs/*.md and this page names a file that exists and,
    into a markdown file, a heading it has (the README's detail moved into docs/)."""
    sources = [REPO / "README.md", PAGE, *sorted((REPO / "docs").glob("*.md"))]
    for source in sources:
        for target, anchor in re.findall(r"\]\(([^)#\s:]*)(?:#([\w-]+))?\)", source.read_text()):
            path = (source.parent / target).resolve() if target else source
            where = f"{source.relative_to(REPO)} links {target}#{anchor}"
            assert path.exists(), where
            if anchor and path.suffix == ".md":
                headings = re.findall(r"^#{1,4} (.+)$", path.read_text(), re.MULTILINE)
                assert anchor in {_anchor(h) for h in headings}, where


def _strings(value: object) -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def test_committed_results_name_no_path_of_the_machine_that_ran_them() -> None:
    files = [*(REPO / "docs").glob("*.json"), *(REPO / "benchmarks" / "results").rglob("*.json")]
    assert len(files) > 20
    for path in files:
        report = json.loads(path.read_text())
        for text in _strings(report):
            assert not re.search(r"(^|[\[ ])(/|bench_out/)\w", text), f"{path.name}: {text}"
        if "model" in report:
            assert report["model"].endswith("random weights"), path.name


def test_reports_name_a_model_by_its_shape(tmp_path: Path) -> None:
    root = bench_model_root()
    assert model_label(str(root / "qwen25-05b")) == "Qwen2.5-0.5B-shaped, random weights"
    assert model_label(str(root / "qwen3-1.7b")) == "Qwen3-1.7B-shaped, random weights"
    checkpoint = tmp_path / "Qwen2.5-0.5B-Instruct"
    checkpoint.mkdir()
    assert model_label(str(checkpoint)) == "Qwen2.5-0.5B-Instruct"  # its name, not where it is
    assert model_label("/srv/models/llama-q8_0.gguf") == "llama-q8_0.gguf"
    assert model_label("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"  # a hub id is a name already
    assert (
        model_label("Qwen2.5-0.5B-shaped, random weights") == "Qwen2.5-0.5B-shaped, random weights"
    )
