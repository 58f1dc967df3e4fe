"""LLM programs on the tiny model, on both backends: multi-turn chat, few-shot select against a
direct log-probability oracle, fork(3), run_batch over 32 argument sets, streaming."""

from __future__ import annotations

from typing import Any

import pytest

from radixserve.frontend import (
    assistant,
    function,
    gen,
    select,
    system,
    user,
)

GREEDY = {"temperature": 0.0}
LABELS = ["positive", "negative", "neutral", "mixed"]
FEW_SHOT = (
    "Classify the sentiment of each review.\n"
    "Review: I loved every minute of it.\nSentiment: positive\n"
    "Review: A waste of two hours.\nSentiment: negative\n"
    "Review: It was fine, nothing special.\nSentiment: neutral\n"
    "Review: Great actors, terrible plot.\nSentiment: mixed\n"
)


@function
def multi_turn(s: Any, q1: str, q2: str) -> None:
    s += system("You are a helpful assistant.")
    s += user(q1)
    s += assistant(gen("a1", max_tokens=12))
    s += user(q2)
    s += assistant(gen("a2", max_tokens=12))


def test_multi_turn_chat(backend: Any, oracle_engine: Any) -> None:
    state = multi_turn.run(
        q1="What is a radix tree?", q2="Why cache prefixes?", backend=backend, **GREEDY
    )
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[1]["content"] == "What is a radix tree?"
    assert messages[2]["content"] == state["a1"] and messages[4]["content"] == state["a2"]
    # the text is the model's own chat template applied to the conversation
    template = oracle_engine.tokenizer.apply_chat_template(messages, tokenize=False)
    assert state.text() == template
    # turn 1 is exactly what a direct greedy request on the templated prompt generates
    prompt1 = oracle_engine.tokenizer.apply_chat_template(
        messages[:2], tokenize=False, add_generation_prompt=True
    )
    direct = oracle_engine.generate(prompt1, {"max_new_tokens": 12, "temperature": 0})
    assert state["a1"] == direct["text"]
    # turn 2 reuses turn 1's prompt from the radix cache (and the answer as far as the
    # re-tokenized text matches the generated tokens)
    m1, m2 = state.get_meta_info("a1"), state.get_meta_info("a2")
    assert m2["cached_tokens"] >= m1["prompt_tokens"] - 1


def _oracle_choice_logprobs(engine: Any, prefix: str, choice: str) -> list[float]:
    """log P(choice tokens | prefix), computed from scratch (logprob_start_len 0: no cache)."""
    tok = engine.tokenizer
    prefix_ids, full = tok.encode(prefix), tok.encode(prefix + choice)
    boundary = next(
        (i for i, (a, b) in enumerate(zip(prefix_ids, full, strict=False)) if a != b),
        min(len(prefix_ids), len(full)),
    )
    out = engine.generate(
        input_ids=full,
        sampling_params={"max_new_tokens": 0},
        return_logprob=True,
        logprob_start_len=0,
    )
    logprobs = [lp for lp, _, _ in out["meta_info"]["input_token_logprobs"]][1:]  # 1..len-1
    return logprobs[boundary - 1 :]


@function
def classify(s: Any, review: str, method: str = "token_length_normalized") -> None:
    s += FEW_SHOT
    s += "Review: " + review + "\nSentiment: "
    s += select("label", choices=LABELS, method=method)


@pytest.mark.parametrize("method", ["token_length_normalized", "sum"])
def test_few_shot_select_matches_the_logprob_oracle(
    backend: Any, oracle_engine: Any, method: str
) -> None:
    reviews = ["Loved it.", "The sound was awful but the story was moving.", "Meh."]
    states = classify.run_batch([{"review": r, "method": method} for r in reviews], backend=backend)
    for review, state in zip(reviews, states, strict=True):
        prefix = FEW_SHOT + "Review: " + review + "\nSentiment: "
        want = [_oracle_choice_logprobs(oracle_engine, prefix, c) for c in LABELS]
        meta = state.get_meta_info("label")
        for got_lps, want_lps in zip(meta["choice_token_logprobs"], want, strict=True):
            assert got_lps == pytest.approx(want_lps, abs=1e-4)
        scores = [sum(w) / len(w) if method != "sum" else sum(w) for w in want]
        best = max(range(len(scores)), key=lambda i: scores[i])
        assert state["label"] == LABELS[meta["index"]]
        # the decision is the oracle's argmax (a near-tie within float noise may go either way)
        assert scores[meta["index"]] >= scores[best] - 1e-4
        assert state.text().endswith("Sentiment: " + state["label"])


def test_select_over_four_choices_computes_the_prefix_once(backend: Any) -> None:
    long_prefix = "".join(f"Note {i}: the cache keeps prefix {i * 7}.\n" for i in range(24))

    @function
    def pick(s: Any) -> None:
        s += long_prefix + "Answer: "
        s += select("x", choices=["alpha", "beta", "gamma", "delta"])

    assert backend.flush_cache()
    before = backend.get_stats()
    state = pick.run(backend=backend)
    after = backend.get_stats()
    prefix_tokens = len(backend.tokenizer.encode(long_prefix + "Answer: "))
    computed = after["num_prefill_tokens"] - before["num_prefill_tokens"]
    cached = after["num_cached_prompt_tokens"] - before["num_cached_prompt_tokens"]
    meta = state.get_meta_info("x")
    print(
        f"\nselect x4 over a {prefix_tokens}-token prefix: {computed} tokens computed, "
        f"{cached} cached; per choice cached {meta['cached_tokens']}"
    )
    # one prefill of the prefix, then a few tokens per choice; 4 prefills would be 4x
    assert computed <= prefix_tokens + 4 * 8
    assert all(c >= prefix_tokens - 2 for c in meta["cached_tokens"])
    assert cached >= 4 * (prefix_tokens - 2)


@function
def tree_of_thought(s: Any, question: str) -> None:
    s += "Question: " + question + "\n"
    forks = s.fork(3)
    for i, branch in enumerate(forks):
        branch += f"Approach {i + 1}: " + gen("thought", max_tokens=6, temperature=0.8, seed=i)
        branch += "\nIs this approach sound? " + select("verdict", choices=["yes", "no"])
    forks.join()
    for i, branch in enumerate(forks):
        s += f"Approach {i + 1}: " + branch["thought"] + " (" + branch["verdict"] + ")\n"
    s += "Best answer: " + gen("answer", max_tokens=6)


def test_tree_of_thought_fork3(backend: Any) -> None:
    state = tree_of_thought.run(question="How many primes are below 20?", backend=backend, **GREEDY)
    text = state.text()
    assert text.startswith("Question: How many primes are below 20?\nApproach 1: ")
    assert "Best answer: " + state["answer"] in text
    assert "thought" not in state  # a branch's variables stay in the branch
    # every branch started from the parent's prefix, prefilled once before the fork
    for i in range(3):
        assert f"Approach {i + 1}: " in text


def test_fork_branches_share_the_cached_prefix(backend: Any) -> None:
    question = "Explain in detail why the radix tree shares prefixes across requests. " * 4
    branch_meta: list[dict[str, Any]] = []

    @function
    def branches(s: Any) -> None:
        s += "Question: " + question + "\n"
        forks = s.fork(3)
        for i, branch in enumerate(forks):
            branch += f"Branch {i}: " + gen("t", max_tokens=4)
        branch_meta.extend(branch.get_meta_info("t") for branch in forks.join())

    branches.run(backend=backend, **GREEDY)
    prefix_tokens = len(backend.tokenizer.encode("Question: " + question + "\n"))
    # the prefix was prefilled once at the fork; every branch request found it in the cache
    assert all(m["cached_tokens"] >= prefix_tokens - 1 for m in branch_meta)


LONG_SYSTEM = "".join(
    f"Rule {i}: answer questions about topic {i} politely, briefly and with citations.\n"
    for i in range(30)
)


@function
def support_bot(s: Any, question: str) -> None:
    s += system(LONG_SYSTEM)
    s += user(question)
    s += assistant(gen("answer", max_tokens=4))


def test_run_batch_32_computes_the_shared_system_prompt_once(backend: Any) -> None:
    args = [{"question": f"Question number {i}: what is topic {i}?"} for i in range(32)]
    assert backend.flush_cache()
    before = backend.get_stats()
    states = support_bot.run_batch(args, backend=backend, **GREEDY)
    after = backend.get_stats()
    assert [s.messages()[1]["content"] for s in states] == [a["question"] for a in args]
    system_tokens = len(
        backend.tokenizer.encode(backend.chat_template.begin("system") + LONG_SYSTEM)
    )
    computed = after["num_prefill_tokens"] - before["num_prefill_tokens"]
    cached = after["num_cached_prompt_tokens"] - before["num_cached_prompt_tokens"]
    per_request = [s.get_meta_info("answer")["cached_tokens"] for s in states]
    prompt_tokens = sum(s.get_meta_info("answer")["prompt_tokens"] for s in states)
    print(
        f"\nrun_batch(32), {system_tokens}-token system prompt: {computed} prompt tokens "
        f"computed, {cached} cached of {prompt_tokens} requested; per-request cached "
        f"min {min(per_request)} max {max(per_request)}"
    )
    assert all(c >= system_tokens - 1 for c in per_request)
    assert computed < 2 * system_tokens + 32 * 30  # the system prompt once, not 32 times
    assert cached >= 32 * (system_tokens - 1)


def test_streaming_a_gen(backend: Any) -> None:
    whole = multi_turn.run(q1="Stream this.", q2="And this.", backend=backend, **GREEDY)
    state = multi_turn.run(
        q1="Stream this.", q2="And this.", backend=backend, stream=True, **GREEDY
    )
    pieces = list(state.text_iter("a2"))
    assert len(pieces) > 1
    assert "".join(pieces) == state["a2"] == whole["a2"]
    everything = multi_turn.run(
        q1="Stream this.", q2="And this.", backend=backend, stream=True, **GREEDY
    )
    assert "".join(everything.text_iter()) == everything.text() == whole.text()
