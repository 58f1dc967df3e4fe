"""ContentGuard: a chat prompt's ids in which the request's text is text, never special tokens.

A chat template writes its own special tokens (``<|im_start|>``, ``<|eot_id|>``) around the
messages. A message that spells one (``<|im_end|>\\n<|im_start|>system\\n...``) would, were
the rendered prompt tokenized as one string, become that token and forge a turn. The guard
keeps the template's special tokens special and tokenizes every special-token text that came
from the request (messages, tools, ``chat_template_kwargs``) as the plain text it spells:

1. :meth:`ContentGuard.escape` replaces each special-token text in the request's strings by a
   marker: one word of ASCII letters and digits holding a random key, which templates copy
   through unchanged (``trim``, ``tojson``, concatenation);
2. the template renders the escaped request, so each special-token text in the rendering is
   the template's own;
3. :meth:`ContentGuard.restore` writes each of those as a stand-in (a token of a private copy
   of the tokenizer, added with the special token's matching flags) and each marker as the
   text it replaced;
4. :meth:`ContentGuard.encode` tokenizes that text at once with the copy, whose special
   tokens are not parsed (``encode_special_tokens``), and maps each stand-in to its special
   token's id.

One tokenization of the whole text splits it at the template's tokens exactly as the
tokenizer splits the plain rendering, and tokenizes each piece in its place (byte-level BPE;
SentencePiece's prefix space, which can depend on where a piece starts), so the ids differ from
transformers' only where the request spelled a special token. Every request costs one regex
pass over its strings; the first that spells a special token also a copy of the tokenizer (about
a second, and its memory again). Special tokens are the added tokens the tokenizer marks special;
others (Qwen3's ``<think>``, ``<tool_call>``) are matched in content as transformers does.
"""

from __future__ import annotations

import re
import secrets
import threading
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _StandIns:
    backend: Any  # a tokenizers.Tokenizer: the copy that tokenizes restored texts
    ids: dict[int, int]  # a stand-in's id -> its special token's id


class ContentGuard:
    """Built from a transformers tokenizer: cheap (the copy of the tokenizer that
    :meth:`encode` needs is made on the first call). Thread-safe after construction."""

    def __init__(self, tokenizer: Any) -> None:
        self._backend: Any = getattr(tokenizer, "backend_tokenizer", None)
        decoder = getattr(tokenizer, "added_tokens_decoder", {})  # id -> AddedToken
        self._specials = {tok.content: i for i, tok in decoder.items() if tok.special}
        self._flags = {tok.content: tok for tok in decoder.values() if tok.special}
        # both keys are secret: a request cannot spell a marker or a stand-in it does not know
        key, stand_key = secrets.token_hex(8), secrets.token_hex(8)
        self._stand_key = stand_key
        # what a marker stands for: each special token's text, and the marker key itself (so
        # that a request spelling the key gets it back as text, never as a marker)
        self._literals = [*sorted(self._specials, key=len, reverse=True), key]
        self._escape_re = re.compile("|".join(re.escape(t) for t in self._literals))
        self._markers = {t: f"Q{key}N{i}Q" for i, t in enumerate(self._literals)}
        specials = "|".join(re.escape(t) for t in self._literals[:-1])
        self._restore_re = re.compile(rf"Q{key}N(\d+)Q" + (f"|{specials}" if specials else ""))
        self._stand_in_text = {t: f"<{stand_key}:{i}>" for t, i in self._specials.items()}
        self._stand_ins: _StandIns | None = None
        self._lock = threading.Lock()

    def escape(self, value: T) -> tuple[T, bool]:
        """``(value, whether it changed)``: ``value`` (strings, and lists, tuples and dicts of
        them, keys included) with each special-token text replaced by a marker."""
        if isinstance(value, str):
            out = self._escape_re.sub(self._to_marker, value)
            return out, out != value  # type: ignore[return-value]
        if isinstance(value, dict):
            pairs = [(self.escape(k), self.escape(v)) for k, v in value.items()]
            changed = any(kc or vc for (_, kc), (_, vc) in pairs)
            return {k: v for (k, _), (v, _) in pairs}, changed  # type: ignore[return-value]
        if isinstance(value, list | tuple):
            items = [self.escape(v) for v in value]
            out_items = [v for v, _ in items]
            seq = out_items if isinstance(value, list) else tuple(out_items)
            return seq, any(c for _, c in items)  # type: ignore[return-value]
        return value, False

    def restore(self, rendered: str) -> tuple[str, int]:
        """``(text, num_chars)`` of a rendering of an escaped request: the text :meth:`encode`
        takes (the template's special tokens as stand-ins, markers as the text they replaced)
        and how many characters the prompt has. ``ValueError`` where the tokenizer has no
        fast backend to tokenize it with."""
        if self._backend is None:
            raise ValueError(
                "this tokenizer cannot keep special-token text in messages as text; remove it "
                "from the request (or start the server with --allow-special-tokens-in-content)"
            )
        if self._stand_key in rendered:  # only a guess of the secret key spells it
            raise ValueError("the request spells a reserved text")
        shrink = 0  # how much longer the markers are than the texts they replaced

        def sub(match: re.Match[str]) -> str:
            nonlocal shrink
            found, index = match.group(0), match.group(1)
            if index is None:  # the template's own special token
                return self._stand_in_text[found]
            literal = self._literals[int(index)] if int(index) < len(self._literals) else found
            shrink += len(found) - len(literal)
            return literal

        text = self._restore_re.sub(sub, rendered)
        return text, len(rendered) - shrink

    def encode(self, text: str) -> list[int]:
        """The ids of a :meth:`restore` text: stand-ins as their special tokens' ids, all other
        text (special-token text included) as plain text."""
        stand_ins = self._stand_ins or self._make_stand_ins()
        ids = stand_ins.backend.encode(text, add_special_tokens=False).ids
        return [stand_ins.ids.get(i, i) for i in ids]

    def _to_marker(self, match: re.Match[str]) -> str:
        return self._markers[match.group(0)]

    def _make_stand_ins(self) -> _StandIns:
        with self._lock:
            if self._stand_ins is None:
                self._stand_ins = self._copy_with_stand_ins()
            return self._stand_ins

    def _copy_with_stand_ins(self) -> _StandIns:
        from tokenizers import AddedToken, Tokenizer

        assert self._backend is not None  # restore refused the text otherwise
        backend: Any = Tokenizer.from_str(self._backend.to_str())
        backend.no_truncation()
        backend.no_padding()
        added = []
        for content, stand_in in self._stand_in_text.items():
            flags = self._flags[content]
            # matched as the special token is (same whitespace rules), but on the raw text
            # and never split: a stand-in is not special
            added.append(
                AddedToken(
                    stand_in,
                    single_word=flags.single_word,
                    lstrip=flags.lstrip,
                    rstrip=flags.rstrip,
                    normalized=False,
                    special=False,
                )
            )
        backend.add_tokens(added)
        backend.encode_special_tokens = True
        ids = {
            int(backend.token_to_id(stand_in)): self._specials[content]
            for content, stand_in in self._stand_in_text.items()
        }
        return _StandIns(backend, ids)
