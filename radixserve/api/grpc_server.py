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
  socket (``api/grpc_kv_events.py``); this is what smg's event-driven cache-aware routing
  reads.

Not served (``UNIMPLEMENTED``): ``Embed``, profiling, LoRA loading over gRPC (the HTTP routes
load adapters).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import time
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.struct_pb2 import Struct
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from radixserve.api.grpc_kv_events import relay_kv_events
from radixserve.config import ServerConfig
from radixserve.runtime.io_struct import GenerateRequest, ReqOutput
from radixserve.server.tokenizer_manager import (
    RequestFailed,
    SchedulerUnavailable,
    TokenizerManager,
)
from radixserve.types import FinishKind, SamplingParams

logger = logging.getLogger(__name__)

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "generation_config.json",
    "config.json",
    "chat_template.jinja",
)
CHUNK_BYTES = 1 << 20


class SchedulerService(pb_grpc.SglangSchedulerServicer):
    def __init__(self, tm: TokenizerManager, config: ServerConfig) -> None:
        self.tm = tm
        self.config = config
        self.started = time.time()

    # ---- generation ---------------------------------------------------------------------
    async def Generate(  # noqa: N802 (the proto's names)
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        try:
            requests = self._requests(request)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        rid = request.request_id
        seen: list[list[ReqOutput]] = [[] for _ in requests]  # each sample's outputs so far
        try:
            async with self.tm.stream(requests) as stream:
                async for i, text in stream:
                    out = text.output
                    seen[i].append(out)
                    if request.stream:
                        yield pb.GenerateResponse(request_id=rid, chunk=_chunk(out, i))
                    if out.finish_reason is not None:  # all of it, as smg's engines send it
                        yield pb.GenerateResponse(request_id=rid, complete=_complete(seen[i], i))
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

    def _requests(self, request: pb.GenerateRequest) -> list[GenerateRequest]:
        if not request.HasField("tokenized") or not request.tokenized.input_ids:
            raise ValueError("Generate needs tokenized input_ids")
        ids = list(request.tokenized.input_ids)
        n = max(1, request.sampling_params.n)
        lora = request.lora_id or None
        if lora is not None and lora not in self.tm.lora_adapters:
            raise ValueError(f"the LoRA adapter {lora!r} is not loaded")
        rid = request.request_id or self.tm.new_rid()
        max_new = self.tm.validator.max_new_tokens_for(len(ids), _max_new(request.sampling_params))
        params = sampling_params(request.sampling_params, max_new)
        out = []
        for i in range(n):
            req = GenerateRequest(
                rid=rid if n == 1 else f"{rid}-{i}",
                input_ids=ids,
                sampling_params=params,
                return_logprob=request.return_logprob,
                top_logprobs_num=request.top_logprobs_num if request.return_logprob else 0,
                logprob_start_len=-1,
                lora_name=lora,
            )
            out.append(self.tm.validator.check(req))
        return out

    async def Abort(self, request: pb.AbortRequest, context: Any) -> pb.AbortResponse:  # noqa: N802
        prefix = f"{request.request_id}-"
        rids = [r for r in list(self.tm.states) if r == request.request_id or r.startswith(prefix)]
        for r in rids:
            self.tm.abort(r)
        return pb.AbortResponse(success=bool(rids), message=f"aborted {len(rids)}")

    # ---- state ---------------------------------------------------------------------------
    async def HealthCheck(self, request: Any, context: Any) -> pb.HealthCheckResponse:  # noqa: N802
        alive = self.tm.is_alive
        return pb.HealthCheckResponse(healthy=alive, message="ok" if alive else "scheduler gone")

    async def GetModelInfo(self, request: Any, context: Any) -> pb.GetModelInfoResponse:  # noqa: N802
        info, path = self.tm.info, self.config.engine.model_path or ""
        config = _read_json(Path(path) / "config.json")
        return pb.GetModelInfoResponse(
            model_path=path,
            tokenizer_path=path,
            is_generation=True,
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
        from radixserve.api.server_info import server_args, version

        args, scheduler = Struct(), Struct()
        args.update(_plain(server_args(self.config)))
        stats = (await self.tm.get_server_info(check_integrity=False))["stats"]
        scheduler.update(_plain({**stats, "max_total_num_tokens": self.tm.info.max_total_tokens}))
        return pb.GetServerInfoResponse(
            server_args=args,
            scheduler_info=scheduler,
            active_requests=len(self.tm.states),
            uptime_seconds=time.time() - self.started,
            sglang_version=version(),
            server_type="grpc",
            max_total_num_tokens=self.tm.info.max_total_tokens,
        )

    async def GetLoads(self, request: Any, context: Any) -> pb.GetLoadsResponse:  # noqa: N802
        stats = (await self.tm.get_server_info(check_integrity=False))["stats"]
        load = pb.SchedulerLoad(
            dp_rank=self.config.engine.dp_rank,
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


def sampling_params(p: pb.SamplingParams, max_new_tokens: int) -> SamplingParams:
    """The proto's parameters as radixserve's (proto3 zeros read as unset where zero is no
    valid value: ``top_p``, ``repetition_penalty``; ``top_k`` 0 or -1 is no limit)."""
    constraint = p.WhichOneof("constraint")
    if constraint == "structural_tag":
        raise ValueError("structural_tag constraints are not supported; use json_schema")
    return SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=p.temperature,
        top_p=p.top_p or 1.0,
        top_k=p.top_k if p.top_k > 0 else -1,
        min_p=p.min_p,
        frequency_penalty=p.frequency_penalty,
        presence_penalty=p.presence_penalty,
        repetition_penalty=p.repetition_penalty or 1.0,
        stop=list(p.stop),
        stop_token_ids=list(p.stop_token_ids),
        ignore_eos=p.ignore_eos,
        skip_special_tokens=p.skip_special_tokens,
        regex=p.regex if constraint == "regex" else None,
        json_schema=p.json_schema if constraint == "json_schema" else None,
        ebnf=p.ebnf_grammar if constraint == "ebnf_grammar" else None,
        logit_bias={int(k): v for k, v in p.logit_bias.items()} or None,
    ).validate()


def _max_new(p: pb.SamplingParams) -> int | None:
    return p.max_new_tokens if p.HasField("max_new_tokens") else None


def _chunk(out: ReqOutput, index: int) -> pb.GenerateStreamChunk:
    return pb.GenerateStreamChunk(
        token_ids=out.new_token_ids,
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        cached_tokens=out.cached_tokens,
        output_logprobs=_logprobs([out]),
        index=index,
    )


def _complete(outputs: list[ReqOutput], index: int) -> pb.GenerateComplete:
    """A sample's end: all of its ids and logprobs, from all of its outputs."""
    out = outputs[-1]
    reason = out.finish_reason
    assert reason is not None
    matched: dict[str, Any] = {}
    if reason.kind == FinishKind.STOP_TOKEN and isinstance(reason.matched, int):
        matched["matched_token_id"] = reason.matched
    elif reason.kind == FinishKind.STOP_STR and isinstance(reason.matched, str):
        matched["matched_stop_str"] = reason.matched
    return pb.GenerateComplete(
        output_ids=[t for o in outputs for t in o.new_token_ids],
        finish_reason=reason.openai_reason,
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        cached_tokens=out.cached_tokens,
        output_logprobs=_logprobs(outputs),
        index=index,
        **matched,
    )


def _logprobs(outputs: list[ReqOutput]) -> pb.OutputLogProbs | None:
    values = [v for o in outputs for v in o.new_logprobs]
    if not values:
        return None
    tops = [
        pb.TopLogProbs(values=[lp for _, lp in top], token_ids=[t for t, _ in top])
        for o in outputs
        for top in o.new_top_logprobs
    ]
    ids = [t for o in outputs for t in o.new_token_ids]
    return pb.OutputLogProbs(token_logprobs=values, token_ids=ids, top_logprobs=tops)


def tokenizer_zip(directory: Path) -> bytes:
    """The checkpoint's tokenizer files (those that exist) as a zip, names at its root."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for name in TOKENIZER_FILES:
            if (directory / name).is_file():
                z.write(directory / name, name)
    return buffer.getvalue()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def _plain(value: Any) -> Any:
    """A value a protobuf Struct takes: dicts, lists, strings, numbers, booleans, None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


async def start_grpc_server(tm: TokenizerManager, config: ServerConfig) -> grpc.aio.Server:
    """Serve :class:`SchedulerService` on ``config.host:config.grpc_port``."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    pb_grpc.add_SglangSchedulerServicer_to_server(SchedulerService(tm, config), server)
    address = f"{config.host}:{config.grpc_port}"
    if server.add_insecure_port(address) == 0:
        raise RuntimeError(f"cannot listen on {address} for gRPC")
    await server.start()
    logger.info("gRPC (SGLang's scheduler service, for smg) on %s", address)
    return server


async def stop_grpc_server(server: grpc.aio.Server, grace_s: float = 1.0) -> None:
    await asyncio.shield(server.stop(grace_s))
