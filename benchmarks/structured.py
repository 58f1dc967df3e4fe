"""Structured output: a 10-field JSON schema with jump-forward on, off, and unconstrained, side
by side in one run, on the Qwen2.5-0.5B-shaped random model (``radixserve.bench.models``).

Per side: the decode steps (decode batches plus jump-forward extends) and the wall time of one
batch of ``--batch-size`` requests at temperature 0; the unconstrained side generates as many
tokens as the constrained one (``ignore_eos``). Then the mask's cost against a decode step at
that batch size: filling the batch's bitmask (the matchers walking a valid instance, token by
token) plus applying it to ``[batch, vocab]`` logits, as a fraction of one decode step.

``--tokenizer DIR`` swaps in a tokenizer of the model's full vocabulary, so that the mask is
computed over as many real tokens as Qwen2's: when ``DIR`` does not exist, a 151,936-token
byte-level BPE is trained into it from the Python sources on disk (several minutes, once). The
default is the bench model's own small tokenizer (its ids above ~2k exist in the model only).
Example::

    python benchmarks/structured.py --tokenizer bench_out/bpe152k --batch-size 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from radixserve import Engine
from radixserve.bench.models import ensure_bench_model
from radixserve.runtime.grammar import ReqGrammar, apply_bitmask, create_grammar_backend
from radixserve.runtime.grammar.bitmask import bitmask_width

FIELDS = [
    ("name", {"type": "string", "maxLength": 12}),
    ("age", {"type": "integer", "minimum": 0, "maximum": 150}),
    ("email", {"type": "string", "maxLength": 16}),
    ("is_active", {"type": "boolean"}),
    ("score", {"type": "integer", "minimum": -1000, "maximum": 1000}),
    ("country", {"enum": ["France", "Germany", "Japan", "Brazil"]}),
    ("city", {"type": "string", "maxLength": 10}),
    ("zip_code", {"type": "string", "pattern": "^[0-9]{5}$"}),
    ("subscription_tier", {"enum": ["free", "pro", "enterprise"]}),
    ("verified", {"type": "boolean"}),
]
SCHEMA = {
    "type": "object",
    "properties": dict(FIELDS),
    "required": [name for name, _ in FIELDS],
    "additionalProperties": False,
}
INSTANCE = {
    "name": "Ada Lovelace",
    "age": 36,
    "email": "ada@example.org",
    "is_active": True,
    "score": 815,
    "country": "France",
    "city": "Paris",
    "zip_code": "75001",
    "subscription_tier": "pro",
    "verified": False,
}


def train_big_tokenizer(target: Path, vocab_size: int = 151936) -> None:
    """A byte-level BPE of ``vocab_size`` tokens trained on the stdlib and site-packages."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    def texts() -> Iterator[str]:
        for key in ("stdlib", "purelib"):
            for path in sorted(Path(sysconfig.get_paths()[key]).rglob("*")):
                if path.suffix in (".py", ".pyi", ".txt", ".rst", ".md") and path.is_file():
                    yield path.read_text(encoding="utf-8", errors="replace")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts(), trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=special[0]).save_pretrained(target)


def run_side(model: str, tokenizer: Any, prompts: list[str], params: dict[str, Any], **cfg: Any):
    with Engine(model, tokenizer=tokenizer, **cfg) as eng:
        eng.generate(prompts[0], {**params, "max_new_tokens": 2})  # warm up
        before = eng.get_stats()
        start = time.perf_counter()
        outs = eng.generate(prompts, params)
        wall = time.perf_counter() - start
        after = eng.get_stats()
        eng.check_integrity()
    steps = sum(after[k] - before[k] for k in ("num_decode_batches", "num_jump_batches"))
    return outs, steps, wall


def decode_step_seconds(model: str, tokenizer: Any, prompts: list[str], n: int) -> float:
    """One decode step at ``len(prompts)``: (time of n tokens - time of 1) / (n - 1)."""
    with Engine(model, tokenizer=tokenizer, disable_overlap_schedule=True) as eng:
        eng.generate(prompts, {"max_new_tokens": 2, "ignore_eos": True, "temperature": 0})
        times = {}
        for k in (1, n):
            start = time.perf_counter()
            eng.generate(prompts, {"max_new_tokens": k, "ignore_eos": True, "temperature": 0})
            times[k] = time.perf_counter() - start
    return (times[n] - times[1]) / (n - 1)


def mask_seconds(tokenizer: Any, vocab: int, eos: list[int], batch: int) -> tuple[float, float]:
    """Median per step of filling the batch's bitmask and of applying it to the logits."""
    backend = create_grammar_backend(tokenizer, vocab, eos)
    compiled = backend.compile(("json_schema", json.dumps(SCHEMA)))
    ids = tokenizer.encode(json.dumps(INSTANCE, separators=(",", ":")))
    grammars = [ReqGrammar(backend.matcher(compiled)) for _ in range(batch)]
    logits = torch.randn(batch, vocab)
    fills, applies = [], []
    for token in ids:
        bitmask = torch.full((batch, bitmask_width(vocab)), -1, dtype=torch.int32)
        start = time.perf_counter()
        for row, g in enumerate(grammars):
            g.matcher.fill_bitmask(bitmask, row)  # the full mask (not the one-hot of forced text)
        fills.append(time.perf_counter() - start)
        start = time.perf_counter()
        apply_bitmask(logits, bitmask)
        applies.append(time.perf_counter() - start)
        for g in grammars:
            g.accept(token)
    return statistics.median(fills), statistics.median(applies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="default: the qwen25-05b bench model")
    parser.add_argument("--tokenizer", default=None, help="default: the model's own")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    model = args.model or str(ensure_bench_model("qwen25-05b"))
    if args.tokenizer and not Path(args.tokenizer).exists():
        print(f"training a 151,936-token BPE into {args.tokenizer} ...")
        train_big_tokenizer(Path(args.tokenizer))
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or model)
    vocab = int(json.loads((Path(model) / "config.json").read_text())["vocab_size"])
    prompts = [f"Record {i} of the user table, as JSON:\n" for i in range(args.batch_size)]
    schema = {"json_schema": json.dumps(SCHEMA), "temperature": 0.0}
    schema["max_new_tokens"] = args.max_new_tokens
    print(f"model {model} (vocab {vocab}), tokenizer {len(tokenizer)} tokens, batch {len(prompts)}")
    rows = []
    out_lens: list[int] = []
    for name, params, cfg in (
        ("json, jump-forward", schema, {}),
        ("json, no jump-forward", schema, {"disable_jump_forward": True}),
        ("unconstrained", None, {}),
    ):
        if params is None:
            n = max(out_lens)
            params = {"max_new_tokens": n, "ignore_eos": True, "temperature": 0.0}
        outs, steps, wall = run_side(model, tokenizer, prompts, params, **cfg)
        lens = [len(o["output_ids"]) for o in outs]
        out_lens = out_lens or lens
        if "json_schema" in params:
            for o in outs:
                json.loads(o["text"])  # every constrained output parses
        rows.append((name, steps, wall, sum(lens)))
        print(f"{name:24s} decode steps {steps:5d}  wall {wall:7.2f} s  output tokens {sum(lens)}")
    step = decode_step_seconds(model, tokenizer, prompts, 16)
    eos = sorted({tokenizer.eos_token_id} - {None})
    fill, apply = mask_seconds(tokenizer, vocab, eos, len(prompts))
    print(
        f"mask per step at batch {len(prompts)}: fill {fill * 1e3:.2f} ms + apply "
        f"{apply * 1e3:.2f} ms = {(fill + apply) / step:.1%} of a decode step "
        f"({step * 1e3:.1f} ms)"
    )


if __name__ == "__main__":
    main()
