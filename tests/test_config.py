"""The engine's config parts: each refuses its own bad values naming the field, the rules across
parts are the engine's, flat names (``Engine(**kwargs)``, SGLang's server args) route to their
part and back, and ``serve``'s flags build the same config as the flat names they stand for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from radixserve.config import (
    PART_OF,
    PARTS,
    AdmissionConfig,
    EngineConfig,
    ExecutionConfig,
    KVTierConfig,
    LoRAConfig,
    ParallelConfig,
    SchedulerConstants,
    ServerConfig,
    SpeculativeConfig,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("part", "fields", "named"),
    [
        (AdmissionConfig, {"max_running_requests": 0}, "max_running_requests"),
        (AdmissionConfig, {"schedule_policy": "sjf"}, "schedule_policy"),
        (AdmissionConfig, {"preemption_mode": "kill"}, "preemption_mode"),
        (KVTierConfig, {"kv_tier_bytes": 0}, "kv_tier_bytes"),
        (KVTierConfig, {"kv_tier_write_policy": "lazy"}, "kv_tier_write_policy"),
        (LoRAConfig, {"max_lora_rank": 0}, "max_lora_rank"),
        (LoRAConfig, {"max_loaded_loras": 2, "max_loras_per_batch": 4}, "max_loaded_loras"),
        (ParallelConfig, {"tp_timeout_s": 0}, "tp_timeout_s"),
        (ParallelConfig, {"nnodes": 2, "node_rank": 2}, "node_rank"),
        (ExecutionConfig, {"overlap_launch": "process"}, "overlap_launch"),
        (ExecutionConfig, {"cpu_isa": "sse2"}, "cpu_isa"),
        (SpeculativeConfig, {"speculative_algorithm": "EAGLE"}, "speculative_algorithm"),
    ],
)
def test_a_part_refuses_its_own_bad_value_naming_the_field(
    part: Any, fields: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        part(**fields)
    with pytest.raises(ValueError, match=named):  # the flat names reach the same check
        EngineConfig.from_flat(**fields)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"preemption_mode": "swap"}, "needs a KV tier"),
        ({"enable_hierarchical_cache": True, "disable_radix_cache": True}, "radix cache"),
        ({"kv_tier_path": "/t", "tp_size": 2}, "tensor parallelism"),
        ({"chunked_prefill_size": 8, "page_size": 16}, "chunked_prefill_size 8 < page_size 16"),
        ({"kv_events_config": '{"publisher": "kafka"}'}, "--kv-events-config"),
    ],
)
def test_the_rules_across_parts_are_the_engines(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        EngineConfig.from_flat(**fields)


def test_flat_names_route_to_their_part_and_back() -> None:
    constants = SchedulerConstants(aging_work_factor=0.0)
    flat: dict[str, Any] = {
        "model_path": "/m",
        "page_size": 4,
        "max_running_requests": 8,
        "constants": constants,
        "kv_tier_bytes": 1 << 20,
        "enable_hierarchical_cache": True,
        "lora_paths": ["a=/x", "/y"],
        "max_lora_rank": 16,
        "tp_size": 2,
        "tp_timeout_s": 5.0,
        "num_threads": 3,
        "overlap_launch": "stream",
        "speculative_algorithm": "NGRAM",
        "kv_events_config": '{"publisher": "zmq"}',
    }
    config = EngineConfig.from_flat(**{**flat, "enable_hierarchical_cache": False})
    assert config.admission == AdmissionConfig(max_running_requests=8, constants=constants)
    assert config.lora == LoRAConfig(lora_paths=(("a", "/x"), ("/y", "/y")), max_lora_rank=16)
    assert config.parallel == ParallelConfig(tp_size=2, tp_timeout_s=5.0)
    assert config.execution.num_threads == 3 and config.execution.overlap_launch == "stream"
    assert config.speculative == SpeculativeConfig(speculative_algorithm="NGRAM")
    assert config.kv_events is not None and config.kv_events.publisher == "zmq"  # parsed once
    assert config.page_size == 4 and config.kv_tier.kv_tier_bytes == 1 << 20
    assert EngineConfig.from_flat(**config.flat()) == config
    assert set(config.flat()) == set(PART_OF) | {f for f in flat if f not in PART_OF} | {
        "dtype", "quantization", "device", "max_total_tokens", "kv_cache_bytes",
        "max_context_len", "disable_radix_cache", "disable_jump_forward", "random_seed",
    }  # fmt: skip
    assert not set(PARTS) & set(config.flat())
    # a changed copy: the part's other fields and the other parts stay
    changed = config.replace(max_lora_rank=8, tp_size=1, device="cuda")
    assert changed.lora == LoRAConfig(lora_paths=config.lora.lora_paths, max_lora_rank=8)
    assert changed.parallel == ParallelConfig(tp_timeout_s=5.0) and changed.device == "cuda"
    assert changed.admission is config.admission
    with pytest.raises(ValueError, match="needs a KV tier"):  # the copy is checked again
        config.replace(preemption_mode="swap")


def test_an_unknown_flat_name_is_refused() -> None:
    with pytest.raises(TypeError, match="'max_lora_rnak'"):
        EngineConfig.from_flat(max_lora_rnak=8)
    with pytest.raises(TypeError, match="'admision'"):
        EngineConfig().replace(admision=AdmissionConfig())
    from radixserve.server.engine import Engine

    with pytest.raises(TypeError, match="'tp'"):  # before any model is loaded
        Engine(None, tp=2)


def test_server_args_show_the_flat_names() -> None:
    from radixserve.api.operator.server_info import server_args

    engine = EngineConfig.from_flat(model_path="/m", tp_size=2, kv_events_config='{"topic": "t"}')
    args = server_args(ServerConfig(engine))
    assert set(engine.flat()) <= set(args) and not set(PARTS) & set(args)
    assert args["tp_size"] == 2 and args["chunked_prefill_size"] == 512
    assert args["constants"]["aging_work_factor"] == 2.0
    assert json.loads(args["kv_events_config"])["topic"] == "t"  # as JSON, as it was given


def test_the_serve_flags_build_the_config_of_their_flat_names(tmp_path: Path) -> None:
    from radixserve.launch.cli import build_parser, make_server_config

    (tmp_path / "config.json").write_text("{}")
    argv = ["serve", "--model", str(tmp_path), "--page-size", "4", "--dtype", "float32"]
    argv += ["--schedule-policy", "lpm", "--chunked-prefill-size", "64", "--max-queued-requests"]
    argv += ["9", "--disable-prefill-interleaving", "--enable-priority-scheduling"]
    argv += ["--enable-hierarchical-cache", "--kv-tier-size", "1MiB", "--preemption-mode", "swap"]
    argv += ["--kv-events-config", '{"publisher": "zmq", "endpoint": "tcp://*:5557"}']
    argv += ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "5"]
    argv += ["--overlap-launch", "stream", "--cuda-graph-max-bs", "32", "--tp-size", "1"]
    argv += ["--lora-paths", "a=/x", "--max-lora-rank", "16", "--disable-jump-forward"]
    engine = make_server_config(build_parser().parse_args(argv)).engine
    assert engine == EngineConfig.from_flat(
        model_path=str(tmp_path.resolve()),
        page_size=4,
        dtype="float32",
        schedule_policy="lpm",
        chunked_prefill_size=64,
        max_queued_requests=9,
        enable_prefill_interleaving=False,
        enable_priority_scheduling=True,
        enable_hierarchical_cache=True,
        kv_tier_bytes=1 << 20,
        preemption_mode="swap",
        kv_events_config='{"publisher": "zmq", "endpoint": "tcp://*:5557"}',
        speculative_algorithm="NGRAM",
        speculative_num_draft_tokens=5,
        overlap_launch="stream",
        cuda_graph_max_bs=32,
        lora_paths=(("a", "/x"),),
        max_lora_rank=16,
        disable_jump_forward=True,
    )
    defaults = make_server_config(build_parser().parse_args(argv[:3])).engine
    assert defaults == EngineConfig(model_path=str(tmp_path.resolve()))
