"""Sampler: masks against direct per-row computations, seeds, penalties, logprobs, validation."""

from __future__ import annotations

import math

import pytest
import torch

from radixserve.runtime.sampler import TOP_P_WIDTH, Sampler, apply_penalties
from radixserve.runtime.sampling_batch_info import DecodeInfoCache, SamplingBatchInfo
from radixserve.types import Req, SamplingParams

VOCAB = 50


def info_for(
    params: list[SamplingParams], outputs: list[list[int]] | None = None, **kw: object
) -> SamplingBatchInfo:
    outputs = outputs if outputs is not None else [[] for _ in params]
    return SamplingBatchInfo.from_params(params, outputs, VOCAB, **kw)  # type: ignore[arg-type]


def direct_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """One row, the slow obvious way: temperature, top-k, renormalise, top-p, renormalise, min-p."""
    probs = torch.softmax(logits.double() / p.temperature, dim=-1)
    keep = torch.ones(len(logits), dtype=torch.bool)
    if p.top_k != -1:
        kth = sorted(logits.tolist(), reverse=True)[p.top_k - 1]
        keep &= logits >= kth
    probs = torch.where(keep, probs, 0.0)
    probs /= probs.sum()
    if p.top_p < 1.0:
        order = sorted(range(len(probs)), key=lambda i: -probs[i].item())
        mass, kept = 0.0, set()
        for i in order:
            if mass >= p.top_p:
                break
            kept.add(i)
            mass += probs[i].item()
        probs = torch.tensor(
            [probs[i].item() if i in kept else 0.0 for i in range(len(probs))], dtype=torch.float64
        )
        probs /= probs.sum()
    if p.min_p > 0:
        probs = torch.where(probs >= p.min_p * probs.max(), probs, 0.0)
        probs /= probs.sum()
    return probs


CASES = [
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.3, top_k=5),
    SamplingParams(temperature=1.0, top_p=0.6),
    SamplingParams(temperature=0.5, top_k=10, top_p=0.8),
    SamplingParams(temperature=1.0, min_p=0.2),
    SamplingParams(temperature=2.0, top_k=20, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=1.0, top_p=1.0, top_k=-1),
]


@pytest.mark.parametrize(
    "params", CASES, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}"
)
def test_probs_match_direct_computation_row_alone_and_in_a_mixed_batch(
    params: SamplingParams,
) -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(len(CASES), VOCAB, generator=gen) * 3
    sampler = Sampler()
    i = CASES.index(params)
    alone = sampler.probs(logits[i : i + 1], info_for([params]))[0]
    mixed = sampler.probs(logits, info_for(CASES))[i]  # batch mates with other parameters
    expected = direct_probs(logits[i], params).float()
    torch.testing.assert_close(alone, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mixed, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scale", [8.0, 0.01], ids=["peaked", "flat"])
def test_top_p_on_a_large_vocab_partial_search_and_full_sort_fallback(scale: float) -> None:
    """The nucleus is searched among the TOP_P_WIDTH most likely tokens; a flat row's nucleus
    is wider than that and takes the full-sort fallback. Both must equal the direct computation."""
    vocab = 3 * TOP_P_WIDTH
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(5)) * scale
    params = [
        SamplingParams(temperature=1.0, top_p=0.9),
        SamplingParams(temperature=0.8, top_p=0.5, min_p=0.01),
    ]
    probs = Sampler().probs(logits, SamplingBatchInfo.from_params(params, [[], []], vocab))
    kept = [(probs[i] > 0).sum().item() for i in range(2)]
    assert (max(kept) > TOP_P_WIDTH) == (scale < 1)  # the flat case does exercise the fallback
    for i, p in enumerate(params):
        torch.testing.assert_close(
            probs[i], direct_probs(logits[i], p).float(), rtol=1e-4, atol=1e-7
        )


def test_greedy_rows_are_argmax_and_one_hot() -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(2))
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.9, top_k=1),
        SamplingParams(temperature=1.0),
    ]
    info = info_for(params)
    probs = Sampler().probs(logits, info)
    for i in (0, 1):
        assert (
            probs[i].argmax() == logits[i].argmax()
            and probs[i].sum() == 1
            and (probs[i] > 0).sum() == 1
        )
    out = Sampler()(logits, info)
    assert out.next_token_ids[:2].tolist() == logits[:2].argmax(-1).tolist()
    all_greedy = info_for([SamplingParams(temperature=0.0)] * 3)
    assert all_greedy.all_greedy
    assert Sampler()(logits, all_greedy).next_token_ids.tolist() == logits.argmax(-1).tolist()


def test_draws_follow_the_distribution() -> None:
    """Empirical frequencies of 20k unseeded draws from one row are within 5 sigma of probs."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -2.0, -8.0])
    params = SamplingParams(temperature=1.0, top_k=6, top_p=0.95)
    n = 20000
    info = SamplingBatchInfo.from_params([params] * n, [[] for _ in range(n)], 8)
    sampler = Sampler(seed=123)
    probs = sampler.probs(logits.expand(1, 8), SamplingBatchInfo.from_params([params], [[]], 8))[0]
    counts = torch.bincount(sampler(logits.expand(n, 8), info).next_token_ids, minlength=8).double()
    for p, c in zip(probs.tolist(), counts.tolist(), strict=True):
        sigma = math.sqrt(n * p * (1 - p)) + 1e-9
        assert abs(c - n * p) <= 5 * sigma + (0 if p > 0 else 0.5), (p, c)
    assert counts[probs == 0].sum() == 0


def test_seeded_draws_reproduce_independently_of_batch_mates() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, VOCAB, generator=gen)
    seeded = SamplingParams(temperature=1.5, seed=42)
    others = [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8, seed=7),
    ]

    def token(
        batch_logits: torch.Tensor,
        params: list[SamplingParams],
        outputs: list[list[int]],
        row: int,
        seed: int,
    ) -> int:
        return int(Sampler(seed=seed)(batch_logits, info_for(params, outputs)).next_token_ids[row])

    alone = token(logits[:1], [seeded], [[1, 2]], 0, seed=0)
    first = token(logits, [seeded, *others], [[1, 2], [], [5], []], 0, seed=99)
    last = token(
        torch.cat([logits[1:], logits[:1]]), [*others, seeded], [[], [5], [], [9, 9]], 3, seed=5
    )
    assert alone == first == last  # same seed, same step (2 output tokens), different batches
    # the stream moves on with the step: 30 consecutive steps do not all draw the same token
    tokens = {token(logits[:1], [seeded], [[0] * step], 0, seed=0) for step in range(30)}
    assert len(tokens) > 1


def test_penalties_change_logits_exactly_as_defined() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, -3.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    params = [
        SamplingParams(repetition_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.25),
        SamplingParams(frequency_penalty=-0.5),
    ]
    prompts, outputs = [[0, 1], [5]], [[3, 3, 4], [2, 2, 2]]
    info = SamplingBatchInfo.from_params(params, outputs, 6, prompt_ids=prompts)
    out = apply_penalties(logits.clone(), info)
    # row 0: repetition over prompt+output {0, 1, 3, 4}; frequency/presence over output {3: 2, 4: 1}
    r0 = [2.0 / 1.5, -1.0 * 1.5, 0.5, -3.0 * 1.5 - 0.5 * 2 - 0.25, 1.0 / 1.5 - 0.5 - 0.25, 0.0]
    # row 1: frequency only, negative (encourages), over output {2: 3}
    r1 = [1.0, 1.0, 1.0 + 0.5 * 3, 1.0, 1.0, 1.0]
    torch.testing.assert_close(out, torch.tensor([r0, r1]), rtol=0, atol=1e-6)


def test_logit_bias_rows_hold_each_requests_own_bias() -> None:
    params = [
        SamplingParams(logit_bias={0: 5.0, 3: -2.5}),
        SamplingParams(),
        SamplingParams(logit_bias={5: 1.0}),
    ]
    info = SamplingBatchInfo.from_params(params, [[], [], []], 6)
    expected = torch.zeros(3, 6)
    expected[0, 0], expected[0, 3], expected[2, 5] = 5.0, -2.5, 1.0
    assert info.logit_bias is not None
    torch.testing.assert_close(info.logit_bias, expected, rtol=0, atol=0)


def test_greedy_uses_penalised_logits_and_input_is_not_modified() -> None:
    logits = torch.tensor([[3.0, 2.9, 0.0, -1.0]])
    copy = logits.clone()
    info = SamplingBatchInfo.from_params(
        [SamplingParams(temperature=0.0, presence_penalty=1.0)], [[0]], 4
    )
    assert Sampler()(logits, info).next_token_ids.tolist() == [1]
    assert torch.equal(logits, copy)


def test_logprobs_are_log_softmax_of_raw_logits() -> None:
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(3, VOCAB, generator=gen) * 2
    params = [
        SamplingParams(temperature=0.0, repetition_penalty=1.8),
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.0, top_k=3),
    ]
    info = info_for(params, [[1, 2], [], [3]], return_logprob=True, top_logprobs_nums=[2, 0, 5])
    out = Sampler()(logits, info)
    ref = torch.log_softmax(logits, dim=-1)
    assert (
        out.next_token_logprobs is not None
        and out.top_logprobs is not None
        and out.top_logprob_ids is not None
    )
    torch.testing.assert_close(
        out.next_token_logprobs, ref.gather(1, out.next_token_ids.unsqueeze(1)).squeeze(1)
    )
    top = ref.topk(5, dim=-1)
    torch.testing.assert_close(out.top_logprobs, top.values)
    assert torch.equal(out.top_logprob_ids, top.indices)
    assert info.top_logprobs_nums == [2, 0, 5]
    plain = Sampler()(logits, info_for(params))
    assert plain.next_token_logprobs is None and plain.top_logprobs is None


def test_from_reqs_uses_prompt_output_and_logprob_wishes() -> None:
    req = Req(
        "r",
        [4, 5],
        SamplingParams(temperature=0.0, repetition_penalty=2.0),
        return_logprob=True,
        top_logprobs_num=3,
    )
    req.output_ids = [6]
    info = SamplingBatchInfo.from_reqs([req], 10)
    assert info.repetition_mask is not None and info.repetition_mask[
        0
    ].nonzero().flatten().tolist() == [4, 5, 6]
    assert info.return_logprob and info.top_logprobs_nums == [3] and info.steps == [1]


def test_a_decode_batchs_info_is_built_again_only_when_it_changes() -> None:
    """DecodeInfoCache: the same requests in the same order get a copy of the info built for
    them (its tensors shared, its ``steps`` its own); another set or order, or rows whose
    sampling follows their output (a penalty), get a new build, equal to a fresh one."""
    a, b = (Req(r, [4, 5], SamplingParams(temperature=0.7, top_k=3, seed=9)) for r in "ab")
    cache, builds = DecodeInfoCache(), []

    def build(reqs: list[Req]) -> SamplingBatchInfo:
        builds.append(reqs)
        return SamplingBatchInfo.from_reqs(reqs, 10)

    first = cache.get([a, b], lambda: build([a, b]))
    again = cache.get([a, b], lambda: build([a, b]))
    assert len(builds) == 1 and again is not first and again.top_ks is first.top_ks
    again.steps = [7, 8]
    assert first.steps == [0, 0]
    swapped = cache.get([b, a], lambda: build([b, a]))
    assert len(builds) == 2 and swapped.seeds == SamplingBatchInfo.from_reqs([b, a], 10).seeds
    c = Req("c", [4, 5], SamplingParams(frequency_penalty=1.0))
    for _ in range(2):
        cache.get([a, c], lambda: build([a, c]))
    assert len(builds) == 4  # its output counts change every step


@pytest.mark.parametrize(
    "bad",
    [
        dict(temperature=-0.1),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(top_k=0),
        dict(top_k=-2),
        dict(min_p=1.5),
        dict(frequency_penalty=2.5),
        dict(presence_penalty=-3.0),
        dict(repetition_penalty=0.0),
    ],
)
def test_invalid_params_raise_value_error(bad: dict) -> None:
    # validated once, at the edge (the request validator); the batch trusts its params
    with pytest.raises(ValueError):
        SamplingParams(**bad).validate()


def test_negative_top_logprobs_raises() -> None:
    with pytest.raises(ValueError):
        info_for([SamplingParams()], top_logprobs_nums=[-1])
