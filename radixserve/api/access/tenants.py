"""Tenants: who a request's API key belongs to, and the prompt-cache namespace that follows.

Every ``--api-key`` is a tenant of its own; a keys file (``--api-keys-file``: lines ``TENANT
KEY``, ``#`` comments) names tenants and may give one several keys. Each tenant's prompts live in
their own namespace of the radix cache (the request's ``extra_key``), so neither
``cached_tokens`` nor the time to the first token tells one tenant anything of another's
prompts. ``cache_salt`` (vLLM's field, on every route) splits a tenant's namespace further and
never reaches across tenants. ``--shared-prefix-cache`` puts every tenant back into one cache
(salts still split it). ``--admin-api-key`` keys may also use the operator routes (those
declared so: ``api/access/routes.py``); when admin keys are configured, only they may. Behind a gateway that
holds the tenants' own keys and forwards one shared key (SGLang's ``smg``), ``--tenant-header``
names the header it writes the tenant into; the header is trusted only when configured.

Who is an operator (:meth:`Tenants.is_operator`): an admin key; on a server without admin keys,
the one tenant of a single-tenant server (SGLang's ``--api-key``: the key's holder owns the
server), or anyone on a server without keys. A server of several tenants and no admin key has
no operator: its operator routes answer 403. ``--dp-size``'s gateway reaches its workers with a
key of its own (``gateway_keys``): the :data:`GATEWAY_TENANT`, which may flush the cache (the
gateway lets only its own admins ask) and sees the global load, but is no operator.

The ``RequestGuard`` resolves the key once, before the body is read, and leaves the tenant in
the request's state (``request.state.tenant``, ``request.state.admin``); every rid a tenant names
is scoped to it (``server/rid_scope.py``).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixserve.config import ServerConfig
from radixserve.runtime.io_struct import TENANT_PART, cache_scope

ADMIN_TENANT = "admin"
GATEWAY_TENANT = "gateway"


KEY_TENANT_PREFIX = "key-"


def tenant_of_key(key: str) -> str:
    """The tenant of a key given alone (``--api-key``): named by a hash, never the key, so its
    cache namespace (and a KV tier's) stays its own whatever the order of the flags. No
    response shows it (:meth:`Tenants.label`)."""
    return KEY_TENANT_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:10]


def read_keys_file(path: str | Path) -> tuple[tuple[str, str], ...]:
    """``(tenant, key)`` pairs of a keys file; ``ValueError`` naming the line that is wrong."""
    pairs = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        fields = text.split()
        if len(fields) != 2:
            raise ValueError(f"{path}:{number}: expected 'TENANT KEY', got {len(fields)} fields")
        pairs.append((fields[0], fields[1]))
    return tuple(pairs)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who calls, as ``request.state`` holds it (the guard) and the gRPC service resolves it:
    ``tenant`` (None on a server without keys) and ``admin``."""

    tenant: str | None
    admin: bool


@dataclass(frozen=True)
class Tenants:
    """Keys and the tenants they name; empty: an open server (one anonymous tenant)."""

    keys: tuple[tuple[str, str], ...] = ()  # (tenant, key)
    admin_keys: tuple[str, ...] = ()
    shared_cache: bool = False
    header: bytes | None = None  # lower-case name of a trusted gateway's tenant header
    gateway_keys: tuple[str, ...] = ()  # the --dp-size gateway's own key to its workers

    @classmethod
    def of(cls, config: ServerConfig) -> Tenants:
        header = config.tenant_header.lower().encode() if config.tenant_header else None
        return cls(
            config.tenant_keys,
            config.admin_api_keys,
            config.shared_prefix_cache,
            header,
            config.gateway_api_keys,
        )

    def from_header(self, headers: dict[bytes, bytes]) -> str | None:
        """The tenant a trusted gateway named in its header, if configured and present."""
        value = headers.get(self.header) if self.header is not None else None
        return "gateway:" + value.decode("latin-1") if value else None

    @property
    def required(self) -> bool:
        return bool(self.keys or self.admin_keys or self.gateway_keys)

    @property
    def single_tenant(self) -> bool:
        """One tenant holds every key, and no gateway names others in a header."""
        return self.header is None and len({tenant for tenant, _ in self.keys}) <= 1

    def resolve(self, token: bytes) -> tuple[str, bool] | None:
        """``(tenant, is_admin)`` of a presented key, or None. Every key is compared, each in
        constant time."""
        found: tuple[str, bool] | None = None
        for key in self.admin_keys:
            if secrets.compare_digest(token, key.encode()):
                found = (ADMIN_TENANT, True)
        for key in self.gateway_keys:
            if secrets.compare_digest(token, key.encode()) and found is None:
                found = (GATEWAY_TENANT, False)
        for tenant, key in self.keys:
            if secrets.compare_digest(token, key.encode()) and found is None:
                found = (tenant, False)
        return found

    def is_operator(self, state: Any) -> bool:
        """Whether the caller whose guard left ``state`` may use the operator routes and see
        the server's global figures (see the module doc)."""
        if not self.required or getattr(state, "admin", False):
            return True
        tenant = getattr(state, "tenant", None)
        return not self.admin_keys and self.single_tenant and tenant != GATEWAY_TENANT

    def is_gateway(self, state: Any) -> bool:
        return bool(self.gateway_keys) and getattr(state, "tenant", None) == GATEWAY_TENANT

    def may_see_text(self, state: Any) -> bool:
        """The cache page shows prompts' text and namespaces to operators only."""
        return self.is_operator(state)

    def label(self, namespace: str | None) -> str | None:
        """A cache namespace as the cache page shows it: a tenant named after its key's digest
        (a lone ``--api-key``) is shown by the key's place on the command line instead, so no
        response holds a digest of a key."""
        if not namespace:
            return namespace
        labels: dict[str, str] = {}
        for tenant, _ in self.keys:
            if tenant.startswith(KEY_TENANT_PREFIX) and tenant not in labels:
                labels[tenant] = f"api-key-{len(labels) + 1}"
        parts = namespace.split("|")
        for i, part in enumerate(parts):
            name = part.removeprefix(TENANT_PART)
            if part.startswith(TENANT_PART) and name in labels:
                parts[i] = TENANT_PART + labels[name]
        return "|".join(parts)

    def scope(self, state: Any) -> str | None:
        """The rid scope of the caller whose guard left ``state``: its tenant on a server
        with keys (``None``: an open server, whose rids are the clients' own)."""
        return getattr(state, "tenant", None) if self.required else None

    def cache_scope(self, state: Any) -> str | None:
        """The cache scope (``runtime/io_struct.py``) of the caller whose guard left
        ``state``: its tenant's, unless tenants share the cache."""
        return cache_scope(self.namespace(state, None))

    def namespace(
        self, state: Any, cache_salt: str | None, extra_key: str | None = None
    ) -> str | None:
        """The radix-cache namespace (the request's ``extra_key``) of a request whose guard
        left ``state``: its tenant's, then SGLang's ``extra_key`` and the ``cache_salt`` it
        sent (each part prefixed, so no client value can name another part or an adapter; a
        ``|`` in a tenant's name, which a gateway's header may hold, is escaped so that no
        tenant's part ends where another's would)."""
        parts = []
        tenant = getattr(state, "tenant", None)
        if tenant is not None and not self.shared_cache:
            escaped = tenant.replace("%", "%25").replace("|", "%7C")
            parts.append(f"{TENANT_PART}{escaped}")
        if extra_key:
            parts.append(f"key:{extra_key}")
        if cache_salt:
            parts.append(f"salt:{cache_salt}")
        return "|".join(parts) or None
