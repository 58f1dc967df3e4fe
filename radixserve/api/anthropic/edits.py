"""``context_management``: the edits of Anthropic's context-editing beta, as typed bodies (a
malformed edit, or one of a type not here, is a 400 naming it). What each does is in
``api/anthropic/clearing.py`` (the two clearing edits) and ``api/summary.py`` (compaction).

- ``clear_thinking_20251015``: the thinking of all but the last ``keep`` assistant turns
  (``{"type": "thinking_turns", "value": N}``, 1 unless given; ``"all"`` keeps every turn's);
- ``clear_tool_uses_20250919``: past its ``trigger`` (``input_tokens``, 100,000 unless given,
  or a number of ``tool_uses``), the results of all but the last ``keep`` tool uses (3);
  ``exclude_tools`` are never cleared, ``clear_tool_inputs`` (true, or tool names) clears the
  calls' inputs too, and nothing is cleared unless ``clear_at_least`` input tokens would be;
- ``compact_20260112``: past its ``trigger`` (150,000 input tokens), the conversation is
  summarized first.

As Anthropic's, ``clear_thinking_20251015`` comes first when it is given with others.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
COMPACT = "compact_20260112"
DEFAULT_CLEAR_TRIGGER = 100_000  # input tokens: Anthropic's default for clearing tool uses
DEFAULT_COMPACT_TRIGGER = 150_000  # and for compaction


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputTokens(_Strict):
    type: Literal["input_tokens"]
    value: int = Field(ge=1)


class ToolUses(_Strict):
    type: Literal["tool_uses"]
    value: int = Field(ge=0)


class AtLeast(_Strict):
    type: Literal["input_tokens"]
    value: int = Field(ge=0)


class ThinkingTurns(_Strict):
    type: Literal["thinking_turns"]
    value: int = Field(ge=0)


class AllTurns(_Strict):
    type: Literal["all"]


class ClearToolUses(_Strict):
    type: Literal["clear_tool_uses_20250919"]
    trigger: InputTokens | ToolUses = InputTokens(type="input_tokens", value=DEFAULT_CLEAR_TRIGGER)
    keep: ToolUses = ToolUses(type="tool_uses", value=3)
    clear_at_least: AtLeast | None = None
    exclude_tools: list[str] | None = None
    clear_tool_inputs: bool | list[str] | None = None

    def triggered(self, prompt_tokens: int, tool_uses: int) -> bool:
        """Whether the conversation is past the trigger."""
        if isinstance(self.trigger, InputTokens):
            return prompt_tokens > self.trigger.value
        return tool_uses > self.trigger.value

    def clears_input(self, tool: str) -> bool:
        inputs = self.clear_tool_inputs
        return inputs is True or (isinstance(inputs, list) and tool in inputs)


class ClearThinking(_Strict):
    type: Literal["clear_thinking_20251015"]
    keep: ThinkingTurns | AllTurns | Literal["all"] = ThinkingTurns(type="thinking_turns", value=1)

    def turns_kept(self) -> int | None:
        """How many of the last assistant turns keep their thinking (None: every one)."""
        return self.keep.value if isinstance(self.keep, ThinkingTurns) else None


class Compact(_Strict):
    type: Literal["compact_20260112"]
    trigger: InputTokens | None = None
    instructions: str | None = None
    pause_after_compaction: bool = False

    def threshold(self) -> int:
        return self.trigger.value if self.trigger is not None else DEFAULT_COMPACT_TRIGGER


Edit = Annotated[ClearToolUses | ClearThinking | Compact, Field(discriminator="type")]
Clearing = ClearToolUses | ClearThinking


class ContextManagement(_Strict):
    edits: list[Edit] = Field(default_factory=list)

    @model_validator(mode="after")
    def _thinking_first(self) -> ContextManagement:
        kinds = [edit.type for edit in self.edits]
        if CLEAR_THINKING in kinds[1:]:
            raise ValueError(f"{CLEAR_THINKING} must be the first of context_management's edits")
        for kind in set(kinds):
            if kinds.count(kind) > 1:
                raise ValueError(f"context_management gives the {kind} edit more than once")
        return self

    def clearing(self) -> list[Clearing]:
        """The clearing edits, in their order."""
        return [edit for edit in self.edits if not isinstance(edit, Compact)]

    def compact(self) -> Compact | None:
        found = [edit for edit in self.edits if isinstance(edit, Compact)]
        return found[0] if found else None
