"""Speculative decoding end to end: greedy outputs equal decoding without drafts, token for
token, on every tiny family and both CPU attention backends, one request and several, with the
overlap loop on and off; stop conditions, lengths and logprobs inside a draft; the rejected
drafts' KV freed (integrity after every round); the tree's drafts never cross a namespace; and
the rejection sampler keeps the target distribution."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from radixserve import Engine
from radixserve.models.tiny_lora import write_tiny_lora
from radixserve.runtime.sampler import Sampler
from radixserve.runtime.sampling_batch_info import SamplingBatchInfo
from radixserve.runtime.schedule_batch import ScheduleBatch
from radixserve.runtime.spec_verify import accept_drafts
from radixserve.types import SamplingParams

pytestmark = pytest.mark.timeout(240)

GREEDY = {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True}
# beside the greedy requests, a sampled one: sent again, it drafts its earlier answer from the
# tree and departs from it now and then, so verify steps reject drafts too
SAMPLED = {"max_new_tokens": 24, "temperature": 0.8, "top_k": 2, "ignore_eos": True, "seed": 3}


def repetitive_prompts(seed: int) -> list[list[int]]:
    """Prompts ending in tokens they hold earlier (prompt lookup drafts what followed there
    from the first step, which a random model rejects) and one that does not; random tiny
    models loop, so their own output gets drafted and accepted too."""
    rng = random.Random(seed)
    unit = [rng.randrange(5, 1000) for _ in range(12)]
    return [
        unit * 2 + [rng.randrange(5, 1000) for _ in range(4)] + unit[:3],
        [rng.randrange(5, 1000) for _ in range(9)] + unit + [7, 8, 9] + unit[:4],
        [rng.randrange(5, 1000) for _ in range(25)],
    ]


def run(
    model: Path, prompts: list[list[int]], loras: list[str | None] | None = None, **config: Any
) -> Any:
    """The first prompt alone, then all together with a sampled one, twice (the second round
    drafts from the tree too); the KV integrity checked after each. ``loras``: each prompt's
    adapter (the sampled one runs under the first's)."""
    with pinned_engine(model, max_total_tokens=2048, **config) as engine:
        outs = []
        first = loras[0] if loras else None
        every = [*loras, first] if loras else None
        for _ in range(2):
            outs.append(
                [engine.generate(input_ids=prompts[0], sampling_params=GREEDY, lora_path=first)]
            )
            batch, params = [*prompts, prompts[0]], [GREEDY] * len(prompts) + [SAMPLED]
            outs.append(engine.generate(input_ids=batch, sampling_params=params, lora_path=every))
            engine.check_integrity()
        return outs, engine.get_stats()


@contextlib.contextmanager
def pinned_engine(model: Path, **config: Any) -> Iterator[Engine]:
    """A float32 engine on ``model`` (``config``: its keywords) whose cost model is the prior,
    not the one measured at start: which tokens are drafted then depends on the texts alone,
    not on how busy the machine was (outputs never do)."""
    from radixserve.spec import StepCosts

    with Engine(str(model), dtype="float32", **config) as engine:
        scheduler = engine.scheduler  # type: ignore[attr-defined]
        if scheduler.spec.enabled:
            scheduler.spec.cost = StepCosts.prior()
        yield engine


def greedy_ids(outs: Any) -> list[list[list[int]]]:
    return [[o["output_ids"] for o in round_[:3]] for round_ in outs]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("backend", ["torch_native", "cpu_kernel"])
def test_greedy_equals_decoding_without_drafts(
    tiny_model_dirs: dict[str, Path], arch: str, backend: str
) -> None:
    prompts = repetitive_prompts(len(arch))
    overlap_off = backend == "cpu_kernel"  # each family runs once with the overlap loop, once not
    config = dict(attention_backend=backend, disable_overlap_schedule=overlap_off)
    config["page_size"] = 4 if arch in ("qwen3", "mistral") else 1
    plain, _ = run(tiny_model_dirs[arch], prompts, **config)
    spec, stats = run(tiny_model_dirs[arch], prompts, speculative_algorithm="NGRAM", **config)
    assert greedy_ids(spec) == greedy_ids(plain)
    assert stats["num_spec_accepted_tokens"] > 0, stats  # drafts were proposed and kept
    assert stats["num_spec_draft_tokens"] > stats["num_spec_accepted_tokens"], stats  # and cut
    meta = spec[-1][0]["meta_info"]
    assert meta["spec_verify_ct"] > 0 and meta["spec_accepted_tokens"] > 0
    assert stats["avg_spec_accept_length"] > 1.0


def test_ends_and_logprobs_inside_a_draft(tiny_llama_dir: Path) -> None:
    """A stop token, a stop string and max_new_tokens that fall inside an accepted draft end
    the request at the same token as without drafts, with the same logprobs per token."""
    prompts = repetitive_prompts(7)
    base = dict(GREEDY, max_new_tokens=30)
    with Engine(str(tiny_llama_dir), dtype="float32", max_total_tokens=2048) as engine:
        reference = engine.generate(input_ids=prompts, sampling_params=base)
    outputs = [r["output_ids"] for r in reference]
    cases: list[dict[str, Any]] = [dict(base, max_new_tokens=n) for n in (2, 5, 13)]
    cases += [dict(base, stop_token_ids=[o[9]]) for o in outputs]
    cases += [dict(base, stop=[r["text"][len(r["text"]) // 2 :][:3]]) for r in reference]
    results = {}
    for spec in (None, "NGRAM"):
        with pinned_engine(
            tiny_llama_dir, speculative_algorithm=spec, max_total_tokens=2048
        ) as engine:
            got = []
            for params in cases:
                outs = engine.generate(
                    input_ids=prompts,
                    sampling_params=params,
                    return_logprob=True,
                    top_logprobs_num=2,
                )
                got.append(outs)
                engine.check_integrity()
            results[spec] = got
            stats = engine.get_stats()
    assert stats["num_spec_accepted_tokens"] > 0
    for plain_outs, spec_outs in zip(results[None], results["NGRAM"], strict=True):
        for a, b in zip(plain_outs, spec_outs, strict=True):
            assert b["output_ids"] == a["output_ids"]
            assert b["text"] == a["text"]
            assert b["meta_info"]["finish_reason"] == a["meta_info"]["finish_reason"]
            la, lb = (
                a["meta_info"]["output_token_logprobs"],
                b["meta_info"]["output_token_logprobs"],
            )
            assert [x[1] for x in lb] == [x[1] for x in la]
            np.testing.assert_allclose([x[0] for x in lb], [x[0] for x in la], atol=1e-4)
            ta, tb = a["meta_info"]["output_top_logprobs"], b["meta_info"]["output_top_logprobs"]
            assert [[t[1] for t in step] for step in tb] == [[t[1] for t in step] for step in ta]


def test_tenant_b_gets_no_draft_from_tenant_a(tiny_llama_dir: Path) -> None:
    """The engine's tree feeds the drafter's index as it caches: tenant A's request drafts
    from A's cached text, tenant B (another namespace) never does."""
    rng = random.Random(5)
    text = [rng.randrange(5, 1000) for _ in range(48)]
    with Engine(
        str(tiny_llama_dir),
        dtype="float32",
        max_total_tokens=2048,
        speculative_algorithm="NGRAM",
    ) as engine:
        engine.generate(input_ids=text, sampling_params=GREEDY, extra_key="tenant-a")
        drafter = engine.scheduler.spec.drafter
        query = np.asarray([7, 8, 9] + text[10:20], dtype=np.int32)
        assert drafter.draft(query, "tenant-a", 5).tokens.tolist() == text[20:25]
        assert len(drafter.draft(query, "tenant-b", 5)) == 0
        assert len(drafter.draft(query, None, 5)) == 0


class _Verify:
    """What accept_drafts reads of a batch: its drafts."""

    def __init__(self, drafts: list[np.ndarray]) -> None:
        self.drafts = drafts


CHI2_DF4_P1E4 = 23.51  # chi-square critical value, 4 degrees of freedom, p = 1e-4


def chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token of probability 0 was drawn"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=4, top_p=0.9, seed=None),
        SamplingParams(temperature=1.3, min_p=0.05, logit_bias={3: 1.0}),
    ],
)
def test_rejection_sampling_keeps_the_distribution(params: SamplingParams) -> None:
    """Rows of two drafted tokens, drafts chosen where the target is likely and unlikely: the
    first kept token follows p_0 whatever the draft, and after the first draft was accepted the
    second follows p_1 (chi-square over many draws of a 5-token vocabulary)."""
    vocab, n = 5, 12000
    logits0 = torch.tensor([2.0, 0.5, 0.0, -1.0, 1.0])
    logits1 = torch.tensor([-0.5, 1.5, 0.3, 0.8, 0.0])
    sampler = Sampler(seed=1)
    checked = 0
    for d1, d2 in [(0, 1), (3, 2), (4, 4)]:
        logits = torch.stack([logits0, logits1, logits0] * n)  # rows: p_0, p_1, p_2 per request
        drafts = [np.asarray([d1, d2], dtype=np.int32)] * n
        info = SamplingBatchInfo.from_params([params] * 3 * n, [[]] * 3 * n, vocab)
        info.steps = [0, 1, 2] * n
        out = accept_drafts(sampler, logits, _Verify(drafts), info)  # type: ignore[arg-type]
        target = sampler.probs(torch.stack([logits0, logits1]), info_of(params, vocab))
        first = np.bincount([t[0] for t in out.tokens], minlength=vocab)
        assert chi2(first, target[0].numpy()) < CHI2_DF4_P1E4, (d1, first)
        second = np.bincount([t[1] for t in out.tokens if t[0] == d1], minlength=vocab)
        if second.sum() >= 1000:  # a likely first draft: the second token's law is testable
            assert chi2(second, target[1].numpy()) < CHI2_DF4_P1E4, (d1, second)
            checked += 1
    assert checked >= 2


def info_of(params: SamplingParams, vocab: int) -> SamplingBatchInfo:
    return SamplingBatchInfo.from_params([params] * 2, [[]] * 2, vocab)


def test_greedy_rows_accept_exactly_the_argmax() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0], [1.0, 0.0, 0.0]])
    params = SamplingParams(temperature=0.0)
    info = SamplingBatchInfo.from_params([params] * 4, [[]] * 4, 3)
    drafts = [np.asarray([1, 0, 1], dtype=np.int32)]  # argmaxes 1, 0, 2: the third is cut
    out = accept_drafts(Sampler(), logits, _Verify(drafts), info)  # type: ignore[arg-type]
    assert out.tokens == [[1, 0, 2]] and out.num_accepted == [2]
    assert isinstance(ScheduleBatch([]).drafts, list)


def test_tensor_parallel_verify_equals_one_rank(tiny_llama_dir: Path) -> None:
    """tp=2 (two gloo processes) with drafts gives the greedy tokens of tp=1 without: the
    verify forward reaches the other rank as its own kind."""
    prompts = repetitive_prompts(11)
    plain, _ = run(tiny_llama_dir, prompts)
    spec, stats = run(tiny_llama_dir, prompts, speculative_algorithm="NGRAM", tp_size=2)
    assert greedy_ids(spec) == greedy_ids(plain)
    assert stats["num_spec_accepted_tokens"] > 0


def test_lora_requests_draft_under_their_adapter(tmp_path: Path, tiny_llama_dir: Path) -> None:
    """Requests under different LoRA adapters (and the base) in one verify batch give the
    tokens of decoding without drafts."""
    adapters = {
        name: str(write_tiny_lora(tiny_llama_dir, tmp_path / name, r=8, seed=seed))
        for name, seed in (("a", 1), ("b", 2))
    }
    prompts = repetitive_prompts(13)
    loras: list[str | None] = ["a", "b", None]
    config = dict(lora_paths=adapters)
    plain, _ = run(tiny_llama_dir, prompts, loras, **config)
    spec, stats = run(tiny_llama_dir, prompts, loras, speculative_algorithm="NGRAM", **config)
    assert greedy_ids(spec) == greedy_ids(plain)
    assert stats["num_spec_accepted_tokens"] > 0


def test_the_cost_model_is_measured_at_start_on_scratch_space(tiny_llama_dir: Path) -> None:
    """The steps are timed on this machine at start (not the prior), every table grows with
    its size, and the scratch rows and slots are back in the pools before the first request;
    ``speculative_cost_model="prior"`` keeps the prior."""
    from radixserve.spec import StepCosts

    config = dict(dtype="float32", max_total_tokens=2048, max_running_requests=8)
    with Engine(str(tiny_llama_dir), speculative_algorithm="NGRAM", **config) as engine:
        scheduler = engine.scheduler  # type: ignore[attr-defined]
        cost, kv = scheduler.spec.cost, scheduler.kv
        assert cost != StepCosts.prior()
        assert cost.decode_sizes[0] == 1 and cost.verify_sizes[0] == 1
        for seconds in (cost.decode_s, cost.verify_s):
            assert list(seconds) == sorted(seconds) and seconds[0] > 0
        assert kv.allocator.available_size() == kv.capacity
        assert kv.req_to_token_pool.available_size() == kv.req_to_token_pool.size
        engine.check_integrity()
    with Engine(
        str(tiny_llama_dir), speculative_algorithm="NGRAM", speculative_cost_model="prior", **config
    ) as engine:
        assert engine.scheduler.spec.cost == StepCosts.prior()  # type: ignore[attr-defined]


def test_grammars_and_penalties_draft_and_equal_decoding_without_drafts(
    tiny_llama_dir: Path,
) -> None:
    """Requests with a grammar (drafts cut where it refuses; each position masked by its state
    after the drafts before) and with frequency, presence and repetition penalties (each
    position counting the drafts before it) draft, and their greedy outputs equal decoding
    without drafts; a sampled request under a grammar keeps to it."""
    import re

    cases: list[dict[str, Any]] = [
        dict(GREEDY, regex="[ab]{6,40}", max_new_tokens=30),
        dict(GREEDY, regex="(ab|ba|abb){4,20}x?", max_new_tokens=30),
        dict(GREEDY, frequency_penalty=0.3, presence_penalty=0.2),
        dict(GREEDY, repetition_penalty=1.3),
        dict(SAMPLED, regex="[ab]{6,40}", max_new_tokens=30),
    ]
    outs = {}
    for spec in (None, "NGRAM"):
        with pinned_engine(
            tiny_llama_dir, speculative_algorithm=spec, max_total_tokens=4096
        ) as engine:
            prompt = engine.tokenizer.encode("ab ba abba " * 6 + "abba")
            ids = [prompt] * len(cases)
            first = engine.generate(input_ids=ids, sampling_params=cases)
            again = engine.generate(input_ids=ids, sampling_params=cases)  # drafts from the tree
            engine.check_integrity()
            outs[spec] = (first, again, engine.get_stats())
    for plain, drafted in zip(outs[None][:2], outs["NGRAM"][:2], strict=True):
        for i in range(4):
            assert drafted[i]["output_ids"] == plain[i]["output_ids"], i
        for i in (0, 1, 4):
            assert re.fullmatch(cases[i]["regex"], drafted[i]["text"]), drafted[i]["text"]
    again = outs["NGRAM"][1]
    assert all(again[i]["meta_info"].get("spec_verify_ct", 0) > 0 for i in range(4)), [
        (o["meta_info"], o["text"]) for o in again
    ]
    assert outs["NGRAM"][2]["num_spec_accepted_tokens"] > 0


@pytest.mark.parametrize("seed", range(3))
def test_draft_masks_are_the_masks_after_each_drafted_token(tiny_tokenizer: Any, seed: int) -> None:
    """``ReqGrammar.draft_masks`` against a fresh grammar stepped token by token: the same
    count of accepted draft tokens, the same mask at every position, its own state untouched."""
    from radixserve.runtime.grammar import ReqGrammar, create_grammar_backend
    from radixserve.runtime.grammar.bitmask import bitmask_width

    vocab = len(tiny_tokenizer)
    backend = create_grammar_backend(tiny_tokenizer, vocab, [tiny_tokenizer.eos_token_id or 0])
    key = ("regex", "(ab|ba|abb){2,9}(x|yz)[0-9]{1,3}")
    rng = np.random.default_rng(seed)

    def walk(grammar: ReqGrammar, n: int) -> list[int]:
        tokens = []
        for _ in range(n):
            mask = torch.zeros(1, bitmask_width(vocab), dtype=torch.int32)
            grammar.fill_bitmask(mask, 0)
            bits = np.unpackbits(mask.numpy().view(np.uint8), count=vocab, bitorder="little")
            allowed = np.flatnonzero(bits)
            if grammar.is_terminated() or not len(allowed):
                break
            tokens.append(int(rng.choice(allowed)))
            grammar.accept(tokens[-1])
        return tokens

    grammar = ReqGrammar(backend.matcher(backend.compile(key)))
    grammar_output = walk(grammar, 3)
    # a draft: a valid continuation, then (or not) a random token it may refuse
    probe = ReqGrammar(backend.matcher(backend.compile(key)))
    probe.sync_to(grammar_output)
    draft = walk(probe, 6) + [int(rng.integers(vocab))] * int(rng.integers(0, 2))
    before = torch.zeros(1, bitmask_width(vocab), dtype=torch.int32)
    grammar.fill_bitmask(before, 0)
    masks = torch.zeros(len(draft) + 1, bitmask_width(vocab), dtype=torch.int32)
    n = grammar.draft_masks(draft, masks, 0)
    after = torch.zeros_like(before)
    grammar.fill_bitmask(after, 0)
    assert torch.equal(before, after) and grammar.num_accepted == len(grammar_output)
    reference = ReqGrammar(backend.matcher(backend.compile(key)))
    reference.sync_to(grammar_output)
    for j in range(n + 1):
        expected = torch.zeros(1, bitmask_width(vocab), dtype=torch.int32)
        reference.fill_bitmask(expected, 0)
        assert torch.equal(masks[j : j + 1], expected), j
        if j < n:
            reference.accept(draft[j])
    assert n == len(draft) or not reference.matcher.accept_token(draft[n])
