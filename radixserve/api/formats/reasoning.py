"""Reasoning parsers (``--reasoning-parser``, SGLang's and vLLM's names): a model's thinking
separated from its answer, as ``reasoning_content``.

- ``qwen3``: the thinking is what stands between ``<think>`` and ``</think>``; an output with no
  ``<think>`` is all answer (``enable_thinking: false``, whose template closes an empty
  thinking block in the prompt). A ``<tool_call>`` before ``</think>`` ends the thinking too.
- ``deepseek-r1``: the output starts inside the thinking (the template opens it in the prompt),
  so everything before ``</think>`` is thinking, with or without a ``<think>``.

A thinking block cut off by the length limit is all thinking. The text is kept as the model
wrote it (no whitespace trimmed), as SGLang and vLLM do. A parser is a small pure object per
choice: it sees text, never the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixserve.config import REASONING_PARSERS

THINK_START, THINK_END = "<think>", "</think>"


@dataclass(slots=True)
class ReasoningParser:
    """One choice's reasoning: :meth:`parse` a whole output, or :meth:`feed` its deltas and
    :meth:`finish`. Each returns ``(reasoning, content)``.

    States: ``undecided`` until the first text that is not white space (does it open a block?),
    then ``thinking`` until the block ends, then ``answer``."""

    forced: bool  # the output starts inside the thinking, <think> or not (deepseek-r1)
    tool_start: str | None = None  # a tool call's opening also ends the thinking (qwen3)
    state: str = "undecided"
    had_thinking: bool = False
    _held: str = ""  # a stream's tail that may be the start of a tag

    @classmethod
    def create(cls, kind: str) -> ReasoningParser:
        if kind not in REASONING_PARSERS:
            raise ValueError(f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}")
        if kind == "deepseek-r1":
            return cls(forced=True)
        return cls(forced=False, tool_start="<tool_call>")

    def parse(self, text: str) -> tuple[str | None, str]:
        """``(reasoning, content)`` of a whole output; reasoning None when it had none."""
        reasoning, content = self.feed(text, final=True)
        return (reasoning if self.had_thinking else None), content

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """The reasoning and content deltas that ``text`` completes; a possible start of a tag
        at its end is held for the next call, unless ``text`` is the output's last."""
        reasoning, content = self._feed(text)
        if final:
            more_reasoning, more_content = self.finish()
            reasoning, content = reasoning + more_reasoning, content + more_content
        return reasoning, content

    def _feed(self, text: str) -> tuple[str, str]:
        text, self._held = self._held + text, ""
        reasoning = ""
        if self.state == "undecided":
            body = text.lstrip()
            if not body or (THINK_START.startswith(body) and body != THINK_START):
                self._held = text  # not yet known whether a block opens
                return "", ""
            opens = body.startswith(THINK_START)
            if opens:
                text = body[len(THINK_START) :]
            self.state = "thinking" if opens or self.forced else "answer"
            self.had_thinking = self.state == "thinking"
        if self.state == "thinking":
            tags = [t for t in (THINK_END, self.tool_start) if t is not None]
            found = [(text.index(t), t) for t in tags if t in text]
            if not found:
                body, self._held = _split_held(text, tags)
                return body, ""
            at, tag = min(found)
            reasoning = text[:at]
            # </think> is dropped; a tool call's opening belongs to the answer
            text = text[at + len(THINK_END) :] if tag == THINK_END else text[at:]
            self.state = "answer"
        return reasoning, text

    def finish(self) -> tuple[str, str]:
        """What was held back, at the end of the output."""
        held, self._held = self._held, ""
        return (held, "") if self.state == "thinking" else ("", held)


def _split_held(text: str, tags: list[str]) -> tuple[str, str]:
    """``text`` cut before its longest tail that is a proper prefix of one of ``tags``."""
    for k in range(min(len(text), max(map(len, tags)) - 1), 0, -1):
        if any(t.startswith(text[-k:]) for t in tags):
            return text[:-k], text[-k:]
    return text, ""


@dataclass(slots=True)
class ReasoningStream:
    """One streamed choice's text, split as it arrives: every door streams its reasoning
    through this. ``parser`` None: all answer. ``reasoning``/``answer``: everything so far;
    ``held``: thinking not handed out yet (:meth:`take_thinking`)."""

    parser: ReasoningParser | None
    reasoning: str = ""
    answer: str = ""
    held: str = ""

    def feed(self, text: str, final: bool) -> tuple[str, str]:
        """The ``(reasoning, answer)`` deltas of ``text``, the choice's next output."""
        reasoning, answer = ("", text) if self.parser is None else self.parser.feed(text, final)
        self.reasoning += reasoning
        self.answer += answer
        self.held += reasoning
        return reasoning, answer

    @property
    def had_thinking(self) -> bool:
        return self.parser is not None and self.parser.had_thinking

    def take_thinking(self, now: bool, final: bool) -> str:
        """The thinking held so far, once ``now`` or once the block has ended (a client that
        takes the thinking whole); empty otherwise."""
        ended = self.parser is None or self.parser.state != "thinking" or final
        if not (now or ended):
            return ""
        held, self.held = self.held, ""
        return held
