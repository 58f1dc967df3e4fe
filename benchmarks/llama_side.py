"""llama.cpp sides of ``model_throughput.py``: one llama-server per GGUF, driven over HTTP.

- Prefill: ``/completion`` of the ``--prompt-len`` prompt with ``cache_prompt: false`` (so the
  whole prompt is computed each time; its ``timings.prompt_n`` is checked) and one token out,
  timed by the wall clock like the other sides.
- Decode at batch B: B sequences of ``--context-len`` random tokens, one per slot, prefilled
  once (their slots keep them: the prompt cache). A repetition sends B requests at once, each
  its sequence so far (so the context grows by the steps of each repetition, as on the other
  sides; the cached prefix is not recomputed), twice: with 1 token to generate, then with
  ``1 + steps``. The server batches the B slots into one decode step (continuous batching).
  The difference of the two wall times is ``steps`` decode steps of the whole batch: the
  prompt evaluation of the uncached tail, the HTTP round trips and the requests' arrival skew
  are in both and cancel. (The server's own ``timings.predicted_ms`` of the long requests
  agrees: 45 vs 45 ms per step at batch 1, 80 vs 74 at batch 4, in a check on this host.) Each
  request's ``timings.prompt_n`` is checked to be 1: a slot that lost its sequence fails loudly.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from llamacpp import LlamaServer

# radixserve configs and the GGUF type of the same storage: the ratio columns pair them
PAIRS = {"bfloat16": "bf16", "float32": "f32", "bfloat16+int8": "q8_0", "float32+int8": "q8_0"}


class LlamaSide:
    def __init__(
        self,
        binary: Path,
        outtype: str,
        gguf: Path,
        port: int,
        slots: int,
        threads: int,
        ctx: int,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.name = f"llama {outtype}"
        self.outtype = outtype
        self.server = LlamaServer(binary, gguf, port, slots, threads, ctx, extra).__enter__()
        self.pool = ThreadPoolExecutor(max_workers=slots)

    def close(self) -> None:
        self.pool.shutdown()
        self.server.__exit__()

    def prefill(self, prompts: torch.Tensor) -> None:
        prompt = prompts.reshape(-1).tolist()
        out = self.server.complete(prompt, 1, cache_prompt=False)
        if out["timings"]["prompt_n"] != len(prompt):  # a cached prefix would flatter it
            raise RuntimeError(f"llama-server computed {out['timings']['prompt_n']} prompt tokens")


class LlamaDecodeRun:
    """A batch of sequences prefilled once into the slots; :meth:`step_time` times steps."""

    def __init__(self, side: LlamaSide, prompts: torch.Tensor) -> None:
        self.side = side
        self.seqs: list[list[int]] = prompts.tolist()
        self._generate(1, cached=False)

    def _generate(self, n: int, cached: bool = True) -> float:
        start = time.perf_counter()
        futures = [self.side.pool.submit(self.side.server.complete, s, n) for s in self.seqs]
        outs = [f.result() for f in futures]
        wall = time.perf_counter() - start
        for seq, out in zip(self.seqs, outs, strict=True):
            # the slot kept the sequence: only the last token (not yet in its KV) is evaluated
            if cached and out["timings"]["prompt_n"] != 1:
                raise RuntimeError(f"a slot lost its sequence: {out['timings']}")
            seq.extend(out["tokens"])
        return wall

    def step_time(self, steps: int) -> float:
        """Seconds per decode step of the whole batch, over ``steps`` steps."""
        short = self._generate(1)
        long = self._generate(1 + steps)
        return max(long - short, 1e-9) / steps


def parse_ggufs(entries: list[str]) -> dict[str, Path | None]:
    """``bf16=PATH`` or ``bf16`` (convert on the fly) per entry, in order."""
    out: dict[str, Path | None] = {}
    for entry in entries:
        outtype, _, path = entry.partition("=")
        if outtype not in set(PAIRS.values()):
            raise SystemExit(
                f"--llama-gguf: {outtype!r} is not one of {sorted(set(PAIRS.values()))}"
            )
        out[outtype] = Path(path) if path else None
    return out


Column = tuple[str, int, list[int]]  # label, a radixserve side, the sides it is divided by


def ratio_columns(configs: list[str], num_hf: int, llama: list[str]) -> list[Column]:
    """The ratio columns of the table, whose sides are radixserve's (``configs``), then
    ``num_hf`` HF sides, then llama sides of GGUF types ``llama``: each radixserve side over
    the best HF side, and over the llama side of the same storage (:data:`PAIRS`)."""
    n_rs = len(configs)
    hf = list(range(n_rs, n_rs + num_hf))
    columns: list[Column] = [(f"rs {c}/best HF", i, hf) for i, c in enumerate(configs) if hf]
    for i, c in enumerate(configs):
        if PAIRS.get(c) in llama:
            columns.append((f"rs {c}/llama {PAIRS[c]}", i, [n_rs + num_hf + llama.index(PAIRS[c])]))
    return columns


def ratio_header(columns: list[Column]) -> str:
    return "".join(f"{label:>{len(label) + 3}s}" for label, _, _ in columns)


def ratio_cells(columns: list[Column], values: list[float]) -> str:
    """One row's ratios, each under its label."""
    cells = [(label, values[i] / max(values[j] for j in over)) for label, i, over in columns]
    return "".join(f"{ratio:.2f}x".rjust(len(label) + 3) for label, ratio in cells)
