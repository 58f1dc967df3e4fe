"""Named traces: the bench shapes (``radixserve bench``'s presets, through its generators),
SGLang's ``generated-shared-prefix`` parameters, and JSONL files."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from radixserve.bench.workload import (
    MULTITURN_SHAPES,
    SHARED_PREFIX_SHAPES,
    MultiTurnSpec,
    SharedPrefixSpec,
    make_multiturn,
)
from radixserve.sim.trace import (
    SimSession,
    from_bench_sessions,
    load_jsonl,
    shared_prefix_sessions,
)

TRACES = ("multiturn-a", "multiturn-b", "shared-prefix", "gsp", "jsonl")
# SGLang bench_serving's --gsp-* defaults
GSP_DEFAULTS = dict(
    groups=64, prompts_per_group=16, system_len=2048, question_len=128, output_len=256
)


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """What ``--trace`` and its flags chose. ``None`` fields take the shape's default."""

    kind: str
    path: str | None = None  # jsonl
    groups: int | None = None
    prompts_per_group: int | None = None
    system_len: int | None = None
    question_len: int | None = None
    output_len: int | None = None
    request_rate: float = float("inf")
    max_concurrency: int | None = None
    conversations: int | None = None
    turns: int | None = None
    seed: int = 0
    token_range: tuple[int, int] = (3, 32000)
    loras: int | None = None  # session i under LoRA adapter f"lora{i % loras}"

    def __post_init__(self) -> None:
        if self.kind not in TRACES:
            raise ValueError(f"trace must be one of {TRACES}, got {self.kind!r}")
        if self.kind == "jsonl" and not self.path:
            raise ValueError("--trace jsonl needs --trace-file PATH")


def _pick(value: int | None, default: int) -> int:
    return default if value is None else value


def build_trace(spec: TraceSpec) -> tuple[list[SimSession], int | None, str]:
    """The sessions, the number of concurrent clients (``None``: open loop) and a description;
    with ``loras``, session ``i`` runs under adapter ``lora{i % loras}``."""
    sessions, clients, text = _build_trace(spec)
    if not spec.loras:
        return sessions, clients, text
    k = spec.loras
    tagged = [dataclasses.replace(s, lora=f"lora{s.sid % k}") for s in sessions]
    return tagged, clients, f"{text}, {k} LoRA adapters"


def _build_trace(spec: TraceSpec) -> tuple[list[SimSession], int | None, str]:
    low, high = spec.token_range
    if spec.kind.startswith("multiturn"):
        p = MULTITURN_SHAPES[spec.kind[-1]]
        mt = MultiTurnSpec(
            num_conversations=_pick(spec.conversations, p["conversations"]),
            num_turns=_pick(spec.turns, p["turns"]),
            user_len=p["user_len"],
            answer_len=p["answer_len"],
            parallel=_pick(spec.max_concurrency, p["parallel"]),
            seed=spec.seed,
        )
        text = f"{mt.num_conversations} conversations x {mt.num_turns} turns, {mt.parallel} clients"
        return from_bench_sessions(make_multiturn(mt, low, high)), mt.parallel, text
    if spec.kind == "jsonl":
        assert spec.path is not None
        sessions = load_jsonl(spec.path, spec.seed, spec.token_range)
        return sessions, spec.max_concurrency, f"{len(sessions)} requests from {spec.path}"
    d = GSP_DEFAULTS if spec.kind == "gsp" else SHARED_PREFIX_SHAPES["default"]
    sp = SharedPrefixSpec(
        num_groups=_pick(spec.groups, d["groups"]),
        prompts_per_group=_pick(spec.prompts_per_group, d["prompts_per_group"]),
        system_len=_pick(spec.system_len, d["system_len"]),
        question_len=_pick(spec.question_len, d["question_len"]),
        output_len=_pick(spec.output_len, d["output_len"]),
        request_rate=spec.request_rate,
        max_concurrency=_pick(spec.max_concurrency, 64),
        seed=spec.seed,
    )
    text = (
        f"{sp.num_groups} groups x {sp.prompts_per_group} prompts, system {sp.system_len}, "
        f"question {sp.question_len}, output {sp.output_len}, {sp.max_concurrency} clients"
    )
    return shared_prefix_sessions(sp, low, high), sp.max_concurrency, text
