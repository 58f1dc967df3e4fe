"""What ``radixserve serve`` chooses beyond the engine (``ServerConfig``), and where radixserve
keeps its files (``cache_dir``, ``default_model_dir``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from radixserve.config.engine import EngineConfig

REASONING_PARSERS = ("qwen3", "deepseek-r1")  # SGLang's and vLLM's --reasoning-parser names
TOOL_CALL_PARSERS = ("qwen25", "qwen", "llama3", "mistral")  # SGLang's --tool-call-parser names

DEFAULT_MODEL_NAME = "radixserve-smoke-test-random"
DEFAULT_MODEL_DIR_ENV = "RADIXSERVE_DEFAULT_MODEL_DIR"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """What ``radixserve serve`` chooses beyond the engine: where to listen, who may call.

    ``served_model_name`` is the name ``/v1/models`` lists and the OpenAI routes accept (the
    model path and the directory's name are accepted too); ``None``: the model path as given,
    as SGLang does (clients such as SGLang's ``bench_serving`` load the tokenizer from it).
    ``tool_call_parser``: the tool-call format of the chat route's ``tool_choice=auto``
    (``qwen25`` or ``qwen``, ``llama3``, ``mistral``); ``None``: the one the chat template
    teaches. ``reasoning_parser``
    (``qwen3``, ``deepseek-r1``): the chat routes return the thinking as ``reasoning_content``.
    ``chat_template``: the text of a Jinja chat template that replaces the checkpoint's. ``is_default_model``
    marks the embedded random-weight smoke-test model, so the log and ``/v1/models`` say so.
    """

    engine: EngineConfig
    host: str = "127.0.0.1"
    port: int = 30000
    # SGLang's gRPC scheduler service on this port too, for smg's gRPC workers (api/grpc/server.py)
    grpc_port: int | None = None
    api_key: str | None = None  # one key: one tenant (the CLI's first --api-key)
    # (tenant, key) pairs: --api-key (each its own tenant) and --api-keys-file; api_key alone
    # becomes one pair. Each tenant has its own prompt-cache namespace unless
    # shared_prefix_cache; admin_api_keys may use /cache_tree, /dashboard, /flush_cache
    tenant_keys: tuple[tuple[str, str], ...] = ()
    admin_api_keys: tuple[str, ...] = ()
    # the key a --dp-size launcher gives its gateway to reach the workers (api/access/tenants.py): no
    # operator, so what the gateway serves without a key (smg's /engine_metrics) shows nothing
    gateway_api_keys: tuple[str, ...] = ()
    shared_prefix_cache: bool = False
    # a request header a trusted gateway sets to the tenant (e.g. x-tenant-id); None: keys only
    tenant_header: str | None = None
    served_model_name: str | None = None
    # SGLang's label of the served weights (meta_info's weight_version) until an update names another
    weight_version: str = "default"
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    chat_template: str | None = None  # the template's text (the CLI reads --chat-template FILE)
    # chat prompts: special-token text in a request's messages and tools becomes the special
    # token, as transformers renders it (False: it is tokenized as plain text; see
    # server/content_guard.py)
    allow_special_tokens_in_content: bool = False
    is_default_model: bool = False
    log_level: str = "info"
    startup_timeout_s: float = 600.0  # loading the model in the scheduler process
    default_max_new_tokens: int = 128  # /generate without max_new_tokens (SGLang's default)
    # SGLang's --allow-auto-truncate: a request asking for more new tokens than the context
    # leaves gets what it leaves (agents' clients send 32k-64k); a prompt past the context is
    # still a 400 (SGLang keeps its head, which cuts off the turn to answer)
    allow_auto_truncate: bool = False
    # limits on one HTTP request (bad or hostile input is refused before it costs anything)
    max_request_bytes: int = 4 << 20  # body size; 413 past it
    # open HTTP connections (None: the descriptor limit less a reserve), how long a new one
    # may take to send a request head, how long a body may take after its head and the rate it
    # must keep up once the header timeout has passed (bytes/s, 0: none) (launch/connections.py)
    max_connections: int | None = None
    request_header_timeout_s: float = 10.0
    request_body_timeout_s: float = 30.0
    min_request_body_rate: float = 500.0
    max_batch_sub_requests: int = 1024  # prompts x n of one request; 400 past it
    max_stop_strings: int = 256  # OpenAI allows 4; SGLang users send more; 400 past it
    max_stored_responses: int = 4096  # Responses API responses (and conversations) a tenant; LRU
    # every data-parallel worker's URL (set by serve --dp-size with HTTP workers; this one's at
    # engine.parallel.dp_rank): a stored object's id names its worker, where requests naming
    # it go (api/responses/peers.py)
    state_peers: tuple[str, ...] = ()
    # their bytes (as JSON) a tenant, responses and conversations each; LRU
    max_stored_bytes: int = 256 << 20
    disable_docs: bool = False  # no /docs, /redoc, /openapi.json
    # on SIGTERM: in-flight requests may finish for this long, then are aborted (closing event)
    graceful_shutdown_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if self.engine.model_path is None:
            raise ValueError("ServerConfig needs engine.model_path (resolve the default first)")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65536), got {self.port}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must be non-empty when given")
        keys = (*(k for _, k in self.tenant_keys), *self.admin_api_keys, *self.gateway_api_keys)
        if not all(keys):
            raise ValueError("API keys must be non-empty")
        reserved = {"admin", "gateway"} & {tenant for tenant, _ in self.tenant_keys}
        if reserved:
            raise ValueError(f"the tenant name {reserved.pop()!r} is reserved; name it otherwise")
        if self.api_key is not None and not self.tenant_keys:
            object.__setattr__(self, "tenant_keys", (("default", self.api_key),))
        elif self.api_key is None and (self.tenant_keys or self.admin_api_keys):
            first = self.tenant_keys[0][1] if self.tenant_keys else self.admin_api_keys[0]
            object.__setattr__(self, "api_key", first)  # the router's and the log's key
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        if self.request_header_timeout_s <= 0:
            raise ValueError("request_header_timeout_s must be > 0")
        if self.request_body_timeout_s <= 0:
            raise ValueError("request_body_timeout_s must be > 0")
        if self.min_request_body_rate < 0:
            raise ValueError("min_request_body_rate must be >= 0")
        for name in (
            "max_request_bytes",
            "max_batch_sub_requests",
            "max_stop_strings",
            "max_stored_responses",
            "max_stored_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.tool_call_parser not in (None, *TOOL_CALL_PARSERS):
            raise ValueError(f"tool_call_parser must be one of {', '.join(TOOL_CALL_PARSERS)}")
        if self.reasoning_parser not in (None, *REASONING_PARSERS):
            raise ValueError(f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}")
        if self.state_peers and not 0 <= self.engine.parallel.dp_rank < len(self.state_peers):
            raise ValueError(
                f"dp_rank {self.engine.parallel.dp_rank} is not a place among "
                f"{len(self.state_peers)} data-parallel peers"
            )
        if any(not url.startswith(("http://", "https://")) for url in self.state_peers):
            raise ValueError("data-parallel peers are http:// or https:// URLs")
        if self.graceful_shutdown_timeout_s < 0:
            raise ValueError("graceful_shutdown_timeout_s must be >= 0")

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        if self.is_default_model:
            return DEFAULT_MODEL_NAME
        assert self.engine.model_path is not None
        return self.engine.model_path


def cache_dir() -> str:
    """radixserve's cache: ``$XDG_CACHE_HOME/radixserve``, else ``~/.cache/radixserve``."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "radixserve")


def default_model_dir() -> str:
    """Where the embedded default model lives: ``$RADIXSERVE_DEFAULT_MODEL_DIR``, else
    ``default-model`` in :func:`cache_dir`."""
    explicit = os.environ.get(DEFAULT_MODEL_DIR_ENV)
    if explicit:
        return os.path.expanduser(explicit)
    return os.path.join(cache_dir(), "default-model")
