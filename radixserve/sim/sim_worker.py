"""SimWorker: a model worker that computes nothing; each batch costs what the CostModel says.

It implements the scheduler's ``Worker`` protocol. The "sampled" tokens are seeded random ids
in ``[low, high)`` (the trace's ordinary token range): the prompts of later turns contain them,
so they take part in prefix matching like real answers, and never hit a stop token (the trace
gives every request its exact output length, as the benchmarks' ``ignore_eos`` does).
"""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np
import torch

from radixserve.runtime.model_worker import BatchResult
from radixserve.runtime.schedule_batch import ScheduleBatch
from radixserve.sim.cost_model import CostModel


class SimWorker:
    overlap = False  # no thread to overlap with: a step's cost is added to the virtual clock

    def __init__(self, cost: CostModel, token_range: tuple[int, int], seed: int = 0) -> None:
        low, high = token_range
        if not 0 <= low < high:
            raise ValueError(f"bad token id range [{low}, {high})")
        self.cost = cost
        self.low, self.high = low, high
        self._rng = np.random.default_rng(seed)
        self._tokens: list[int] = []  # a refill buffer: drawing in blocks is much cheaper
        self.device = torch.device("cpu")
        self.vocab_size = high
        self.eos_token_ids: frozenset[int] = frozenset()
        self.num_batches = 0
        self.last_cost_s = 0.0  # the cost of the last batch run; the simulation reads it
        self.busy_s = 0.0

    def run(self, batch: ScheduleBatch) -> BatchResult:
        fb = batch.forward_batch
        assert fb is not None
        if fb.is_decode:
            cost = self.cost.decode_s(fb.seq_lens_list)
        else:
            cost = self.cost.prefill_s(fb.extend_seq_lens_list, fb.extend_prefix_lens_list)
        self.num_batches += 1
        self.last_cost_s = cost
        self.busy_s += cost
        tokens: list[int | None] = [self._token() if s else None for s in batch.samples]
        return BatchResult(tokens)  # no logprobs: the simulated requests ask for none

    def submit(self, batch: ScheduleBatch) -> Future[BatchResult]:
        raise NotImplementedError("the simulator runs the scheduler without overlap")

    def check_alive(self) -> None:
        pass  # nothing runs that could die

    def update_weights_from_disk(self, model_path: str) -> None:
        raise ValueError("a simulated model has no weights to update")

    def weight_by_name(self, hf_name: str) -> torch.Tensor:
        raise ValueError("a simulated model has no weights")

    def shutdown(self) -> None:
        pass

    def _token(self) -> int:
        if not self._tokens:
            self._tokens = self._rng.integers(self.low, self.high, 4096).tolist()
        return self._tokens.pop()
