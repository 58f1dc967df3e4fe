"""Request ids scoped by tenant: two tenants may use the same ``rid``, and none can name
another's.

The scheduler knows a request by one string. On a server with keys, the edge names each request
``SCOPE + SEP + rid``: ``SCOPE`` is its tenant, ``rid`` what the client sent (or one the server
made). A client's rid may not hold ``SEP``, so the scope of a scheduler rid is the part before
its last ``SEP`` and no client rid can end up in another scope. Whatever is shown to a client
(``meta_info.id``, an abort's answer, an error) is :func:`client_rid`, the part after it.
"""

from __future__ import annotations

SEP = "\x1f"  # ASCII unit separator: never part of a client's rid (check_client_rid)
MAX_RID_CHARS = 256


def check_client_rid(rid: str) -> str:
    """``rid`` as a client may send it; ``ValueError`` naming what is wrong."""
    if not rid:
        raise ValueError("rid must be a non-empty string")
    if len(rid) > MAX_RID_CHARS:
        raise ValueError(f"rid is {len(rid)} characters long; at most {MAX_RID_CHARS}")
    if any(ch < " " or ch == "\x7f" for ch in rid):
        raise ValueError("rid must not contain control characters")
    return rid


def scoped_rid(scope: str | None, rid: str) -> str:
    """The scheduler's name of ``rid`` in ``scope`` (``None``: a server without tenants)."""
    return rid if scope is None else f"{scope}{SEP}{rid}"


def client_rid(rid: str) -> str:
    """What a client knows a scheduler rid as."""
    return rid.rpartition(SEP)[2]


def scope_of(rid: str) -> str | None:
    """The scope of a scheduler rid, ``None`` for an unscoped one."""
    scope, sep, _ = rid.rpartition(SEP)
    return scope if sep else None
