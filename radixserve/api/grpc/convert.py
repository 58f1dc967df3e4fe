"""Conversions between SGLang's gRPC scheduler messages (``smg-grpc-proto``) and radixserve's:
sampling parameters in, outputs and logprobs out, the tokenizer's files, protobuf Structs."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb

from radixserve.runtime.io_struct import ReqOutput
from radixserve.types import FinishKind, SamplingParams

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


def max_new_tokens_of(p: pb.SamplingParams) -> int | None:
    return p.max_new_tokens if p.HasField("max_new_tokens") else None


def stream_chunk(out: ReqOutput, index: int) -> pb.GenerateStreamChunk:
    return pb.GenerateStreamChunk(
        token_ids=out.new_token_ids,
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        cached_tokens=out.cached_tokens,
        output_logprobs=_logprobs([out]),
        index=index,
    )


def complete_of(outputs: list[ReqOutput], index: int) -> pb.GenerateComplete:
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


def read_json(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def plain(value: Any) -> Any:
    """A value a protobuf Struct takes: dicts, lists, strings, numbers, booleans, None."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
