"""StopMatcher against a naive oracle (random stop sets, text fed in random pieces), and a hostile
load: 10,000 distinct 9-character stop strings."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.runtime.stop_matcher import StopMatch, StopMatcher
from radixserve.runtime.stop_strings import find_stop

ALPHABET = "abc"


def oracle(stops: list[str], text: str) -> StopMatch | None:
    """The stop string ending first in ``text`` (the longest of those ending together)."""
    for end in range(1, len(text) + 1):
        ending = [s for s in stops if text[:end].endswith(s)]
        if ending:
            stop = max(ending, key=len)
            return StopMatch(stop, end - len(stop), end)
    return None


def held_oracle(stops: list[str], text: str) -> int:
    return max(
        (
            k
            for k in range(len(text) + 1)
            if any(s.startswith(text[len(text) - k :]) for s in stops)
        ),
        default=0,
    )


def feed_in_pieces(matcher: StopMatcher, text: str, cuts: list[int]) -> StopMatch | None:
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    for a, b in zip(bounds, bounds[1:], strict=False):
        found = matcher.feed(text[a:b])
        if found is not None:
            return found
    return None


@settings(max_examples=300, deadline=None)
@given(
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), min_size=1, max_size=6),
    text=st.text(ALPHABET, max_size=30),
    cuts=st.lists(st.integers(0, 40), max_size=6),
)
def test_matches_like_the_oracle(stops: list[str], text: str, cuts: list[int]) -> None:
    matcher = StopMatcher(stops)
    found = feed_in_pieces(matcher, text, cuts)
    assert found == oracle(stops, text)
    if found is None:
        assert matcher.held_len == held_oracle(stops, text)
        assert matcher.num_fed == len(text)
    else:
        assert text[found.start : found.end] == found.stop


def test_a_stop_split_across_pieces() -> None:
    matcher = StopMatcher(["</answer>", "\n\n"])
    assert matcher.feed("the answer is 4</ans") is None
    assert matcher.held_len == len("</ans")
    assert matcher.feed("wer> and more") == StopMatch("</answer>", 15, 24)


def test_empty_stop_strings_are_refused() -> None:
    with pytest.raises(ValueError):
        StopMatcher(["ok", ""])


def test_ten_thousand_stop_strings_cost_little_per_character() -> None:
    rng = random.Random(15)
    stops = list({"".join(rng.choices("abcdefghij", k=9)) for _ in range(10_000)})
    start = time.perf_counter()
    matcher = StopMatcher(stops)
    built = time.perf_counter() - start
    text = "".join(rng.choices("klmnopqrst", k=20_000))  # shares no character with the stops
    start = time.perf_counter()
    for i in range(0, len(text), 4):  # a few characters per token, as decoding feeds it
        assert matcher.feed(text[i : i + 4]) is None
    fed = time.perf_counter() - start
    # generous bounds for a loaded 2-core host; a per-stop check per token is ~1000x slower
    assert built < 5.0 and fed < 2.0, (built, fed)
    hit = StopMatcher(stops)
    assert hit.feed("zz" + stops[123] + "zz") == StopMatch(stops[123], 2, 11)


@settings(max_examples=300, deadline=None)
@given(
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), min_size=1, max_size=6),
    text=st.text(ALPHABET, max_size=30),
)
def test_first_in_finds_the_earliest_start_like_the_plain_search(
    stops: list[str], text: str
) -> None:
    """The judge's scan: the same cut as ``find_stop`` (the earliest start), one step per
    character; among stops starting there, the one that ends first."""
    found = StopMatcher(stops).first_in(text)
    plain = find_stop(text, stops)
    if plain is None:
        assert found is None
        return
    assert found is not None and found.start == plain[0]
    assert text[found.start : found.end] == found.stop
    assert found.stop == min((s for s in stops if text.startswith(s, plain[0])), key=len)
