"""Errors of the frontend, and the user's source location they carry.

A program's operations run on the state's executor thread, so a raw traceback would point into
the frontend. Each ``s += expr`` records where in the user's code it was written; a failure is
re-raised as :class:`ProgramError` naming that line, with the original exception as its cause.
"""

from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass

_FRONTEND_DIR = os.path.dirname(os.path.abspath(__file__))


class BackendError(RuntimeError):
    """The backend failed: an HTTP error status, an unreachable server, a timeout, a dead
    engine. The message says which."""


@dataclass(frozen=True, slots=True)
class SourceLocation:
    filename: str
    lineno: int
    function: str

    @property
    def line(self) -> str:
        return linecache.getline(self.filename, self.lineno).strip()

    def __str__(self) -> str:
        text = f'File "{self.filename}", line {self.lineno}, in {self.function}'
        return f"{text}: {self.line}" if self.line else text


class ProgramError(RuntimeError):
    """An operation of an LLM program failed; ``location`` is the program line that added it."""

    def __init__(self, what: str, location: SourceLocation | None, cause: BaseException) -> None:
        where = f"\n  at {location}" if location is not None else ""
        super().__init__(f"{what} failed{where}\n  {type(cause).__name__}: {cause}")
        self.what = what
        self.location = location
        self.cause = cause


def user_location() -> SourceLocation | None:
    """The innermost caller frame outside this package (the program line being run)."""
    frame = sys._getframe(1)
    while frame is not None and _is_frontend(frame.f_code.co_filename):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return None
    return SourceLocation(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


def _is_frontend(filename: str) -> bool:
    path = os.path.abspath(filename)
    return path.startswith(_FRONTEND_DIR + os.sep)
