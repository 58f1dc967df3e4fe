"""``@function``: an LLM program, and how it runs (``run``, ``run_batch``, streaming)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

from radixserve.frontend.backends.base import Backend, get_default_backend
from radixserve.frontend.batch import run_batch
from radixserve.frontend.executor import StreamExecutor
from radixserve.frontend.ir import GenParams
from radixserve.frontend.state import ProgramState


class Program:
    """A function ``f(s, *args, **kwargs)`` over a :class:`ProgramState`.

    ``program.run(...)`` runs it on a fresh state and returns the state; calling the program
    with a state as the first argument runs its body inline on that state (a sub-program).
    """

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        functools.update_wrapper(self, func)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], ProgramState):
            return self.func(*args, **kwargs)
        return self.run(*args, **kwargs)

    def run(
        self,
        *args: Any,
        backend: Backend | None = None,
        stream: bool = False,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        stop: str | list[str] | None = None,
        ignore_eos: bool | None = None,
        seed: int | None = None,
        lora: str | None = None,
        **kwargs: Any,
    ) -> ProgramState:
        """Run the program on a new state. The sampling keywords are defaults for every
        ``gen`` that does not set its own (``lora``: a LoRA adapter's name). Without ``stream`` it returns when the program is
        over and raises its error; with ``stream=True`` it returns at once and the program
        runs on a thread: iterate ``state.text_iter()``, then read the state."""
        defaults = GenParams(
            max_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            stop=stop,
            ignore_eos=ignore_eos,
            seed=seed,
            lora=lora,
        )
        executor = StreamExecutor(backend or get_default_backend(), defaults, stream=stream)
        state = ProgramState(executor)
        if stream:
            thread = threading.Thread(
                target=self._run_streamed,
                args=(state, executor, args, kwargs),
                name=f"radixserve-{self.func.__name__}",
                daemon=True,
            )
            thread.start()
            return state
        try:
            self.func(state, *args, **kwargs)
        finally:
            executor.end()
        state.sync()
        return state

    def run_batch(
        self,
        batch_kwargs: Sequence[dict[str, Any]],
        *,
        num_threads: int | Literal["auto"] = "auto",
        backend: Backend | None = None,
        warmup_prefix: bool = True,
        **sampling: Any,
    ) -> list[ProgramState]:
        """Run the program once per argument dict on a thread pool (``"auto"``: a thread per
        program, at most 64) and return the states in order; ``sampling`` as in ``run``.

        The runs share the backend, so their requests are batched together. With
        ``warmup_prefix`` the first run's first prompt is prefilled before the others start,
        so a prefix they share is computed once (see ``batch.py``). Raises the first failed
        program's error (by position) after all have finished."""
        chosen = backend or get_default_backend()

        def run_one(b: Backend, kwargs: dict[str, Any]) -> ProgramState:
            return self.run(backend=b, **sampling, **kwargs)

        return run_batch(run_one, chosen, batch_kwargs, num_threads, warmup_prefix)

    def _run_streamed(
        self,
        state: ProgramState,
        executor: StreamExecutor,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        try:
            self.func(state, *args, **kwargs)
        except BaseException as exc:  # delivered through text_iter / sync
            executor.fail(exc)
        finally:
            executor.end()


def function(func: Callable[..., Any]) -> Program:
    """Decorate ``def program(s, ...)`` as an LLM program."""
    return Program(func)
