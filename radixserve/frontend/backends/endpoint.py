"""RuntimeEndpoint: a radixserve (or SGLang) server over its native HTTP API.

Routes used: ``/get_model_info`` (once, at construction: an unreachable server fails fast),
``/generate`` (text prompts: the server tokenizes, so its radix cache sees the same tokens for
the same text; ``select`` sends token ids, see ``scoring.py``), ``/get_server_info`` (stats) and
``/flush_cache``. Every request has a timeout (``timeout`` seconds between bytes, which bounds a
stalled stream too), and an error status or a broken connection raises :class:`BackendError`.

The chat template and the tokenizer come from the model path that ``/get_model_info`` reports
when that directory exists on this machine (``make serve`` on localhost); otherwise the role
helpers use ChatML and ``select`` scores without a tokenizer (see ``scoring.py``). Pass
``chat_template=`` to override.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import httpx

from radixserve.frontend.backends.base import GenChunk
from radixserve.frontend.backends.scoring import (
    PromptInputs,
    prompt_logprob_rows,
    score_choices,
)
from radixserve.frontend.chat_template import ChatTemplate
from radixserve.frontend.errors import BackendError
from radixserve.frontend.select_methods import ChoiceLogprobs
from radixserve.tokenizer_loader import load_tokenizer

logger = logging.getLogger(__name__)

_PREFILL_ONLY = {"max_new_tokens": 0}


class RuntimeEndpoint:
    """``RuntimeEndpoint("http://127.0.0.1:30000", api_key=None)``."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = 300.0,
        connect_timeout: float = 10.0,
        chat_template: ChatTemplate | None = None,
        load_tokenizer: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )
        self.model_info: dict[str, Any] = self._request("GET", "/get_model_info").json()
        self._tokenizer = _local_tokenizer(self.model_info) if load_tokenizer else None
        self._chat_template = chat_template or ChatTemplate.from_tokenizer(self._tokenizer)

    @property
    def chat_template(self) -> ChatTemplate:
        return self._chat_template

    @property
    def tokenizer(self) -> Any | None:
        return self._tokenizer

    # ---- generation ----------------------------------------------------------------------------
    def generate(
        self, prompt: str, sampling_params: dict[str, Any], lora: str | None = None
    ) -> GenChunk:
        body: dict[str, Any] = {"text": prompt, "sampling_params": sampling_params}
        if lora is not None:
            body["lora_path"] = lora
        return GenChunk.of(self._request("POST", "/generate", body).json())

    def generate_stream(
        self, prompt: str, sampling_params: dict[str, Any], lora: str | None = None
    ) -> Iterator[GenChunk]:
        """Text deltas; the server's events carry the text so far (SGLang's shape)."""
        body = {"text": prompt, "sampling_params": sampling_params, "stream": True}
        if lora is not None:
            body["lora_path"] = lora
        sent = ""
        try:
            with self._client.stream("POST", "/generate", json=body) as response:
                if response.status_code >= 400:
                    response.read()
                    raise BackendError(_status_message("POST /generate", response))
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:") :].strip()
                    if data == "[DONE]":
                        return
                    event = json.loads(data)
                    if "error" in event:
                        raise BackendError(f"POST /generate (stream): {_error_text(event)}")
                    text = event["text"]
                    delta = text[len(sent) :] if text.startswith(sent) else text
                    sent = text
                    yield GenChunk(delta, event.get("meta_info", {}))
        except httpx.HTTPError as exc:
            raise self._transport_error("POST /generate (stream)", exc) from exc
        raise BackendError("POST /generate (stream): the stream ended without [DONE]")

    # ---- prefill and scoring -------------------------------------------------------------------
    def cache_prefix(self, prompt: str) -> dict[str, Any]:
        body = {"text": prompt, "sampling_params": _PREFILL_ONLY}
        return dict(self._request("POST", "/generate", body).json()["meta_info"])

    def prompt_logprobs(
        self, inputs: PromptInputs, start: int
    ) -> list[tuple[list[float], list[int], dict[str, Any]]]:
        by_ids = bool(inputs) and isinstance(inputs[0], list)
        body = {
            "input_ids" if by_ids else "text": list(inputs),
            "sampling_params": _PREFILL_ONLY,
            "return_logprob": True,
            "logprob_start_len": start,
        }
        outs = self._request("POST", "/generate", body).json()
        return prompt_logprob_rows(inputs, outs, start)

    def score_choices(self, prefix: str, choices: list[str]) -> list[ChoiceLogprobs]:
        return score_choices(self, prefix, choices)

    # ---- server management -----------------------------------------------------------------------
    def get_stats(self) -> dict[str, Any]:
        info = self._request("GET", "/get_server_info").json()
        return dict(info.get("scheduler", info))

    def flush_cache(self) -> bool:
        try:
            self._request("POST", "/flush_cache")
        except BackendError as exc:
            if "HTTP 400" in str(exc):  # requests are running: not flushed
                return False
            raise
        return True

    def shutdown(self) -> None:
        self._client.close()

    def __enter__(self) -> RuntimeEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- transport -----------------------------------------------------------------------------
    def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> httpx.Response:
        what = f"{method} {path}"
        try:
            response = self._client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise self._transport_error(what, exc) from exc
        if response.status_code >= 400:
            raise BackendError(_status_message(what, response))
        return response

    def _transport_error(self, what: str, exc: httpx.HTTPError) -> BackendError:
        if isinstance(exc, httpx.TimeoutException):
            return BackendError(f"{what} to {self.base_url} timed out ({type(exc).__name__})")
        return BackendError(f"{what} to {self.base_url} failed: {type(exc).__name__}: {exc}")


def _status_message(what: str, response: httpx.Response) -> str:
    try:
        detail = _error_text(response.json())
    except ValueError:
        detail = response.text[:500]
    return f"{what}: HTTP {response.status_code}: {detail}"


def _error_text(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", body["error"]))
    return str(body)[:500]


def _local_tokenizer(model_info: dict[str, Any]) -> Any | None:
    """The server's tokenizer when its files are on this machine, else None."""
    path = model_info.get("tokenizer_path") or model_info.get("model_path")
    if not isinstance(path, str) or not os.path.isdir(path):
        return None
    try:
        return load_tokenizer(path, local_files_only=True)
    except Exception as exc:  # a missing or broken tokenizer only costs the template
        logger.warning("cannot load the server's tokenizer from %s: %s", path, exc)
        return None
