"""What the repository's text cites: only what a reader of the repository can open.

Comments, docstrings and docs state contracts and cite the repository's own docs
(``docs/design.md``, ``docs/*.md``) or SGLang's and vLLM's sources by path. They never cite a
document outside the repository (the design notes, the seeds, the performance and GPU notes it
was built from) nor a unit of past work (an issue number, a work session): a reader cannot open
either. SGLang's and vLLM's own GitHub issues by number ("SGLang issue 31954") stay allowed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
# the package, its docs and benchmarks, the tests and tools, and the top-level files
SCANNED: tuple[str, ...] = ("radixserve", "benchmarks", "docs", "tests", "tools", "examples")
SCANNED += ("README.md", "Makefile", "pyproject.toml")
SUFFIXES = {".py", ".md", ".sh", ".txt", ".html", ".js", ".jinja", ".cpp", ".h", ".toml"}
SKIPPED_NAMES = {"echarts.min.js", Path(__file__).name}  # vendored; this file names the patterns

OUTSIDE_DOCUMENTS = re.compile(
    r"DESIGN\.md|STYLE\.md|PERF-NOTES|GPU-NOTES|TOKENIZER-NOTES|\b[Ss]eeds?\s+0\d\d\b|\bseeds/"
)
# an internal issue: "issue #15", "(#32)", "since #11", "#32's"; not a CSS colour (``#222;``)
WORK_UNITS = re.compile(
    r"(?i)\bissues?\s+#\d+|\(#\d+\b|\b(?:since|before|after|until|in|of|see|it:)\s+#\d+\b"
    r"|(?:^|\s)#\d+(?:'s|\s+(?:made|item|part))\b|\bsessions?\s+\d+\b"
)


def scanned_files() -> list[Path]:
    files: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            files.append(path)
            continue
        for p in sorted(path.rglob("*")):
            if p.suffix in SUFFIXES and p.name not in SKIPPED_NAMES and p.is_file():
                if "__pycache__" not in p.parts:
                    files.append(p)
    return files


def citations(text: str) -> list[str]:
    """Each line of ``text`` that cites an outside document or an internal work unit."""
    return [
        line.strip()
        for line in text.splitlines()
        if OUTSIDE_DOCUMENTS.search(line) or WORK_UNITS.search(line)
    ]


@pytest.mark.parametrize(
    "line",
    [
        "See DESIGN.md section 7.",
        '"""The ignore_eos admission (seed 004 section 9)."""',
        "vLLM V0's OK / LATER / NEVER (seeds 002-003).",
        '"""Seed 004 section 3: sort by -len(prefix_indices)."""',
        "# the default since issue #32",
        "Issue #28, item 2: kv.bin overwritten",
        "sglang-router forwards these (as seen through it: #29).",
        "list keys (what the scheduler passed before #11)",
        "# #32 made aging by admissions the default",
        "### Measured on an H200 (session 13, 2026-11-26)",
        "the prior (0.14, from PERF-NOTES)",
        "a retraction (#7) frees its KV",
    ],
)
def test_a_citation_of_what_a_reader_cannot_open_is_found(line: str) -> None:
    assert citations(line) == [line.strip()]


@pytest.mark.parametrize(
    "line",
    [
        "body { color: #222; background: #fafafa; }",
        'itemStyle: { color: isRoot ? "#263238" : nodeColor(n) }',
        "SGLang issue 31954's starvation: 40x FCFS's cold TTFT p99",
        "vLLM issues 31731 and 57413",
        "docs/design.md, section 5 (Scheduling)",
        "session i runs under adapter lora{i % K}",
        '@pytest.fixture(scope="session")',
        "see `python/sglang/srt/managers/schedule_policy.py`",
    ],
)
def test_legitimate_text_is_not_flagged(line: str) -> None:
    assert citations(line) == []


def test_the_repository_cites_only_what_a_reader_can_open() -> None:
    found = [
        f"{p.relative_to(ROOT)}: {line}"
        for p in scanned_files()
        for line in citations(p.read_text(encoding="utf-8", errors="replace"))
    ]
    assert not found, "cites what a reader cannot open:\n" + "\n".join(found)


def test_the_design_doc_exists_and_the_module_map_links_it() -> None:
    design = ROOT / "docs" / "design.md"
    assert design.is_file()
    assert "design.md" in (ROOT / "docs" / "structure.md").read_text(encoding="utf-8")
