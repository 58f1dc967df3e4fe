"""The server's command line: ``radixserve serve`` (the parser of its sub-command, the
``ServerConfig`` it makes, and running it). The ``radixserve`` command itself, which adds
``bench`` and ``sim`` beside it, is :mod:`radixserve.cli`."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import sys
from pathlib import Path
from typing import Any

from radixserve.config import (
    DTYPES,
    QUANTIZATIONS,
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    EngineConfig,
    ServerConfig,
    default_model_dir,
)
from radixserve.hub import is_hub_id, resolve_model
from radixserve.launch.cli_access import access_fields, add_access_flags
from radixserve.launch.cli_admission import add_admission_flags, admission_part
from radixserve.launch.cli_cache import add_cache_flags, kv_events_config, kv_tier_part
from radixserve.launch.cli_execution import (
    add_execution_flags,
    add_parallel_flags,
    execution_part,
    parallel_part,
)
from radixserve.launch.cli_lora import add_lora_flags, check_lora_paths, lora_part
from radixserve.launch.cli_parts import part_from_args
from radixserve.launch.cli_spec import add_spec_flags, speculative_part

logger = logging.getLogger("radixserve.cli")
_DEFAULTS = EngineConfig()
DEFAULT_MODEL_KV_TOKENS = 65536


def build_parser() -> argparse.ArgumentParser:
    """The server's parser: ``serve`` alone (``radixserve.cli.build_parser`` has every command)."""
    parser = argparse.ArgumentParser(
        prog="radixserve", description="SGLang-style LLM serving runtime"
    )
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def add_serve_parser(sub: Any) -> argparse.ArgumentParser:
    """Adds ``serve`` and its flags to the ``radixserve`` sub-parsers ``sub``: each group of
    engine flags is the module that builds its config part."""
    serve = sub.add_parser(
        "serve",
        help="start the HTTP server (native /generate and OpenAI-compatible routes)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _add_model_flags(serve)
    add = serve.add_argument
    add("--host", default="127.0.0.1", help="address to listen on")
    add("--port", type=int, default=30000, help="port to listen on")
    add("--grpc-port", type=int, default=None, help="also serve SGLang's gRPC API (for smg)")
    add_admission_flags(serve)
    _add_kv_flags(serve)
    add_cache_flags(serve)
    add_spec_flags(serve)
    add_execution_flags(serve)
    add_parallel_flags(serve)
    _add_chat_flags(serve)
    _add_limit_flags(serve)
    add_access_flags(serve)
    add_lora_flags(serve)
    add(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="log level of all three processes",
    )
    from radixserve.launch.data_parallel import add_arguments as add_data_parallel_arguments

    add_data_parallel_arguments(serve)
    return serve


def _add_model_flags(serve: argparse.ArgumentParser) -> None:
    """The checkpoint, and how its weights are held."""
    add = serve.add_argument
    add(
        "--model",
        "--model-path",
        dest="model",
        default=None,
        help="a Hugging Face checkpoint (Llama, Qwen2, Qwen3, Mistral): a local directory, or a "
        "hub id ORG/NAME resolved through huggingface_hub's cache (HF_HOME, HF_HUB_OFFLINE), "
        "downloaded when online. Without it the server runs an embedded tiny random-weight "
        f"smoke-test model, created on first use in {default_model_dir()} (override with "
        "$RADIXSERVE_DEFAULT_MODEL_DIR)",
    )
    add(
        "--revision",
        default=None,
        help="the hub id's branch, tag or commit (default: main)",
    )
    add(
        "--dtype",
        choices=DTYPES,
        default=_DEFAULTS.dtype,
        help="weight and KV dtype (auto: bfloat16 on GPU and on CPUs with the radixserve "
        "kernels or native bf16, else float32)",
    )
    add(
        "--quantization",
        choices=QUANTIZATIONS,
        default=_DEFAULTS.quantization,
        help="quantization at load (int8: weights per output channel; the CPU kernels multiply "
        "them by activations quantized per block of 32, like llama.cpp's Q8_0)",
    )
    add("--device", default=_DEFAULTS.device, help="cpu, cuda or cuda:N")


def _add_kv_flags(serve: argparse.ArgumentParser) -> None:
    """The KV pool, the context and the prefix cache."""
    add = serve.add_argument
    add(
        "--max-total-tokens",
        type=int,
        default=None,
        help="KV cache size in tokens (default: what a 1 GiB KV budget holds for the model; "
        f"{DEFAULT_MODEL_KV_TOKENS} for the embedded default model)",
    )
    add("--page-size", type=int, default=_DEFAULTS.page_size, help="KV slots per page")
    add("--max-context-len", type=int, default=None, help="context length (default: the model's)")
    add("--disable-radix-cache", action="store_true", help="no prefix caching (a baseline)")
    add("--disable-jump-forward", action="store_true", help="decode a grammar's forced text")


def _add_chat_flags(serve: argparse.ArgumentParser) -> None:
    """The served name, the chat template and what the chat routes parse out of the output."""
    add = serve.add_argument
    add(
        "--served-model-name",
        default=None,
        help="the model name /v1/models lists and the OpenAI routes accept "
        "(default: the model path as given, as SGLang does)",
    )
    add(
        "--weight-version",
        default="default",
        help="a label of the served weights, in each /generate result's meta_info and "
        "/model_info until a weight update or /update_weight_version names another (SGLang's)",
    )
    add(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="a Jinja chat template file that replaces the checkpoint's own",
    )
    add(
        "--allow-special-tokens-in-content",
        action="store_true",
        help="tokenize special-token text in chat messages and tools (<|im_end|>, <|eot_id|>) "
        "as the special token, as transformers does; by default it is plain text, so a request "
        "cannot forge a turn",
    )
    add(
        "--reasoning-parser",
        choices=REASONING_PARSERS,
        default=None,
        help="return the model's thinking as reasoning_content on the chat routes (qwen3: "
        "<think>...</think>; deepseek-r1: the output starts inside the thinking)",
    )
    add(
        "--tool-call-parser",
        choices=TOOL_CALL_PARSERS,
        default=None,
        help="the tool-call format parsed for tool_choice=auto (default: the one the chat "
        "template teaches)",
    )


def _add_limit_flags(serve: argparse.ArgumentParser) -> None:
    """What one request may cost, and how the server stops."""
    defaults = ServerConfig(EngineConfig(model_path="-"))
    add = serve.add_argument
    add(
        "--max-request-bytes",
        type=int,
        default=defaults.max_request_bytes,
        help="largest request body; 413 past it",
    )
    add(
        "--max-batch-sub-requests",
        type=int,
        default=defaults.max_batch_sub_requests,
        help="most prompts x n (choices) in one request; 400 past it",
    )
    add(
        "--max-stop-strings",
        type=int,
        default=defaults.max_stop_strings,
        help="most stop strings in one request; 400 past it",
    )
    add(
        "--allow-auto-truncate",
        action="store_true",
        help="a request asking for more new tokens than the context leaves gets what it leaves "
        "(else a 400); a prompt past the context is still refused",
    )
    add(
        "--max-stored-responses",
        type=int,
        default=defaults.max_stored_responses,
        help="stored Responses API responses, and as many conversations, of each tenant; "
        "its least recently used out",
    )
    add(
        "--max-stored-bytes",
        type=int,
        default=defaults.max_stored_bytes,
        help="bytes (as JSON) of each tenant's stored responses, and as many of its "
        "conversations; its least recently used out",
    )
    add(
        "--dp-peers",
        nargs="+",
        default=None,
        metavar="URL",
        help="every data-parallel worker's URL in --dp-rank order, the same on each: a stored "
        "response's or conversation's id names its worker, and requests naming another's go "
        "there; --dp-size sets it itself",
    )
    add(
        "--graceful-shutdown-timeout",
        type=float,
        default=defaults.graceful_shutdown_timeout_s,
        help="seconds in-flight requests may run on after SIGTERM before they are aborted",
    )
    add(
        "--disable-docs",
        action="store_true",
        help="serve no /docs, /redoc or /openapi.json (with --api-key they need the key)",
    )


def engine_config(args: argparse.Namespace, model_path: str) -> EngineConfig:
    """The engine's config of ``args``: each part from its flags' module, the model's and the
    KV pool's fields by name."""
    return part_from_args(
        EngineConfig,
        args,
        model_path=model_path,
        kv_events_config=kv_events_config(args),
        admission=admission_part(args),
        kv_tier=kv_tier_part(args),
        lora=lora_part(args),
        parallel=parallel_part(args),
        execution=execution_part(args),
        speculative=speculative_part(args),
    )


def make_server_config(args: argparse.Namespace) -> ServerConfig:
    """The config for ``args``; creates the embedded default model when no --model is given."""
    is_default = args.model is None
    if is_default:
        from radixserve.runtime.default_model import DESCRIPTION, ensure_default_model

        logger.warning(
            "no --model given: serving the embedded %s. Pass --model DIR for a real model.",
            DESCRIPTION,
        )
        model_path = str(ensure_default_model(default_model_dir()))
        if args.max_total_tokens is None:  # a smoke test needs no 1 GiB of KV
            args.max_total_tokens = DEFAULT_MODEL_KV_TOKENS
    else:
        try:
            model_path = resolve_model(args.model, args.revision)
        except ValueError as exc:
            raise ValueError(f"--model {exc}") from None
        if args.served_model_name is None and is_hub_id(args.model):
            args.served_model_name = args.model  # as SGLang: the name the client asked for
    return ServerConfig(
        engine=engine_config(args, model_path),
        host=args.host,
        port=args.port,
        grpc_port=args.grpc_port,
        **access_fields(args),
        served_model_name=args.served_model_name,
        weight_version=args.weight_version,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        chat_template=_read_template(args.chat_template),
        allow_special_tokens_in_content=args.allow_special_tokens_in_content,
        is_default_model=is_default,
        log_level=args.log_level,
        max_request_bytes=args.max_request_bytes,
        max_batch_sub_requests=args.max_batch_sub_requests,
        max_stop_strings=args.max_stop_strings,
        max_stored_responses=args.max_stored_responses,
        max_stored_bytes=args.max_stored_bytes,
        state_peers=tuple(args.dp_peers or ()),
        allow_auto_truncate=args.allow_auto_truncate,
        graceful_shutdown_timeout_s=args.graceful_shutdown_timeout,
        disable_docs=args.disable_docs,
    )


def _read_template(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).expanduser().read_text()
    except OSError as exc:
        raise ValueError(f"--chat-template {path}: {exc.strerror or exc}") from None


def main(argv: list[str] | None = None) -> int:
    """``radixserve serve ...`` alone; the exit code."""
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Runs ``radixserve serve ...`` from its parsed arguments; the exit code (2: bad input)."""
    from radixserve.server.ipc import LOG_FORMAT

    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
    from radixserve.launch import data_parallel

    try:
        dp = data_parallel.from_args(args)
        if dp.dp_size > 1:  # the router it names (auto: the one installed), or the install hint
            dp = dataclasses.replace(dp, router=data_parallel.resolve_router(dp.router))
        config = make_server_config(args)
        check_lora_paths(config.engine)
    except ValueError as exc:
        print(f"radixserve serve: {exc}", file=sys.stderr)
        return 2
    if dp.dp_size > 1:
        return data_parallel.serve_data_parallel(config, dp)
    if config.engine.parallel.node_rank > 0:  # this machine only runs its tensor-parallel ranks
        from radixserve.runtime.tp_ranks import run_node
        from radixserve.runtime.tp_worker import run_tp_worker

        return run_node(config.engine, run_tp_worker)
    from radixserve.launch.server import StartupError, launch_server

    code = 0
    try:
        code = launch_server(config)
    except StartupError as exc:
        logger.error("the server could not start: %s", exc)
        return 1
    except KeyboardInterrupt:
        pass
    # the interpreter's last garbage collection over torch's and transformers' objects takes
    # seconds; nothing left needs it
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(main())
