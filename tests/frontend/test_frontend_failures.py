"""A backend failure is an exception, never a hang: unreachable and stalled servers, HTTP
errors, the select scoring boundary on a real tokenizer."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from radixserve.frontend import BackendError, ProgramError, RuntimeEndpoint, function, gen
from radixserve.frontend.backends.scoring import score_choices


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A TCP server that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    sock.close()


def test_an_unreachable_server_fails_at_once() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    started = time.monotonic()
    with pytest.raises(BackendError, match="get_model_info"):
        RuntimeEndpoint(f"http://127.0.0.1:{port}", connect_timeout=2.0)
    assert time.monotonic() - started < 5


def test_a_stalled_server_times_out(silent_server: str) -> None:
    started = time.monotonic()
    with pytest.raises(BackendError, match="timed out"):
        RuntimeEndpoint(silent_server, timeout=0.5, connect_timeout=0.5)
    assert time.monotonic() - started < 5


def test_an_http_error_names_the_line_and_the_servers_message(fe_endpoint: Any) -> None:
    @function
    def bad(s: Any) -> None:
        s += "x = "
        s += gen("y", max_tokens=2, temperature=-1.0)  # the server answers 400

    with pytest.raises(ProgramError) as info:
        bad.run(backend=fe_endpoint)
    assert "HTTP 400" in str(info.value) and "temperature" in str(info.value)
    assert info.value.location is not None and "temperature=-1.0" in info.value.location.line


def test_an_engine_error_names_the_line(fe_runtime: Any) -> None:
    @function
    def bad(s: Any) -> None:
        s += "x = "
        s += gen("y", max_tokens=2, top_p=0.0)  # invalid

    with pytest.raises(ProgramError, match="top_p") as info:
        bad.run(backend=fe_runtime)
    assert info.value.location is not None and "top_p=0.0" in info.value.location.line


class _RecordingClient:
    """Scores every token -token_id/1000, so a slice's alignment is visible."""

    def __init__(self, tokenizer: Any, with_tokenizer: bool = True) -> None:
        self._tok = tokenizer
        self.tokenizer = tokenizer if with_tokenizer else None
        self.prefilled: list[str] = []
        self.starts: list[int] = []

    def cache_prefix(self, prompt: str) -> dict[str, Any]:
        self.prefilled.append(prompt)
        return {"prompt_tokens": len(self._tok.encode(prompt))}

    def prompt_logprobs(self, inputs: Any, start: int) -> list[Any]:
        self.starts.append(start)
        rows = []
        for item in inputs:
            ids = item if isinstance(item, list) else self._tok.encode(item)
            tail = ids[max(start, 1) :]
            rows.append(([-t / 1000 for t in tail], tail, {}))
        return rows


def test_select_scores_the_choice_tokens_after_the_merged_boundary(tiny_tokenizer: Any) -> None:
    prefix = "Sentiment: pos"  # BPE merges "pos" + "itive" differently from "pos" alone
    choices = ["itive", "e", " negative"]
    client = _RecordingClient(tiny_tokenizer)
    scored = score_choices(client, prefix, choices)
    assert client.prefilled == [prefix]
    prefix_ids = tiny_tokenizer.encode(prefix)
    for c, s in zip(choices, scored, strict=True):
        full = tiny_tokenizer.encode(prefix + c)
        boundary = next(
            (i for i, (a, b) in enumerate(zip(prefix_ids, full, strict=False)) if a != b),
            len(prefix_ids),
        )
        assert s.token_ids == full[boundary:] and s.token_ids
        assert s.logprobs == [-t / 1000 for t in s.token_ids]
        assert tiny_tokenizer.decode(full[:boundary]) + tiny_tokenizer.decode(s.token_ids) == (
            prefix + c
        )
    no_tok = score_choices(_RecordingClient(tiny_tokenizer, with_tokenizer=False), prefix, choices)
    assert all(s.logprobs for s in no_tok)  # text fallback: from the prefix's last token on
    with pytest.raises(ValueError, match="text before it"):
        score_choices(client, "", choices)
