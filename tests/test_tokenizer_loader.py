"""load_tokenizer gives the tokenizer AutoTokenizer gives, without importing the config class."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from radixserve.tokenizer_loader import JsonDecoder, decoder_json, load_tokenizer

pytestmark = pytest.mark.timeout(120)

TEXT = "def f(x):\n    return x  # é 日本 <|im_end|><|eot_id|> <think>\n</think>"


def _same(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    assert len(a) == len(b) and a.get_vocab() == b.get_vocab()
    assert a.all_special_ids == b.all_special_ids and a.eos_token_id == b.eos_token_id
    assert a.chat_template == b.chat_template
    for special in (True, False):
        ids = a.encode(TEXT, add_special_tokens=special)
        assert ids == b.encode(TEXT, add_special_tokens=special)
        assert a.decode(ids, skip_special_tokens=special) == b.decode(
            ids, skip_special_tokens=special
        )


@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "qwen3_model_dir", "llama3_model_dir"])
def test_the_same_tokenizer_as_auto_tokenizer(fixture: str, request: pytest.FixtureRequest) -> None:
    path = str(request.getfixturevalue(fixture))
    _same(load_tokenizer(path), AutoTokenizer.from_pretrained(path))


def test_a_checkpoint_without_a_named_class_goes_through_auto_tokenizer(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    import json
    import shutil

    copy = shutil.copytree(tiny_llama_dir, tmp_path / "m")
    config_path = copy / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("tokenizer_class", None)
    config_path.write_text(json.dumps(config))
    _same(load_tokenizer(str(copy)), AutoTokenizer.from_pretrained(str(copy)))


def test_loading_imports_no_model_config_class(tiny_llama_dir: Path) -> None:
    code = (
        "import sys; from radixserve.tokenizer_loader import load_tokenizer; "
        f"load_tokenizer({str(tiny_llama_dir)!r}); "
        "print(any(m.endswith('configuration_llama') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _decoders_agree(tokenizer: Any, seqs: list[list[int]]) -> None:
    """JsonDecoder decodes every sequence as the tokenizer does, special tokens skipped or not."""
    decoder = JsonDecoder(decoder_json(tokenizer) or "")
    for ids in seqs:
        for skip in (True, False):
            want = tokenizer.decode(
                ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False
            )
            assert decoder.decode(ids, skip_special_tokens=skip) == want, (ids, skip)


def _sequences(tokenizer: Any, seed: int = 0) -> list[list[int]]:
    """The test text's ids, every added token's id alone and beside text, and random ids over the
    whole vocabulary (its added tokens included) of 1 to 40 tokens."""
    rng = random.Random(seed)
    text = tokenizer.encode(TEXT, add_special_tokens=True)
    added = sorted(tokenizer.added_tokens_decoder)
    seqs = [text, *([i] for i in added), *(text[:3] + [i] + text[3:6] for i in added)]
    size = len(tokenizer)
    seqs += [[rng.randrange(size) for _ in range(rng.randint(1, 40))] for _ in range(300)]
    return seqs


@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "qwen3_model_dir", "llama3_model_dir"])
def test_the_detokenizers_decoder_decodes_as_the_tokenizer(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    tokenizer = load_tokenizer(str(request.getfixturevalue(fixture)))
    _decoders_agree(tokenizer, _sequences(tokenizer))


def test_special_tokens_named_only_by_the_tokenizer_config_are_skipped_alike(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    """A token the checkpoint's tokenizer.json lacks, made special by tokenizer_config.json: the
    decoder has it, special, as transformers does."""
    import shutil

    copy = shutil.copytree(tiny_llama_dir, tmp_path / "m")
    config_path = copy / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["extra_special_tokens"] = ["<tool_secret>"]
    config["additional_special_tokens"] = ["<tool_secret>"]
    config_path.write_text(json.dumps(config))
    tokenizer = load_tokenizer(str(copy))
    ids = tokenizer.encode("a <tool_secret> b", add_special_tokens=False)
    (secret,) = [i for i in ids if tokenizer.convert_ids_to_tokens(i) == "<tool_secret>"]
    assert secret in tokenizer.all_special_ids
    assert "<tool_secret>" not in tokenizer.decode(ids, skip_special_tokens=True)
    _decoders_agree(tokenizer, [ids, *_sequences(tokenizer, seed=1)[:50]])


def test_a_tokenizer_that_decodes_its_own_way_gets_no_decoder(tiny_llama_dir: Path) -> None:
    """A class overriding ``decode`` (as CodeGen's does) keeps transformers in the detokenizer."""
    tokenizer = load_tokenizer(str(tiny_llama_dir))
    assert decoder_json(tokenizer) is not None

    class OwnDecode(type(tokenizer)):  # type: ignore[misc]
        def decode(self, *args: Any, **kwargs: Any) -> Any:
            return super().decode(*args, **kwargs).upper()

    tokenizer.__class__ = OwnDecode
    assert decoder_json(tokenizer) is None
    with pytest.raises(ValueError, match="clean up"):
        JsonDecoder(decoder_json(load_tokenizer(str(tiny_llama_dir))) or "").decode(
            [1], clean_up_tokenization_spaces=True
        )


def test_the_detokenizer_process_imports_neither_transformers_nor_torch(
    tiny_llama_dir: Path,
) -> None:
    """What the server's detokenizer child runs, given the decoder: its imports and its decoder."""
    decoder = decoder_json(load_tokenizer(str(tiny_llama_dir)))
    code = (
        "import sys, json; import radixserve.server.detokenizer_process as p; "
        "from radixserve.server.detokenizer import Detokenizer; "
        "d = Detokenizer(p.JsonDecoder(json.loads(sys.stdin.read()))); "
        "print(sorted({'transformers', 'torch'} & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(decoder),
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
