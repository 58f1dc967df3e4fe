"""What the reliability tests share beyond fixtures: the guarded server's key and limits, the
command line of every server they start (127.0.0.1 only), and ``tests/api/serving_harness``
(put on the path here, so the test modules import it by name)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "api"))

API_KEY = "sk-reliability"
# the limits of the guarded server (small, so tests reach them with little traffic)
MAX_REQUEST_BYTES = 1 << 20
MAX_SUB_REQUESTS = 256
MAX_STOP_STRINGS = 64


def server_args(model_dir: Path, *extra: str) -> list[str]:
    return ["--model", str(model_dir), "--host", "127.0.0.1", "--max-total-tokens", "16384", *extra]
