"""llama-server's side of ``spec_llamacpp.py``: plain decoding, speculation at a synthetic
acceptance, and its own n-gram speculation, each a fresh server on one GGUF.

``--spec-synth-len L`` replaces only the verification: a drafted token is kept with a fixed
probability (per position, geometric, a mean of ``L`` tokens per verify step over full drafts)
whatever the model says, and at the first rejection the model's own token is taken. It needs a
drafter's drafts. Four drafters give them (``DRAFTERS``), each drafting at most ``n_draft``
tokens (radixserve's longest):

- ``model``: ``draft-simple`` with a one-layer model of the same vocabulary
  (:func:`write_draft_model`), which drafts ``n_max`` tokens every step; its own decode is the
  price (``drafter_step_ms`` measures it);
- ``ngram-mod``: llama.cpp's n-gram table (a hash of the last ``n_match`` tokens, 24 by default,
  to the next token; one table for every slot, kept across requests), free to draft but
  drafting only what its table holds: it is first given ``prompt + O`` (``O`` the plain run's
  greedy output; ngram-mod indexes a prompt when its slot starts generating), so while the
  output stays on ``O`` every step finds a draft. ``on_text`` is the share that stayed on
  ``O``: a kept draft is ``O``'s token, a rejection takes the model's, which is ``O``'s unless
  a verify batch's rounding changes an argmax (a random model has near ties). ngram-mod also
  empties its table after five drafts in a row with under a quarter kept, so at a low ``L`` it
  stops drafting (its guard against bad drafts); the measured accept length and verify steps
  show how much was verified;
- ``ngram-cache``: llama.cpp's lookup decoding: counts of the token after each 1- to 4-gram
  (sizes fixed at build time) of a slot's tokens, a draft token taken from the longest n-gram
  whose counts are clear enough (a 3- or 4-gram seen once will do), up to 8 tokens (fixed in
  this build; optional static and dynamic caches from files are not used). Its cache belongs to
  the slot and outlives a request, but it counts only the n-grams inside each batch of new
  tokens it is shown: the whole prompt at a slot's first draft, then each step's new tokens
  (one, unless drafts were kept), so a slot's own output is hardly counted, and a later request
  on the slot adds nothing until it is longer than what the slot has seen. It is given
  ``prompt + O`` as ngram-mod is, as the prompt of a first request that drafts once. It drafts
  8 where the others draft 7, so its synthetic rates are the others' 7
  (``--spec-synth-rates``) and a last one of 0: the same acceptance, a verify row more;
- ``ngram-simple``: prompt lookup without memory: the latest occurrence, earlier in the
  request's own tokens, of its last ``NGRAM_SIMPLE_N`` tokens (radixserve's shortest match),
  and the ``n_draft`` tokens after it (the latest only: one too near the end to leave
  ``NGRAM_SIMPLE_N`` tokens after it, as in a run of one token repeated, gives no draft; its
  ``--spec-ngram-simple-min-hits`` is not read). Nothing of an earlier request reaches it, so
  it cannot be given ``O``: it drafts what the request's prompt and its output so far repeat (a
  kept synthetic draft is a copy of an earlier stretch, so the output follows that stretch until
  a rejection).

The real runs (:meth:`LlamaSpecRunner.real`, no synthetic acceptance) are of the drafters that
keep what one request saw for the next (``REAL_DRAFTERS``): a request sent again.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from llamacpp import LlamaServer, convert

from radixserve.models.tiny import write_tiny_model
from radixserve.tokenizer_loader import load_tokenizer

DRAFTERS = ("model", "ngram-mod", "ngram-simple", "ngram-cache")
REAL_DRAFTERS = ("ngram-mod", "ngram-cache")  # they keep what a request saw for the next
NGRAM_SIMPLE_N = 2  # the lookup's length: radixserve's shortest match
NGRAM_CACHE_DRAFT = 8  # ngram-cache's draft length, fixed in llama.cpp b11434
FILL_MARGIN = 64  # extra tokens of the real run's first request: ngram-mod indexes in chunks
DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32, "f16": torch.float16}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metrics(server: LlamaServer) -> dict[str, float]:
    """llama-server's ``/metrics`` counters (``--metrics``), by name without the prefix."""
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as r:
        text = r.read().decode()
    found = re.findall(r"^llamacpp:(\w+) ([-+.\deE]+)$", text, re.MULTILINE)
    return {name: float(value) for name, value in found}


def spec_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Verify steps, drafted and accepted tokens between two ``/metrics`` reads, and the accept
    length: tokens a request got per verify step it drafted in (SGLang's, as radixserve's)."""

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    steps = delta("spec_decode_num_drafts_total")
    accepted = delta("spec_decode_num_accepted_tokens_total")
    return {
        "verify_steps": steps,
        "draft_tokens": delta("spec_decode_num_draft_tokens_total"),
        "accepted_tokens": accepted,
        "accept": (steps + accepted) / steps if steps else 0.0,
    }


def write_draft_model(model_dir: Path, outtype: str, source: Path | None) -> Path:
    """A GGUF of a random one-layer Qwen2 (hidden 16) with ``model_dir``'s tokenizer and
    vocabulary size, beside it (``<dir>-draft-<type>.gguf``, kept for later runs): a drafter
    that costs little next to the model (its embedding, tied, is most of it)."""
    out = model_dir.parent / f"{model_dir.name}-draft-{outtype}.gguf"
    if out.is_file():
        return out
    draft_dir = model_dir.parent / f"{model_dir.name}-draft"
    if not (draft_dir / "config.json").is_file():
        vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        write_tiny_model(
            draft_dir,
            "qwen2",
            num_layers=1,
            hidden_size=16,
            num_heads=2,
            num_kv_heads=1,
            intermediate_size=32,
            tie_word_embeddings=True,
            tokenizer=load_tokenizer(str(model_dir)),
            vocab_size=vocab,
            dtype=DTYPES.get(outtype, torch.float32),
        )
    return convert(draft_dir, outtype, out, source)


class LlamaSpecRunner:
    """Each method starts a llama-server (``--parallel`` = the number of prompts) on ``gguf``
    for one measurement and stops it. ``n_draft``: the longest draft (radixserve's
    ``num_draft_tokens - 1``)."""

    def __init__(
        self,
        binary: Path,
        gguf: Path,
        draft_gguf: Path | None,
        threads: int,
        n_draft: int,
        slot_ctx: int,
    ) -> None:
        self.binary, self.gguf, self.draft_gguf = binary, gguf, draft_gguf
        self.threads, self.n_draft, self.slot_ctx = threads, n_draft, slot_ctx

    def server(self, bs: int, extra: tuple[str, ...] = (), gguf: Path | None = None) -> LlamaServer:
        port = free_port()
        model = gguf or self.gguf
        flags = ("--metrics", *extra)
        return LlamaServer(self.binary, model, port, bs, self.threads, self.slot_ctx, flags)

    def drafter_flags(self, drafter: str) -> tuple[str, ...]:
        n = str(self.n_draft)
        if drafter == "ngram-mod":
            return ("--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", n) + (
                "--spec-ngram-mod-n-min",
                "1",
            )
        if drafter == "ngram-simple":  # its min-hits is ngram-map's, unused here
            return ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n") + (
                str(NGRAM_SIMPLE_N),
                "--spec-ngram-simple-size-m",
                n,
            )
        if drafter == "ngram-cache":  # no options: n-gram sizes and draft length are fixed
            return ("--spec-type", "ngram-cache")
        if drafter == "model" and self.draft_gguf is not None:
            return ("--spec-type", "draft-simple", "-md", str(self.draft_gguf)) + (
                "--spec-draft-n-max",
                n,
            )
        raise ValueError(f"drafter must be one of {DRAFTERS} (model needs a draft GGUF)")

    def described(self, drafter: str) -> str:
        """``drafter``'s flags as a reader needs them (a file by its name)."""
        return " ".join(
            Path(f).name if f.startswith("/") else f for f in self.drafter_flags(drafter)
        )

    def synth_flags(self, drafter: str, accept: float) -> tuple[str, ...]:
        """Synthetic acceptance at accept length ``accept`` over drafts of ``n_draft`` tokens;
        for ngram-cache, which drafts :data:`NGRAM_CACHE_DRAFT`, the same rates and 0 after."""
        length = min(max(accept, 1.0), self.n_draft + 1.0)
        if drafter != "ngram-cache":
            return ("--spec-synth-len", f"{length:.4f}")
        rates = geometric_rates(length, self.n_draft)
        rates += [0.0] * (NGRAM_CACHE_DRAFT - len(rates))
        return ("--spec-synth-rates", ",".join(f"{r:.6f}" for r in rates))

    @staticmethod
    def generate(server: LlamaServer, prompts: list[list[int]], n: int) -> tuple[float, list[Any]]:
        """``n`` greedy tokens for each prompt, all at once; (seconds, the generated ids)."""
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            start = time.perf_counter()
            outs = list(pool.map(lambda p: server.complete(p, n), prompts))
            elapsed = time.perf_counter() - start
        tokens = [list(o["tokens"]) for o in outs]
        if any(len(t) != n for t in tokens):
            raise RuntimeError(f"llama-server generated {[len(t) for t in tokens]}, not {n} each")
        return elapsed, tokens

    def plain(
        self, prompts: list[list[int]], n: int, gguf: Path | None = None
    ) -> tuple[float, list[list[int]]]:
        """(tokens/s, the outputs) of plain decoding, the prompts cached by a first request."""
        with self.server(len(prompts), gguf=gguf) as server:
            self.generate(server, prompts, 1)
            elapsed, outs = self.generate(server, prompts, n)
        return len(prompts) * n / elapsed, outs

    def drafter_step_ms(self, prompts: list[list[int]], n: int) -> float:
        """Milliseconds the draft model takes per verify step: ``n_draft`` of its decode steps
        at this batch (its plain decode, timed like the model's)."""
        assert self.draft_gguf is not None
        tok_s, _ = self.plain(prompts, n, self.draft_gguf)
        return 1000.0 * self.n_draft * len(prompts) / tok_s

    def synthetic(
        self, drafter: str, prompts: list[list[int]], outs: list[list[int]], accept: float
    ) -> dict[str, float]:
        """tokens/s of speculation at synthetic accept length ``accept`` (within ``[1,
        n_draft + 1]``) and its measured figures; ``outs``: the plain run's outputs (the text
        ngram-mod and ngram-cache are given, see the module doc)."""
        n = len(outs[0])
        flags = (*self.drafter_flags(drafter), *self.synth_flags(drafter, accept))
        with self.server(len(prompts), flags) as server:
            seen = [p + o for p, o in zip(prompts, outs, strict=True)]
            if drafter == "ngram-mod":  # the table learns prompt + output as the slot starts
                self.generate(server, seen, 1)
            elif drafter == "ngram-cache":  # the slot's cache counts them at its first draft,
                self.generate(server, seen, 3)  # the second step of a request of 3 tokens
            else:
                self.generate(server, prompts, 1)
            before = metrics(server)
            elapsed, got = self.generate(server, prompts, n)
            figures = spec_figures(before, metrics(server))
        pairs = (a == b for g, o in zip(got, outs, strict=True) for a, b in zip(g, o, strict=True))
        on_text = sum(pairs) / (n * len(outs))
        return dict(figures, tok_s=len(prompts) * n / elapsed, on_text=on_text)

    def real(self, drafter: str, prompts: list[list[int]], n: int) -> dict[str, float]:
        """llama.cpp's own speculation with ``drafter`` (one of :data:`REAL_DRAFTERS`) on a
        request sent again: a first request generates the random model's text (``n +
        FILL_MARGIN`` tokens) and fills the drafter's table or cache, the same request again is
        timed."""
        if drafter not in REAL_DRAFTERS:
            raise ValueError(f"real drafts of a request sent again: one of {REAL_DRAFTERS}")
        with self.server(len(prompts), self.drafter_flags(drafter)) as server:
            self.generate(server, prompts, n + FILL_MARGIN)
            before = metrics(server)
            elapsed, _ = self.generate(server, prompts, n)
            figures = spec_figures(before, metrics(server))
        return dict(figures, tok_s=len(prompts) * n / elapsed)


def geometric_rates(length: float, n_max: int) -> list[float]:
    """Per-position rates ``p, p^2, ..., p^n_max`` whose sum is ``length - 1``: what
    llama-server makes of ``--spec-synth-len length`` over ``n_max`` drafts (the same
    bisection)."""
    if length >= n_max + 1.0:
        return [1.0] * n_max
    lo, hi = 0.0, 1.0
    for _ in range(32):
        mid = 0.5 * (lo + hi)
        if sum(mid**j for j in range(1, n_max + 1)) < length - 1.0:
            lo = mid
        else:
            hi = mid
    p = 0.5 * (lo + hi) if length > 1.0 else 0.0
    return [p**j for j in range(1, n_max + 1)]
