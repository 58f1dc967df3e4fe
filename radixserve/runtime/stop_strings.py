"""Stop strings, judged once, by the scheduler (which holds the tokenizer).

The text a request's stop strings are matched in is the text the client sees: its output
tokens decoded with ``skip_special_tokens`` as asked, after the last ``PROMPT_CONTEXT_TOKENS``
prompt tokens (the detokenizer decodes the same context, so a SentencePiece leading space
reads the same on both sides). The detokenizer never judges: told ``STOP_STR`` with the
matched string, it cuts its text at that string's first occurrence.

Cost per token: a stop string completed by the newest token ends inside that token's text and
starts at most ``len(stop) - 1`` characters before it, so only a tail of the output is decoded
(and only its last ``len(newest) + longest stop`` characters scanned):
enough tokens that the text before the newest token holds the longest stop string plus an edge
margin (the tail may start inside a multi-byte character, which decodes to up to 3 U+FFFD).
Most tokens show at least one character; when they do not (skipped special tokens), the tail
doubles until it is long enough or reaches the start of the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from radixserve.runtime.stop_matcher import StopMatcher

PROMPT_CONTEXT_TOKENS = 5  # prompt tokens decoded as context before the output (SGLang: 5)
EDGE_MARGIN_CHARS = 4  # U+FFFD of a character cut at the tail's start, plus one


def find_stop(text: str, stops: list[str], start: int = 0) -> tuple[int, str] | None:
    """The earliest match of any stop string in ``text[start:]``: (position, stop) or None.

    The plain reference (stops x length per call) that ``StopMatcher.first_in`` is tested
    against; the judge uses the automaton."""
    best: tuple[int, str] | None = None
    for stop in stops:
        pos = text.find(stop, start)
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, stop)
    return best


def match_stop_str(
    tokenizer: Any,
    prompt_ids: Sequence[int],
    output_ids: list[int],
    stops: StopMatcher | list[str],
    skip_special_tokens: bool = True,
) -> str | None:
    """The stop string that the text of ``output_ids`` now contains (checked after every new
    token, so the match ends in the last token's text), or None. When several match, the one
    that starts first (the detokenizer cuts there). ``stops``: the request's automaton (built
    once per request by the caller; a list is compiled here)."""
    if not stops or not output_ids:
        return None
    matcher = stops if isinstance(stops, StopMatcher) else StopMatcher(stops)
    need = matcher.max_len + EDGE_MARGIN_CHARS
    newest = decode(tokenizer, output_ids[-1:], skip_special_tokens)
    n = len(output_ids)
    num = min(n, need)
    while num < n:
        text = decode(tokenizer, output_ids[n - num :], skip_special_tokens)
        if len(text) - len(newest) >= need:
            break
        num = min(n, 2 * num)
    else:
        text = output_text(tokenizer, prompt_ids, output_ids, skip_special_tokens)
    # a match ends in the newest token's text (an earlier one ended the request before), so
    # it starts within the last len(newest) + longest stop characters: scan only those
    hit = matcher.first_in(text[max(0, len(text) - len(newest) - need) :])
    return None if hit is None else hit.stop


def output_text(
    tokenizer: Any, prompt_ids: Sequence[int], output_ids: list[int], skip_special_tokens: bool
) -> str:
    """The whole text of ``output_ids``, decoded after the prompt's context tokens."""
    context = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:])
    prefix = decode(tokenizer, context, skip_special_tokens)
    return decode(tokenizer, context + output_ids, skip_special_tokens)[len(prefix) :]


def decode(tokenizer: Any, ids: list[int], skip_special_tokens: bool) -> str:
    if not ids:
        return ""
    return str(
        tokenizer.decode(
            ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )
    )
