"""StreamExecutor: runs one program state's expressions, in order, on its own thread.

``s += expr`` only queues; reading (``s["x"]``, ``s.text()``, ``s.fork``) waits for what was
queued before. So a program's own Python runs ahead of the model, and the forks of a state
run in parallel, each on its thread, which the backend batches together. The state's text,
messages and variables are written by the worker thread only and read after a ``sync``.

An operation that fails stores a :class:`ProgramError` naming the program line that queued it;
later operations are skipped, and every read raises it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from radixserve.frontend.backends.base import Backend
from radixserve.frontend.errors import ProgramError, SourceLocation
from radixserve.frontend.ir import Concat, Expr, Gen, GenParams, RoleBegin, RoleEnd, Select, Text
from radixserve.frontend.select_methods import decide


@dataclass(frozen=True, slots=True)
class _Op:
    expr: Expr
    location: SourceLocation | None


_END = None  # queue sentinel: the program is over


class StreamExecutor:
    """The state of one program (or one fork) and the thread that advances it."""

    def __init__(
        self,
        backend: Backend,
        defaults: GenParams,
        stream: bool = False,
        parent: StreamExecutor | None = None,
    ) -> None:
        self.backend = backend
        self.defaults = defaults
        self.chat = backend.chat_template
        self.text: str = parent.text if parent else ""
        self.messages: list[dict[str, str]] = list(parent.messages) if parent else []
        self.variables: dict[str, str] = dict(parent.variables) if parent else {}
        self.meta_info: dict[str, dict[str, Any]] = dict(parent.meta_info) if parent else {}
        self.role: str | None = parent.role if parent else None
        self.role_start: int = parent.role_start if parent else 0
        self.error: BaseException | None = None
        self._children: list[StreamExecutor] = []
        self._queue: queue.Queue[_Op | None] = queue.Queue()
        self._events: queue.Queue[tuple[str | None, str] | None] | None = (
            queue.Queue() if stream else None
        )
        self._ended = False
        self._end_lock = threading.Lock()
        self._thread = threading.Thread(target=self._worker, name="radixserve-program", daemon=True)
        self._thread.start()

    # ---- caller side ---------------------------------------------------------------------------
    def submit(self, expr: Expr, location: SourceLocation | None) -> None:
        if self._ended:
            raise RuntimeError("this program state has finished; it can only be read")
        self._queue.put(_Op(expr, location))

    def sync(self) -> None:
        """Wait for everything queued so far; raise the state's error if it has one."""
        self._queue.join()
        if self.error is not None:
            raise self.error

    def fork(self, n: int) -> list[StreamExecutor]:
        """``n`` states continuing from this one; the shared text is prefilled once first, so
        the branches' requests all find it in the radix cache."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"fork needs a positive number of branches, got {n!r}")
        self.sync()
        if self.text:
            self.backend.cache_prefix(self.text)
        children = [StreamExecutor(self.backend, self.defaults, parent=self) for _ in range(n)]
        self._children.extend(children)
        return children

    def fail(self, exc: BaseException) -> None:
        """Record an error raised by the program's own code (a streamed run's thread)."""
        if self.error is None:
            self.error = exc

    def end(self) -> None:
        """The program is over: finish the queue (and the forks'), stop the threads, close the
        stream. Idempotent; errors stay in ``error``."""
        with self._end_lock:
            if self._ended:
                return
            self._ended = True
        self._queue.put(_END)
        self._thread.join()
        for child in self._children:
            child.end()
            if self.error is None and child.error is not None:
                self.error = child.error
        if self._events is not None:
            self._events.put(None)

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """The text as it is appended (only variable ``var_name``'s, if given), until the
        program ends; then raises the program's error, if any."""
        if self._events is None:
            raise ValueError("run the program with stream=True to iterate over its text")
        while (event := self._events.get()) is not None:
            name, piece = event
            if var_name is None or name == var_name:
                yield piece
        self._events.put(None)  # a later iterator ends at once too
        if self.error is not None:
            raise self.error

    # ---- worker thread ---------------------------------------------------------------------------
    def _worker(self) -> None:
        while True:
            op = self._queue.get()
            try:
                if op is _END:
                    return
                if self.error is None:
                    self._run_op(op)
            finally:
                self._queue.task_done()

    def _run_op(self, op: _Op) -> None:
        leaves = op.expr.items if isinstance(op.expr, Concat) else [op.expr]
        for leaf in leaves:
            try:
                self._execute(leaf)
            except BaseException as exc:  # stored, so no reader ever waits on a dead worker
                self.error = ProgramError(_describe(leaf), op.location, exc)
                self.error.__cause__ = exc
                return

    def _execute(self, expr: Expr) -> None:
        if isinstance(expr, Text):
            self._append(expr.value)
        elif isinstance(expr, Gen):
            self._gen(expr)
        elif isinstance(expr, Select):
            self._select(expr)
        elif isinstance(expr, RoleBegin):
            if self.role is not None:
                raise ValueError(f"a {expr.role} message begins inside the open {self.role} one")
            self._append(self.chat.begin(expr.role))
            self.role, self.role_start = expr.role, len(self.text)
        elif isinstance(expr, RoleEnd):
            if self.role != expr.role:
                raise ValueError(f"{expr.role}_end() closes no open {expr.role} message")
            self.messages.append({"role": expr.role, "content": self.text[self.role_start :]})
            self.role = None
            self._append(self.chat.end(expr.role))
        elif isinstance(expr, Concat):
            for item in expr.items:
                self._execute(item)
        else:
            raise TypeError(f"not a program expression: {expr!r}")

    def _gen(self, expr: Gen) -> None:
        merged = expr.params.merged_over(self.defaults)
        params, lora = merged.to_sampling_params(), merged.lora
        if self._events is None:
            chunk = self.backend.generate(self.text, params, lora)
            self._append(chunk.text)
            value, meta = chunk.text, chunk.meta_info
        else:
            pieces, meta = [], {}
            for chunk in self.backend.generate_stream(self.text, params, lora):
                self._append(chunk.text, expr.name)
                pieces.append(chunk.text)
                meta = chunk.meta_info or meta
            value = "".join(pieces)
        if expr.name is not None:
            self.variables[expr.name] = value
            self.meta_info[expr.name] = meta

    def _select(self, expr: Select) -> None:
        scored = self.backend.score_choices(self.text, expr.choices)
        result = decide(scored, expr.method)
        self._append(result.decision, expr.name)
        if expr.name is not None:
            self.variables[expr.name] = result.decision
            self.meta_info[expr.name] = result.meta_info()

    def _append(self, text: str, var_name: str | None = None) -> None:
        self.text += text
        if self._events is not None and text:
            self._events.put((var_name, text))


def _describe(expr: Expr) -> str:
    if isinstance(expr, Gen):
        return f"gen({expr.name!r})"
    if isinstance(expr, Select):
        return f"select({expr.name!r})"
    if isinstance(expr, (RoleBegin, RoleEnd)):
        return f"{expr.role}_{'begin' if isinstance(expr, RoleBegin) else 'end'}()"
    return type(expr).__name__.lower()
