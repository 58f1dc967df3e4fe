"""The embedded default model: what ``radixserve serve`` runs without ``--model``.

A tiny Llama with random weights and a real tokenizer (byte-level BPE with ChatML tokens and
chat template), written by :mod:`radixserve.models.tiny` on first use into the user's cache
directory (:func:`radixserve.config.default_model_dir`). It exists so the server starts on a
fresh, offline machine; its output is gibberish. It is a smoke test, never a model.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

logger = logging.getLogger(__name__)

MARKER_FILE = "radixserve-default-model.json"
MARKER_VERSION = 1
DESCRIPTION = "random-weight smoke-test model (tiny Llama, output is gibberish)"


def is_default_model_dir(path: str | Path) -> bool:
    marker = Path(path) / MARKER_FILE
    if not marker.is_file():
        return False
    try:
        return int(json.loads(marker.read_text()).get("version", 0)) == MARKER_VERSION
    except (ValueError, OSError):
        return False


def ensure_default_model(path: str | Path) -> Path:
    """The default model's directory, creating it first if missing (a few seconds).

    It is written into a temporary sibling and renamed into place, so an interrupted or
    concurrent creation never leaves a half-written model at ``path``.
    """
    target = Path(path)
    if is_default_model_dir(target):
        return target
    from radixserve.models.tiny import write_tiny_model

    logger.warning("creating the default %s in %s", DESCRIPTION, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    try:
        write_tiny_model(tmp, "llama", seed=0)
        (tmp / MARKER_FILE).write_text(
            json.dumps({"version": MARKER_VERSION, "description": DESCRIPTION})
        )
        if target.exists():
            if is_default_model_dir(target):  # a concurrent creation won the race
                return target
            if any(target.iterdir()):
                raise RuntimeError(
                    f"{target} exists and is not a radixserve default model; remove it or point "
                    "RADIXSERVE_DEFAULT_MODEL_DIR elsewhere"
                )
            target.rmdir()
        try:
            tmp.rename(target)
        except OSError:
            if not is_default_model_dir(target):  # not someone else's concurrent success
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
