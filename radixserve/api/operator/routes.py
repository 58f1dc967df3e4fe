"""The server's own routes: health (open), what the server is and how loaded (a tenant's, each
seeing its own figures), the cache flush, SGLang's pause and continue of generation and its
weight update from disk (an operator's)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict

from radixserve.api.access.routes import Access, declare
from radixserve.api.access.tenants import Tenants
from radixserve.api.errors import APIError
from radixserve.api.openapi import EMPTY, TEXT
from radixserve.api.operator import server_info
from radixserve.api.operator.tenant_metrics import MetricsByTenant
from radixserve.api.streaming import collect_all, open_requests
from radixserve.config import ServerConfig
from radixserve.runtime.io_struct import GenerateRequest
from radixserve.runtime.pause import check_mode
from radixserve.runtime.weight_update import check_load_format, updated
from radixserve.server.tokenizer_manager import TokenizerManager
from radixserve.types import SamplingParams

HEALTH_GENERATE_TIMEOUT_S = 20.0
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


def health_router(tm: TokenizerManager) -> APIRouter:
    router = APIRouter()

    @router.get("/health", responses=EMPTY)
    async def health() -> Response:
        if not tm.is_alive:
            raise APIError(f"unhealthy: {tm.dead_reason}".splitlines()[0], 503, "server_error")
        return Response(status_code=200)

    return declare(router, Access.OPEN)


def flush_router(tm: TokenizerManager) -> APIRouter:
    router = APIRouter()

    async def flush() -> Response:
        if await tm.flush_cache():
            return PlainTextResponse("Cache flushed.\n")
        raise APIError("cannot flush the cache while requests are running", 400)

    # one route a method, so each has its own OpenAPI operation id
    router.add_api_route("/flush_cache", flush, methods=["POST"], responses=TEXT)
    router.add_api_route(
        "/flush_cache", flush, methods=["GET"], responses=TEXT, name="flush_cache_get"
    )

    return declare(router, Access.OPERATOR, gateway=True)


class PauseBody(BaseModel):
    """SGLang's ``PauseGenerationReqInput``: what becomes of the requests in flight."""

    model_config = ConfigDict(extra="forbid")
    mode: str = "abort"  # abort | retract | in_place (runtime/pause.py)


def generation_router(tm: TokenizerManager) -> APIRouter:
    """``/pause_generation`` and ``/continue_generation``, as SGLang's (an RL trainer's, around
    a weight update): while paused no step runs and new requests wait."""
    router = APIRouter()

    @router.post("/pause_generation")
    async def pause_generation(body: PauseBody | None = None) -> dict[str, str]:
        await tm.pause_generation(check_mode((body or PauseBody()).mode))  # ValueError: a 400
        return {"message": "Generation paused successfully.", "status": "ok"}

    @router.post("/continue_generation")
    async def continue_generation() -> dict[str, str]:
        await tm.pause_generation(None)
        return {"message": "Generation continued successfully.", "status": "ok"}

    return declare(router, Access.OPERATOR, gateway=True)


class UpdateWeightsBody(BaseModel):
    """SGLang's ``UpdateWeightFromDiskReqInput``. Taken and without effect here: ``is_async``
    (nothing waits: a running request refuses the update), ``torch_empty_cache``,
    ``recapture_cuda_graph`` (the weights keep their memory), ``keep_pause`` (the pause state
    is left as it is), ``token_step`` and ``manifest``."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True
    is_async: bool = False
    torch_empty_cache: bool = False
    keep_pause: bool = False
    recapture_cuda_graph: bool = False
    token_step: int = 0
    manifest: dict[str, Any] | None = None


class WeightsByNameBody(BaseModel):
    """SGLang's ``GetWeightsByNameReqInput``."""

    model_config = ConfigDict(extra="forbid")
    name: str
    truncate_size: int = 100


class WeightVersionBody(BaseModel):
    """SGLang's ``UpdateWeightVersionReqInput``."""

    model_config = ConfigDict(extra="forbid")
    new_version: str
    abort_all_requests: bool = False


def weights_router(tm: TokenizerManager) -> APIRouter:
    """``/update_weights_from_disk``, as SGLang's (``runtime/weight_update.py``): 200 with
    ``success`` true, or 400 with ``success`` false and why, the served weights unchanged;
    ``/get_weights_by_name`` and ``/update_weight_version``, SGLang's too."""
    router = APIRouter()

    @router.post("/update_weights_from_disk")
    async def update_weights_from_disk(body: UpdateWeightsBody) -> JSONResponse:
        try:
            check_load_format(body.load_format)
            await tm.update_weights_from_disk(
                body.model_path, body.flush_cache, body.abort_all_requests, body.weight_version
            )
        except ValueError as exc:
            refused = {"success": False, "message": str(exc), "num_paused_requests": 0}
            return JSONResponse(refused, status_code=400)
        done = {"success": True, "message": updated(body.weight_version), "num_paused_requests": 0}
        return JSONResponse(done)

    @router.post("/get_weights_by_name")
    async def get_weights_by_name(body: WeightsByNameBody) -> list[Any]:
        """SGLang's: the first ``truncate_size`` rows of a checkpoint tensor as served (how a
        trainer checks an update); an unknown name is a 400."""
        return await tm.get_weights_by_name(body.name, body.truncate_size)  # ValueError: 400

    @router.post("/update_weight_version")
    async def update_weight_version(body: WeightVersionBody) -> dict[str, Any]:
        """SGLang's: a new label of the served weights (``abort_all_requests``: every request
        waiting here ends first, so no result of the old weights carries the new label)."""
        if body.abort_all_requests:
            tm.abort()
        tm.weight_version = body.new_version
        message = f"Weight version updated to {body.new_version}"
        return {"success": True, "message": message, "new_version": body.new_version}

    return declare(router, Access.OPERATOR, gateway=True)


def info_router(
    tm: TokenizerManager, config: ServerConfig, tenants: Tenants, metrics: MetricsByTenant
) -> APIRouter:
    router = APIRouter()
    meter = server_info.ThroughputMeter()

    @router.get("/get_weight_version")
    async def get_weight_version() -> dict[str, str]:
        """SGLang's older route for the label of the served weights (now in ``/model_info``)."""
        return {"weight_version": tm.weight_version}

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
            return server_info.tenant_server_info(tm, config, tenant, metrics.usage(tenant))
        info = await server_info.get_server_info(tm, config, meter)
        metrics.server.update_scheduler_stats(info["scheduler"])
        return info

    @router.get("/health_generate", responses=EMPTY)
    async def health_generate() -> Response:
        """SGLang's deep health check: one token generated end to end (503 otherwise)."""
        await _generate_one(tm)
        return Response(status_code=200)

    @router.get("/get_load")
    async def get_load(raw: Request) -> dict[str, Any]:
        """What sglang-router's load-aware policies read (the gateway and operators: the
        scheduler's; a tenant: its own pending requests)."""
        if not (tenants.is_operator(raw.state) or tenants.is_gateway(raw.state)):
            mine = tm.num_pending(raw.state.tenant)
            return {"load": mine, "dp_rank": 0, "num_reqs": mine, "num_waiting_reqs": 0}
        return server_info.load(await tm.get_server_info(check_integrity=False))

    @router.get("/metrics", responses=TEXT)
    async def prometheus_metrics(raw: Request) -> Response:
        """The server's metrics to an operator; a tenant's own requests' to a tenant."""
        if not tenants.is_operator(raw.state):
            return Response(metrics.of(str(raw.state.tenant)).render(), media_type=PROMETHEUS)
        if tm.is_alive:
            with contextlib.suppress(Exception):
                info = await tm.get_server_info(check_integrity=False)
                metrics.server.update_scheduler_stats(info["stats"])
        return Response(metrics.server.render(), media_type=PROMETHEUS)

    return declare(router, Access.TENANT)


async def _generate_one(tm: TokenizerManager) -> None:
    """One token generated end to end; a 503 naming why not."""
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
