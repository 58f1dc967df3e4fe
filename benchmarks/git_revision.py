"""Old code for before/after benchmarks, taken from git into a temp dir (never committed).

``exported(rev, paths)`` extracts ``paths`` at ``rev`` (``git archive``); ``worktree(rev)`` makes
a detached checkout (``git worktree add --detach``, removed afterwards). Either yields a
directory to put first on ``PYTHONPATH`` of a subprocess, so ``import radixserve`` finds the old
package there rather than the checkout this script runs from; ``run_json`` runs one such
subprocess.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def describe(rev: str) -> str:
    """``rev`` as a short hash and subject line."""
    return _git("log", "-1", "--format=%h %s", rev).strip()


@contextmanager
def exported(rev: str, paths: list[str]) -> Iterator[str]:
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev, *paths],
        check=True,
        capture_output=True,
    ).stdout
    _exit_on_sigterm()
    with tempfile.TemporaryDirectory(prefix=f"radixserve-{rev}-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        yield tmp


@contextmanager
def worktree(rev: str) -> Iterator[str]:
    _exit_on_sigterm()
    with tempfile.TemporaryDirectory(prefix=f"radixserve-{rev}-") as tmp:
        path = os.path.join(tmp, "checkout")
        _git("worktree", "add", "--detach", "--quiet", path, rev)
        try:
            yield path
        finally:
            _git("worktree", "remove", "--force", path)


def run_json(argv: list[str], path: str) -> dict[str, Any]:
    """Run ``python *argv`` importing ``radixserve`` from ``path``; its last stdout line is a
    JSON object whose ``module`` (the ``__file__`` it imported) must lie under ``path``."""
    out = subprocess.run(
        [sys.executable, *argv],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} on {path} failed:\n{out.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["module"].startswith(path), f"{result['module']} is not from {path}"
    return result


def _exit_on_sigterm() -> None:
    """A SIGTERM (a timeout, a kill) unwinds like Ctrl-C, so the temp dir is still removed."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True
    ).stdout
