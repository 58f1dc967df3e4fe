"""The synthetic workloads and the optimal hit rate, without a model."""

from __future__ import annotations

from radixserve.bench.records import RequestRecord, TokenTrie, optimal_hits, summarize
from radixserve.bench.workload import (
    MultiTurnSpec,
    SharedPrefixSpec,
    make_multiturn,
    make_shared_prefix,
)


def _record(
    sid: int, turn: int, prompt: list[int], output: list[int], sent: float
) -> RequestRecord:
    return RequestRecord(sid, turn, prompt, output, sent_s=sent, done_s=sent + 1.0, cached_tokens=0)


def test_trie_match_and_insert() -> None:
    trie = TokenTrie()
    trie.insert([1, 2, 3])
    assert trie.match([1, 2, 3, 4]) == 3
    assert trie.match([1, 5]) == 1
    assert trie.match([7]) == 0


def test_optimal_multiturn_counts_history_but_not_the_last_answer_token() -> None:
    turn0 = _record(0, 0, [1, 2, 3, 4], [10, 11, 12], sent=0.0)
    # turn 1 = turn 0's prompt + answer + new user tokens
    turn1 = _record(0, 1, [1, 2, 3, 4, 10, 11, 12, 20, 21], [13, 14], sent=2.0)
    assert optimal_hits([turn1, turn0]) == [6, 0]  # 4 prompt + 2 answer tokens; 12 has no KV


def test_optimal_caps_at_prompt_len_minus_one() -> None:
    first = _record(0, 0, [1, 2, 3], [4], sent=0.0)
    same = _record(1, 0, [1, 2, 3], [4], sent=1.0)
    assert optimal_hits([first, same]) == [0, 2]


def test_optimal_shared_system_prompt() -> None:
    system = [9, 9, 8, 7]
    records = [_record(i, 0, system + [50 + i, 60 + i], [1, 2], sent=float(i)) for i in range(4)]
    assert optimal_hits(records) == [0, 4, 4, 4]
    summary = summarize("x", records, wall_s=2.0)
    assert summary["optimal_cached_tokens"] == 12
    assert summary["optimal_hit_rate"] == 12 / 24
    assert summary["hit_rate"] == 0.0
    assert summary["requests_per_s"] == 2.0


def test_multiturn_workload_shape_and_determinism() -> None:
    spec = MultiTurnSpec(3, 4, (5, 9), (2, 3), parallel=2, system_len=4, seed=7)
    sessions = make_multiturn(spec, 10, 100)
    assert [len(s.turns) for s in sessions] == [4, 4, 4]
    assert all(s.prefix_ids == sessions[0].prefix_ids and len(s.prefix_ids) == 4 for s in sessions)
    for s in sessions:
        for t in s.turns:
            assert 5 <= len(t.user_ids) <= 9 and 2 <= t.answer_len <= 3
            assert len(t.fallback_answer_ids) == t.answer_len
            assert all(10 <= i < 100 for i in t.user_ids)
    assert make_multiturn(spec, 10, 100) == sessions


def test_shared_prefix_workload_groups_and_arrivals() -> None:
    spec = SharedPrefixSpec(3, 5, system_len=20, question_len=4, output_len=2, request_rate=10.0)
    sessions = make_shared_prefix(spec, 10, 1000)
    assert len(sessions) == 15
    assert len({tuple(s.prefix_ids) for s in sessions}) == 3
    arrivals = [s.arrival_s for s in sessions]
    assert arrivals == sorted(arrivals) and arrivals[-1] > 0
    at_once = make_shared_prefix(SharedPrefixSpec(2, 2, 8, 4, 2), 10, 1000)
    assert all(s.arrival_s == 0.0 for s in at_once)


def test_text_prompts_are_windows_of_real_text_with_the_same_shape(
    checkpoint_tokenizers: dict,
) -> None:
    """``--prompts text``: the trace cut from real text through the real tokenizer has the
    lengths and the sharing of the random one, is seeded, and decodes to the corpus's text."""
    import numpy as np

    from radixserve.models.tiny import corpus_texts

    tok = checkpoint_tokenizers["qwen3"]
    text = "\n".join(corpus_texts(20_000))
    corpus = np.asarray(tok.encode(text, add_special_tokens=False), dtype=np.int64)
    spec = MultiTurnSpec(num_conversations=3, num_turns=2, user_len=(8, 20), system_len=16)
    drawn = make_multiturn(spec, 10, 100, corpus)
    plain = make_multiturn(spec, 10, 100)
    shape = [(len(s.prefix_ids), [(len(t.user_ids), t.answer_len) for t in s.turns]) for s in drawn]
    assert shape == [
        (len(s.prefix_ids), [(len(t.user_ids), t.answer_len) for t in s.turns]) for s in plain
    ]
    assert make_multiturn(spec, 10, 100, corpus) == drawn  # seeded
    assert all(s.prefix_ids == drawn[0].prefix_ids for s in drawn)  # one system prompt
    user = drawn[1].turns[1].user_ids
    assert tok.decode(user) in text + text[: len(text) // 2]  # a window of the text (wrapping)
    shared = make_shared_prefix(SharedPrefixSpec(2, 3, 12, 6, 4), 10, 100, corpus)
    assert {len(s.prefix_ids) for s in shared} == {12} and len(
        {tuple(s.prefix_ids) for s in shared}
    ) == 2
