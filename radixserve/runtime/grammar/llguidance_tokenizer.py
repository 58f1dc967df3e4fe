"""llguidance's view of a Hugging Face tokenizer, agreeing with itself on added tokens.

llguidance treats every added token as special (bytes behind its 0xFF marker, which no text
matches), while the tokenizer it is handed turns the text of an added token into that token
(``<think>`` becomes Qwen3's id 151667). The mask of a grammar that forces the text
``<think>`` then allowed the one token that its matcher refused, and the scheduler died on
it. Here the two agree:

- an added token that the checkpoint marks not special (Qwen3's ``<think>``, ``<tool_call>``)
  is an ordinary token with the bytes of its text, as the model uses it: a grammar's
  ``<think>`` may be written by that one token, or by the pieces of its text;
- a special token (``<|im_end|>``, ``<|eot_id|>``) stays special: the text of a grammar never
  produces it, and tokenizing text splits it into ordinary pieces;
- ids past the tokenizer, up to the model's vocabulary (Qwen3's 151,669 to 151,935), are
  special too: no grammar ever allows them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import llguidance
import llguidance.hf


class _TokenizerView:
    """What ``llguidance.TokenizerWrapper`` reads: each id's bytes, the special ids, and a
    tokenize function over text."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos: list[int]) -> None:
        base = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos)
        self.tokens = [base.decode_bytes([i]) for i in range(vocab_size)]
        self.special_token_ids = list(range(len(tokenizer), vocab_size))
        for token_id, added in tokenizer.added_tokens_decoder.items():
            if token_id >= vocab_size:
                continue
            if added.special:
                self.special_token_ids.append(token_id)
            else:
                self.tokens[token_id] = added.content.encode()
        self.eos_token_id = eos[0] if eos else tokenizer.eos_token_id
        self.bos_token_id = tokenizer.bos_token_id
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):  # TokenizerWrapper probes with bytes: text only, please
            raise TypeError("text only")
        return list(
            self._tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        )


def llguidance_tokenizer(
    tokenizer: Any, vocab_size: int, eos_token_ids: Iterable[int]
) -> llguidance.LLTokenizer:
    """The ``LLTokenizer`` of ``tokenizer`` over the model's ``vocab_size`` ids (about 3 s for a
    150k vocabulary: build it once per engine)."""
    eos = sorted(eos_token_ids)
    view = _TokenizerView(tokenizer, vocab_size, eos)
    return llguidance.LLTokenizer(
        llguidance.TokenizerWrapper(view), n_vocab=vocab_size, eos_token=eos or None
    )
