"""SGLang's ``/pause_generation`` and ``/continue_generation`` on a real server: a stream paused
in place gets nothing until continue and then the very tokens of an unpaused run; the default
mode aborts what runs; a bad mode or field is a 400 in the server's error shape (OpenAI's). (Who may call
them: ``test_authorization.py``'s matrix. The modes one by one: ``tests/runtime/test_pause.py``.)
Whether the scheduler stepped is read from its counters, each read a pass of its loop."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from serving_harness import paused_while_running

pytestmark = pytest.mark.timeout(180)
# most often still running when the pause comes right after the first event (hundreds of tiny
# steps); paused_while_running sends it again when not
LONG = {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True}


def _scheduler(client: httpx.Client) -> dict[str, Any]:
    info: dict[str, Any] = client.get("/get_server_info").json()["scheduler"]
    return info


@contextmanager
def _paused(client: httpx.Client, mode: str | None) -> Iterator[None]:
    body = None if mode is None else {"mode": mode}
    resp = client.post("/pause_generation", json=body)
    assert resp.json() == {"message": "Generation paused successfully.", "status": "ok"}
    try:
        yield
    finally:  # a failure must not leave the shared server paused
        resp = client.post("/continue_generation")
        assert resp.json() == {"message": "Generation continued successfully.", "status": "ok"}


def test_a_stream_paused_in_place_goes_on_to_the_same_tokens(client: httpx.Client) -> None:
    body = {"text": "def paused(n):", "sampling_params": LONG}
    reference = client.post("/generate", json=body).json()["output_ids"]
    with paused_while_running(client, body) as events:  # paused in place, the request running
        before = _scheduler(client)
        for _ in range(3):
            assert _scheduler(client)["num_generated_tokens"] == before["num_generated_tokens"]
        resp = client.post("/continue_generation")
        assert resp.json() == {"message": "Generation continued successfully.", "status": "ok"}
        last = list(events)[-1]
    assert last["output_ids"] == reference
    assert last["meta_info"]["finish_reason"]["type"] == "length"


def test_the_default_mode_aborts_what_runs(client: httpx.Client) -> None:
    body = {"text": "import paused", "sampling_params": LONG}
    with paused_while_running(client, body) as events:
        with _paused(client, None):  # the default mode, no body
            last = list(events)[-1]
            assert last["meta_info"]["finish_reason"]["type"] == "abort"
            assert _scheduler(client)["num_running_reqs"] == 0
    done = client.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 2}})
    assert done.status_code == 200 and done.json()["meta_info"]["completion_tokens"] <= 2


@pytest.mark.parametrize("body", [{"mode": "sleep"}, {"mode": "abort", "drain": True}])
def test_a_bad_body_is_a_400_and_pauses_nothing(client: httpx.Client, body: Any) -> None:
    resp = client.post("/pause_generation", json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["type"] == "invalid_request_error", resp.text
    out = client.post("/generate", json={"text": "y", "sampling_params": {"max_new_tokens": 2}})
    assert out.status_code == 200
