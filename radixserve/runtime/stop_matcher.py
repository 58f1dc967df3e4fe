"""StopMatcher: one request's stop strings as an Aho-Corasick automaton, fed text as it streams.

Checking each stop string against the text after every token costs O(number of stop strings) per
token, so 10,000 stop strings on one request would stall every client. The automaton reads each new
character once, whatever the number of stop strings: a step is one dict lookup, plus failure links
amortised over the text. Building it is linear in the stop strings' total length.

It carries its state between ``feed`` calls, so a stop string split across tokens (or across
detokenizer outputs) is found, and ``held_len`` says how much of the text's end could still
become a stop string (what a streaming client must not be shown yet). Pure Python: no
dependency, and incremental feeding is what the serving loop needs (pyahocorasick searches whole
strings).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StopMatch:
    """A stop string found in the fed text: ``start`` and ``end`` are offsets in everything
    fed so far (``text[start:end] == stop``)."""

    stop: str
    start: int
    end: int


class StopMatcher:
    """Matches ``stops`` (non-empty strings; duplicates are fine) in text fed piece by piece.

    The match reported is the one that *ends* first in the text (the earliest moment a
    streaming judge can stop); among those ending at the same character, the longest (so the
    cut is earliest).
    """

    def __init__(self, stops: Sequence[str]) -> None:
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self.stops = list(dict.fromkeys(stops))
        self._next: list[dict[str, int]] = [{}]
        self._fail: list[int] = [0]
        self._depth: list[int] = [0]
        # the longest stop string ending at a node (itself or through failure links), -1: none
        self._match: list[int] = [-1]
        for i, stop in enumerate(self.stops):
            self._insert(stop, i)
        self._link()
        self._node = 0
        self._fed = 0

    def _insert(self, stop: str, index: int) -> None:
        node = 0
        for ch in stop:
            child = self._next[node].get(ch)
            if child is None:
                child = len(self._next)
                self._next.append({})
                self._fail.append(0)
                self._depth.append(self._depth[node] + 1)
                self._match.append(-1)
                self._next[node][ch] = child
            node = child
        self._match[node] = index

    def _link(self) -> None:
        """Failure links breadth first; a node's match inherits its failure target's when it
        has none of its own (its own is longer: it ends at the same place and starts earlier)."""
        queue = deque(self._next[0].values())
        while queue:
            node = queue.popleft()
            for ch, child in self._next[node].items():
                fail = self._fail[node]
                while fail and ch not in self._next[fail]:
                    fail = self._fail[fail]
                target = self._next[fail].get(ch, 0)
                self._fail[child] = target if target != child else 0
                if self._match[child] < 0:
                    self._match[child] = self._match[self._fail[child]]
                queue.append(child)

    def feed(self, text: str) -> StopMatch | None:
        """Read ``text`` after everything fed so far; the first stop string completed in it,
        or None. After a match the matcher stays where it was (feed nothing more)."""
        node, nxt, fail, match = self._node, self._next, self._fail, self._match
        for offset, ch in enumerate(text):
            while node and ch not in nxt[node]:
                node = fail[node]
            node = nxt[node].get(ch, 0)
            if match[node] >= 0:
                stop = self.stops[match[node]]
                end = self._fed + offset + 1
                self._node, self._fed = node, end
                return StopMatch(stop, end - len(stop), end)
        self._node = node
        self._fed += len(text)
        return None

    @property
    def max_len(self) -> int:
        """The longest stop string's length."""
        return max(self._depth, default=0)

    def first_in(self, text: str) -> StopMatch | None:
        """The stop string that starts first in ``text`` alone (then the one ending first), by
        a fresh scan: one step per character whatever the number of stop strings. The
        streaming state of ``feed`` is untouched. Offsets are into ``text``."""
        node, nxt, fail, match = 0, self._next, self._fail, self._match
        best: StopMatch | None = None
        for end, ch in enumerate(text, 1):
            while node and ch not in nxt[node]:
                node = fail[node]
            node = nxt[node].get(ch, 0)
            if match[node] >= 0:  # the longest stop ending here: the earliest start here
                stop = self.stops[match[node]]
                if best is None or end - len(stop) < best.start:
                    best = StopMatch(stop, end - len(stop), end)
        return best

    @property
    def held_len(self) -> int:
        """The length of the longest end of the fed text that begins some stop string: the
        characters a stream must hold back until it knows whether they complete one."""
        return self._depth[self._node]

    @property
    def num_fed(self) -> int:
        return self._fed
