"""``radixserve serve``'s flags of who may connect and what they share: API keys and tenants,
admin keys, the tenant header of a trusted gateway, the shared prompt cache, the connection
bounds (``api/access/tenants.py``, ``launch/connections.py``)."""

from __future__ import annotations

import argparse
from typing import Any

from radixserve.api.access.tenants import read_keys_file, tenant_of_key
from radixserve.config import EngineConfig, ServerConfig

_DEFAULTS = ServerConfig(EngineConfig(model_path="-"))


def add_access_flags(serve: argparse.ArgumentParser) -> None:
    add = serve.add_argument
    add(
        "--api-key",
        action="append",
        default=None,
        help="require 'Authorization: Bearer KEY' on every route but /health; give it again for "
        "more keys, each a tenant with its own prompt cache",
    )
    add(
        "--api-keys-file",
        default=None,
        help="a file of 'TENANT KEY' lines: named tenants, several keys each (# comments)",
    )
    add(
        "--admin-api-key",
        action="append",
        default=None,
        help="a key for the operator routes (/cache_tree, /dashboard, /flush_cache); once any is "
        "given, only these keys may use them",
    )
    add(
        "--tenant-header",
        default=None,
        help="take the tenant from this request header when present (only behind a gateway "
        "that sets it, e.g. x-tenant-id; the key is still checked)",
    )
    add(
        "--shared-prefix-cache",
        action="store_true",
        help="one prompt cache for every tenant (a tenant's cached_tokens and timing then "
        "reveal other tenants' prompts)",
    )
    add(
        "--max-connections",
        type=int,
        default=None,
        help="most open HTTP connections; past it a new one closes the longest-idle one "
        "(default: the descriptor limit less 128 and less the listen backlog)",
    )
    add(
        "--request-header-timeout",
        type=float,
        default=_DEFAULTS.request_header_timeout_s,
        help="seconds a new connection may take to send a whole request head before it is closed",
    )
    add(
        "--request-body-timeout",
        type=float,
        default=_DEFAULTS.request_body_timeout_s,
        help="seconds a request body may take to arrive after its head; past it the connection "
        "is answered 408 and closed",
    )
    add(
        "--min-request-body-rate",
        type=float,
        default=_DEFAULTS.min_request_body_rate,
        help="bytes/s a request body must average once --request-header-timeout has passed "
        "since its head, or the connection is answered 408 and closed (0: no minimum)",
    )


def access_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The ``ServerConfig`` fields of these flags."""
    return {
        "tenant_keys": _tenant_keys(args),
        "admin_api_keys": tuple(args.admin_api_key or ()),
        "shared_prefix_cache": args.shared_prefix_cache,
        "tenant_header": args.tenant_header,
        "max_connections": args.max_connections,
        "request_header_timeout_s": args.request_header_timeout,
        "request_body_timeout_s": args.request_body_timeout,
        "min_request_body_rate": args.min_request_body_rate,
    }


def _tenant_keys(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """``--api-key`` (each its own tenant) and ``--api-keys-file``'s (tenant, key) pairs."""
    pairs = tuple((tenant_of_key(key), key) for key in args.api_key or ())
    if args.api_keys_file is not None:
        try:
            pairs += read_keys_file(args.api_keys_file)
        except (OSError, ValueError) as exc:
            raise SystemExit(f"--api-keys-file: {exc}") from None
    return pairs
