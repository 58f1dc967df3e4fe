"""``--grpc-port``: SGLang's gRPC scheduler service, so smg can run radixserve as a gRPC worker.

smg's gRPC mode tokenizes, applies the chat template and detokenizes in the gateway, and talks
to each worker over ``sglang.grpc.scheduler.SglangScheduler`` (the proto of the
``smg-grpc-proto`` package). This serves it beside the HTTP routes, from the same
``TokenizerManager``:

- ``Generate``: token ids in, token ids out (a ``GenerateStreamChunk`` of the new ids per
  output when the request streams, then one ``GenerateComplete`` per sample with all of its
  ids and logprobs; ``n`` samples are ``n`` requests), with the sampling parameters, stop strings and token ids, structured output,
  logprobs and the adapter (``lora_id``) of the HTTP routes. A bad request is
  ``INVALID_ARGUMENT`` with the HTTP route's message;
- ``HealthCheck``, ``Abort``, ``GetModelInfo``, ``GetServerInfo``, ``GetLoads``,
  ``FlushCache``, ``GetTokenizer`` (the checkpoint's tokenizer files as a zip);
- ``SubscribeKvEvents``: the KV events (``--kv-events-config``) relayed from the publisher's
  socket (``api/grpc/kv_events.py``); this is what smg's event-driven cache-aware routing
  reads.

Not served (``UNIMPLEMENTED``): ``Embed``, profiling, LoRA loading over gRPC (the HTTP routes
load adapters).

On a server with keys every call needs one (``api/grpc/auth.py``): the HTTP routes' keys,
tenants and operator rule; a tenant's rids and prompt cache are its own, as over HTTP.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.struct_pb2 import Struct
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from radixserve.api.access.tenants import Caller, Tenants
from radixserve.api.errors import APIError
from radixserve.api.grpc.auth import KeyInterceptor, caller
from radixserve.api.grpc.convert import (
    complete_of,
    max_new_tokens_of,
    plain,
    read_json,
    sampling_params,
    stream_chunk,
    tokenizer_zip,
)
from radixserve.api.grpc.kv_events import relay_kv_events
from radixserve.api.operator.server_info import server_args, version
from radixserve.api.request_builder import Generation, RequestBuilder
from radixserve.config import ServerConfig
from radixserve.runtime.io_struct import GenerateRequest, ReqOutput
from radixserve.server.request_state import RequestFailed, SchedulerUnavailable
from radixserve.server.rid_scope import client_rid, scope_of
from radixserve.server.tokenizer_manager import TokenizerManager

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
UNSERVED = (
    "Embed",
    "StartProfile",
    "StopProfile",
    "LoadLoRAAdapter",
    "UnloadLoRAAdapter",
    "ListLoadedLoRAAdapters",
)


class SchedulerService(pb_grpc.SglangSchedulerServicer):
    def __init__(self, tm: TokenizerManager, config: ServerConfig) -> None:
        self.tm = tm
        self.config = config
        self.tenants = Tenants.of(config)
        self.builder = RequestBuilder(tm, self.tenants, config)
        self.started = time.time()

    def _caller(self, context: grpc.aio.ServicerContext) -> Caller:
        """The caller the interceptor let in (its key resolved again: the same answer)."""
        who = caller(self.tenants, context.invocation_metadata())
        assert who is not None, "KeyInterceptor lets no call without a key through"
        return who

    # ---- generation ---------------------------------------------------------------------
    async def Generate(  # noqa: N802 (the proto's names)
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        try:
            requests = self._requests(request, self._caller(context))
        except (ValueError, APIError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        rid = request.request_id
        seen: list[list[ReqOutput]] = [[] for _ in requests]  # each sample's outputs so far
        try:
            async with self.tm.stream(requests) as stream:
                async for i, text in stream:
                    out = text.output
                    seen[i].append(out)
                    if request.stream:
                        yield pb.GenerateResponse(request_id=rid, chunk=stream_chunk(out, i))
                    if out.finish_reason is not None:  # all of it, as smg's engines send it
                        yield pb.GenerateResponse(request_id=rid, complete=complete_of(seen[i], i))
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except SchedulerUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except RequestFailed as exc:
            code = (
                grpc.StatusCode.INVALID_ARGUMENT
                if exc.status_code < 500
                else grpc.StatusCode.INTERNAL
            )
            await context.abort(code, str(exc))

    def _requests(self, request: pb.GenerateRequest, who: Caller) -> list[GenerateRequest]:
        """The call's ``n`` requests, through the one request builder of every door."""
        if not request.HasField("tokenized") or not request.tokenized.input_ids:
            raise ValueError("Generate needs tokenized input_ids")
        ids = list(request.tokenized.input_ids)
        n = max(1, request.sampling_params.n)
        self.builder.check_size(1, n, list(request.sampling_params.stop), "n")
        rid = request.request_id or self.tm.new_rid()
        max_new = self.tm.validator.max_new_tokens_for(
            len(ids), max_new_tokens_of(request.sampling_params)
        )
        params = sampling_params(request.sampling_params, max_new)  # one for the n samples
        generations = [
            Generation(
                ids,
                params,
                rid=rid if n == 1 else f"{rid}-{i}",
                lora=request.lora_id or None,
                return_logprob=request.return_logprob,
                top_logprobs_num=request.top_logprobs_num,
            )
            for i in range(n)
        ]
        return self.builder.build(who, generations)

    async def Abort(self, request: pb.AbortRequest, context: Any) -> pb.AbortResponse:  # noqa: N802
        """The caller's own request (and its ``n`` samples); an operator's reaches any."""
        who = self._caller(context)
        target = request.request_id

        def match(rid: str) -> bool:
            own = self.tenants.is_operator(who) or scope_of(rid) == self.tenants.scope(who)
            name = client_rid(rid)
            return own and (name == target or name.startswith(f"{target}-"))

        rids = self.tm.abort_where(match)
        return pb.AbortResponse(success=bool(rids), message=f"aborted {len(rids)}")

    # ---- state ---------------------------------------------------------------------------
    async def HealthCheck(self, request: Any, context: Any) -> pb.HealthCheckResponse:  # noqa: N802
        alive = self.tm.is_alive
        return pb.HealthCheckResponse(healthy=alive, message="ok" if alive else "scheduler gone")

    async def GetModelInfo(self, request: Any, context: Any) -> pb.GetModelInfoResponse:  # noqa: N802
        info, path = self.tm.info, self.config.engine.model_path or ""
        config = read_json(Path(path) / "config.json")
        return pb.GetModelInfoResponse(
            model_path=self.tm.model_path,  # the checkpoint served now (a weight update's)
            tokenizer_path=path,
            is_generation=True,
            weight_version=self.tm.weight_version,
            served_model_name=self.config.model_name,
            max_context_length=info.max_context_len,
            vocab_size=info.vocab_size,
            model_type=str(config.get("model_type", "")),
            eos_token_ids=list(info.eos_token_ids),
            pad_token_id=int(config.get("pad_token_id") or 0),
            bos_token_id=int(config.get("bos_token_id") or 0),
            max_req_input_len=info.max_context_len - 1,
            architectures=list(config.get("architectures", [])),
        )

    async def GetServerInfo(self, request: Any, context: Any) -> pb.GetServerInfoResponse:  # noqa: N802
        """The settings (no key shown) and, to an operator, the scheduler's figures; a
        tenant (or the gateway) sees its own requests' count only."""
        who = self._caller(context)
        args, scheduler = Struct(), Struct()
        args.update(plain(server_args(self.config)))
        if self.tenants.is_operator(who):
            stats = (await self.tm.get_server_info(check_integrity=False))["stats"]
            stats = {**stats, "max_total_num_tokens": self.tm.info.max_total_tokens}
            active = len(self.tm.states)
        else:
            active = self._pending(who)
            stats = {"view": "tenant", "max_total_num_tokens": self.tm.info.max_total_tokens}
        scheduler.update(plain(stats))
        return pb.GetServerInfoResponse(
            server_args=args,
            scheduler_info=scheduler,
            active_requests=active,
            uptime_seconds=time.time() - self.started,
            sglang_version=version(),
            server_type="grpc",
            max_total_num_tokens=self.tm.info.max_total_tokens,
        )

    def _pending(self, who: Caller) -> int:
        return self.tm.num_pending(self.tenants.scope(who))

    async def GetLoads(self, request: Any, context: Any) -> pb.GetLoadsResponse:  # noqa: N802
        """The scheduler's load to an operator and the gateway (its routing reads it); a
        tenant's own pending requests to a tenant."""
        who = self._caller(context)
        if not (self.tenants.is_operator(who) or self.tenants.is_gateway(who)):
            mine = self._pending(who)
            own = pb.SchedulerLoad(dp_rank=self.config.engine.parallel.dp_rank, num_total_reqs=mine)
            return pb.GetLoadsResponse(dp_rank_count=1, loads=[own])
        stats = (await self.tm.get_server_info(check_integrity=False))["stats"]
        load = pb.SchedulerLoad(
            dp_rank=self.config.engine.parallel.dp_rank,
            num_running_reqs=int(stats["num_running_reqs"]),
            num_waiting_reqs=int(stats["num_waiting_reqs"]),
            num_total_reqs=int(stats["num_running_reqs"] + stats["num_waiting_reqs"]),
            num_used_tokens=int(stats["token_usage"] * self.tm.info.max_total_tokens),
            max_total_num_tokens=self.tm.info.max_total_tokens,
            token_usage=float(stats["token_usage"]),
            cache_hit_rate=float(stats["cache_hit_rate"]),
            max_running_requests=self.tm.info.max_running_requests,
        )
        return pb.GetLoadsResponse(
            timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            dp_rank_count=1,
            loads=[load],
        )

    async def FlushCache(self, request: Any, context: Any) -> common_pb2.FlushCacheResponse:  # noqa: N802
        flushed = await self.tm.flush_cache()
        message = "flushed" if flushed else "refused: requests are running"
        return common_pb2.FlushCacheResponse(success=flushed, message=message)

    async def GetTokenizer(  # noqa: N802
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        data = tokenizer_zip(Path(self.config.engine.model_path or "."))
        digest = hashlib.sha256(data).hexdigest()
        for off in range(0, len(data), CHUNK_BYTES):
            last = off + CHUNK_BYTES >= len(data)
            yield common_pb2.GetTokenizerChunk(
                data=data[off : off + CHUNK_BYTES], sha256=digest if last else ""
            )

    async def SubscribeKvEvents(  # noqa: N802
        self, request: common_pb2.SubscribeKvEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.KvEventBatch]:
        events = self.config.engine.kv_events
        if events is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                "KV events are off: start radixserve with --kv-events-config",
            )
        await context.send_initial_metadata(())
        async for batch in relay_kv_events(events, context):  # type: ignore[arg-type]
            yield batch


async def _unimplemented(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not served by radixserve")


# answered UNIMPLEMENTED, cleanly (the generated base class raises in the server instead)
for _name in UNSERVED:
    setattr(SchedulerService, _name, _unimplemented)


async def start_grpc_server(tm: TokenizerManager, config: ServerConfig) -> grpc.aio.Server:
    """Serve :class:`SchedulerService` on ``config.host:config.grpc_port``."""
    server = grpc.aio.server(
        interceptors=[KeyInterceptor(Tenants.of(config))],
        options=[("grpc.max_receive_message_length", 64 << 20)],
    )
    pb_grpc.add_SglangSchedulerServicer_to_server(SchedulerService(tm, config), server)
    address = f"{config.host}:{config.grpc_port}"
    if server.add_insecure_port(address) == 0:
        raise RuntimeError(f"cannot listen on {address} for gRPC")
    await server.start()
    logger.info("gRPC (SGLang's scheduler service, for smg) on %s", address)
    return server


async def stop_grpc_server(server: grpc.aio.Server, grace_s: float = 1.0) -> None:
    await asyncio.shield(server.stop(grace_s))
