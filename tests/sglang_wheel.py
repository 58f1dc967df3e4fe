"""SGLang's own source as an oracle: files read from its wheel (sglang 0.5.23, downloaded once,
without its dependencies, into the user cache). Used by slow tests only."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

SGLANG = "sglang==0.5.23"


def sglang_source(path: str) -> str:
    """The text of ``path`` (e.g. ``sglang/srt/managers/io_struct.py``) in SGLang's wheel; the
    test skips, saying why, when the wheel cannot be downloaded."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = cache / "radixserve" / "sglang-wheels"
    wheels = sorted(folder.glob("sglang-0.5.23-*.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(folder)]
        done = subprocess.run([*cmd, SGLANG], capture_output=True, text=True, timeout=600)
        wheels = sorted(folder.glob("sglang-0.5.23-*.whl"))
        if not wheels:
            pytest.skip(f"cannot download {SGLANG}: {done.stderr[-400:]}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        return wheel.read(path).decode()
