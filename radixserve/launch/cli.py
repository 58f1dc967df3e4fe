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
    OVERLAP_LAUNCHES,
    PREEMPTION_MODES,
    QUANTIZATIONS,
    REASONING_PARSERS,
    SCHEDULE_POLICIES,
    TOOL_CALL_PARSERS,
    EngineConfig,
    ServerConfig,
    default_model_dir,
)
from radixserve.hub import is_hub_id, resolve_model
from radixserve.launch.cli_access import access_fields, add_access_flags
from radixserve.launch.cli_cache import add_cache_flags, cache_fields
from radixserve.launch.cli_lora import add_lora_flags, check_lora_paths, lora_fields
from radixserve.launch.cli_spec import add_spec_flags, spec_fields

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
    """Adds ``serve`` and its flags to the ``radixserve`` sub-parsers ``sub``."""
    serve = sub.add_parser(
        "serve",
        help="start the HTTP server (native /generate and OpenAI-compatible routes)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
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
    add("--host", default="127.0.0.1", help="address to listen on")
    add("--port", type=int, default=30000, help="port to listen on")
    add("--grpc-port", type=int, default=None, help="also serve SGLang's gRPC API (for smg)")
    add(
        "--schedule-policy",
        choices=SCHEDULE_POLICIES,
        default=_DEFAULTS.admission.schedule_policy,
        help="waiting-queue order: fcfs, lof (longest output first), random; cache-aware lpm "
        "(longest prefix match), dfs-weight, hrrn (highest response ratio: work done since "
        "a request arrived over its uncached tokens) and adaptive (lpm while the queue does not "
        "fit in the pool, fcfs while it does)",
    )
    add(
        "--chunked-prefill-size",
        type=int,
        default=_DEFAULTS.admission.chunked_prefill_size,
        help="most prompt tokens one prefill step computes per request; <= 0 disables chunking",
    )
    add(
        "--disable-prefill-interleaving",
        action="store_true",
        help="let a long prompt's continuing chunk take the whole chunk budget (by default it is "
        "cut so whole short prompts queued behind it run in the same step, keeping at least "
        "--prefill-interleaving-min-continuation-tokens, default half the chunk)",
    )
    add("--enable-prefill-interleaving", action="store_true", help="the default; for SGLang's")
    add("--prefill-interleaving-min-continuation-tokens", type=int, default=None)
    add(
        "--max-running-requests",
        type=int,
        default=_DEFAULTS.admission.max_running_requests,
        help="most requests in the running batch",
    )
    add(
        "--max-queued-requests",
        type=int,
        default=None,
        help="most requests waiting to run; beyond it a new one gets 429 with Retry-After "
        "(default: no bound)",
    )
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
    add_cache_flags(serve)
    add_spec_flags(serve)
    add(
        "--preemption-mode",
        choices=PREEMPTION_MODES,
        default=_DEFAULTS.admission.preemption_mode,
        help="a preempted or retracted request's KV: cached and recomputed where evicted, or "
        "swapped to the tier and back (needs a tier)",
    )
    add(
        "--disable-overlap-schedule",
        action="store_true",
        help="do not prepare the next batch while the current one runs",
    )
    add(
        "--overlap-launch",
        choices=OVERLAP_LAUNCHES,
        default=_DEFAULTS.execution.overlap_launch,
        help="with overlap: launch each batch from a worker thread, or from the scheduler thread "
        "on the device's stream (asynchronous on CUDA only)",
    )
    add(
        "--disable-cuda-graph",
        action="store_true",
        help="CUDA: run every decode step eagerly instead of replaying captured graphs",
    )
    add(
        "--cuda-graph-max-bs",
        type=int,
        default=None,
        help="CUDA: the largest decode batch replayed from a graph (default: "
        "--max-running-requests, at most 256)",
    )
    add(
        "--enable-priority-scheduling",
        action="store_true",
        help="order by the requests' priority first (and preempt for much higher priority)",
    )
    add(
        "--dtype",
        choices=("auto", "float32", "bfloat16", "float16"),
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
    add(
        "--tp-size",
        type=int,
        default=_DEFAULTS.parallel.tp_size,
        help="tensor parallelism: split the model over this many processes (gloo on CPU, NCCL "
        "on CUDA: one GPU each); see docs/tensor_parallel.md",
    )
    add("--nnodes", type=int, default=1, help="machines the --tp-size ranks are spread over")
    add("--node-rank", type=int, default=0, help="this machine's index (0 serves)")
    add("--dist-init-addr", default=None, metavar="HOST:PORT", help="node 0's address, all nodes")
    add(
        "--served-model-name",
        default=None,
        help="the model name /v1/models lists and the OpenAI routes accept "
        "(default: the model path as given, as SGLang does)",
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
    add("--max-stored-responses", type=int, default=defaults.max_stored_responses,
        help="stored Responses API responses (every tenant's); least recently used out")  # fmt: skip
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
    engine = EngineConfig.from_flat(
        model_path=model_path,
        dtype=args.dtype,
        quantization=args.quantization,
        device=args.device,
        page_size=args.page_size,
        max_total_tokens=args.max_total_tokens,
        max_running_requests=args.max_running_requests,
        max_queued_requests=args.max_queued_requests,
        max_context_len=args.max_context_len,
        chunked_prefill_size=args.chunked_prefill_size,
        enable_prefill_interleaving=not args.disable_prefill_interleaving,
        prefill_interleaving_min_continuation_tokens=(
            args.prefill_interleaving_min_continuation_tokens
        ),
        schedule_policy=args.schedule_policy,
        disable_radix_cache=args.disable_radix_cache,
        disable_overlap_schedule=args.disable_overlap_schedule,
        overlap_launch=args.overlap_launch,
        disable_cuda_graph=args.disable_cuda_graph,
        cuda_graph_max_bs=args.cuda_graph_max_bs,
        disable_jump_forward=args.disable_jump_forward,
        **cache_fields(args),
        **spec_fields(args),
        preemption_mode=args.preemption_mode,
        enable_priority_scheduling=args.enable_priority_scheduling,
        tp_size=args.tp_size,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        dist_init_addr=args.dist_init_addr,
        **lora_fields(args),
    )
    return ServerConfig(
        engine=engine,
        host=args.host,
        port=args.port,
        grpc_port=args.grpc_port,
        **access_fields(args),
        served_model_name=args.served_model_name,
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
