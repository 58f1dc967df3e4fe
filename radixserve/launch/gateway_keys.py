"""The keys of a ``--dp-size`` server: every tenant's key and the admin's work through the
gateway as they do on one server.

smg (the default gateway) takes each tenant's key (``--tenant-api-key TENANT:KEY``) and passes
the client's own ``Authorization`` on to the worker, which resolves the tenant itself, so each
tenant keeps its own prompt cache and rids. smg's own calls to the workers (health, server
info, load, the metrics its public ``/engine_metrics`` relays, a flush its admins ask for) go
with ``--api-key``: a key made at start for this purpose alone, which the workers take as the
gateway (``Tenants.is_gateway``: no operator, so no unauthenticated route of smg shows a global
figure). smg's control plane (``/flush_cache``, ``/workers``) takes the operators' keys.

Each key goes as ``--flag=value``: a key may begin with ``-`` (``token_urlsafe`` makes one in
64), which the router's argparse would read as a flag of its own in ``--flag value``.

sglang-router takes one key only: with several tenants or an admin key it is refused at start.
So is ``--worker-transport grpc`` with any key: smg's gRPC mode calls its workers with no
key and no tenant (it tokenizes in the gateway), so the workers could tell no tenant from
another, nor smg from any other local process.
"""

from __future__ import annotations

import dataclasses
import secrets

from radixserve.api.access.tenants import ADMIN_TENANT, Tenants
from radixserve.config import ServerConfig


@dataclasses.dataclass(frozen=True)
class GatewayAccess:
    workers: ServerConfig  # the workers' config: the gateway's own key added where it has one
    flags: list[str]  # the router's key flags
    control_key: str | None  # what the launcher sends to the router's control plane (/workers)


def gateway_access(config: ServerConfig, router: str, transport: str = "http") -> GatewayAccess:
    """How ``router`` and the workers take ``config``'s keys. ``ValueError`` for keys the
    router cannot take, or a transport that carries no key."""
    tenants = Tenants.of(config)
    if not tenants.required:
        return GatewayAccess(config, [], None)
    if transport != "http":
        raise ValueError(
            "smg's gRPC mode sends its workers no key and no tenant, so a server with API keys "
            "needs --worker-transport http (the default)"
        )
    if router != "smg":
        if not tenants.single_tenant or config.admin_api_keys:
            raise ValueError(
                f"{router} takes one API key; several tenants or an admin key need --router smg"
            )
        return GatewayAccess(config, [f"--api-key={config.api_key}"], config.api_key)
    gateway = secrets.token_urlsafe(32)
    flags = [f"--api-key={gateway}"]
    pairs = [*config.tenant_keys, *((ADMIN_TENANT, key) for key in config.admin_api_keys)]
    for tenant, key in pairs:
        flags.append(f"--tenant-api-key={tenant.replace(':', '_')}:{key}")
    operators = config.admin_api_keys or (
        tuple(key for _, key in config.tenant_keys) if tenants.single_tenant else ()
    )
    if operators:
        flags.append("--control-plane-api-keys")
        flags += [f"operator{i}:operator:admin:{key}" for i, key in enumerate(operators)]
    workers = dataclasses.replace(config, gateway_api_keys=(gateway,))
    return GatewayAccess(workers, flags, operators[0] if operators else gateway)
