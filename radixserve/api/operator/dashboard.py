"""The live cache page: ``GET /dashboard`` (a static page) and ``GET /cache_tree`` (its data).

The page polls ``/cache_tree`` every couple of seconds. One poll asks the scheduler for the
radix tree, summarised to ``max_nodes`` nodes (``radix/tree_summary.py``), and its counters;
the HTTP process adds each node's text and keeps the counters of the last minutes
(:class:`StatsHistory`) so a page opened late still draws them. Nothing is sampled while no
page polls. Both routes sit behind the API key like every other route; a browser that cannot
set the ``Authorization`` header may pass ``?api_key=`` to these two GET routes only
(the routes are declared ``query_key``: ``api/access/routes.py``). On a server that drafts
(``--speculative-algorithm``) the data adds the scheduler's speculative figures (accept length,
drafts, draft and accepted tokens) and each history point the accept length of its interval.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse

from radixserve.api.access.routes import Access, declare
from radixserve.api.access.tenants import Tenants
from radixserve.api.errors import APIError
from radixserve.radix.tree_summary import HEAD_TOKENS
from radixserve.server.tokenizer_manager import TokenizerManager

STATIC_DIR = Path(__file__).parent / "static"
MAX_TREE_NODES = 2000  # the most nodes one poll may ask for


class StatsHistory:
    """Rates over the last ``window_s`` seconds from the scheduler's cumulative counters,
    one point per poll (at most one each ``min_interval_s``)."""

    def __init__(
        self,
        window_s: float = 600.0,
        min_interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.window_s = window_s
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._last: tuple[float, dict[str, Any]] | None = None
        self._points: deque[dict[str, Any]] = deque()

    def add(self, stats: dict[str, Any]) -> None:
        now = self.clock()
        if self._last is not None and now - self._last[0] < self.min_interval_s:
            return
        if self._last is not None:
            self._points.append(_point(now, now - self._last[0], self._last[1], stats))
        self._last = (now, stats)
        while self._points and self._points[0]["t"] < now - self.window_s:
            self._points.popleft()

    def points(self) -> list[dict[str, Any]]:
        return list(self._points)


def _point(now: float, dt: float, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    def delta(key: str) -> int:
        return max(int(new[key]) - int(old[key]), 0)  # a counter never falls but on a restart

    cached, computed = delta("num_cached_prompt_tokens"), delta("num_prefill_tokens")
    prompt = cached + computed
    return {
        "t": now,
        "hit_rate": cached / prompt if prompt else None,
        "prompt_tokens_per_s": prompt / dt,
        "generated_tokens_per_s": delta("num_generated_tokens") / dt,
        "running": new["num_running_reqs"],
        "waiting": new["num_waiting_reqs"],
        "accept_length": _accept_length(old, new),
    }


def _accept_length(old: dict[str, Any], new: dict[str, Any]) -> float | None:
    """Tokens per drafted verify step between two polls (None: no draft between them)."""
    drafts = new.get("num_spec_drafts", 0) - old.get("num_spec_drafts", 0)
    accepted = new.get("num_spec_accepted_tokens", 0) - old.get("num_spec_accepted_tokens", 0)
    return (drafts + accepted) / drafts if drafts > 0 else None


def speculative_figures(stats: dict[str, Any]) -> dict[str, Any]:
    """The scheduler's speculative decoding figures, since it started."""
    return {
        "accept_length": stats["avg_spec_accept_length"],
        "num_drafts": stats["num_spec_drafts"],
        "num_draft_tokens": stats["num_spec_draft_tokens"],
        "num_accepted_tokens": stats["num_spec_accepted_tokens"],
    }


def kv_usage(stats: dict[str, Any]) -> dict[str, int]:
    """The pool in three parts: free, cached (in the tree, evictable) and in use."""
    free, evictable = int(stats["num_free_tokens"]), int(stats["num_evictable_tokens"])
    return {
        "free": free,
        "cached": evictable,
        "in_use": int(stats["max_total_tokens"]) - free - evictable,
    }


def dashboard_router(tm: TokenizerManager, tenants: Tenants, speculative: bool) -> APIRouter:
    """``speculative``: the server drafts (the data carries its figures)."""
    router = APIRouter()
    history = StatsHistory()

    @router.get("/dashboard", include_in_schema=False)
    async def dashboard() -> FileResponse:
        return FileResponse(STATIC_DIR / "dashboard.html", media_type="text/html")

    @router.get("/dashboard/static/{name}", include_in_schema=False)
    async def dashboard_static(name: str) -> FileResponse:
        return FileResponse(_static_file(name))

    @router.get("/cache_tree")
    async def cache_tree(
        request: Request,
        max_nodes: int = Query(200, ge=1, le=MAX_TREE_NODES),
        token_ids: bool = False,
    ) -> dict[str, Any]:
        """The radix tree (at most ``max_nodes`` nodes: the ones holding the most tokens, each
        saying what it leaves out), KV usage, queue lengths and the last minutes' rates. The
        prompts' text and namespaces only to an admin key, or on a server without keys; with
        ``token_ids``, each node's whole run of token ids too (what KV events describe);
        ``speculative``: the drafting figures, None on a server that does not draft."""
        reply = await tm.get_cache_tree(max_nodes, full_keys=token_ids)
        tree, stats = reply["tree"], reply["stats"]
        show = tenants.may_see_text(request.state)
        for node in tree["nodes"]:
            head_ids = node.pop("head_ids")
            node["text"] = tm.prompts.decode(head_ids[:HEAD_TOKENS]) if show else None
            if token_ids:
                node["token_ids"] = head_ids if show else None
            node["extra_key"] = tenants.label(node["extra_key"]) if show else None
        history.add(stats)
        return {
            "tree": tree,
            "kv": kv_usage(stats),
            "running": stats["num_running_reqs"],
            "waiting": stats["num_waiting_reqs"],
            "cache_hit_rate": stats["cache_hit_rate"],
            "speculative": speculative_figures(stats) if speculative else None,
            "history": history.points(),
        }

    return declare(router, Access.OPERATOR, query_key=True)


_STATIC_FILES = {"dashboard.js", "echarts.min.js"}


def _static_file(name: str) -> Path:
    if name not in _STATIC_FILES:  # a fixed set: no path from the URL reaches the disk
        raise APIError(f"no such file: {name}", 404, "not_found")
    return STATIC_DIR / name
