"""ProgramState: what an ``@function`` program receives as ``s`` and what ``run`` returns."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from radixserve.frontend.errors import ProgramError, user_location
from radixserve.frontend.executor import StreamExecutor
from radixserve.frontend.ir import ExprLike, to_expr


class ProgramState:
    """``s += "text" | gen(...) | select(...) | user(...)``; ``s["name"]`` reads a variable.

    Appending returns at once (the executor runs it in order); every read waits for what was
    appended before and raises the program's error, if an operation failed.
    """

    def __init__(self, executor: StreamExecutor) -> None:
        self._executor = executor

    def __iadd__(self, other: ExprLike) -> ProgramState:
        self._executor.submit(to_expr(other), user_location())
        return self

    def __getitem__(self, name: str) -> str:
        self._executor.sync()
        try:
            return self._executor.variables[name]
        except KeyError:
            known = sorted(self._executor.variables)
            raise KeyError(f"no variable {name!r} in this state (it has {known})") from None

    def __contains__(self, name: str) -> bool:
        self._executor.sync()
        return name in self._executor.variables

    def get_meta_info(self, name: str) -> dict[str, Any]:
        """The backend's ``meta_info`` of the ``gen`` (``prompt_tokens``, ``cached_tokens``,
        ``finish_reason``...) or ``select`` (``scores``, per-choice token logprobs) ``name``."""
        self._executor.sync()
        return self._executor.meta_info[name]

    def variables(self) -> dict[str, str]:
        self._executor.sync()
        return dict(self._executor.variables)

    def text(self) -> str:
        """All the text so far: role markers, literal text and generated text."""
        self._executor.sync()
        return self._executor.text

    def messages(self) -> list[dict[str, str]]:
        """The closed role messages as ``{"role", "content"}`` dicts (content without markers)."""
        self._executor.sync()
        return [dict(m) for m in self._executor.messages]

    def sync(self) -> None:
        """Wait for what was appended; raise the program's error, if any."""
        self._executor.sync()

    def error(self) -> BaseException | None:
        """The error that stopped the program, or None (does not wait)."""
        return self._executor.error

    def fork(self, n: int) -> ForkGroup:
        """``n`` states continuing from this text, run in parallel; join their results back
        with ``forks.join()`` / ``s += forks[i]["name"]``."""
        location = user_location()
        try:
            children = self._executor.fork(n)
        except ProgramError:
            raise
        except Exception as exc:
            raise ProgramError(f"fork({n})", location, exc) from exc
        return ForkGroup(ProgramState(c) for c in children)

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Stream a ``run(..., stream=True)``: text pieces as they are appended (only those of
        variable ``var_name`` if given), until the program ends."""
        return self._executor.text_iter(var_name)

    def __repr__(self) -> str:
        return f"ProgramState({self._executor.text[-60:]!r})"


class ForkGroup(list[ProgramState]):
    """The states of one ``fork``: a list, plus ``join`` and ``values``."""

    def join(self) -> ForkGroup:
        """Wait for every branch; raise the first branch error."""
        for state in self:
            state.sync()
        return self

    def values(self, name: str) -> list[str]:
        """Variable ``name`` of every branch, in order (waits for them)."""
        return [state[name] for state in self]
