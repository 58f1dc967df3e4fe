"""Clients that send one request and time it: in-process Engine, native ``/generate`` and any
OpenAI-compatible ``/v1/completions``. All of them are safe to call from many threads.

Every request is greedy with ``ignore_eos`` and streamed, so the first output marks the TTFT.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import httpx


@dataclass(slots=True)
class Generated:
    output_ids: list[int] | None  # None: the system does not return token ids
    num_output_tokens: int
    first_token_at: float | None  # time.perf_counter() of the first output token
    cached_tokens: int | None
    # the part of cached_tokens loaded back from a KV tier (meta_info's
    # cached_tokens_details.host, as in SGLang); None where the system does not say
    cached_tokens_tier: int | None = None


def _tier_part(meta: dict[str, Any]) -> int | None:
    details = meta.get("cached_tokens_details")
    return details.get("host") if isinstance(details, dict) else None


class Client(Protocol):
    def generate(self, input_ids: list[int], max_new_tokens: int) -> Generated: ...

    def stats(self) -> dict[str, Any] | None:
        """The scheduler's counters (``get_stats``), or None where the system has none."""
        ...

    def flush(self) -> None: ...


def _sampling(max_new_tokens: int) -> dict[str, Any]:
    return {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}


class EngineClient:
    """An in-process :class:`radixserve.Engine`."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def generate(self, input_ids: list[int], max_new_tokens: int) -> Generated:
        output_ids: list[int] = []
        first: float | None = None
        meta: dict[str, Any] = {}
        for chunk in self.engine.generate(
            input_ids=input_ids, sampling_params=_sampling(max_new_tokens), stream=True
        ):
            if chunk["output_ids"] and first is None:
                first = time.perf_counter()
            output_ids.extend(chunk["output_ids"])  # the Engine streams deltas
            meta = chunk["meta_info"]
        cached = meta.get("cached_tokens")
        return Generated(output_ids, len(output_ids), first, cached, _tier_part(meta))

    def stats(self) -> dict[str, Any] | None:
        return dict(self.engine.get_stats())

    def flush(self) -> None:
        self.engine.flush_cache()


def _sse_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    if response.status_code != 200:
        response.read()
        raise RuntimeError(f"HTTP {response.status_code}: {response.text[:500]}")
    for line in response.iter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        event = json.loads(data)
        if "error" in event:
            raise RuntimeError(f"the server reported an error: {event['error']}")
        yield event


class HttpClient:
    """radixserve's (or SGLang's) native ``/generate`` with ``input_ids``, streamed."""

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 3600.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
        self.http = httpx.Client(
            base_url=url.rstrip("/"), headers=headers, timeout=timeout_s, limits=limits
        )
        self.model: str | None = None  # sent as "model" (smg's gRPC mode routes by it)
        self.deltas = False  # each event's output_ids are new ones (smg's gRPC mode)

    def generate(self, input_ids: list[int], max_new_tokens: int) -> Generated:
        body: dict[str, Any] = {
            "input_ids": input_ids,
            "sampling_params": _sampling(max_new_tokens),
            "stream": True,
        }
        if self.model is not None:
            body["model"] = self.model
        first: float | None = None
        last: dict[str, Any] = {}
        ids: list[int] = []
        with self.http.stream("POST", "/generate", json=body) as response:
            for event in _sse_events(response):
                if event.get("output_ids") and first is None:
                    first = time.perf_counter()
                last = event  # radixserve's events are cumulative
                if self.deltas and event.get("meta_info", {}).get("finish_reason") is None:
                    ids += event.get("output_ids", [])  # (smg's last event repeats the last id)
        if not self.deltas:
            ids = list(last.get("output_ids", []))
        meta = last.get("meta_info", {})
        return Generated(ids, len(ids), first, meta.get("cached_tokens"), _tier_part(meta))

    def server_info(self) -> dict[str, Any]:
        response = self.http.get("/get_server_info")
        response.raise_for_status()
        return dict(response.json())

    def stats(self) -> dict[str, Any] | None:
        stats = self.server_info().get("scheduler")
        return dict(stats) if isinstance(stats, dict) else None

    def flush(self) -> None:
        self.http.post("/flush_cache").raise_for_status()

    def close(self) -> None:
        self.http.close()


class RouterClient(HttpClient):
    """``/generate`` through SGLang's router or gateway (``radixserve serve --dp-size``); the
    scheduler stats are the workers' (listed by the router's ``/workers``), summed. With gRPC
    workers (``--worker-transport grpc``) smg's ``/generate`` needs the model and streams new
    ids only, and each worker's stats come from its gRPC ``GetServerInfo``."""

    def __init__(self, url: str, grpc: bool = False) -> None:
        super().__init__(url)
        if grpc:
            models = self.http.get("/v1/models")
            models.raise_for_status()
            self.model, self.deltas = str(models.json()["data"][0]["id"]), True

    def worker_urls(self) -> list[str]:
        response = self.http.get("/workers")
        response.raise_for_status()
        return [str(w["url"]) for w in response.json()["workers"]]

    def worker_stats(self) -> list[dict[str, Any]]:
        out = []
        for url in self.worker_urls():
            if url.startswith("grpc://"):
                out.append(dict(_grpc_server_info(url)["scheduler"]))
                continue
            response = httpx.get(f"{url}/get_server_info", timeout=60)
            response.raise_for_status()
            out.append(dict(response.json()["scheduler"]))
        return out

    def server_info(self) -> dict[str, Any]:
        url = self.worker_urls()[0]
        if url.startswith("grpc://"):
            return _grpc_server_info(url)
        response = httpx.get(f"{url}/get_server_info", timeout=60)
        response.raise_for_status()
        return dict(response.json())

    def stats(self) -> dict[str, Any] | None:
        per_worker = self.worker_stats()
        keys = [k for k, v in per_worker[0].items() if isinstance(v, (int, float))]
        return {k: sum(w[k] for w in per_worker) for k in keys}


def _grpc_server_info(url: str) -> dict[str, Any]:
    """A gRPC worker's ``GetServerInfo``: its server args, and its scheduler's stats under
    ``scheduler`` (the shape of ``/get_server_info``)."""
    import grpc
    from google.protobuf.json_format import MessageToDict
    from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
    from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

    with grpc.insecure_channel(url.removeprefix("grpc://")) as channel:
        info = pb_grpc.SglangSchedulerStub(channel).GetServerInfo(
            pb.GetServerInfoRequest(), timeout=60
        )
    return {**MessageToDict(info.server_args), "scheduler": MessageToDict(info.scheduler_info)}


class OpenAIClient:
    """Any OpenAI-compatible server's ``/v1/completions`` with the prompt as token ids.

    Output token ids come back only from servers that support vLLM's ``return_token_ids``; for
    the others the runner appends the trace's fallback answer ids to the history instead.
    Cached tokens come from ``usage.prompt_tokens_details`` when the server reports them.
    """

    def __init__(self, url: str, model: str | None, api_key: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
        self.http = httpx.Client(
            base_url=url.rstrip("/"), headers=headers, timeout=3600.0, limits=limits
        )
        self.model = model or self._first_model()
        self.saw_token_ids = False  # any response carried output token ids

    def _first_model(self) -> str:
        response = self.http.get("/v1/models")
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])

    def generate(self, input_ids: list[int], max_new_tokens: int) -> Generated:
        body = {
            "model": self.model,
            "prompt": input_ids,
            "max_tokens": max_new_tokens,
            "min_tokens": max_new_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        first: float | None = None
        ids: list[int] = []
        usage: dict[str, Any] = {}
        with self.http.stream("POST", "/v1/completions", json=body) as response:
            for event in _sse_events(response):
                for choice in event.get("choices") or []:
                    if first is None and (choice.get("text") or choice.get("token_ids")):
                        first = time.perf_counter()
                    ids.extend(choice.get("token_ids") or [])
                usage = event.get("usage") or usage
        self.saw_token_ids = self.saw_token_ids or bool(ids)
        details = usage.get("prompt_tokens_details") or {}
        num_out = int(usage.get("completion_tokens", len(ids) or max_new_tokens))
        return Generated(ids or None, num_out, first, details.get("cached_tokens"))

    def stats(self) -> dict[str, Any] | None:
        return None

    def flush(self) -> None:
        return None

    def close(self) -> None:
        self.http.close()
