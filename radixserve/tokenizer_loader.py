"""A checkpoint's tokenizer, as ``transformers.AutoTokenizer`` loads it, about a second sooner.

``AutoTokenizer.from_pretrained`` first builds the model's config class to learn its
``model_type``; in transformers 5 importing a config class (``LlamaConfig``, ``Qwen2Config``)
pulls in ``torch.distributed.tensor`` and the model-loading machinery: about a second of CPU in
every process that loads a tokenizer (the server's, the scheduler's, the detokenizer's). When
the checkpoint's ``tokenizer_config.json`` names its ``tokenizer_class`` and no custom code
(``auto_map``), AutoTokenizer picks the class from that name and the ``model_type`` string
alone; :func:`load_tokenizer` hands it a plain record of ``config.json`` instead of the
config class, and the same tokenizer comes back. Any other checkpoint goes through
AutoTokenizer as it is.
"""

from __future__ import annotations

import json
import os
from typing import Any


class _ConfigRecord:
    """What AutoTokenizer reads of a config when the tokenizer config names the class."""

    def __init__(self, fields: dict[str, Any], path: str) -> None:
        self.model_type = fields.get("model_type")
        self.tokenizer_class = fields.get("tokenizer_class")
        self._name_or_path = path


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def load_tokenizer(path: str, **kwargs: Any) -> Any:
    """The tokenizer of the checkpoint directory (or hub id) ``path``; ``kwargs`` go to
    ``from_pretrained``."""
    from transformers import AutoTokenizer

    if os.path.isdir(path):
        tokenizer_config = _read_json(os.path.join(path, "tokenizer_config.json")) or {}
        config = _read_json(os.path.join(path, "config.json"))
        if (
            config is not None
            and tokenizer_config.get("tokenizer_class")
            and ("auto_map" not in tokenizer_config and "auto_map" not in config)
        ):
            kwargs.setdefault("config", _ConfigRecord(config, path))
    return AutoTokenizer.from_pretrained(path, **kwargs)


def decoder_json(tokenizer: Any) -> str | None:
    """The Rust tokenizer behind ``tokenizer`` as JSON, from which :class:`JsonDecoder` decodes
    exactly as ``tokenizer.decode`` does: its added tokens and their special flags as the loaded
    tokenizer has them (``tokenizer_config.json``'s included, as llguidance relies on too).
    ``None`` for a tokenizer whose decode is not its backend's (a slow tokenizer, or a class
    that overrides ``decode``): the detokenizer then loads it itself."""
    from transformers import PreTrainedTokenizerFast
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    cls = type(tokenizer)
    if not (
        isinstance(tokenizer, PreTrainedTokenizerFast)
        and cls._decode is PreTrainedTokenizerFast._decode
        and cls.decode is PreTrainedTokenizerBase.decode
    ):
        return None
    return str(tokenizer.backend_tokenizer.to_str())


class JsonDecoder:
    """``decode`` of a fast tokenizer from its :func:`decoder_json`, with neither transformers nor
    torch in the process (about 2 s of CPU less for the detokenizer to start): Hugging Face's
    fast ``decode`` without ``clean_up_tokenization_spaces`` is its backend's."""

    def __init__(self, text: str) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_str(text)

    def decode(
        self,
        ids: list[int],
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool = False,
    ) -> str:
        if clean_up_tokenization_spaces:
            raise ValueError("JsonDecoder does not clean up tokenization spaces")
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))
