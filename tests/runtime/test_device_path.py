"""The device path end to end in bf16: on a CUDA GPU (FlashInfer attention, the CUDA sampler,
pinned KV tier copies, overlap with the sampled ids copied to the host asynchronously) or, with
``--device cpu``, the same tests as a dry run here (``benchmarks/device_gpu.sh --device cpu``).

Marked ``gpu``: deselected by default, run by ``pytest -m gpu [--device cpu]``.

bf16 changes the oracle of the float32 parity tests. Two correct bf16 implementations round
at different points, and on these small random models the best two tokens are often close, so
even Hugging Face in bf16 leaves its own float32 greedy path within a few tokens. So the model is
teacher-forced along HF's float32 greedy continuation (the truth) and held to HF in bf16 on the
same device (the calibration): at every step, its greedy token is float32's wherever float32's
top two are further apart than HF-bf16's own error there could explain, and its logits are no
further from float32's than HF-bf16's are (twice, plus a little). Scheduler runs are checked for
what batching cannot change on a GPU: lengths, integrity, accounting.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from test_model_parity import (
    Driver,
    hf_greedy,
    make_runner,
    prompts,  # noqa: F401 (the fixture: the parity tests' prompts)
    run_chunked,
    run_prefix_hit,
    run_scratch,
)
from test_scheduler_stress import make_requests, run

from radixserve import Engine
from radixserve.config import EngineConfig, SchedulerConstants
from radixserve.models.forward_batch import ForwardBatch
from radixserve.runtime.io_struct import GenerateRequest
from radixserve.runtime.scheduler import Scheduler
from radixserve.types import FinishKind, SamplingParams

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def device_llama_dir(device_model_dirs: dict[str, Path]) -> Path:
    return device_model_dirs["llama"]


MIN_MATCH = 16  # steps per prompt whose greedy token must equal float32 HF's (of 32)
ERR_SLACK = 0.02  # absolute logit error allowed beyond twice HF-bf16's


def hf_forced_logits(
    model_dir: Path, prompt_ids: list[list[int]], forced: list[list[int]], device: str
) -> list[torch.Tensor]:
    """HF in bf16 on ``device``: the logits [NUM_NEW_TOKENS, vocab] after each prompt and each
    forced token but the last, one forward per prompt."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
    out = []
    with torch.inference_mode():
        for prompt, tokens in zip(prompt_ids, forced, strict=True):
            ids = torch.tensor([prompt + tokens[:-1]], device=device)
            logits = model.eval()(ids).logits[0, len(prompt) - 1 :]
            out.append(logits.float().cpu())
    return out


def check_forced(ours: torch.Tensor, hf16: torch.Tensor, f32: torch.Tensor) -> int:
    """Logits [steps, vocab] of radixserve-bf16, HF-bf16 and HF-float32 along the same tokens:
    asserts the rule of the module docstring, returns the steps whose argmax equals float32's."""
    err_ours = (ours - f32).abs().amax(dim=-1)  # [steps]
    err_hf = (hf16 - f32).abs().amax(dim=-1)
    assert err_ours.max() <= 2 * err_hf.max() + ERR_SLACK, (err_ours.max(), err_hf.max())
    top2 = f32.topk(2, dim=-1).values
    decided = (top2[:, 0] - top2[:, 1]) > 2 * err_hf  # HF-bf16 cannot flip these
    agree = ours.argmax(dim=-1) == f32.argmax(dim=-1)
    assert bool(agree[decided].all()), f"argmax differs at steps {(~agree & decided).nonzero()}"
    return int(agree.sum())


_oracles: dict[tuple[str, str], tuple[list, list[torch.Tensor]]] = {}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize(
    "mode", [run_scratch, run_prefix_hit, run_chunked], ids=["scratch", "prefix_hit", "chunked"]
)
def test_bf16_greedy_matches_hf(
    arch: str,
    mode: object,
    device: str,
    device_model_dirs: dict[str, Path],
    prompts: list[list[int]],  # noqa: F811 (the fixture of test_model_parity)
) -> None:
    model_dir = device_model_dirs[arch]
    if (arch, device) not in _oracles:
        f32 = hf_greedy(model_dir, prompts)  # the truth: float32 on the CPU
        forced = [tokens for tokens, _ in f32]
        _oracles[arch, device] = f32, hf_forced_logits(model_dir, prompts, forced, device)
    f32, hf16 = _oracles[arch, device]
    runner = make_runner(model_dir, dtype="bfloat16", device=device)
    if device.startswith("cuda"):
        assert type(runner.attn_backend).__name__ == "FlashInferBackend"
    driver = Driver(runner)
    driver.forced = [tokens for tokens, _ in f32]
    seqs = mode(driver, prompts)  # type: ignore[operator]
    for seq, (_, f32_logits), hf_logits in zip(seqs, f32, hf16, strict=True):
        assert check_forced(torch.stack(seq.logits), hf_logits, f32_logits) >= MIN_MATCH


@pytest.mark.parametrize("launch", ["thread", "stream"])
def test_kv_stress_with_overlap(device: str, device_llama_dir: Path, launch: str) -> None:
    """500 requests through a pool small enough to evict, retract and preempt, some aborted,
    overlap on (each batch launched from the worker thread, or from the scheduler thread on the
    device's stream): every request ends with its full length (or is aborted),
    ``check_integrity`` holds after every step, and every slot is free or cached at the end."""
    requests = make_requests(500)
    config = EngineConfig.from_flat(
        model_path=str(device_llama_dir),
        dtype="bfloat16",
        device=device,
        random_seed=0,
        max_total_tokens=400,
        max_running_requests=24,
        chunked_prefill_size=32,
        schedule_policy="lpm",
        enable_priority_scheduling=True,
        constants=SchedulerConstants(new_token_ratio_decay_steps=40),
        overlap_launch=launch,
    )
    scheduler = Scheduler(config)
    assert scheduler.worker.overlap
    got = run(scheduler, requests, 7, check=True)
    stats = scheduler.get_stats()
    scheduler.shutdown()
    assert set(got) == {r.rid for r, _ in requests}
    for request, abort_at in requests:
        reason, ids = got[request.rid]
        if reason.kind is FinishKind.ABORT:
            assert abort_at is not None and len(ids) <= request.sampling_params.max_new_tokens
        else:
            assert reason.kind is FinishKind.LENGTH
            assert len(ids) == request.sampling_params.max_new_tokens
    assert stats["num_retractions"] > 0 and stats["num_preemptions"] > 0
    assert (
        stats["num_free_tokens"] + stats["num_cached_tokens_in_tree"] == stats["max_total_tokens"]
    )


def _sampled(device: str, model_dir: Path, seeds: list[int | None]) -> list[list[int]]:
    scheduler = Scheduler(
        EngineConfig(model_path=str(model_dir), dtype="bfloat16", device=device, random_seed=3)
    )
    rng = random.Random(0)
    prompt = [rng.randrange(5, 1000) for _ in range(20)]  # one prompt: rows differ by seed
    for i, seed in enumerate(seeds):
        params = SamplingParams(
            max_new_tokens=24, temperature=1.0, top_p=0.9, top_k=50, ignore_eos=True, seed=seed
        )
        scheduler.add_request(GenerateRequest(f"s{i}", prompt, params))
    tokens: dict[str, list[int]] = {}
    while scheduler.has_work:
        for out in scheduler.step():
            tokens.setdefault(out.rid, []).extend(out.new_token_ids)
    scheduler.shutdown()
    return [tokens[f"s{i}"] for i in range(len(seeds))]


def test_sampling_on_device_is_reproducible(device: str, device_llama_dir: Path) -> None:
    """The device's generator: a run repeats itself; a seeded request follows its seed, not its
    row (the same prompt and seed in two rows samples the same tokens, another seed others)."""
    first = _sampled(device, device_llama_dir, [7, 7, None, 11])
    again = _sampled(device, device_llama_dir, [7, 7, None, 11])
    assert first == again
    assert first[0] == first[1] and first[0] != first[3]
    assert len({t for row in first for t in row}) > 20  # sampled, not collapsed to greedy


TIE = 0.25  # logprob margin under which bf16 rounding (a few % of a logit of ~8) may flip a pick


def test_kv_tier_load_back_on_device(device: str, device_llama_dir: Path) -> None:
    """A host KV tier (pinned on CUDA) under a pool a third of the work: the second round loads
    the prompts back from the tier and decodes what the first round did (a divergence only at
    a near tie of the first round's top two)."""
    rng = random.Random(5)
    batch = [[rng.randrange(5, 1000) for _ in range(60)] for _ in range(6)]
    params = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
    with Engine(
        str(device_llama_dir),
        dtype="bfloat16",
        device=device,
        max_total_tokens=160,
        enable_hierarchical_cache=True,
    ) as engine:
        rounds = [
            engine.generate(
                input_ids=batch, sampling_params=params, return_logprob=True, top_logprobs_num=2
            )
            for _ in range(2)
        ]
        engine.check_integrity()
        stats = engine.get_stats()
    assert stats["num_cached_prompt_tokens_tier"] > 0
    for first, second in zip(*rounds, strict=True):
        a, b = first["output_ids"], second["output_ids"]
        step = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
        if step is not None:
            (lp1, _, _), (lp2, _, _) = first["meta_info"]["output_top_logprobs"][step][:2]
            assert lp1 - lp2 < TIE, f"diverged at step {step} with a margin of {lp1 - lp2:.3f}"


@pytest.mark.parametrize("fast_plan", [True, False], ids=["fast_plan", "full_plan"])
@pytest.mark.parametrize("arch", ["llama", "llama-tc", "qwen3", "mistral"])
def test_cuda_graph_decode_matches_eager(
    arch: str, fast_plan: bool, device: str, device_model_dirs: dict[str, Path]
) -> None:
    """A decode step replayed from a CUDA graph gives the eager step's logits, at captured and
    padded sizes, a smaller batch after a larger one (stale graph inputs must not leak), on
    FlashInfer's CUDA-core decode (llama: groups of 4), its tensor-core decode (qwen3: groups
    of 3; llama-tc: groups of 4 on tensor cores, ``flashinfer_decode_tensor_cores``) and a
    sliding window (mistral); each replay planned through FlashInfer's ``fast_decode_plan``
    (the default) or its full ``plan``."""
    if not device.startswith("cuda"):
        pytest.skip("CUDA graphs need a CUDA GPU (--device cpu: there are none to replay)")
    model, _, tc = arch.partition("-")
    runner = make_runner(
        device_model_dirs[model], dtype="bfloat16", device=device, tensor_cores=bool(tc) or None
    )
    assert runner.attn_backend._factory.use_tensor_cores == (model == "qwen3" or bool(tc))  # type: ignore[attr-defined]
    runner.attn_backend.fast_graph_plan = fast_plan  # type: ignore[attr-defined]
    graphs = runner.graphs
    assert graphs is not None and graphs.sizes == [1, 2, 4, 8, 16]
    driver = Driver(runner)
    rng = random.Random(arch)
    seqs = [
        driver.new_seq([rng.randrange(5, 1000) for _ in range(rng.randrange(10, 40))])
        for _ in range(13)
    ]
    driver.extend(seqs, [len(s.tokens) for s in seqs])
    for bs in (1, 3, 8, 13, 2):
        part = seqs[:bs]
        slots = driver.allocator.alloc(bs)
        assert slots is not None
        for seq, slot in zip(part, slots, strict=True):
            driver.pool.write(seq.row, seq.kv_len, slot.view(1))

        def step(use_graphs: bool, part: list = part, slots: torch.Tensor = slots) -> torch.Tensor:
            runner.graphs = graphs if use_graphs else None
            batch = ForwardBatch.decode(
                [s.tokens[-1] for s in part],
                [s.row for s in part],
                [s.kv_len + 1 for s in part],
                slots,
                device,
            )
            return runner.forward(batch).next_token_logits.cpu()

        replayed, eager = step(True), step(False)
        torch.testing.assert_close(replayed, eager, rtol=3e-2, atol=3e-2)
        assert replayed.shape == (bs, runner.vocab_size)
        for seq, row in zip(part, eager, strict=True):
            seq.kv_len += 1
            seq.tokens.append(int(row.argmax()))
    runner.graphs = graphs
