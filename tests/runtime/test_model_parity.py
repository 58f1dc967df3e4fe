"""Token-for-token parity with Hugging Face transformers (the oracle), float32.

A tiny driver below plays the scheduler: it takes request rows from the ReqToTokenPool, KV
slots from a TokenToKVPoolAllocator, writes ``req_to_token`` and calls ``ModelRunner.forward``.
Three ways of feeding the same prompts must give HF's 32 greedy tokens and HF's logits
(max abs diff < LOGIT_TOL at every step):

(a) from scratch, all prompts in one EXTEND batch, then batched DECODE;
(b) the first half of each prompt already in the pool from an earlier request (its row freed,
    its slots kept, as the radix tree would), only the second half computed;
(c) the prompts fed in chunks of 7 tokens, all requests chunked in the same batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from radixserve.config import EngineConfig
from radixserve.memory_pool import TokenToKVPoolAllocator
from radixserve.models.attention.flashinfer_backend import FlashInferBackend
from radixserve.models.attention.paged_reference import ReferenceWrappers
from radixserve.models.forward_batch import ForwardBatch
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.model_runner import ModelRunner

NUM_NEW_TOKENS = 32
LOGIT_TOL = (
    1e-4  # float32, logits of std ~2.3: observed <= 4.2e-5 (summation order of batched GEMMs)
)
CHUNK = 7
PROMPTS = [
    "import os",
    "def add(a, b):\n    return a + b\n",
    "class Config:\n    def __init__(self, path):\n        self.path = path\n",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n    else:\n        continue\n# done",
    "x = 1",
]


@dataclass
class Seq:
    row: int
    tokens: list[int]  # every token whose KV is (or is about to be) in the pool
    kv_len: int = 0
    logits: list[torch.Tensor] = field(default_factory=list)  # logits of each generated position


class Driver:
    """Allocates rows and slots and fills ``req_to_token`` like the scheduler, then runs forwards."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.pool = runner.req_to_token_pool
        self.allocator = TokenToKVPoolAllocator(runner.kv_cache.num_slots, page_size=1)
        self.forced: list[list[int]] | None = None

    def new_seq(self, tokens: list[int], prefix_slots: torch.Tensor | None = None) -> Seq:
        rows = self.pool.alloc(1)
        assert rows is not None
        seq = Seq(rows[0], list(tokens))
        if prefix_slots is not None:
            self.pool.write(seq.row, 0, prefix_slots)
            seq.kv_len = len(prefix_slots)
        return seq

    def extend(self, seqs: list[Seq], lens: list[int]) -> torch.Tensor:
        """Compute the next ``lens[i]`` tokens of each seq; returns last-token logits [bs, vocab]."""
        slots = self.allocator.alloc(sum(lens))
        assert slots is not None
        ids, off = [], 0
        for seq, n in zip(seqs, lens, strict=True):
            self.pool.write(seq.row, seq.kv_len, slots[off : off + n])
            ids += seq.tokens[seq.kv_len : seq.kv_len + n]
            off += n
        batch = ForwardBatch.extend(
            ids, [s.row for s in seqs], [s.kv_len for s in seqs], lens, slots, self.runner.device
        )
        out = self.runner.forward(batch)
        for seq, n in zip(seqs, lens, strict=True):
            seq.kv_len += n
        return out.next_token_logits

    def decode(self, seqs: list[Seq]) -> torch.Tensor:
        slots = self.allocator.alloc(len(seqs))
        assert slots is not None
        for seq, slot in zip(seqs, slots, strict=True):
            self.pool.write(seq.row, seq.kv_len, slot.view(1))
        batch = ForwardBatch.decode(
            [s.tokens[-1] for s in seqs],
            [s.row for s in seqs],
            [s.kv_len + 1 for s in seqs],
            slots,
            self.runner.device,
        )
        out = self.runner.forward(batch)
        for seq in seqs:
            seq.kv_len += 1
        return out.next_token_logits

    def generate(self, seqs: list[Seq], first_logits: torch.Tensor) -> None:
        """Greedy decoding of NUM_NEW_TOKENS tokens for every seq, batched; with ``forced``
        (per seq, the tokens to feed), teacher-forced: the logits of each step are kept, the
        given token is fed."""
        logits = first_logits
        for step in range(NUM_NEW_TOKENS):
            for i, (seq, row) in enumerate(zip(seqs, logits, strict=True)):
                seq.logits.append(row.float().cpu())
                seq.tokens.append(
                    int(row.argmax()) if self.forced is None else self.forced[i][step]
                )
            if step + 1 < NUM_NEW_TOKENS:
                logits = self.decode(seqs)


def run_scratch(driver: Driver, prompts: list[list[int]]) -> list[Seq]:
    seqs = [driver.new_seq(p) for p in prompts]
    driver.generate(seqs, driver.extend(seqs, [len(p) for p in prompts]))
    return seqs


def run_prefix_hit(driver: Driver, prompts: list[list[int]]) -> list[Seq]:
    halves = [max(len(p) // 2, 1) for p in prompts]
    earlier = [driver.new_seq(p[:h]) for p, h in zip(prompts, halves, strict=True)]
    driver.extend(earlier, halves)
    kept = [driver.pool.req_to_token[s.row, : s.kv_len].to(torch.int64).clone() for s in earlier]
    driver.pool.free([s.row for s in earlier])  # the row goes; the slots stay (the tree holds them)
    k_before = [
        driver.runner.kv_cache.k_buffer[layer][torch.cat(kept)].clone()
        for layer in range(driver.runner.kv_cache.num_layers)
    ]
    seqs = [driver.new_seq(p, prefix_slots=slots) for p, slots in zip(prompts, kept, strict=True)]
    computed = [len(p) - h for p, h in zip(prompts, halves, strict=True)]
    first = driver.extend(seqs, computed)
    for layer in range(
        driver.runner.kv_cache.num_layers
    ):  # the cached prefix is read, never rewritten
        assert torch.equal(driver.runner.kv_cache.k_buffer[layer][torch.cat(kept)], k_before[layer])
    driver.generate(seqs, first)
    return seqs


def run_chunked(driver: Driver, prompts: list[list[int]]) -> list[Seq]:
    seqs = [driver.new_seq(p) for p in prompts]
    first: list[torch.Tensor | None] = [None] * len(seqs)
    while any(s.kv_len < len(p) for s, p in zip(seqs, prompts, strict=True)):
        active = [
            i for i, (s, p) in enumerate(zip(seqs, prompts, strict=True)) if s.kv_len < len(p)
        ]
        lens = [min(CHUNK, len(prompts[i]) - seqs[i].kv_len) for i in active]
        logits = driver.extend([seqs[i] for i in active], lens)
        for j, i in enumerate(active):
            if seqs[i].kv_len == len(prompts[i]):
                first[i] = logits[j]
    driver.generate(seqs, torch.stack([f for f in first if f is not None]))
    return seqs


def hf_greedy(
    model_dir: Path,
    prompts: list[list[int]],
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> list[tuple[list[int], torch.Tensor]]:
    """HF's greedy continuation and per-step logits [NUM_NEW_TOKENS, vocab] (float32, on the
    CPU) of each prompt, one prompt at a time (no padding in the oracle)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    results = []
    for prompt in prompts:
        out = model.generate(
            torch.tensor([prompt], device=device),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.int64, device=device),
            max_new_tokens=NUM_NEW_TOKENS,
            do_sample=False,
            eos_token_id=None,
            output_logits=True,
            return_dict_in_generate=True,
        )
        tokens = out.sequences[0, len(prompt) :].tolist()
        assert len(tokens) == NUM_NEW_TOKENS
        results.append((tokens, torch.cat(out.logits).float().cpu()))
    return results


@pytest.fixture(scope="module")
def prompts(tiny_tokenizer: object) -> list[list[int]]:
    ids = [tiny_tokenizer(p)["input_ids"] for p in PROMPTS]  # type: ignore[operator]
    lengths = sorted(len(p) for p in ids)
    assert lengths[0] < CHUNK < lengths[-1] and lengths[-1] > 16, lengths  # chunks, window, halves
    return ids


_oracle_cache: dict[str, list[tuple[list[int], torch.Tensor]]] = {}


def oracle(
    arch: str, model_dir: Path, prompts: list[list[int]]
) -> list[tuple[list[int], torch.Tensor]]:
    if arch not in _oracle_cache:
        _oracle_cache[arch] = hf_greedy(model_dir, prompts)
    return _oracle_cache[arch]


def make_runner(
    model_dir: Path,
    backend: str | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    tensor_cores: bool | None = None,
) -> ModelRunner:
    config = EngineConfig.from_flat(
        model_path=str(model_dir),
        dtype=dtype,
        device=device,
        max_total_tokens=2048,
        max_running_requests=16,
        max_context_len=256,
        attention_backend=backend,
        flashinfer_decode_tensor_cores=tensor_cores,
    )
    kv = KVManager.build(config)
    assert kv.kv_cache is not None
    return ModelRunner(config, kv.kv_cache, kv.req_to_token_pool)


def assert_matches_hf(
    seqs: list[Seq], prompts: list[list[int]], expected: list[tuple[list[int], torch.Tensor]]
) -> None:
    for seq, prompt, (hf_tokens, hf_logits) in zip(seqs, prompts, expected, strict=True):
        assert seq.tokens[len(prompt) :] == hf_tokens
        diff = (torch.stack(seq.logits) - hf_logits).abs().max().item()
        assert diff < LOGIT_TOL, f"max |logit diff| {diff:.2e}"
    assert (
        len({t for seq in seqs for t in seq.tokens[-NUM_NEW_TOKENS:]}) > 10
    )  # a non-degenerate test


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize(
    "mode", [run_scratch, run_prefix_hit, run_chunked], ids=["scratch", "prefix_hit", "chunked"]
)
def test_greedy_matches_hf(
    arch: str, mode: object, tiny_model_dirs: dict[str, Path], prompts: list[list[int]]
) -> None:
    driver = Driver(make_runner(tiny_model_dirs[arch]))
    seqs = mode(driver, prompts)  # type: ignore[operator]
    assert_matches_hf(seqs, prompts, oracle(arch, tiny_model_dirs[arch], prompts))


@pytest.mark.parametrize("arch", ["qwen3", "mistral"])
def test_flashinfer_backend_wiring_matches_hf_on_cpu(
    arch: str, tiny_model_dirs: dict[str, Path], prompts: list[list[int]]
) -> None:
    """FlashInferBackend end to end (metadata, one wrapper per window, plan/run, KV views) with
    the pure-torch kernels of paged_reference standing in for FlashInfer's CUDA ones."""
    runner = make_runner(tiny_model_dirs[arch])
    spec = runner.model.attention_spec
    runner.attn_backend = FlashInferBackend(
        spec, runner.kv_cache, runner.req_to_token_pool, wrappers=ReferenceWrappers()
    )
    seqs = run_prefix_hit(Driver(runner), prompts)
    assert_matches_hf(seqs, prompts, oracle(arch, tiny_model_dirs[arch], prompts))
