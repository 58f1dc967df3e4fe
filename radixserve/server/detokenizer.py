"""Detokenizer: token ids to text deltas, correct across multi-byte characters, cut at stop
strings.

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
- :class:`Detokenizer`, which trims at stop strings but never judges them (the scheduler
  does, ``runtime/stop_strings.py``): told ``STOP_STR`` with the matched string, it cuts its
  text at that string's first occurrence; while a request streams, a tail that could still
  become a stop string is held back until it cannot (or the request ends).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from radixserve.runtime.io_struct import ReqOutput
from radixserve.runtime.stop_strings import PROMPT_CONTEXT_TOKENS, decode
from radixserve.server.io_struct import DetokenizeParams, ReqError, TextOutput
from radixserve.types import FinishKind

logger = logging.getLogger(__name__)

REPLACEMENT_CHAR = "\ufffd"


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
        return decode(self.tokenizer, ids, self.skip_special_tokens)


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
    text: str = ""  # final text so far
    sent: int = 0  # characters of ``text`` already emitted


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
                results.append(self._process_or_fail(msg))
            else:
                results.append(msg)
        return results

    def _process_or_fail(self, out: ReqOutput) -> TextOutput | ReqError:
        """A failure decoding one request is that request's error (the HTTP side ends it and
        aborts it in the scheduler); the others are served on."""
        try:
            return self.process(out)
        except Exception as exc:
            logger.error("detokenizing request %s failed: %r", out.rid, exc, exc_info=exc)
            self.reqs.pop(out.rid, None)
            return ReqError(out.rid, f"internal error detokenizing: {exc!r}", status_code=500)

    def register(self, params: DetokenizeParams) -> None:
        context = params.prompt_tail_ids[-PROMPT_CONTEXT_TOKENS:]
        self.reqs[params.rid] = _ReqText(
            decoder=IncrementalDecoder(self.tokenizer, context, params.skip_special_tokens),
            stops=list(params.stop),
        )

    def process(self, out: ReqOutput) -> TextOutput:
        """The text message for ``out``: the text that became final since the last one."""
        state = self.reqs.get(out.rid)
        if state is None:
            self.register(DetokenizeParams(out.rid, [], True, []))
            state = self.reqs[out.rid]
        reason = out.finish_reason
        if reason is not None:
            del self.reqs[out.rid]
        state.text += state.decoder.add(out.new_token_ids, reason is not None)
        if reason is None:
            end = len(state.text) - stop_prefix_len(state.text, state.stops)
        elif reason.kind is FinishKind.STOP_STR and isinstance(reason.matched, str):
            pos = state.text.find(reason.matched)
            end = len(state.text) if pos < 0 else max(pos, state.sent)
        else:
            end = len(state.text)
        delta = state.text[state.sent : end]
        state.sent = max(state.sent, end)
        return TextOutput(out, delta)
