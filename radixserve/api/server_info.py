"""What ``/get_server_info`` (``/server_info``) and ``/get_model_info`` (``/model_info``)
answer, in SGLang's shape where SGLang's clients read it.

SGLang's ``bench_serving`` reads ``internal_states[0]`` after a run (one dict per scheduler
rank: ``last_gen_throughput``, ``load`` and the server args) and ``version``; the flat server
args and radixserve's own fields (``scheduler``, ``integrity_ok``, ``pids``, ...) stay at the
top level.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import time
from typing import Any

from radixserve.config import ServerConfig
from radixserve.server.tokenizer_manager import TokenizerManager


def version() -> str:
    try:
        return importlib.metadata.version("radixserve")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


class ThroughputMeter:
    """Generated tokens per second between two reads of the scheduler's counters (SGLang's
    ``last_gen_throughput``: the decode throughput of the last interval)."""

    def __init__(self) -> None:
        self._last: tuple[float, int] | None = None
        self._value = 0.0

    def update(self, num_generated_tokens: int) -> float:
        now = time.monotonic()
        if self._last is not None:
            then, tokens = self._last
            if now > then and num_generated_tokens >= tokens:
                self._value = (num_generated_tokens - tokens) / (now - then)
        self._last = (now, num_generated_tokens)
        return self._value


def server_args(config: ServerConfig) -> dict[str, Any]:
    """The engine's and the server's settings, flat (the API key masked)."""
    engine = dataclasses.asdict(config.engine)
    server = {k: v for k, v in dataclasses.asdict(config).items() if k != "engine"}
    server["api_key"] = None if config.api_key is None else "***"
    return {**engine, **server, "served_model_name": config.model_name}


async def get_server_info(
    tm: TokenizerManager, config: ServerConfig, meter: ThroughputMeter
) -> dict[str, Any]:
    info = await tm.get_server_info(check_integrity=True)
    stats = info["stats"]
    args = server_args(config)
    internal = {
        **args,
        "last_gen_throughput": meter.update(stats["num_generated_tokens"]),
        "load": stats["num_running_reqs"] + stats["num_waiting_reqs"],
        "dp_rank": config.engine.dp_rank,
        "max_total_num_tokens": tm.info.max_total_tokens,
    }
    return {
        **args,
        "version": version(),
        "internal_states": [internal],
        "max_total_tokens": tm.info.max_total_tokens,
        "scheduler": stats,
        "integrity_ok": info.get("integrity_ok"),
        "integrity_error": info.get("integrity_error"),
        "num_pending_http_requests": len(tm.states),
        "pids": {"http": os.getpid(), **tm.child_pids()},
    }


def get_model_info(tm: TokenizerManager, config: ServerConfig) -> dict[str, Any]:
    return {
        "model_path": config.engine.model_path,
        "tokenizer_path": config.engine.model_path,
        "served_model_name": config.model_name,
        "is_generation": True,
        "is_smoke_test_model": config.is_default_model,
        "max_context_len": tm.info.max_context_len,
        "vocab_size": tm.info.vocab_size,
        "eos_token_ids": list(tm.info.eos_token_ids),
        "preferred_sampling_params": None,
    }
