"""Who may call a route, declared with the route.

Every route says its :class:`Access` when it is declared (``declare``: the routers of the
app's modules each declare theirs), in the route's OpenAPI extension ``x-access``:

- ``open``: no key needed (``/health``);
- ``tenant``: any key the server takes;
- ``operator``: an operator only (``Tenants.is_operator``: 403 for anyone else), except that a
  route marked ``gateway`` also admits the ``--dp-size`` gateway's own key.

A route may also take its key as ``?api_key=`` (``query_key``: the cache page, which a browser
opens). :class:`RouteTable` reads the declarations of the built app once; the guard asks it
before any body is read. A route that declares nothing is refused at start
(:meth:`RouteTable.of` raises), so no route is public by omission. FastAPI's own document
routes (``/docs``, ``/redoc``, ``/openapi.json``) are a tenant's.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI

EXTENSION = "x-access"
DOC_PATHS = ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")


class Access(str, enum.Enum):
    OPEN = "open"
    TENANT = "tenant"
    OPERATOR = "operator"


def declare(
    router: APIRouter, access: Access, query_key: bool = False, gateway: bool = False
) -> APIRouter:
    """Mark every route of ``router`` (declared so far) with ``access``; returns it."""
    for route in router.routes:
        extra = dict(getattr(route, "openapi_extra", None) or {})
        extra[EXTENSION] = {"access": access.value, "query_key": query_key, "gateway": gateway}
        route.openapi_extra = extra  # type: ignore[attr-defined]
    return router


@dataclass(frozen=True)
class RouteFacts:
    access: Access
    query_key: bool = False  # the key may come as ?api_key= (a browser's GET)
    gateway: bool = False  # an operator route the --dp-size gateway may call


@dataclass(frozen=True)
class _Entry:
    pattern: re.Pattern[str]
    methods: frozenset[str]
    facts: RouteFacts


class RouteTable:
    """The declared facts of every route of an app, looked up by method and path."""

    def __init__(self, entries: Iterable[_Entry] = ()) -> None:
        self._entries = list(entries)

    @classmethod
    def of(cls, app: FastAPI) -> RouteTable:
        """The table of ``app``'s routes; ``ValueError`` naming a route that declares no
        access."""
        entries = []
        for route in routes_of(app.routes):
            facts = facts_of(route)
            if facts is None:
                raise ValueError(
                    f"the route {route.path} declares no access (api/access/routes.py)"
                )
            methods = frozenset(getattr(route, "methods", None) or ())
            entries.append(_Entry(route.path_regex, methods, facts))
        return cls(entries)

    def facts(self, method: str, path: str) -> RouteFacts:
        """The facts of the route serving ``method path``; a path no route serves is a
        tenant's (a key first, then its 404)."""
        for entry in self._entries:
            if entry.pattern.match(path) and (not entry.methods or method in entry.methods):
                return entry.facts
        return RouteFacts(Access.TENANT)


def routes_of(routes: Iterable[Any]) -> Iterator[Any]:
    """Every route, included routers walked (FastAPI keeps them as wrappers)."""
    for route in routes:
        if hasattr(route, "original_router"):
            yield from routes_of(route.original_router.routes)
        elif hasattr(route, "path_regex"):
            yield route


def facts_of(route: Any) -> RouteFacts | None:
    if route.path in DOC_PATHS:
        return RouteFacts(Access.TENANT)
    declared = (getattr(route, "openapi_extra", None) or {}).get(EXTENSION)
    if declared is None:
        return None
    return RouteFacts(Access(declared["access"]), declared["query_key"], declared["gateway"])
