"""The FastAPI application: routes over a :class:`TokenizerManager`.

Routes: ``/generate`` (SGLang native), ``/v1/completions``, ``/v1/chat/completions``,
``/v1/models``, ``/health``, ``/health_generate`` (one token end to end),
``/get_model_info`` = ``/model_info``, ``/get_server_info`` = ``/server_info``, ``/get_load``,
``/flush_cache``, ``/abort_request``, ``/metrics``, the cache page (``/dashboard``,
``/cache_tree``: ``api/operator/dashboard.py``), and the docs (``/docs``, ``/redoc``,
``/openapi.json``) unless ``disable_docs``. With an API key, every path but ``/health`` needs
``Authorization: Bearer <key>`` (401 otherwise; :class:`RequestGuard` checks it before reading
the body).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from radixserve.api.access.guard import RequestGuard
from radixserve.api.access.tenants import Tenants
from radixserve.api.errors import APIError, UnhandledErrors, install_error_handlers
from radixserve.api.native.protocol import AbortReqInput, GenerateReqInput
from radixserve.api.native.serving import NativeServing
from radixserve.api.openai.bodies import ModelCard, ModelList, dump
from radixserve.api.openai.chat import ChatServing
from radixserve.api.openai.completions import CompletionServing
from radixserve.api.openai.protocol import ChatCompletionRequest, CompletionRequest
from radixserve.api.openapi import ROUTE_RESPONSES, install_openapi
from radixserve.api.operator import server_info
from radixserve.api.operator.dashboard import dashboard_router
from radixserve.api.operator.lora import lora_router
from radixserve.api.operator.tenant_metrics import MetricsByTenant
from radixserve.api.request_builder import RequestBuilder
from radixserve.api.streaming import collect_all, open_requests
from radixserve.config import ServerConfig
from radixserve.runtime.default_model import DESCRIPTION as DEFAULT_MODEL_DESCRIPTION
from radixserve.runtime.io_struct import GenerateRequest
from radixserve.server.rid_scope import client_rid, scope_of, scoped_rid
from radixserve.server.tokenizer_manager import TokenizerManager
from radixserve.types import SamplingParams

logger = logging.getLogger(__name__)

HEALTH_GENERATE_TIMEOUT_S = 20.0


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


def abort_matcher(body: AbortReqInput, scope: str | None) -> Callable[[str], bool]:
    """Which scheduler rids an abort reaches: ``scope`` None (an operator, or an open server)
    any request of that client rid (every one with ``abort_all``); else that scope's only."""
    if scope is None:
        return lambda rid: body.abort_all or client_rid(rid) == body.rid
    if body.abort_all:
        return lambda rid: scope_of(rid) == scope
    target = scoped_rid(scope, body.rid)
    return lambda rid: rid == target


def create_app(
    tm: TokenizerManager, config: ServerConfig, metrics: MetricsByTenant | None = None
) -> FastAPI:
    """The app; its lifespan starts and stops ``tm``'s background tasks. ``metrics`` should
    be ``tm``'s output observer (the server's launcher makes it so)."""
    by_tenant = metrics or MetricsByTenant(config.model_name)
    server_metrics = by_tenant.server

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

    docs = {} if not config.disable_docs else dict(docs_url=None, redoc_url=None, openapi_url=None)
    app = FastAPI(title="radixserve", lifespan=lifespan, **docs)  # type: ignore[arg-type]
    app.add_middleware(JSONBodyMiddleware)
    tenants = Tenants.of(config)
    app.add_middleware(RequestGuard, tenants=tenants, max_request_bytes=config.max_request_bytes)
    app.add_middleware(UnhandledErrors)  # added last: the outermost layer, so it runs first
    install_error_handlers(app)
    meter = server_info.ThroughputMeter()
    native = NativeServing(RequestBuilder(tm, tenants, config), config.reasoning_parser)
    completions = CompletionServing(tm, config)
    chat = ChatServing(tm, config)
    router = APIRouter()

    @app.get("/health", responses=ROUTE_RESPONSES["empty"])
    async def health() -> Response:
        if not tm.is_alive:
            raise APIError(f"unhealthy: {tm.dead_reason}".splitlines()[0], 503, "server_error")
        return Response(status_code=200)

    @router.post("/generate", responses=ROUTE_RESPONSES["generate"])
    async def generate(body: GenerateReqInput, raw: Request) -> Response:
        return await native.generate(body, raw)

    @router.post("/v1/completions", responses=ROUTE_RESPONSES["completions"])
    async def v1_completions(body: CompletionRequest, raw: Request) -> Response:
        return await completions.create(body, raw)

    @router.post("/v1/chat/completions", responses=ROUTE_RESPONSES["chat"])
    async def v1_chat_completions(body: ChatCompletionRequest, raw: Request) -> Response:
        return await chat.create(body, raw)

    @router.get("/v1/models", responses=ROUTE_RESPONSES["models"])
    async def v1_models() -> dict[str, Any]:
        """The base model, then every LoRA adapter with the base as its ``parent`` (vLLM's)."""
        ctx = tm.info.max_context_len
        card = ModelCard(
            id=config.model_name,
            root=config.engine.model_path,
            max_model_len=ctx,
            description=DEFAULT_MODEL_DESCRIPTION if config.is_default_model else None,
            is_smoke_test_model=config.is_default_model,
        )
        adapters = [
            ModelCard(id=name, root=path, parent=config.model_name, max_model_len=ctx)
            for name, path in sorted(tm.lora_adapters.items())
        ]
        return dump(ModelList(data=[card, *adapters]))

    @router.get("/get_model_info")
    @router.get("/model_info")
    async def get_model_info() -> dict[str, Any]:
        return server_info.get_model_info(tm, config)

    @router.get("/get_server_info")
    @router.get("/server_info")
    async def get_server_info(raw: Request) -> dict[str, Any]:
        """The whole server's figures to an operator, a tenant's own to a tenant."""
        if not tenants.is_operator(raw.state):
            tenant = str(raw.state.tenant)
            return server_info.tenant_server_info(tm, config, tenant, by_tenant.usage(tenant))
        info = await server_info.get_server_info(tm, config, meter)
        server_metrics.update_scheduler_stats(info["scheduler"])
        return info

    @router.get("/health_generate", responses=ROUTE_RESPONSES["empty"])
    async def health_generate() -> Response:
        """SGLang's deep health check: one token generated end to end (503 otherwise)."""
        if not tm.is_alive:
            raise APIError(f"unhealthy: {tm.dead_reason}".splitlines()[0], 503, "server_error")
        request = GenerateRequest(
            rid=f"health-{tm.new_rid()}",
            input_ids=await tm.prompts.tokenize("Hello"),
            sampling_params=SamplingParams(max_new_tokens=1, temperature=0.0),
        )
        try:
            group = await open_requests(tm, [tm.validator.check(request)], None)
            await asyncio.wait_for(collect_all(group, [request]), HEALTH_GENERATE_TIMEOUT_S)
        except Exception as exc:
            raise APIError(f"unhealthy: {exc!r}".splitlines()[0], 503, "server_error") from None
        return Response(status_code=200)

    @router.get("/get_load")
    async def get_load(raw: Request) -> dict[str, Any]:
        """What sglang-router's load-aware policies read: ``load`` (requests running or
        waiting here), with the parts SGLang's own ``/get_load`` reports; a tenant's own
        pending requests to a tenant."""
        if not (tenants.is_operator(raw.state) or tenants.is_gateway(raw.state)):
            mine = sum(scope_of(rid) == raw.state.tenant for rid in tm.states)
            return {"load": mine, "dp_rank": 0, "num_reqs": mine, "num_waiting_reqs": 0}
        stats = (await tm.get_server_info(check_integrity=False))["stats"]
        running, waiting = stats["num_running_reqs"], stats["num_waiting_reqs"]
        used = stats["max_total_tokens"] - stats["num_free_tokens"] - stats["num_evictable_tokens"]
        return {
            "load": running + waiting,
            "dp_rank": 0,
            "num_reqs": running + waiting,
            "num_waiting_reqs": waiting,
            "num_tokens": used,
        }

    @router.api_route("/flush_cache", methods=["GET", "POST"], responses=ROUTE_RESPONSES["text"])
    async def flush_cache() -> Response:
        if await tm.flush_cache():
            return PlainTextResponse("Cache flushed.\n")
        raise APIError("cannot flush the cache while requests are running", 400)

    @router.post("/abort_request")
    async def abort_request(body: AbortReqInput, raw: Request) -> dict[str, Any]:
        """A tenant's abort reaches its own requests only (rids are scoped to it); an operator's
        reaches every tenant's; ``abort_all`` is an operator's call where there is one."""
        if not body.abort_all and not body.rid:
            raise APIError("give rid or abort_all", param="rid")
        operator = tenants.is_operator(raw.state)
        if body.abort_all and not operator and tenants.admin_keys:
            raise APIError("abort_all needs an admin API key", 403, code="admin_key_required")
        scope = tenants.scope(raw.state)
        aborted = tm.abort_where(abort_matcher(body, None if operator else scope))
        return {"aborted": [client_rid(r) for r in aborted]}

    @router.get("/metrics", responses=ROUTE_RESPONSES["text"])
    async def prometheus_metrics(raw: Request) -> Response:
        """The server's metrics to an operator; a tenant's own requests' to a tenant."""
        media_type = "text/plain; version=0.0.4; charset=utf-8"
        if not tenants.is_operator(raw.state):
            return Response(by_tenant.of(str(raw.state.tenant)).render(), media_type=media_type)
        if tm.is_alive:
            with contextlib.suppress(Exception):
                info = await tm.get_server_info(check_integrity=False)
                server_metrics.update_scheduler_stats(info["stats"])
        return Response(server_metrics.render(), media_type=media_type)

    app.include_router(router)
    app.include_router(dashboard_router(tm, tenants))
    app.include_router(lora_router(tm))
    install_openapi(app)
    app.state.metrics = server_metrics
    return app
