"""LoRA adapters end to end through the Engine, against PEFT on Hugging Face transformers.

Every adapter here is random in both A and B (``write_tiny_lora``), so its greedy tokens differ
from the base model's: a test that passes with the adapter applied fails without it.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("peft")

from radixserve import Engine  # noqa: E402
from radixserve.config import SchedulerConstants  # noqa: E402
from radixserve.models.tiny_lora import write_tiny_lora  # noqa: E402

MAX_NEW = 10
PARAMS = {"max_new_tokens": MAX_NEW, "temperature": 0.0, "ignore_eos": True}

# name -> write_tiny_lora's keywords: every target, a subset with rsLoRA, a rank pattern and an
# alpha pattern, and the MLP alone
ADAPTERS: dict[str, dict[str, Any]] = {
    "all": dict(r=8, seed=1),
    "qv-rslora": dict(r=4, seed=2, target_modules=["q_proj", "v_proj"], use_rslora=True),
    "patterns": dict(
        r=8,
        seed=3,
        target_modules=["k_proj", "o_proj", "up_proj"],
        rank_pattern={"o_proj": 2},
        alpha_pattern={"up_proj": 4},
    ),
    "mlp": dict(r=16, seed=4, target_modules=["gate_proj", "down_proj"], lora_alpha=8),
}


@pytest.fixture(scope="module")
def lora_dirs(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> dict[str, str]:
    root = tmp_path_factory.mktemp("loras")
    return {
        name: str(write_tiny_lora(tiny_llama_dir, root / name, **kw))
        for name, kw in ADAPTERS.items()
    }


@pytest.fixture(scope="module")
def peft_greedy(tiny_llama_dir: Path, lora_dirs: dict[str, str]):
    """Greedy continuation by PEFT (the oracle) under adapter ``name`` (None: the base)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    names = list(lora_dirs)
    model = PeftModel.from_pretrained(base, lora_dirs[names[0]], adapter_name=names[0])
    for name in names[1:]:
        model.load_adapter(lora_dirs[name], adapter_name=name)
    cache: dict[tuple[str | None, tuple[int, ...], int], list[int]] = {}

    def generate(name: str | None, ids: list[int], max_new: int = MAX_NEW) -> list[int]:
        key = (name, tuple(ids), max_new)
        if key not in cache:
            with torch.inference_mode():
                prompt = torch.tensor([ids])
                kwargs = dict(max_new_tokens=max_new, do_sample=False, pad_token_id=0)
                if name is None:
                    with model.disable_adapter():
                        out = model.generate(input_ids=prompt, eos_token_id=None, **kwargs)
                else:
                    model.set_adapter(name)
                    out = model.generate(input_ids=prompt, eos_token_id=None, **kwargs)
            cache[key] = out[0, len(ids) :].tolist()
        return cache[key]

    return generate


def prompts(n: int, seed: int = 0, shared: int = 24) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randrange(5, 1000) for _ in range(shared)]
    return [system + [rng.randrange(5, 1000) for _ in range(rng.randint(3, 20))] for _ in range(n)]


def engine(model_dir: Path, lora_dirs: dict[str, str], **kw: Any) -> Engine:
    kw.setdefault("max_total_tokens", 4096)
    return Engine(str(model_dir), dtype="float32", lora_paths=lora_dirs, **kw)


@pytest.mark.parametrize("disable_overlap", [False, True])
@pytest.mark.parametrize("chunk", [None, 16])
def test_mixed_batch_equals_peft_per_adapter(
    tiny_llama_dir, lora_dirs, peft_greedy, chunk, disable_overlap
) -> None:
    names: list[str | None] = [None, *lora_dirs]
    ps = prompts(10)
    which = [names[i % len(names)] for i in range(len(ps))]
    expected = [peft_greedy(n, p) for n, p in zip(which, ps, strict=True)]
    assert len({tuple(peft_greedy(n, ps[0])) for n in names}) == len(names), "adapters differ"
    with engine(
        tiny_llama_dir,
        lora_dirs,
        chunked_prefill_size=chunk,
        disable_overlap_schedule=disable_overlap,
    ) as e:
        for _ in range(2):  # the second round hits the cache each adapter filled
            outs = e.generate(input_ids=ps, sampling_params=PARAMS, lora_path=which)
            assert [o["output_ids"] for o in outs] == expected
        e.check_integrity()


def test_the_cache_is_split_by_adapter(tiny_llama_dir, lora_dirs, peft_greedy) -> None:
    [p] = prompts(1, seed=5)
    with engine(tiny_llama_dir, lora_dirs) as e:
        first = e.generate(input_ids=p, sampling_params=PARAMS, lora_path="all")
        assert first["meta_info"]["cached_tokens"] == 0
        # the same prompt under another adapter, the base, or a caller's own namespace: no hit
        for name in ("mlp", None):
            out = e.generate(input_ids=p, sampling_params=PARAMS, lora_path=name)
            assert out["meta_info"]["cached_tokens"] == 0
            assert out["output_ids"] == peft_greedy(name, p)
        again = e.generate(input_ids=p, sampling_params=PARAMS, lora_path="all")
        assert again["meta_info"]["cached_tokens"] == len(p) - 1
        assert again["output_ids"] == first["output_ids"] == peft_greedy("all", p)
        with pytest.raises(ValueError, match="extra_key may not start"):
            e.generate(input_ids=p, sampling_params=PARAMS, extra_key="lora:anything")
        e.check_integrity()


def test_retraction_under_memory_pressure(tiny_llama_dir, lora_dirs, peft_greedy) -> None:
    """Eight requests of about 60 tokens each in a pool of 200 slots, admitted eagerly: decode
    runs out of memory and retracts; the retracted ones resume under their own adapters."""
    names: list[str | None] = [None, *lora_dirs]
    ps = prompts(8, seed=7, shared=0)
    which = [names[i % len(names)] for i in range(len(ps))]
    # without ignore_eos: its admission reserves every request's whole output, never retracts
    params = {"max_new_tokens": 40, "temperature": 0.0}
    over_admit = SchedulerConstants(init_new_token_ratio=0.05, min_new_token_ratio=0.05)
    with engine(
        tiny_llama_dir,
        lora_dirs,
        max_total_tokens=200,
        disable_radix_cache=True,
        constants=over_admit,
    ) as e:
        outs = e.generate(input_ids=ps, sampling_params=params, lora_path=which)
        stats = e.get_stats()
        e.check_integrity()
    assert stats["num_retractions"] > 0
    for out, name, p in zip(outs, which, ps, strict=True):
        ids = out["output_ids"]  # up to an end-of-sequence token, which PEFT's run ignores
        assert ids and ids == peft_greedy(name, p, 40)[: len(ids)]


def test_batches_hold_at_most_max_loras_per_batch(tiny_llama_dir, lora_dirs, peft_greedy) -> None:
    names = list(lora_dirs)
    ps = prompts(8, seed=9)
    which = [names[i % len(names)] for i in range(len(ps))]
    with engine(tiny_llama_dir, lora_dirs, max_loras_per_batch=2, max_loaded_loras=2) as e:
        seen: list[set[str]] = []
        manager = e.scheduler.loras
        forward_lora = manager.forward_lora

        def recording(reqs, counts, keep=()):
            seen.append({r.lora_id for r in (*reqs, *keep) if r.lora_id is not None})
            return forward_lora(reqs, counts, keep)

        manager.forward_lora = recording  # type: ignore[method-assign]
        outs = e.generate(input_ids=ps, sampling_params=PARAMS, lora_path=which)
        e.check_integrity()
        loads = manager.num_loads
    assert [o["output_ids"] for o in outs] == [
        peft_greedy(n, p) for n, p in zip(which, ps, strict=True)
    ]
    assert seen and max(len(s) for s in seen) <= 2
    assert max(len(s) for s in seen) == 2  # they did share batches
    assert loads > len(names)  # dropped from memory (two at a time) and read again


def test_load_and_unload_at_run_time(tiny_llama_dir, lora_dirs, peft_greedy) -> None:
    [p] = prompts(1, seed=11)
    long_params = {**PARAMS, "max_new_tokens": 40}
    with Engine(str(tiny_llama_dir), dtype="float32", max_total_tokens=4096) as e:
        with pytest.raises(ValueError, match="not loaded"):
            e.generate(input_ids=p, sampling_params=PARAMS, lora_path="all")
        e.load_lora_adapter("a", lora_dirs["all"])
        with pytest.raises(ValueError, match="already loaded"):
            e.load_lora_adapter("a", lora_dirs["mlp"])
        assert e.lora_adapters() == {"a": lora_dirs["all"]}
        # unloaded while a request runs under it: that request finishes under it, unharmed
        stream = e.generate(input_ids=p, sampling_params=long_params, lora_path="a", stream=True)
        first = next(stream)
        e.unload_lora_adapter("a")
        tokens = first["output_ids"] + [t for chunk in stream for t in chunk["output_ids"]]
        assert tokens[:MAX_NEW] == peft_greedy("all", p)
        with pytest.raises(ValueError, match="not loaded"):
            e.generate(input_ids=p, sampling_params=PARAMS, lora_path="a")
        e.check_integrity()
        assert e.scheduler.loras.entries == {}  # its weights went with its last request
        # the same files again, under another name: the same namespace, so its cache hits
        e.load_lora_adapter("b", lora_dirs["all"])
        out = e.generate(input_ids=p, sampling_params=PARAMS, lora_path="b")
        assert out["meta_info"]["cached_tokens"] == len(p) - 1
        assert out["output_ids"] == peft_greedy("all", p)
        with pytest.raises(ValueError, match="not loaded"):
            e.unload_lora_adapter("a")
        e.check_integrity()


def test_adapters_this_runtime_cannot_apply_are_refused(
    tiny_llama_dir, lora_dirs, tmp_path
) -> None:
    import json

    from radixserve.models.lora import load_adapter
    from radixserve.models.model_config import ModelConfig

    cfg = ModelConfig.from_dict(json.loads((tiny_llama_dir / "config.json").read_text()))

    def load(path: Path | str, max_rank: int = 64) -> Any:
        return load_adapter(path, cfg, torch.float32, torch.device("cpu"), max_rank)

    with pytest.raises(ValueError, match="no adapter_config.json"):
        load(tmp_path)
    with pytest.raises(ValueError, match="exceeds --max-lora-rank 8"):
        load(lora_dirs["mlp"], max_rank=8)
    for key, value, message in [
        ("use_dora", True, "DoRA"),
        ("bias", "all", "trains biases"),
        ("modules_to_save", ["lm_head"], "modules_to_save"),
        ("peft_type", "IA3", "not a LoRA adapter"),
    ]:
        bad = tmp_path / key
        bad.mkdir()
        src = Path(lora_dirs["all"])
        config = json.loads((src / "adapter_config.json").read_text()) | {key: value}
        (bad / "adapter_config.json").write_text(json.dumps(config))
        (bad / "adapter_model.safetensors").write_bytes(
            (src / "adapter_model.safetensors").read_bytes()
        )
        with pytest.raises(ValueError, match=message):
            load(bad)
    embed = write_tiny_lora(tiny_llama_dir, tmp_path / "embed", target_modules=["embed_tokens"])
    with pytest.raises(ValueError, match="not supported"):
        load(embed)
    with Engine(str(tiny_llama_dir), dtype="float32", max_total_tokens=4096) as e:
        with pytest.raises(ValueError, match="not a PEFT LoRA adapter"):
            e.load_lora_adapter("x", str(tmp_path / "missing"))
        with pytest.raises(ValueError, match="not a valid adapter name"):
            e.load_lora_adapter("a:b", lora_dirs["all"])
        assert e.lora_adapters() == {}


def test_a_restarted_file_tier_hits_only_under_the_same_adapter_files(
    tiny_llama_dir, lora_dirs, peft_greedy, tmp_path
) -> None:
    """The namespace is the adapter's content: after a restart the tier's KV of "all" is hit
    by the same files under any name, never by other files given that name."""
    [p] = prompts(1, seed=13, shared=40)
    tier = dict(
        max_total_tokens=256,
        kv_tier_path=str(tmp_path / "tier"),
        kv_tier_write_policy="write_through",
    )
    with Engine(
        str(tiny_llama_dir), dtype="float32", lora_paths={"x": lora_dirs["all"]}, **tier
    ) as e:
        e.generate(input_ids=p, sampling_params=PARAMS, lora_path="x")
    with Engine(
        str(tiny_llama_dir),
        dtype="float32",
        lora_paths={"renamed": lora_dirs["all"], "x": lora_dirs["mlp"]},
        **tier,
    ) as e:
        other = e.generate(input_ids=p, sampling_params=PARAMS, lora_path="x")
        same = e.generate(input_ids=p, sampling_params=PARAMS, lora_path="renamed")
        e.check_integrity()
    assert other["meta_info"]["cached_tokens"] == 0
    assert other["output_ids"] == peft_greedy("mlp", p)
    assert same["meta_info"]["cached_tokens"] >= len(p) - 2
    assert same["output_ids"] == peft_greedy("all", p)


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight"])
def test_cache_aware_policies_match_within_the_namespace(
    tiny_llama_dir, lora_dirs, peft_greedy, policy
) -> None:
    """The same prompts under two adapters: LPM and DFS-weight see each request's match in its
    own namespace, so the second round hits under each adapter what that adapter computed."""
    ps = prompts(4, seed=17)
    which = ["all", "mlp"] * 2
    twice = [*ps, *ps]
    names = [*which, *reversed(which)]  # the same prompts, each under the other adapter too
    with engine(tiny_llama_dir, lora_dirs, schedule_policy=policy) as e:
        first = e.generate(input_ids=ps, sampling_params=PARAMS, lora_path=which)
        both = e.generate(input_ids=twice, sampling_params=PARAMS, lora_path=names)
        e.check_integrity()
    assert [o["output_ids"] for o in first] == [
        peft_greedy(n, p) for n, p in zip(which, ps, strict=True)
    ]
    assert [o["output_ids"] for o in both] == [
        peft_greedy(n, p) for n, p in zip(names, twice, strict=True)
    ]
    cached = [o["meta_info"]["cached_tokens"] for o in both]
    assert all(c >= len(p) - 1 for c, p in zip(cached[:4], ps, strict=True))
    # under the other adapter: at most what the batch's own first request computed
    assert all(c < len(p) - 1 for c, p in zip(cached[4:], ps, strict=True))


def test_an_adapter_whose_files_went_fails_its_requests_alone(
    tiny_llama_dir, lora_dirs, peft_greedy, tmp_path
) -> None:
    """Dropped from memory (--max-loaded-loras 1), then its directory deleted: the next
    request under it ends with an error when it would be admitted; the others run on."""
    import shutil

    [p] = prompts(1, seed=19)
    doomed = shutil.copytree(lora_dirs["all"], tmp_path / "doomed")
    paths = {"doomed": str(doomed), "mlp": lora_dirs["mlp"]}
    with Engine(
        str(tiny_llama_dir),
        dtype="float32",
        max_total_tokens=4096,
        lora_paths=paths,
        max_loras_per_batch=1,
        max_loaded_loras=1,
    ) as e:
        assert e.generate(input_ids=p, sampling_params=PARAMS, lora_path="doomed")[
            "output_ids"
        ] == peft_greedy("all", p)
        e.generate(input_ids=p, sampling_params=PARAMS, lora_path="mlp")  # drops "doomed"
        shutil.rmtree(doomed)
        outs = e.generate(input_ids=[p, p], sampling_params=PARAMS, lora_path=["doomed", "mlp"])
        assert outs[0]["meta_info"]["finish_reason"]["type"] == "abort"
        assert outs[1]["output_ids"] == peft_greedy("mlp", p)
        e.check_integrity()
        assert e.scheduler.stats.num_failed_reqs == 1


def test_aborted_and_preempted_requests_release_their_adapter(
    tiny_llama_dir, lora_dirs, peft_greedy
) -> None:
    """A client that stops reading (abort) and urgent requests preempting running ones: every
    hold on an adapter ends with its request, the preempted ones finish under their adapters."""
    [p] = prompts(1, seed=23)
    long = {**PARAMS, "max_new_tokens": 30}
    with engine(
        tiny_llama_dir, lora_dirs, max_running_requests=2, enable_priority_scheduling=True
    ) as e:
        stream = e.generate(input_ids=p, sampling_params=long, lora_path="all", stream=True)
        next(stream)
        stream.close()  # the consumer stopped early: the request is aborted
        slow = [
            e.generate(input_ids=p, sampling_params=long, lora_path=n, stream=True, priority=0)
            for n in ("mlp", "qv-rslora")
        ]
        firsts = [next(s) for s in slow]  # both running
        urgent = e.generate(
            input_ids=[p, p], sampling_params=PARAMS, lora_path=["all", None], priority=[20, 20]
        )
        rest = [
            f["output_ids"] + [t for c in s for t in c["output_ids"]]
            for f, s in zip(firsts, slow, strict=True)
        ]
        e.check_integrity()
        stats = e.get_stats()
        assert e.scheduler.loras.entries[e.scheduler.loras.names["all"]].refs == 0
    assert stats["num_preemptions"] > 0 and stats["num_aborted_reqs"] >= 1
    assert [u["output_ids"] for u in urgent] == [peft_greedy("all", p), peft_greedy(None, p)]
    assert rest == [peft_greedy("mlp", p, 30), peft_greedy("qv-rslora", p, 30)]
