"""Drafts from text already seen: prompt lookup against a plain reference, and the tree's draft
index against the tree's own contents (it follows inserts, evictions and namespaces, and stays
within its bound)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from radixserve.radix import RadixCache
from radixserve.radix.kv_events import KVEventRecorder
from radixserve.spec import NgramDrafter, NgramParams, StepCosts, TreeDraftIndex, suffix_match
from radixserve.spec.tree_index import _hash_tail, _hash_windows

pytestmark = pytest.mark.timeout(60)


def naive_suffix_match(tokens: list[int], min_n: int, max_n: int, k: int) -> tuple[list[int], int]:
    """suffix_match's contract written plainly: (draft, match length)."""
    length = len(tokens)
    best, ends = 0, []
    for j in range(length - 1):
        n = 0
        while n < max_n and j - n >= 0 and tokens[j - n] == tokens[length - 1 - n]:
            n += 1
        if n > best:
            best, ends = n, [j]
        elif n == best and n > 0:
            ends.append(j)
    if best < min_n or length < min_n + 1:
        return [], 0
    full = [j for j in ends if j + k <= length - 1]
    j = full[-1] if full else ends[0]
    return tokens[j + 1 : j + 1 + k], best


def test_suffix_match_equals_the_reference() -> None:
    rng = random.Random(0)
    for _ in range(600):
        vocab = rng.choice([2, 3, 5, 50])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        min_n, k = rng.randint(1, 3), rng.randint(1, 8)
        max_n = rng.randint(min_n, 6)
        got = suffix_match(np.asarray(tokens, dtype=np.int32), min_n, max_n, k)
        want, m = naive_suffix_match(tokens, min_n, max_n, k)
        assert (got.tokens.tolist(), got.match_len) == (want, m), (tokens, min_n, max_n, k)


def test_a_loop_drafts_its_next_turn_in_full() -> None:
    tokens = np.asarray([9, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2], dtype=np.int32)
    draft = suffix_match(tokens, 2, 4, 5)
    assert draft.tokens.tolist() == [3, 1, 2, 3, 1] and draft.match_len == 4


def paths(tree: RadixCache, namespace: str | None) -> list[list[int]]:
    """Every root-to-leaf token sequence of ``namespace`` in the tree."""
    out: list[list[int]] = []

    def walk(node, prefix: list[int]) -> None:  # type: ignore[no-untyped-def]
        seq = prefix + node.key.tolist()
        kids = [c for c in node.children.values()]
        if not kids:
            out.append(seq)
        for c in kids:
            walk(c, seq)

    for child in tree.root.children.values():
        if child.extra_key == namespace:
            walk(child, [])
    return out


def best_cached_match(seqs: list[list[int]], query: list[int], max_n: int) -> int:
    best = 0
    for seq in seqs:
        for e in range(len(seq) - 1):
            n = 0
            while n < max_n and e - n >= 0 and n < len(query) and seq[e - n] == query[-1 - n]:
                n += 1
            best = max(best, n)
    return best


def contains(seqs: list[list[int]], run: list[int]) -> bool:
    return any(seq[i : i + len(run)] == run for seq in seqs for i in range(len(seq) - len(run) + 1))


@pytest.mark.parametrize("page_size", [1, 4])
def test_tree_index_follows_the_tree(page_size: int) -> None:
    """Random inserts, evictions and flushes of a real RadixCache with the index observing it
    beside a KV event recorder: every draft continues a match found in the tree's own
    sequences of the request's namespace; without evictions the match is the longest there
    is; the index stays within its bound."""
    rng = random.Random(page_size)
    index = TreeDraftIndex(page_size, min_n=2, max_n=6, capacity=400, max_entries=64)
    tree = RadixCache(page_size, KVEventRecorder(page_size))
    tree.add_observer(index)
    slot = iter(range(1, 10**9))
    evicted = False
    for step in range(300):
        op = rng.random()
        ns = rng.choice([None, "tenant-a", "tenant-b"])
        if op < 0.55:
            base = rng.choice([[1, 2, 3, 4], [5, 6, 7, 8], []])
            key = base + [rng.randrange(12) for _ in range(rng.randrange(1, 24))]
            value = torch.tensor([next(slot) for _ in key], dtype=torch.int64)
            tree.insert(key, value, ns)
        elif op < 0.8:
            tree.evict(rng.randrange(1, 30))
            evicted = True
        elif op < 0.82:
            tree.reset()
            evicted = False
        index.check_integrity()
        assert index.num_tokens <= index.capacity
        query = [rng.randrange(12) for _ in range(rng.randrange(2, 10))]
        draft = index.propose(np.asarray(query, dtype=np.int32), ns, 5)
        seqs = paths(tree, ns)
        if len(draft):
            run = query[-draft.match_len :] + draft.tokens.tolist()
            assert contains(seqs, run), (step, query, draft)
        elif index.num_tokens < index.capacity // 2 and not evicted:
            assert best_cached_match(seqs, query, 6) < 2, (step, query)
        if len(draft) and not evicted and index.num_tokens < index.capacity // 2:
            assert draft.match_len == best_cached_match(seqs, query, 6)


def test_tenant_b_gets_no_draft_from_tenant_a() -> None:
    index = TreeDraftIndex(1, 2, 8, capacity=1000)
    tree = RadixCache(1)
    tree.add_observer(index)
    text = list(range(100, 140))
    tree.insert(text, torch.arange(1, 41), "tenant-a")
    query = np.asarray([7, 7] + text[:10], dtype=np.int32)
    assert index.propose(query, "tenant-a", 4).tokens.tolist() == text[10:14]
    assert len(index.propose(query, "tenant-b", 4)) == 0
    assert len(index.propose(query, None, 4)) == 0
    drafter = NgramDrafter(NgramParams(), index)
    assert len(drafter.draft(query, "tenant-b", 4)) == 0
    assert drafter.draft(query, "tenant-a", 4).source == "tree"
    tree.evict(100)  # the tree lets it go: so does the index
    assert len(index.propose(query, "tenant-a", 4)) == 0 and index.num_tokens == 0


def test_cost_model_drafts_at_batch_one_not_at_a_large_batch() -> None:
    cost = StepCosts.prior(0.14)
    gains = [0.8**j for j in range(1, 8)]
    assert cost.plan([gains], [100])[0] >= 3
    assert cost.plan([gains] * 64, [100] * 64) == [0] * 64
    assert cost.plan([[0.01] * 7], [100]) == [0]


def _brute_force(cost: StepCosts, gains: list[list[float]], contexts: list[int]) -> float:
    """The best tokens per second over every choice of draft lengths (the reference)."""
    import itertools

    bs, context = len(gains), sum(contexts)
    best = bs / cost.decode(bs, context)
    for counts in itertools.product(*(range(len(row) + 1) for row in gains)):
        if sum(counts):
            got = bs + sum(sum(row[:c]) for row, c in zip(gains, counts, strict=True))
            drafted = sum(c * n for c, n in zip(counts, contexts, strict=True))
            best = max(best, got / cost.verify_step(bs, sum(counts), context, drafted))
    return best


def _rate(cost: StepCosts, gains: list[list[float]], contexts: list[int], plan: list[int]) -> float:
    bs, context = len(gains), sum(contexts)
    if not sum(plan):
        return bs / cost.decode(bs, context)
    got = bs + sum(sum(row[:c]) for row, c in zip(gains, plan, strict=True))
    drafted = sum(c * n for c, n in zip(plan, contexts, strict=True))
    return got / cost.verify_step(bs, sum(plan), context, drafted)


def _check_near_the_best(cost: StepCosts, rng: np.random.Generator) -> None:
    """On 1 to 3 requests of random gains and contexts, the plan's tokens per second within 3%
    of the best of every choice, and never below the plain decode's."""
    bs = int(rng.integers(1, 4))
    gains = [sorted(rng.uniform(0, 1, 3).tolist(), reverse=True) for _ in range(bs)]
    contexts = rng.integers(1, 8000, bs).tolist()
    plan = cost.plan(gains, contexts)
    assert _rate(cost, gains, contexts, plan) >= 0.97 * _brute_force(cost, gains, contexts)
    assert _rate(cost, gains, contexts, plan) >= bs / cost.decode(bs, sum(contexts))


def test_measured_costs_plan_near_the_best_choice() -> None:
    """On tables shaped as measured ones are (a flat start, then linear; context costs), the
    plan's tokens per second come within 3% of the best of every choice, and it never picks
    drafts that lose to the plain decode."""
    rng = np.random.default_rng(0)
    for _ in range(60):
        knee = int(rng.integers(1, 64))
        sizes = (1, 2, 4, 8, 16, 32, 64, 128)
        per = float(rng.uniform(0.005, 0.2))
        seconds = tuple(1.0 + per * max(n - knee, 0) + 0.002 * n for n in sizes)
        decode_ctx, verify_ctx, draft_ctx = (float(x) for x in rng.uniform(0, 1e-4, 3))
        verify = tuple(s * 1.05 for s in seconds)
        cost = StepCosts(sizes, seconds, sizes, verify, decode_ctx, verify_ctx, draft_ctx)
        _check_near_the_best(cost, rng)


def test_verify_graphs_plan_near_the_best_choice() -> None:
    """With verify graphs (a verify's time its graph's, whatever it drafts, plus context), the
    plan is within 3% of the best choice too; and at a batch where eager verifies of each
    drafted token would not pay, a graph barely dearer than the decode drafts."""
    rng = np.random.default_rng(1)
    sizes = (1, 2, 4, 8, 16, 32, 64, 128)
    for _ in range(60):
        seconds = tuple(1.0 + float(rng.uniform(0.005, 0.05)) * n for n in sizes)
        graph = tuple(s * float(rng.uniform(1.0, 1.6)) for s in seconds[:5])
        decode_ctx, verify_ctx, draft_ctx = (float(x) for x in rng.uniform(0, 1e-4, 3))
        cost = StepCosts(
            sizes, seconds, sizes, seconds, decode_ctx, verify_ctx, draft_ctx, sizes[:5], graph
        )
        _check_near_the_best(cost, rng)
    steep = tuple(1.0 + n for n in sizes)  # every token computed costs a step
    gains = [[0.9, 0.81, 0.73]] * 16
    eager = StepCosts(sizes, steep, sizes, steep)
    assert eager.plan(gains, [100] * 16) == [0] * 16
    graphs = StepCosts(sizes, steep, sizes, steep, graph_sizes=(8, 16), graph_s=(9.5, 18.0))
    assert graphs.plan(gains, [100] * 16) == [3] * 16
    assert graphs.plan(gains * 2, [100] * 32) == eager.plan(gains * 2, [100] * 32)  # no graph


def test_where_certain_drafts_do_not_pay_no_drafts_do() -> None:
    """``SpecDecoder.may_draft`` skips drafting where the plan for every request's longest
    draft, each token certain, is empty: then the plan for any gains (at most 1) is empty too,
    eager or with graphs."""
    rng = np.random.default_rng(2)
    sizes = (1, 2, 4, 8, 16, 32, 64)
    refused = 0
    for _ in range(300):
        decode = tuple(1.0 + float(rng.uniform(0.01, 0.5)) * n for n in sizes)
        verify = tuple(1.0 + float(rng.uniform(0.01, 0.5)) * n for n in sizes)
        decode_ctx, verify_ctx, draft_ctx = (float(x) for x in rng.uniform(0, 1e-3, 3))
        with_graphs = rng.random() < 0.5
        cost = StepCosts(
            sizes,
            decode,
            sizes,
            verify,
            decode_ctx,
            verify_ctx,
            draft_ctx,
            (8, 16) if with_graphs else (),
            (float(rng.uniform(2, 12)), float(rng.uniform(4, 24))) if with_graphs else (),
        )
        bs = int(rng.integers(1, 17))
        contexts = rng.integers(1, 4000, bs).tolist()
        if any(cost.plan([[1.0] * 7] * bs, contexts)):
            continue
        refused += 1
        gains = [sorted(rng.uniform(0, 1, 7).tolist(), reverse=True) for _ in range(bs)]
        assert not any(cost.plan(gains, contexts))
    assert refused > 30


def test_a_long_context_drafts_less() -> None:
    sizes = (1, 8, 64)
    cost = StepCosts(sizes, (1.0, 1.05, 1.6), sizes, (1.0, 1.05, 1.6), 1e-5, 1e-5, 2e-6)
    gains = [0.6**j for j in range(1, 8)]
    short, long = cost.plan([gains, gains], [100, 20000])
    assert short > long


def test_step_costs_refuse_bad_tables() -> None:
    with pytest.raises(ValueError):
        StepCosts((2, 1), (1.0, 2.0), (1,), (1.0,))
    with pytest.raises(ValueError):
        StepCosts((1,), (0.0,), (1,), (1.0,))


def test_a_lookups_hash_is_the_indexed_windows_hash() -> None:
    """The index hashes its segments' windows with numpy and a lookup's window in Python ints:
    the same uint64 arithmetic, negative ids and ids past 2**31 included."""
    rng = np.random.default_rng(0)
    for _ in range(500):
        n = int(rng.integers(1, 6))
        window = rng.integers(-(2**31), 2**31 - 1, n).astype(np.int32)
        assert _hash_tail(window.tolist()[::-1]) == int(_hash_windows(window, n)[0])
