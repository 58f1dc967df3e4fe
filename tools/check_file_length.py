"""Fail when a source file grows past ``LIMIT`` lines: split it by concept before then."""

from __future__ import annotations

import sys
from pathlib import Path

LIMIT = 400


def main(roots: list[str]) -> int:
    too_long = [
        (path, n)
        for root in roots
        for path in sorted(Path(root).rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > LIMIT
    ]
    for path, n in too_long:
        print(f"{path}: {n} lines (limit {LIMIT}); split it by concept")
    return 1 if too_long else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["radixserve"]))
