"""load_tokenizer gives the tokenizer AutoTokenizer gives, without importing the config class."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from radixserve.tokenizer_loader import load_tokenizer

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
