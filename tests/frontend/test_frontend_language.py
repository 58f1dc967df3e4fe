"""The language without a model: expressions, ordering, roles, fork/join, select's decision,
run_batch, streaming and error locations, on a scripted backend."""

from __future__ import annotations

import inspect
import subprocess
import sys
from typing import Any

import pytest
from frontend_fakes import FakeBackend

from radixserve.frontend import (
    ChatTemplate,
    ProgramError,
    assistant,
    assistant_begin,
    assistant_end,
    function,
    gen,
    select,
    set_default_backend,
    system,
    user,
)
from radixserve.frontend.ir import Concat, Gen, RoleBegin, RoleEnd, Text
from radixserve.frontend.select_methods import ChoiceLogprobs, decide


def test_import_loads_neither_torch_nor_the_runtime() -> None:
    code = (
        "import sys, radixserve.frontend\n"
        "bad = [m for m in ('torch', 'radixserve.runtime', 'radixserve.server', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_expressions_concatenate_and_roles_wrap() -> None:
    expr = "Q: " + gen("a", max_tokens=3) + "!"
    assert isinstance(expr, Concat)
    assert [type(e) for e in expr.items] == [Text, Gen, Text]
    wrapped = user("hi " + gen("x"))
    assert isinstance(wrapped, Concat)
    assert [type(e) for e in wrapped.items] == [RoleBegin, Text, Gen, RoleEnd]
    params = gen("a", max_tokens=3, stop="\n", temperature=0.0).params  # type: ignore[attr-defined]
    assert params.to_sampling_params() == {"max_new_tokens": 3, "stop": ["\n"], "temperature": 0.0}


@pytest.mark.parametrize(
    "call",
    [
        lambda: select("x", choices=[]),
        lambda: select("x", choices=["a", ""]),
        lambda: select("x", choices=["a"], method="nope"),
        lambda: gen("x", max_tokens=-1),
    ],
)
def test_bad_arguments_are_rejected_when_written(call: Any) -> None:
    with pytest.raises(ValueError):
        call()


def test_text_roles_messages_and_defaults() -> None:
    fake = FakeBackend(replies=["Paris."])

    @function
    def chat(s: Any, question: str) -> None:
        s += system("Be brief.")
        s += user(question)
        s += assistant(gen("answer", max_tokens=5))

    state = chat.run(question="Capital of France?", backend=fake, temperature=0.0)
    assert state["answer"] == "Paris."
    assert state.messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ]
    assert state.text() == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nCapital of France?<|im_end|>\n"
        "<|im_start|>assistant\nParis.<|im_end|>\n"
    )
    (kind, prompt, params) = fake.calls[0]
    assert prompt.endswith("<|im_start|>assistant\n")
    assert params == {"max_new_tokens": 5, "temperature": 0.0}  # gen's own over run's defaults


def test_chat_template_markers_from_the_tokenizer(tiny_tokenizer: Any) -> None:
    template = ChatTemplate.from_tokenizer(tiny_tokenizer)
    assert template.source == "tokenizer"
    assert template.markers == ChatTemplate.chatml().markers

    class DropsSystem:
        chat_template = "x"

        def apply_chat_template(self, messages: Any, **kwargs: Any) -> str:
            return "".join(
                f"[{m['role']}]{m['content']}" for m in messages if m["role"] != "system"
            )

    assert ChatTemplate.from_tokenizer(DropsSystem()).source.startswith("chatml (fallback")
    assert ChatTemplate.from_tokenizer(None).source.startswith("chatml")


def test_select_picks_the_best_score_and_names_it() -> None:
    fake = FakeBackend(choice_logprobs={"cat": [-1.0, -1.0], "dog": [-0.5, -2.0], "emu": [-3.0]})

    @function
    def pick(s: Any, method: str) -> None:
        s += "The animal is a "
        s += select("animal", choices=["cat", "dog", "emu"], method=method)

    assert pick.run(method="token_length_normalized", backend=fake)["animal"] == "cat"  # -1.0
    state = pick.run(method="sum", backend=fake)
    assert state["animal"] == "cat" and state.text() == "The animal is a cat"
    assert state.get_meta_info("animal")["scores"] == [-2.0, -2.5, -3.0]
    scored = [ChoiceLogprobs(c, [-1.0], [], {}) for c in "ab"]
    assert decide(scored, "sum").decision == "a"  # ties go to the first choice


def test_fork_copies_the_state_and_joins_back() -> None:
    fake = FakeBackend(replies=["A", "B", "C", "final"])

    @function
    def branches(s: Any) -> None:
        s += "Root. "
        forks = s.fork(3)
        for i, branch in enumerate(forks):
            branch += f"b{i}=" + gen("x", max_tokens=1)
        assert sorted(forks.join().values("x")) == ["A", "B", "C"]
        for branch in forks:
            s += branch["x"]
        s += gen("y")

    state = branches.run(backend=fake)
    assert fake.prompts("cache_prefix") == ["Root. "]  # the shared prefix, prefilled once
    assert sorted(fake.prompts("generate")[:3]) == ["Root. b0=", "Root. b1=", "Root. b2="]
    assert state.text().startswith("Root. ") and "x" not in state and state["y"] == "final"


def test_run_batch_keeps_order_and_warms_the_prefix_first() -> None:
    fake = FakeBackend()

    @function
    def one(s: Any, i: int) -> None:
        s += f"shared prefix / item {i}: " + gen("g", max_tokens=1)

    states = one.run_batch([{"i": i} for i in range(8)], backend=fake, num_threads=4)
    assert [s.text().split(": ")[0] for s in states] == [
        f"shared prefix / item {i}" for i in range(8)
    ]
    kinds = [k for k, _, _ in fake.calls]
    assert kinds[0] == "cache_prefix" and kinds.count("cache_prefix") == 1
    assert kinds.index("generate") > 0  # nothing generated before the warm-up prefill
    with pytest.raises(ValueError):
        one.run_batch([{"i": 0}], backend=fake, num_threads=0)


def test_streaming_yields_the_text_as_it_is_produced() -> None:
    fake = FakeBackend(replies=["hello", "world"])

    @function
    def two(s: Any) -> None:
        s += "A: " + gen("a") + "\nB: " + gen("b")

    state = two.run(backend=fake, stream=True)
    assert list(state.text_iter("b")) == list("world")
    assert state.text() == "A: hello\nB: world"
    state = two.run(backend=fake, stream=True)
    assert "".join(state.text_iter()) == state.text()
    with pytest.raises(ValueError):
        next(iter(two.run(backend=fake).text_iter()))


def _line_of(fragment: str, func: Any) -> int:
    lines, first = inspect.getsourcelines(func)
    return first + next(i for i, line in enumerate(lines) if fragment in line)


def test_a_backend_error_names_the_program_line() -> None:
    @function
    def failing(s: Any) -> None:
        s += "Question: "
        s += gen("answer", max_tokens=4)  # this line fails
        s += "never appended"

    with pytest.raises(ProgramError) as info:
        failing.run(backend=FakeBackend(fail_on="generate"))
    err = info.value
    assert err.location is not None and err.location.lineno == _line_of("this line", failing.func)
    assert "gen('answer')" in str(err) and "scripted generate failure" in str(err)
    assert isinstance(err.__cause__, ConnectionError)


def test_errors_surface_on_read_stream_and_batch() -> None:
    @function
    def reads(s: Any) -> None:
        s += user_end_without_begin()
        s += "after"

    def user_end_without_begin() -> Any:
        return assistant_end()

    with pytest.raises(ProgramError, match="assistant_end"):
        reads.run(backend=FakeBackend())
    state = reads.run(backend=FakeBackend(), stream=True)
    with pytest.raises(ProgramError):
        list(state.text_iter())

    @function
    def maybe(s: Any, fail: bool) -> None:
        s += assistant_begin()
        if fail:
            s += assistant_begin()  # nested role: a program error
        s += assistant_end()

    with pytest.raises(ProgramError, match="run_batch item 2"):
        maybe.run_batch([{"fail": i == 2} for i in range(4)], backend=FakeBackend())


def test_default_backend() -> None:
    @function
    def hello(s: Any) -> None:
        s += "hi " + gen("x")

    set_default_backend(None)
    with pytest.raises(ValueError, match="no backend"):
        hello.run()
    set_default_backend(FakeBackend(replies=["there"]))
    try:
        assert hello.run()["x"] == "there"
    finally:
        set_default_backend(None)


def test_sub_programs_run_inline_and_gen_choices_is_select() -> None:
    fake = FakeBackend(replies=["4"], choice_logprobs={"yes": [-0.1], "no": [-2.0]})

    @function
    def ask(s: Any, question: str) -> None:
        s += user(question)
        s += assistant(gen("answer"))

    @function
    def outer(s: Any) -> None:
        ask(s, "2+2?")  # a program called on a state runs inline on it
        s += "Correct? " + gen("ok", choices=["yes", "no"])

    state = outer.run(backend=fake)
    assert state["answer"] == "4" and state["ok"] == "yes"
    assert [m["role"] for m in state.messages()] == ["user", "assistant"]
