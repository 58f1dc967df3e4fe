"""What ``/get_server_info`` (``/server_info``) and ``/get_model_info`` (``/model_info``)
answer, in SGLang's shape where SGLang's clients read it.

SGLang's ``bench_serving`` reads ``internal_states[0]`` after a run (one dict per scheduler
rank: ``last_gen_throughput``, ``load`` and the server args) and ``version``; the flat server
args and radixserve's own fields (``scheduler``, ``integrity_ok``, ``pids``, ...) stay at the
top level. A server that drafts (``--speculative-algorithm``) adds SGLang's
``avg_spec_accept_length`` to ``internal_states[0]`` (``bench_serving`` prints it where
present; absent with speculation off, as in SGLang). No key is ever shown (:data:`SECRET_FIELD`, :func:`scrub`). An operator
(``Tenants.is_operator``) sees the whole server's figures; a tenant sees the same shape with the
figures of its own requests (:func:`tenant_server_info`).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import re
import time
from typing import Any

from radixserve.api.access.tenants import KEY_TENANT_PREFIX
from radixserve.config import ServerConfig
from radixserve.kv_events_config import KVEventsConfig
from radixserve.server.tokenizer_manager import TokenizerManager


def speculating(config: ServerConfig) -> bool:
    """Whether the server drafts (``--speculative-algorithm``)."""
    return config.engine.speculative.speculative_algorithm is not None


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


# a configuration field holding secrets: its value is never shown (a field added later is
# covered by its name; :func:`scrub` covers any value that holds a key whatever its field)
SECRET_FIELD = re.compile(r"(^|_)(keys?|secrets?|passwords?|credentials?)$")
REDACTED = "***"


def secrets_of(config: ServerConfig) -> list[str]:
    """Every key the server takes, and each lone key's tenant name (a digest of the key)."""
    keys = [key for _, key in config.tenant_keys] + [*config.admin_api_keys]
    keys += [*config.gateway_api_keys, *([config.api_key] if config.api_key else [])]
    digests = [tenant for tenant, _ in config.tenant_keys if tenant.startswith(KEY_TENANT_PREFIX)]
    return [s for s in {*keys, *digests} if s]


def scrub(value: Any, secrets: list[str]) -> Any:
    """``value`` with every string that holds one of ``secrets`` replaced by ``***``."""
    if isinstance(value, dict):
        return {k: scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(v, secrets) for v in value]
    if isinstance(value, str) and any(secret in value for secret in secrets):
        return REDACTED
    return value


def server_args(config: ServerConfig) -> dict[str, Any]:
    """The engine's and the server's settings, flat (the engine's parts by their fields' flat
    names, SGLang's server args), each secret field shown as ``***`` (set) or None (unset)."""
    engine = {name: _plain(value) for name, value in config.engine.flat().items()}
    server = {k: v for k, v in dataclasses.asdict(config).items() if k != "engine"}
    args = {**engine, **server, "served_model_name": config.model_name}
    for name, value in args.items():
        if SECRET_FIELD.search(name):
            args[name] = REDACTED if value else None
    return scrub(args, secrets_of(config))  # type: ignore[no-any-return]


def _plain(value: Any) -> Any:
    """A setting as JSON shows it: a record as its dict, ``--kv-events-config`` as its JSON."""
    if isinstance(value, KVEventsConfig):
        return value.model_dump_json(exclude_unset=True)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


async def get_server_info(
    tm: TokenizerManager, config: ServerConfig, meter: ThroughputMeter
) -> dict[str, Any]:
    """The operator's view: the whole scheduler's figures."""
    info = await tm.get_server_info(check_integrity=True)
    stats = info["stats"]
    throughput = meter.update(stats["num_generated_tokens"])
    load = stats["num_running_reqs"] + stats["num_waiting_reqs"]
    shape = _shape(tm, config, throughput, load, stats)
    if speculating(config):  # the scheduler's, so the operator's view only
        shape["internal_states"][0]["avg_spec_accept_length"] = stats["avg_spec_accept_length"]
    return {
        **shape,
        "integrity_ok": info.get("integrity_ok"),
        "integrity_error": info.get("integrity_error"),
        "num_pending_http_requests": len(tm.states),
        "pids": {"http": os.getpid(), **tm.child_pids()},
    }


def tenant_server_info(
    tm: TokenizerManager, config: ServerConfig, tenant: str, usage: dict[str, Any]
) -> dict[str, Any]:
    """A tenant's view: the settings, and figures of its own requests only (``usage``, from
    :class:`~radixserve.api.operator.tenant_metrics.MetricsByTenant`); no other tenant's load,
    prompts or cache hits."""
    pending = tm.num_pending(tenant)
    scheduler = {**usage, "num_pending_reqs": pending, "view": "tenant"}
    return {
        **_shape(tm, config, usage["gen_throughput"], pending, scheduler),
        "num_pending_http_requests": pending,
    }


def _shape(
    tm: TokenizerManager,
    config: ServerConfig,
    throughput: float,
    load: int,
    scheduler: dict[str, Any],
) -> dict[str, Any]:
    """SGLang's shape: the settings flat, ``version``, ``internal_states[0]`` (what
    ``bench_serving`` reads), and radixserve's ``scheduler`` figures."""
    args = server_args(config)
    internal = {
        **args,
        "last_gen_throughput": throughput,
        "load": load,
        "dp_rank": config.engine.parallel.dp_rank,
        "max_total_num_tokens": tm.info.max_total_tokens,
    }
    return {
        **args,
        "version": version(),
        "internal_states": [internal],
        "max_total_tokens": tm.info.max_total_tokens,
        "scheduler": scheduler,
    }


def load(info: dict[str, Any]) -> dict[str, Any]:
    """``/get_load`` from the scheduler's stats: ``load`` (requests running or waiting), with
    the parts SGLang's own ``/get_load`` reports."""
    stats = info["stats"]
    running, waiting = stats["num_running_reqs"], stats["num_waiting_reqs"]
    used = stats["max_total_tokens"] - stats["num_free_tokens"] - stats["num_evictable_tokens"]
    return {
        "load": running + waiting,
        "dp_rank": 0,
        "num_reqs": running + waiting,
        "num_waiting_reqs": waiting,
        "num_tokens": used,
    }


def get_model_info(tm: TokenizerManager, config: ServerConfig) -> dict[str, Any]:
    return {
        "model_path": tm.model_path,
        "tokenizer_path": config.engine.model_path,
        "served_model_name": config.model_name,
        "is_generation": True,
        "is_smoke_test_model": config.is_default_model,
        "max_context_len": tm.info.max_context_len,
        "vocab_size": tm.info.vocab_size,
        "eos_token_ids": list(tm.info.eos_token_ids),
        "preferred_sampling_params": None,
        "weight_version": tm.weight_version,
    }
