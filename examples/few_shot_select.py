"""Few-shot classification with ``select``, batched, against a running server (``make serve``).

    .venv/bin/python examples/few_shot_select.py [URL]     # default http://127.0.0.1:30000

``select`` never generates: it prefills the shared prompt once, then scores each label with one
prefill on top of it (the label's mean token log-probability). ``run_batch`` runs the reviews in
parallel; the few-shot examples are computed once and then found in the radix cache.
"""

from __future__ import annotations

import sys
from typing import Any

from radixserve.frontend import RuntimeEndpoint, function, select

DEFAULT_URL = "http://127.0.0.1:30000"
LABELS = ["positive", "negative", "neutral", "mixed"]
EXAMPLES = [
    ("I loved every minute of it.", "positive"),
    ("A waste of two hours.", "negative"),
    ("It was fine, nothing special.", "neutral"),
    ("Great actors, terrible plot.", "mixed"),
]
REVIEWS = [
    "An instant classic.",
    "I walked out halfway through.",
    "The music was lovely but the pacing dragged.",
    "It is a film. It has a beginning and an end.",
]


@function
def classify(s: Any, review: str) -> None:
    s += "Classify the sentiment of each movie review.\n\n"
    for text, label in EXAMPLES:
        s += f"Review: {text}\nSentiment: {label}\n\n"
    s += f"Review: {review}\nSentiment: " + select("label", choices=LABELS)


def main(url: str) -> None:
    backend = RuntimeEndpoint(url)
    before = backend.get_stats()
    states = classify.run_batch([{"review": r} for r in REVIEWS], backend=backend)
    after = backend.get_stats()
    for review, state in zip(REVIEWS, states, strict=True):
        scores = state.get_meta_info("label")["scores"]
        ranked = ", ".join(f"{c} {s:.2f}" for c, s in zip(LABELS, scores, strict=True))
        print(f"{state['label']:>9} <- {review!r}  ({ranked})")
    computed = after["num_prefill_tokens"] - before["num_prefill_tokens"]
    cached = after["num_cached_prompt_tokens"] - before["num_cached_prompt_tokens"]
    print(f"prompt tokens computed: {computed}, found in the cache: {cached}")
    backend.shutdown()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_URL)
