"""A chat template's own words for a forced tool call (``api/formats/call_form.py``), with the
template itself as the oracle: over real checkpoints' tokenizers and templates (Qwen3's,
Llama 3.1's JSON tools), any calls the template renders are text the form's grammar takes, token
by token over the real vocabulary, and that the form parses back into the same calls; a template
that writes its calls otherwise has no form."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tool_template import QWEN_TOOLS_TEMPLATE

from radixserve.api.formats.call_form import CallForm, learn_form
from radixserve.api.openai.chat_tools import plan_tools
from radixserve.api.openai.protocol import ChatCompletionRequest
from radixserve.api.responses.protocol import ResponsesRequest
from radixserve.models.checkpoint_shapes import FAMILIES
from radixserve.runtime.grammar import create_grammar_backend
from radixserve.server.prompt_tokenizer import PromptTokenizer

pytestmark = pytest.mark.timeout(300)
VOCAB = {"qwen3": 151936, "llama3": 128256}  # the models' embedding rows
USER = [{"role": "user", "content": "Go."}]
NAMES = ["get_weather", "get_time", "x"]
TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in NAMES
]


def _form(tokenizer: Any, end_texts: Any, **kwargs: Any) -> CallForm | None:
    prompts = PromptTokenizer(tokenizer)
    specials = [t.content for t in tokenizer.added_tokens_decoder.values() if t.special]

    def render(messages: Any, tools: Any, generation_prompt: bool) -> str:
        return prompts.render_text(messages, tools, generation_prompt, **kwargs)

    return learn_form(render, end_texts, specials)


def _real(checkpoint_tokenizers: dict[str, Any], family: str, **kwargs: Any) -> CallForm | None:
    return _form(checkpoint_tokenizers[family], FAMILIES[family].eos_tokens, **kwargs)


def test_the_forms_of_real_templates(checkpoint_tokenizers: dict[str, Any]) -> None:
    qwen3 = _real(checkpoint_tokenizers, "qwen3")
    call = '<tool_call>\n{"name": "'
    assert qwen3 == CallForm(
        "<think>\n\n</think>\n\n" + call,  # the template's last turn: an empty thinking
        '", "arguments": ',
        "}\n</tool_call>\n" + call,
        "}\n</tool_call>",
        ": ",
        ", ",
    )
    assert qwen3 is not None
    after = qwen3.after("</think>")  # a grammar after the thinking writes the rest of the head
    assert after.grammar([("f", None)], None, False).startswith(
        "start: " + json.dumps("\n\n" + call)
    )
    # and a reasoning parser may leave any end of the head in the text
    for text in ("</think>\n\n", "\n\n", ""):
        assert after.parse(text + call + 'f", "arguments": {}}\n</tool_call>', ["f"])
    assert _real(checkpoint_tokenizers, "qwen3", enable_thinking=False) == CallForm(
        call, '", "arguments": ', "}\n</tool_call>\n" + call, "}\n</tool_call>", ": ", ", "
    )
    assert _real(checkpoint_tokenizers, "llama3") == CallForm(
        '{"name": "', '", "parameters": ', '}; {"name": "', "}", ": ", ", "
    )


END = ["<|im_end|>"]


def test_the_test_servers_template(tiny_tokenizer: Any) -> None:
    form = _form(_with_template(tiny_tokenizer), END)
    call = '<tool_call>\n{"name": "'
    # its assistant turn writes a newline before each call, its content (none) before that
    assert form == CallForm(
        "\n" + call, '", "arguments": ', "}\n</tool_call>\n" + call, "}\n</tool_call>", ": ", ", "
    )
    assert _form(_with_template(tiny_tokenizer), []) is None  # no end of the turn


@pytest.mark.parametrize(
    "arguments",
    [
        "call.function.arguments | tojson(indent=2)",  # laid out on lines
        "call.function.arguments | string",  # Python's repr of a dict
        "call.function.arguments | tojson(sort_keys=True)",  # its keys sorted
    ],
)
def test_a_template_that_writes_arguments_otherwise_has_no_form(
    tiny_tokenizer: Any, arguments: str
) -> None:
    tokenizer = _with_template(tiny_tokenizer, "call.function.arguments | tojson", arguments)
    assert _form(tokenizer, END) is None


def test_a_template_without_calls_or_spelling_a_special_token_in_them_has_none(
    tiny_tokenizer: Any,
) -> None:
    assert _form(tiny_tokenizer, END) is None  # ChatML: an assistant turn is its content
    special = _with_template(tiny_tokenizer, "'\\n<tool_call>", "'\\n<|im_start|>")
    assert "<|im_start|>" in special.chat_template.split("for call in")[1]
    assert _form(special, END) is None


def _with_template(tokenizer: Any, old: str = "", new: str = "") -> Any:
    """A copy of ``tokenizer`` with the test servers' tools template, ``old`` in it made
    ``new``."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = QWEN_TOOLS_TEMPLATE.replace(old, new)
    return tok


# DEL aside: llguidance's JSON strings never hold it raw (json.dumps leaves it so), a grammar
# narrower than the template, never one that writes other text
_chars = st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="\x7f")
_text = st.text(_chars, max_size=12)
_scalars = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | _text
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)
_calls = st.lists(
    st.tuples(st.sampled_from(NAMES), st.dictionaries(_text, _values, max_size=4)),
    min_size=1,
    max_size=3,
)


@pytest.fixture(scope="module")
def forms(checkpoint_tokenizers: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for family, tok in checkpoint_tokenizers.items():
        eos = [tok.convert_tokens_to_ids(t) for t in FAMILIES[family].eos_tokens]
        backend = create_grammar_backend(tok, VOCAB[family], eos)
        kwargs = {"enable_thinking": False} if family == "qwen3" else {}
        form = _form(tok, FAMILIES[family].eos_tokens, **kwargs)
        out[family] = (tok, backend, form, eos[0])
    return out


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=_calls)
def test_what_the_template_renders_the_grammar_takes_and_the_form_reads(
    forms: dict[str, Any], family: str, calls: list[tuple[str, dict[str, Any]]]
) -> None:
    tok, backend, form, eos = forms[family]
    if family == "llama3":
        calls = calls[:1]  # its template renders one call a turn
    prompts = PromptTokenizer(tok)
    kwargs = {"enable_thinking": False} if family == "qwen3" else {}
    turn = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": f"c{k}", "type": "function", "function": {"name": n, "arguments": a}}
            for k, (n, a) in enumerate(calls)
        ],
    }
    prompt = prompts.render_text(USER, TOOLS, True, **kwargs)
    rendered = prompts.render_text([*USER, turn], TOOLS, False, **kwargs)
    assert rendered.startswith(prompt)
    text = rendered[len(prompt) :]
    # the turn ends at its last end-of-turn text (an argument may spell one: it is text)
    text = text[: max(text.rfind(e) for e in FAMILIES[family].eos_tokens)]
    # the form reads the calls back, the arguments as the template wrote them
    parsed = form.parse(text, NAMES)
    assert parsed is not None, repr(text)
    assert [(c.name, json.loads(c.arguments)) for c in parsed] == calls
    # the grammar takes that text as the tokenizer writes it, and ends there
    tools = [(n, {"type": "object"}) for n in NAMES]
    source = form.grammar(tools, None, parallel=True)
    matcher = backend.matcher(backend.compile(("ebnf", source)))
    ids = tok.encode(text, add_special_tokens=False, split_special_tokens=True)  # text is text
    for token in ids:
        assert matcher.accept_token(token), (text, tok.decode([token]))
    assert matcher.accept_token(eos) and matcher.is_terminated()  # the model's end of turn


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Oslo", "Paris"]}},
    "required": ["city"],
    "additionalProperties": False,
}


def _takes(tok: Any, backend: Any, source: str, text: str) -> tuple[bool, bool]:
    """``(whether the grammar takes all of text, whether it may end there)``."""
    matcher = backend.matcher(backend.compile(("ebnf", source)))
    # text is text (an argument may spell a special token); ``<tool_call>`` and
    # ``</tool_call>`` are added tokens that are not special: one token each, as the model
    # writes them
    for token in tok.encode(text, add_special_tokens=False, split_special_tokens=True):
        if not matcher.accept_token(token):
            return False, False
    return True, matcher.accept_token(tok.eos_token_id)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=_calls, lead=st.sampled_from(["", "Let me check.", "A <tool> tag, and\n"]))
def test_auto_modes_grammar_takes_text_and_the_allowed_calls_the_template_renders(
    forms: dict[str, Any], calls: list[tuple[str, dict[str, Any]]], lead: str
) -> None:
    """``tool_choice: auto`` with strict or ``allowed_tools``: any text, and any call the
    template renders of a tool the grammar allows, its arguments as written (the oracle:
    Qwen3's real template, its real vocabulary); parallel calls only where allowed."""
    tok, backend, form, _ = forms["qwen3"]
    prompts = PromptTokenizer(tok)
    turn = {
        "role": "assistant",
        "content": lead,
        "tool_calls": [
            {"id": f"c{k}", "type": "function", "function": {"name": n, "arguments": a}}
            for k, (n, a) in enumerate(calls)
        ],
    }
    kwargs = {"enable_thinking": False}
    prompt = prompts.render_text(USER, TOOLS, True, **kwargs)
    text = prompts.render_text([*USER, turn], TOOLS, False, **kwargs)[len(prompt) :]
    text = text[: text.rfind("<|im_end|>")]
    tools: list[Any] = [(n, None) for n in NAMES]
    assert _takes(tok, backend, form.lazy_grammar(tools, "<tool_call>", True), text) == (True, True)
    assert _takes(tok, backend, form.lazy_grammar(tools, "<tool_call>", True), lead) == (True, True)
    one = form.lazy_grammar(tools, "<tool_call>", False)
    assert _takes(tok, backend, one, text) == ((True, True) if len(calls) == 1 else (False, False))
    # a tool not allowed: refused at its name
    others = [(n, None) for n in NAMES if n != calls[0][0]]
    assert not _takes(tok, backend, form.lazy_grammar(others, "<tool_call>", True), text)[0]


def test_auto_modes_grammar_keeps_a_strict_tools_arguments(forms: dict[str, Any]) -> None:
    tok, backend, form, _ = forms["qwen3"]
    source = form.lazy_grammar([("get_weather", WEATHER), ("x", None)], "<tool_call>", True)
    call = '<tool_call>\n{"name": "get_weather", "arguments": '
    end = "}\n</tool_call>"
    assert _takes(tok, backend, source, f'{call}{{"city": "Oslo"}}{end}') == (True, True)
    for bad in ('{"city": "Rome"}', '{"town": "Oslo"}', '{"city": "Oslo", "x": 1}', "{}"):
        assert not _takes(tok, backend, source, f"Sure. {call}{bad}{end}")[0], bad
    # a tool that is not strict takes any object
    free = '<tool_call>\n{"name": "x", "arguments": {"a": [1, {"b": null}]}}\n</tool_call>'
    assert _takes(tok, backend, source, free) == (True, True)
    # the call goes on from the marker in the template's words: nothing else after it
    assert not _takes(tok, backend, source, "<tool_call> and more text")[0]
    # a form whose calls do not begin with the marker (Llama 3.1's bare JSON) has none
    assert forms["llama3"][2].lazy_grammar([("x", None)], "<|python_tag|>", True) is None


def test_a_schema_the_grammar_engine_cannot_take_is_named(forms: dict[str, Any]) -> None:
    form = forms["qwen3"][2]
    bad = {"type": "object", "properties": {"t": {"type": "array", "uniqueItems": True}}}
    for make in (
        lambda: form.grammar([("ok", None), ("f", bad)], None, True),
        lambda: form.lazy_grammar([("ok", None), ("f", bad)], "<tool_call>", True),
    ):
        with pytest.raises(ValueError, match="the parameters of `f`: .*uniqueItems"):
            make()


def test_a_custom_tool_is_kept_in_auto_mode_through_both_doors(forms: dict[str, Any]) -> None:
    """``auto`` keeps a custom tool's calls to its one ``input`` string, a regex format's
    pattern included, whether it came through the chat route or the Responses API."""
    tok, backend, form, _ = forms["qwen3"]
    regex = {"syntax": "regex", "definition": "[a-z]{2,6}"}
    chat_shape = {"type": "grammar", "grammar": regex}
    messages = [{"role": "user", "content": "hi"}]
    chat = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": messages,
            "tools": [{"type": "custom", "custom": {"name": "shell", "format": chat_shape}}],
        }
    )
    flat = {"type": "custom", "name": "shell", "format": {"type": "grammar", **regex}}
    responses = ResponsesRequest.model_validate({"model": "m", "input": "hi", "tools": [flat]})
    call, end = '<tool_call>\n{"name": "shell", "arguments": ', "}\n</tool_call>"
    for body in (chat, responses.to_chat(messages)):
        source = plan_tools(body, "qwen25", lambda: form).grammar["ebnf"]
        assert _takes(tok, backend, source, f'Sure. {call}{{"input": "ls"}}{end}') == (True, True)
        for bad in ('{"input": "LS -la"}', '{"input": "l"}', '{"cmd": "ls"}'):
            assert not _takes(tok, backend, source, f"{call}{bad}{end}")[0], bad
