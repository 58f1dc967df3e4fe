"""SGLang's ``update_weights_from_disk`` on the Engine (``runtime/weight_update.py``): after an
update the engine generates what Hugging Face transformers generates with the new checkpoint,
its prefix cache emptied; a request running refuses it (unless ``abort_all_requests``, or a
pause that retracts it, after which it goes on under the new weights); and a checkpoint that
cannot serve as the model refuses it with the served weights unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hf_oracle import greedy, load_hf
from running_stream import paused_while_running
from safetensors.torch import load_file

from radixserve import Engine
from radixserve.models.tiny import write_tiny_model

pytestmark = pytest.mark.timeout(240)
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
LONG = {"max_new_tokens": 1800, "temperature": 0, "ignore_eos": True}
PROMPT = [5, 17, 42, 9, 33, 71, 2, 64]


def tiny(path: Path, tokenizer: Any, seed: int, **overrides: Any) -> Path:
    """The shape of the engine tests' tiny Llama (``tiny_llama_dir``), weights of ``seed``."""
    spec = dict(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=128)
    return write_tiny_model(path, "llama", tokenizer=tokenizer, seed=seed, **{**spec, **overrides})


@pytest.fixture(scope="module")
def other_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Any) -> Path:
    return tiny(tmp_path_factory.mktemp("update") / "b", tiny_tokenizer, seed=2)


def hf_greedy(model_dir: Path, ids: list[int], n: int) -> list[int]:
    return greedy(load_hf(model_dir), ids, n)


@pytest.fixture
def engine(engine_model_dir: Path):
    with Engine(str(engine_model_dir), dtype="float32", max_total_tokens=2048) as eng:
        yield eng


def test_after_an_update_the_engine_generates_the_new_checkpoints_tokens(
    engine: Engine, engine_model_dir: Path, other_dir: Path
) -> None:
    first = engine.generate(input_ids=PROMPT, sampling_params=GREEDY)
    assert first["output_ids"] == hf_greedy(engine_model_dir, PROMPT, 8)
    hit = engine.generate(input_ids=PROMPT, sampling_params=GREEDY)
    assert hit["meta_info"]["cached_tokens"] > 0
    assert first["meta_info"]["weight_version"] == "default"
    assert engine.update_weights_from_disk(str(other_dir), weight_version="step-1") == (
        True,
        "Succeeded to update model weights. Weight version updated to step-1.",
        0,
    )
    after = engine.generate(input_ids=PROMPT, sampling_params=GREEDY)
    assert after["meta_info"]["weight_version"] == "step-1"
    # SGLang's check of an update: a tensor as served, against the new checkpoint's
    name = "model.layers.1.self_attn.k_proj.weight"
    want = load_file(other_dir / "model.safetensors")[name][:3].tolist()
    assert engine.get_weights_by_name(name, truncate_size=3) == want
    with pytest.raises(ValueError, match="holds no weight named"):
        engine.get_weights_by_name("model.layers.9.mlp.up_proj.weight")
    want = hf_greedy(other_dir, PROMPT, 8)
    assert want != first["output_ids"]
    assert after["output_ids"] == want
    assert after["meta_info"]["cached_tokens"] == 0  # the old weights' KV is gone
    engine.check_integrity()
    ok, _, _ = engine.update_weights_from_disk(str(engine_model_dir), load_format="safetensors")
    assert ok
    assert (
        engine.generate(input_ids=PROMPT, sampling_params=GREEDY)["output_ids"]
        == first["output_ids"]
    )


def test_a_running_request_refuses_the_update(engine: Engine, other_dir: Path) -> None:
    reference = engine.generate(input_ids=PROMPT, sampling_params=GREEDY)["output_ids"]
    with paused_while_running(engine, LONG, input_ids=PROMPT, rid="runs") as (_, stream):
        ok, message, _ = engine.update_weights_from_disk(str(other_dir))
        assert not ok and "1 request(s) are running" in message
        engine.abort("runs")
    assert list(stream)[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert engine.generate(input_ids=PROMPT, sampling_params=GREEDY)["output_ids"] == reference
    engine.check_integrity()


def test_abort_all_requests_ends_them_then_updates(engine: Engine, other_dir: Path) -> None:
    with paused_while_running(engine, LONG, input_ids=PROMPT) as (_, stream):
        ok, _, _ = engine.update_weights_from_disk(str(other_dir), abort_all_requests=True)
        assert ok
        assert list(stream)[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    after = engine.generate(input_ids=PROMPT, sampling_params=GREEDY)["output_ids"]
    assert after == hf_greedy(other_dir, PROMPT, 8)
    engine.check_integrity()


def test_a_retracted_request_goes_on_under_the_new_weights(
    engine: Engine, engine_model_dir: Path, other_dir: Path
) -> None:
    n = 1000
    params = {**LONG, "max_new_tokens": n}
    with paused_while_running(engine, params, "retract", input_ids=PROMPT) as (got, stream):
        ok, message, _ = engine.update_weights_from_disk(str(other_dir))
        assert ok, message
    got += [t for c in stream for t in c["output_ids"]]
    assert len(got) == n
    # the old weights' tokens up to the retraction, then the new weights' continuation of them
    old = hf_greedy(engine_model_dir, PROMPT, n)
    k = next(i for i in range(n) if got[i] != old[i])
    assert got[k:] == hf_greedy(other_dir, PROMPT + got[:k], n - k)
    engine.check_integrity()


def test_a_checkpoint_that_cannot_serve_is_refused(
    engine: Engine, tmp_path: Path, tiny_tokenizer: Any
) -> None:
    reference = engine.generate(input_ids=PROMPT, sampling_params=GREEDY)["output_ids"]
    wider = tiny(tmp_path / "wider", tiny_tokenizer, seed=2, intermediate_size=256)
    for path, kw, why in [
        (wider, {}, "its config differs in ['intermediate_size']"),
        (tmp_path / "nowhere", {}, "not a model directory"),
        (wider, {"load_format": "pt"}, "load_format must be auto or safetensors"),
    ]:
        ok, message, paused = engine.update_weights_from_disk(str(path), **kw)
        assert (ok, paused) == (False, 0) and why in message
    assert engine.generate(input_ids=PROMPT, sampling_params=GREEDY)["output_ids"] == reference
    engine.check_integrity()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_tensor_parallel_rank_takes_the_new_weights(
    engine_model_dir: Path, other_dir: Path, tmp_path: Path, tiny_tokenizer: Any
) -> None:
    """tp=2 (two gloo processes): each rank stages its slice, and all of them or none take it."""
    args: dict[str, Any] = dict(dtype="float32", max_total_tokens=2048, tp_size=2)
    with Engine(str(engine_model_dir), **args) as engine:
        first = engine.generate(input_ids=PROMPT, sampling_params=GREEDY)["output_ids"]
        assert first == hf_greedy(engine_model_dir, PROMPT, 8)
        wider = tiny(tmp_path / "wider", tiny_tokenizer, seed=2, intermediate_size=256)
        ok, message, _ = engine.update_weights_from_disk(str(wider))
        assert not ok and "intermediate_size" in message
        assert engine.generate(input_ids=PROMPT, sampling_params=GREEDY)["output_ids"] == first
        assert engine.update_weights_from_disk(str(other_dir))[0]
        after = engine.generate(input_ids=PROMPT, sampling_params=GREEDY)["output_ids"]
        assert after == hf_greedy(other_dir, PROMPT, 8)
        engine.check_integrity()
