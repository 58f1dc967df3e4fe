"""A server with small bounds. ``--max-queued-requests``: beyond the bound a new request gets 429
with ``Retry-After`` in OpenAI's error shape, the official client sees its ``RateLimitError``, the
queued requests run in their order, and the pool is whole afterwards."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import openai
import pytest
from serving_harness import serving

pytestmark = pytest.mark.timeout(180)

BOUND = 2  # the scheduler's side: tests/runtime/test_scheduler_bounds.py
POOL = 200  # KV slots, under the model's context of 1024


async def _post_all(url: str, n: int, max_tokens: int = 48) -> list[httpx.Response]:
    """One request, then (once it runs) ``n - 1`` more at once: so one runs and ``BOUND``
    wait, whatever message batch of the scheduler the others arrive in."""
    body = {"prompt": "count with me:", "max_tokens": max_tokens, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        first = asyncio.create_task(client.post("/v1/completions", json=body))
        for _ in range(200):
            load = (await client.get("/get_load")).json()  # no integrity wait, unlike server_info
            if load["load"] - load["num_waiting_reqs"] == 1:
                break
            await asyncio.sleep(0.01)
        rest = await asyncio.gather(
            *(client.post("/v1/completions", json=body) for _ in range(n - 1))
        )
        return [await first, *rest]


def test_a_full_queue_answers_429_and_a_small_pool_bounds_chat(
    api_model_dir: Path, tmp_path: Path
) -> None:
    args = ["--model", str(api_model_dir), "--max-running-requests", "1"]
    args += ["--max-queued-requests", str(BOUND), "--disable-overlap-schedule"]
    args += ["--max-total-tokens", str(POOL)]  # the context is 1024
    with serving(args, tmp_path / "server.log") as server:
        chat = {"messages": [{"role": "user", "content": "hi"}], "ignore_eos": True}
        resp = httpx.post(f"{server.url}/v1/chat/completions", json=chat, timeout=60)
        assert resp.status_code == 200, resp.text
        usage = resp.json()["usage"]
        assert usage["prompt_tokens"] + usage["completion_tokens"] == POOL - 2  # page, reserve

        responses = asyncio.run(_post_all(server.url, 12))
        codes = sorted(r.status_code for r in responses)
        assert set(codes) == {200, 429} and codes.count(200) >= BOUND + 1, codes
        refused = next(r for r in responses if r.status_code == 429)
        assert refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert error["code"] == "rate_limit_exceeded" and "queue is full" in error["message"]
        assert set(error) == {"message", "type", "param", "code"}
        done = [r.json() for r in responses if r.status_code == 200]
        assert all(d["usage"]["completion_tokens"] == 48 for d in done)

        oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        asyncio.run(_flood_then(server.url, oai))
        info = httpx.get(f"{server.url}/get_server_info", timeout=30).json()
        assert info["integrity_ok"] is True, info["integrity_error"]
        assert info["scheduler"]["num_running_reqs"] == info["scheduler"]["num_waiting_reqs"] == 0


def model_name_of(url: str) -> str:
    return str(httpx.get(f"{url}/v1/models").json()["data"][0]["id"])


async def _flood_then(url: str, oai: openai.OpenAI) -> None:
    """Streamed requests and the official client's, sent all at once beside long ones: with one
    running and BOUND waiting at most, some of each are refused (429 before any stream starts,
    ``RateLimitError`` in the client). Which ones depends on arrival order: a round that saw
    no refusal of a kind is tried again, at most 5 times."""
    model = model_name_of(url)

    def official() -> BaseException | None:
        try:
            oai.completions.create(model=model, prompt="x", max_tokens=2, temperature=0)
        except openai.RateLimitError as exc:
            return exc
        return None

    seen_stream, seen_client = False, False
    body = {"prompt": "x", "max_tokens": 2, "stream": True}
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        for _ in range(5):
            flood = _post_all(url, BOUND + 1, max_tokens=500)
            streams = [client.post("/v1/completions", json=body) for _ in range(6)]
            calls = [asyncio.to_thread(official) for _ in range(6)]
            _, *rest = await asyncio.gather(flood, *streams, *calls)
            streamed, refused = rest[:6], rest[6:]
            assert all(r.status_code in (200, 429) for r in streamed), streamed
            limited = [r for r in streamed if r.status_code == 429]
            assert all(r.headers["retry-after"] == "1" for r in limited)
            seen_stream |= bool(limited)
            seen_client |= any(isinstance(e, openai.RateLimitError) for e in refused)
            if seen_stream and seen_client:
                return
    raise AssertionError(
        f"in 5 rounds: a streamed 429 {seen_stream}, a RateLimitError {seen_client}"
    )
