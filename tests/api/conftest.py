"""Server fixtures: the real ``radixserve serve`` in a subprocess on a tiny model written into a
temp dir (see ``serving_harness``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from keyed_harness import KeyedServer, keyed_serving
from serving_harness import Server, serving, write_api_model
from tool_template import write_tools_model


@pytest.fixture(scope="session")
def api_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: object) -> Path:
    """A tiny random Llama (context 1024) with the real ChatML tokenizer."""
    return write_api_model(tmp_path_factory.mktemp("api-model") / "tiny-llama", tiny_tokenizer)


@pytest.fixture(scope="session")
def server(api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server shared by the tests that leave it serving."""
    log = tmp_path_factory.mktemp("server-log") / "server.log"
    args = ["--model", str(api_model_dir), "--max-total-tokens", "32768", "--log-level", "info"]
    with serving(args, log) as srv:
        yield srv
    assert " ERROR " not in srv.log(), srv.log()[-6000:]


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


@pytest.fixture
def openai_client(server: Server):  # type: ignore[no-untyped-def]
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="session")
def tools_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: object) -> Path:
    """The servers' tiny model with a Qwen2.5-style template that renders tools."""
    return write_tools_model(tmp_path_factory.mktemp("tools-model") / "tiny-tools", tiny_tokenizer)


@pytest.fixture(scope="session")
def compat_server(
    tools_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """A server on :func:`tools_model_dir` (SGLang compatibility, tools, structured output;
    ``--allow-auto-truncate``, as agents' servers run)."""
    log = tmp_path_factory.mktemp("compat-log") / "server.log"
    args = ["--model", str(tools_model_dir), "--max-total-tokens", "32768", "--allow-auto-truncate"]
    with serving(args, log) as srv:
        yield srv


@pytest.fixture
def http(compat_server: Server) -> Iterator[httpx.Client]:
    with compat_server.client() as c:
        yield c


@pytest.fixture
def oai(compat_server: Server):  # type: ignore[no-untyped-def]
    import openai

    return openai.OpenAI(base_url=f"{compat_server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture
def claude(compat_server: Server):  # type: ignore[no-untyped-def]
    """The official ``anthropic`` client on :func:`compat_server`."""
    import anthropic

    return anthropic.Anthropic(base_url=compat_server.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="session")
def keyed_server(
    tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: object
) -> Iterator[KeyedServer]:
    """A server of two tenants and an admin, with gRPC and KV events, on a model whose
    vocabulary is padded past its tokenizer (ids no text makes), at most 4 queued requests."""
    yield from keyed_serving(tmp_path_factory.mktemp("keyed"), tiny_tokenizer)
