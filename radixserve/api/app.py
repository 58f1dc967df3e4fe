"""The FastAPI application: every door's routes over one :class:`TokenizerManager`.

The routers: SGLang's native ``/generate`` and ``/abort_request`` (``api/native``), OpenAI's
``/v1/completions``, ``/v1/chat/completions`` and ``/v1/models`` (``api/openai``), Anthropic's
``/v1/messages`` (``api/anthropic``) and the Responses API (``api/responses``), both onto the
chat pipeline, the server's
own routes (``api/operator``: ``/health``, ``/health_generate``, model and server info,
``/get_load``, ``/metrics``, ``/flush_cache``, ``/pause_generation`` and ``/continue_generation``,
the cache page, the LoRA routes), and the docs
(``/docs``, ``/redoc``, ``/openapi.json``) unless ``disable_docs``. Each route declares who may
call it (``api/access/routes.py``); the :class:`RequestGuard` enforces that before it reads a
body. The gRPC service (``api/grpc``) starts with the app when ``--grpc-port`` is given.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from radixserve.api.access.guard import RequestGuard
from radixserve.api.access.routes import RouteTable
from radixserve.api.access.tenants import Tenants
from radixserve.api.anthropic.messages import error_body as anthropic_error
from radixserve.api.anthropic.routes import ERROR_PREFIX as ANTHROPIC_PREFIX
from radixserve.api.anthropic.routes import anthropic_router
from radixserve.api.anthropic.threads import ThreadStore
from radixserve.api.errors import UnhandledErrors, install_error_handlers
from radixserve.api.native.routes import native_router
from radixserve.api.native.serving import NativeServing
from radixserve.api.openai.chat import ChatServing
from radixserve.api.openai.routes import openai_router
from radixserve.api.openai.tokenize import tokenize_router
from radixserve.api.openapi import install_openapi
from radixserve.api.operator.dashboard import dashboard_router
from radixserve.api.operator.lora import lora_router
from radixserve.api.operator.routes import (
    flush_router,
    generation_router,
    health_router,
    info_router,
    weights_router,
)
from radixserve.api.operator.server_info import speculating
from radixserve.api.operator.tenant_metrics import MetricsByTenant
from radixserve.api.request_builder import RequestBuilder
from radixserve.api.responses.conversations import conversations_router
from radixserve.api.responses.peers import ForwardToOwner, StatePeers
from radixserve.api.responses.routes import responses_router
from radixserve.api.responses.store import ConversationStore, ResponseStore
from radixserve.config import ServerConfig
from radixserve.server.tokenizer_manager import TokenizerManager


class JSONBodyMiddleware:
    """Reads every POST body as JSON whatever its Content-Type (``curl -d`` sends
    ``application/x-www-form-urlencoded``), as SGLang and OpenAI clients mean it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST":
            headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
            headers.append((b"content-type", b"application/json"))
            scope = {**scope, "headers": headers}
        await self.app(scope, receive, send)


def create_app(
    tm: TokenizerManager, config: ServerConfig, metrics: MetricsByTenant | None = None
) -> FastAPI:
    """The app; its lifespan starts and stops ``tm``'s background tasks (and the gRPC
    service). ``metrics`` should be ``tm``'s output observer (the launcher makes it so)."""
    metrics = metrics or MetricsByTenant(config.model_name, speculating(config))
    docs = {} if not config.disable_docs else dict(docs_url=None, redoc_url=None, openapi_url=None)
    app = FastAPI(title="radixserve", lifespan=_lifespan(tm, config), **docs)  # type: ignore[arg-type]
    tenants = Tenants.of(config)
    native = NativeServing(RequestBuilder(tm, tenants, config), config.reasoning_parser)
    chat = ChatServing(tm, config)
    bounds = (config.max_stored_responses, config.max_stored_bytes)  # responses; conversations
    conversations = ConversationStore(*bounds)
    peers = StatePeers(config.state_peers, config.engine.parallel.dp_rank)
    for router in (
        health_router(tm),
        native_router(tm, tenants, native),
        tokenize_router(tm),
        openai_router(tm, config, chat),
        anthropic_router(chat, tenants, ThreadStore(*bounds), peers),
        responses_router(chat, tenants, ResponseStore(*bounds), conversations, peers),
        conversations_router(tenants, conversations, peers),
        info_router(tm, config, tenants, metrics),
        flush_router(tm),
        generation_router(tm),
        weights_router(tm),
        dashboard_router(tm, tenants, speculating(config)),
        lora_router(tm),
    ):
        app.include_router(router)
    install_error_handlers(app, {ANTHROPIC_PREFIX: anthropic_error})
    install_openapi(app)
    app.add_middleware(JSONBodyMiddleware)
    app.add_middleware(ForwardToOwner, peers=peers)  # inside the guard: callers checked first
    routes, limit = RouteTable.of(app), config.max_request_bytes
    app.add_middleware(RequestGuard, tenants=tenants, routes=routes, max_request_bytes=limit)
    app.add_middleware(UnhandledErrors)  # added last: the outermost layer, so it runs first
    app.state.metrics = metrics.server
    return app


def _lifespan(tm: TokenizerManager, config: ServerConfig) -> Any:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await tm.start()
        grpc_server = None
        try:
            if config.grpc_port is not None:  # grpcio and smg-grpc-proto: the [grpc] extra
                from radixserve.api.grpc.server import start_grpc_server

                grpc_server = await start_grpc_server(tm, config)
            yield
        finally:
            if grpc_server is not None:
                await grpc_server.stop(1.0)
            await tm.close()

    return lifespan
