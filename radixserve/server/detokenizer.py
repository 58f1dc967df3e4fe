"""Detokenizer: token ids to text deltas, correct across multi-byte characters; stop strings.

Two pieces, both pure (no sockets; the process loop is ``detokenizer_process``):

- :class:`IncrementalDecoder`, the read-offset scheme of vLLM and SGLang. Per request it keeps
  ``ids`` and two offsets::

      [0, prefix_offset)             text already emitted, no longer decoded
      [prefix_offset, read_offset)   context: decoded again so the next piece joins correctly
                                     (byte-level merges, SentencePiece's leading spaces)
      [read_offset, len(ids))        tokens whose text is not emitted yet

  Each step decodes ``ids[prefix_offset:]`` and emits what it adds to ``ids[prefix_offset:
  read_offset]``, unless it ends in U+FFFD (an incomplete UTF-8 sequence: a later token
  completes it); then the tokens wait. The last step of a request flushes whatever is left.
- :class:`Detokenizer`, which adds per-request stop strings: a matched stop string and
  everything after it is trimmed, and a tail that could still become a stop string is held
  back until it cannot (or the request ends).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from radixserve.runtime.io_struct import ReqOutput
from radixserve.server.io_struct import DetokenizeParams, TextOutput
from radixserve.types import FinishKind, FinishReason

REPLACEMENT_CHAR = "\ufffd"
INIT_CONTEXT_TOKENS = 5  # prompt tokens decoded as context before the first output (SGLang: 5)


class IncrementalDecoder:
    """Text of a growing token sequence, emitted piece by piece and only when final."""

    def __init__(
        self, tokenizer: Any, context_ids: list[int], skip_special_tokens: bool = True
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids = list(context_ids)
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def add(self, new_ids: list[int], final: bool = False) -> str:
        """Append ``new_ids``; return the text that became final (``final``: flush everything)."""
        self.ids.extend(new_ids)
        if len(self.ids) == self.read_offset:
            return ""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset :])
        if len(full_text) <= len(prefix_text):
            return ""  # e.g. skipped special tokens: nothing visible yet
        if full_text.endswith(REPLACEMENT_CHAR) and not final:
            return ""  # an incomplete character: wait for the bytes that complete it
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return full_text[len(prefix_text) :]

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return str(
            self.tokenizer.decode(
                ids,
                skip_special_tokens=self.skip_special_tokens,
                clean_up_tokenization_spaces=False,
            )
        )


def find_stop(text: str, stops: list[str], start: int = 0) -> tuple[int, str] | None:
    """The earliest match of any stop string in ``text[start:]``: (position, stop) or None."""
    best: tuple[int, str] | None = None
    for stop in stops:
        pos = text.find(stop, start)
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, stop)
    return best


def stop_prefix_len(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string: the
    characters to hold back, since the next tokens may complete the stop string."""
    longest = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:k]):
                longest = k
                break
    return longest


@dataclass(slots=True)
class _ReqText:
    decoder: IncrementalDecoder
    stops: list[str]
    max_stop_len: int
    text: str = ""  # final text so far, cut at a matched stop string
    sent: int = 0  # characters of ``text`` already emitted
    matched: str | None = None
    stopped_early: bool = False  # matched before the scheduler finished: drop what comes next


class Detokenizer:
    """Turns the scheduler's messages into text messages for the HTTP process.

    Contract: a request's :class:`DetokenizeParams` comes before its first :class:`ReqOutput`
    (a ReqOutput of an unknown rid is decoded with no stop strings and no prompt context);
    its state is dropped at its last output (``finish_reason`` set). Other messages pass
    through unchanged and in order.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.reqs: dict[str, _ReqText] = {}

    def handle(self, msgs: list[object]) -> list[object]:
        results: list[object] = []
        for msg in msgs:
            if isinstance(msg, DetokenizeParams):
                self.register(msg)
            elif isinstance(msg, ReqOutput):
                out = self.process(msg)
                if out is not None:
                    results.append(out)
            else:
                results.append(msg)
        return results

    def register(self, params: DetokenizeParams) -> None:
        context = params.prompt_tail_ids[-INIT_CONTEXT_TOKENS:]
        self.reqs[params.rid] = _ReqText(
            decoder=IncrementalDecoder(self.tokenizer, context, params.skip_special_tokens),
            stops=list(params.stop),
            max_stop_len=max((len(s) for s in params.stop), default=0),
        )

    def process(self, out: ReqOutput) -> TextOutput | None:
        """The text message for ``out``, or None when the request was already stopped here."""
        state = self.reqs.get(out.rid)
        if state is None:
            self.register(DetokenizeParams(out.rid, [], True, []))
            state = self.reqs[out.rid]
        final = out.finish_reason is not None
        if final:
            del self.reqs[out.rid]
        if state.stopped_early:
            return None
        old_len = len(state.text)
        state.text += state.decoder.add(out.new_token_ids, final)
        if state.stops and state.matched is None:
            hit = find_stop(state.text, state.stops, max(0, old_len - state.max_stop_len + 1))
            if hit is not None:
                state.text, state.matched = state.text[: hit[0]], hit[1]
        if final or state.matched is not None:
            end = len(state.text)
        else:
            end = len(state.text) - stop_prefix_len(state.text, state.stops)
        delta = state.text[state.sent : end]
        state.sent = max(state.sent, end)
        if state.matched is None:
            return TextOutput(out, delta)
        if final:
            if out.finish_reason is not None and out.finish_reason.kind is not FinishKind.ABORT:
                out = dataclasses.replace(
                    out, finish_reason=FinishReason(FinishKind.STOP_STR, state.matched)
                )
            return TextOutput(out, delta)
        state.stopped_early = True
        stopped = dataclasses.replace(
            out, finish_reason=FinishReason(FinishKind.STOP_STR, state.matched)
        )
        return TextOutput(stopped, delta, stopped_early=True)
