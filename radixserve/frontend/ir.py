"""The program language's expressions: what ``s += ...`` appends to a state.

An expression is a plain value: building one calls no backend. The state's executor runs it
(``executor.py``). ``a + b`` concatenates expressions, so ``user("Q: " + question)`` and
``assistant(gen("answer"))`` work as in SGLang; a ``str`` anywhere is literal text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

ROLES = ("system", "user", "assistant")
# the regexes of gen_int / gen_string (SGLang's, without their trailing whitespace)
REGEX_INT = r"[-+]?[0-9]+"
REGEX_STR = r'"[^"\\\n]*"'


class Expr:
    """Base of the expressions; ``+`` concatenates."""

    def __add__(self, other: ExprLike) -> Concat:
        return Concat([*_items(self), *_items(to_expr(other))])

    def __radd__(self, other: ExprLike) -> Concat:
        return Concat([*_items(to_expr(other)), *_items(self)])


ExprLike = Expr | str


@dataclass(frozen=True, eq=False)
class Text(Expr):
    """Literal text appended to the state."""

    value: str


@dataclass(frozen=True, eq=False)
class Concat(Expr):
    """Expressions run one after the other."""

    items: list[Expr]


@dataclass(frozen=True, slots=True)
class GenParams:
    """Sampling parameters of one ``gen``; ``None`` leaves the field to the run's defaults, then
    to the backend's (SGLang's names: ``max_tokens`` is sent as ``max_new_tokens``)."""

    max_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    ignore_eos: bool | None = None
    seed: int | None = None
    regex: str | None = None  # structured output (SGLang's names), sent as they are
    json_schema: str | None = None
    lora: str | None = None  # the LoRA adapter's name (sent as the request's lora_path)

    def merged_over(self, defaults: GenParams) -> GenParams:
        """These parameters, with the unset ones taken from ``defaults``."""
        values = {
            f.name: getattr(self, f.name)
            if getattr(self, f.name) is not None
            else getattr(defaults, f.name)
            for f in fields(self)
        }
        return GenParams(**values)

    def to_sampling_params(self) -> dict[str, Any]:
        """The native API's ``sampling_params`` dict (set fields only; ``lora`` is not one)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or f.name == "lora":
                continue
            if f.name == "stop" and isinstance(value, str):
                value = [value]
            out["max_new_tokens" if f.name == "max_tokens" else f.name] = value
        return out


@dataclass(frozen=True, eq=False)
class Gen(Expr):
    """Generate text into variable ``name`` (appended to the state as it is produced)."""

    name: str | None
    params: GenParams = field(default_factory=GenParams)


SelectMethod = str | Callable[[Sequence[float]], float]


@dataclass(frozen=True, eq=False)
class Select(Expr):
    """Append the choice the model scores highest; store it in variable ``name``."""

    name: str | None
    choices: list[str]
    method: SelectMethod = "token_length_normalized"


@dataclass(frozen=True, eq=False)
class RoleBegin(Expr):
    role: str


@dataclass(frozen=True, eq=False)
class RoleEnd(Expr):
    role: str


def to_expr(value: ExprLike) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return Text(value)
    raise TypeError(f"cannot append a {type(value).__name__} to a program state: use a str")


def _items(expr: Expr) -> list[Expr]:
    return list(expr.items) if isinstance(expr, Concat) else [expr]


# ---- constructors (the public language) -------------------------------------------------------


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    stop: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    ignore_eos: bool | None = None,
    *,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    stop_token_ids: list[int] | None = None,
    seed: int | None = None,
    choices: list[str] | None = None,
    regex: str | None = None,
    json_schema: str | dict[str, Any] | None = None,
    lora: str | None = None,
) -> Expr:
    """Generate into ``name``. With ``choices`` it is :func:`select` (SGLang's form). ``regex``
    or ``json_schema`` (a JSON string or a dict) constrain the text (the backend checks them).
    ``lora``: the name of a LoRA adapter the server serves (a run's default like the others)."""
    if choices is not None:
        return select(name, choices)
    if regex is not None and json_schema is not None:
        raise ValueError("give at most one of regex and json_schema")
    if isinstance(json_schema, dict):
        json_schema = json.dumps(json_schema)
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 0):
        raise ValueError(f"max_tokens must be a non-negative integer, got {max_tokens!r}")
    params = GenParams(
        max_tokens=max_tokens,
        stop=stop,
        stop_token_ids=stop_token_ids,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        ignore_eos=ignore_eos,
        seed=seed,
        regex=regex,
        json_schema=json_schema,
        lora=lora,
    )
    return Gen(name, params)


def gen_int(name: str | None = None, max_tokens: int | None = None, **kwargs: Any) -> Expr:
    """Generate an integer's digits (``REGEX_INT``) into ``name``, as text."""
    return gen(name, max_tokens, regex=REGEX_INT, **kwargs)


def gen_string(name: str | None = None, max_tokens: int | None = None, **kwargs: Any) -> Expr:
    """Generate a double-quoted string on one line (``REGEX_STR``) into ``name``."""
    return gen(name, max_tokens, regex=REGEX_STR, **kwargs)


def select(
    name: str | None = None,
    choices: Sequence[str] = (),
    method: SelectMethod = "token_length_normalized",
) -> Select:
    """Pick among ``choices`` by the model's log-probability of each after the current text.

    ``method``: ``"token_length_normalized"`` (mean token logprob, the default), ``"sum"``
    (total logprob: favours short choices), or a callable mapping a choice's token logprobs
    to its score.
    """
    if not choices or any(not isinstance(c, str) or not c for c in choices):
        raise ValueError("select needs a non-empty list of non-empty string choices")
    if isinstance(method, str):
        from radixserve.frontend.select_methods import SELECT_METHODS

        if method not in SELECT_METHODS:
            raise ValueError(f"unknown select method {method!r}; known: {sorted(SELECT_METHODS)}")
    return Select(name, list(choices), method)


def _role(role: str, expr: ExprLike | None) -> Expr:
    if expr is None:
        return Concat([RoleBegin(role), RoleEnd(role)])
    return Concat([RoleBegin(role), *_items(to_expr(expr)), RoleEnd(role)])


def system(expr: ExprLike | None = None) -> Expr:
    """A system message (the model's chat template) holding ``expr``."""
    return _role("system", expr)


def user(expr: ExprLike | None = None) -> Expr:
    """A user message holding ``expr``."""
    return _role("user", expr)


def assistant(expr: ExprLike | None = None) -> Expr:
    """An assistant message holding ``expr`` (typically ``gen(...)``)."""
    return _role("assistant", expr)


def system_begin() -> RoleBegin:
    return RoleBegin("system")


def system_end() -> RoleEnd:
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    return RoleBegin("user")


def user_end() -> RoleEnd:
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    return RoleEnd("assistant")
