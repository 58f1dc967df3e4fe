"""Reliability fixtures: real ``radixserve serve`` subprocesses (``tests/api/serving_harness``)
on 127.0.0.1, a tiny model, tight limits so each bound is cheap to reach."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from reliability_harness import (
    API_KEY,
    MAX_REQUEST_BYTES,
    MAX_STOP_STRINGS,
    MAX_SUB_REQUESTS,
    server_args,
)
from serving_harness import Server, serving, write_api_model


@pytest.fixture(scope="session")
def rel_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: object) -> Path:
    """A tiny random Llama (context 1024) with the real ChatML tokenizer."""
    return write_api_model(tmp_path_factory.mktemp("rel-model") / "tiny-llama", tiny_tokenizer)


@pytest.fixture(scope="session")
def guarded(rel_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server with an API key and tight limits, shared by the tests that leave it serving;
    it must stop with exit code 0 and no traceback in its log."""
    log = tmp_path_factory.mktemp("guarded-log") / "server.log"
    args = server_args(
        rel_model_dir,
        "--max-request-bytes",
        str(MAX_REQUEST_BYTES),
        "--max-batch-sub-requests",
        str(MAX_SUB_REQUESTS),
        "--max-stop-strings",
        str(MAX_STOP_STRINGS),
    )
    with serving(args, log, api_key=API_KEY) as srv:
        yield srv
