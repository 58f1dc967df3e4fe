"""Hugging Face transformers baselines over the same sessions, batched turn by turn.

Sessions run in batches of ``batch_size`` (static batching: a batch starts when its last
session has arrived). Each turn is one ``generate`` over the batch, greedy, ``min_new_tokens ==
max_new_tokens`` (the batch's longest answer), so lengths match the trace; a row keeps only its
own answer length (extra tokens are dropped, or masked out when the KV is carried).

- ``recompute``: each turn re-prefills the whole history, left padded (what a server without a
  prefix cache does).
- ``carry_kv``: the batch's KV cache carries over to the next turn, which appends the
  new user messages (left padded, masked) after the last answers: only new tokens are computed.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from typing import Any

import torch
from tqdm import tqdm

from radixserve.bench.records import RequestRecord
from radixserve.bench.workload import Session, num_requests

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def load_hf_model(model_path: str, dtype: str) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPES.get(dtype, torch.float32))
    return model.eval()


def _left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [batch, width]
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(row)
            mask[i, width - len(row) :] = 1
    return ids, mask


def _cache_field() -> str:
    """What ``generate`` calls the cache it continues and returns: ``cache`` where transformers
    has renamed ``past_key_values`` (5.x, which warns of the old name and drops it in 6)."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    fields = {f.name for f in dataclasses.fields(GenerateDecoderOnlyOutput)}
    return "cache" if "cache" in fields else "past_key_values"


class HFRunner:
    def __init__(
        self, model_path: str, dtype: str, num_threads: int | None = None, device: str = "cpu"
    ) -> None:
        self._from_arrival = False
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.device = torch.device(device)
        self.model = load_hf_model(model_path, dtype).to(self.device)
        pad = self.model.config.pad_token_id
        self.pad_id = int(pad) if pad is not None else 0
        self.cache_field = _cache_field()

    def _generate(self, ids: torch.Tensor, mask: torch.Tensor, new: int, cache: Any) -> Any:
        """``generate`` on the model's device; the returned ``sequences`` are on the CPU."""
        result = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            **{self.cache_field: cache},
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
        )
        result.sequences = result.sequences.cpu()
        return result

    @torch.inference_mode()
    def warmup(self) -> None:
        ids, mask = _left_pad([[1, 2, 3, 4]], self.pad_id)
        self._generate(ids, mask, 2, None)

    @torch.inference_mode()
    def run(
        self, sessions: list[Session], batch_size: int, carry_kv: bool, desc: str
    ) -> tuple[list[RequestRecord], float]:
        todo = sorted(sessions, key=lambda s: (s.arrival_s, s.sid))
        # open loop (arrival times): first-turn latency counts from arrival, batching wait included
        self._from_arrival = any(s.arrival_s > 0 for s in sessions)
        records: list[RequestRecord] = []
        bar = tqdm(total=num_requests(sessions), desc=desc, unit="req", leave=False)
        start = time.perf_counter()
        try:
            for b in range(0, len(todo), batch_size):
                batch = todo[b : b + batch_size]
                delay = start + max(s.arrival_s for s in batch) - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                records += self._run_batch(batch, carry_kv, start, bar)
        finally:
            bar.close()
        return records, time.perf_counter() - start

    def _run_batch(
        self, batch: list[Session], carry_kv: bool, start: float, bar: tqdm[Any]
    ) -> list[RequestRecord]:
        num_turns = len(batch[0].turns)
        if any(len(s.turns) != num_turns for s in batch):
            raise ValueError("the sessions of an HF batch must have the same number of turns")
        histories = [list(s.prefix_ids) for s in batch]
        seq = mask = None  # carry_kv: every token so far and its mask, [batch, seq_len]
        cache: Any = None
        out: list[RequestRecord] = []
        for t in range(num_turns):
            turns = [s.turns[t] for s in batch]
            prompts = [h + turn.user_ids for h, turn in zip(histories, turns, strict=True)]
            lens = [turn.answer_len for turn in turns]
            new = max(lens)
            sent = time.perf_counter()
            if carry_kv and seq is not None and mask is not None:
                chunk, chunk_mask = _left_pad([turn.user_ids for turn in turns], self.pad_id)
                ids, in_mask = torch.cat([seq, chunk], 1), torch.cat([mask, chunk_mask], 1)
            else:
                ids, in_mask = _left_pad(prompts, self.pad_id)
            result = self._generate(ids, in_mask, new, cache if carry_kv else None)
            done = time.perf_counter()
            gen = result.sequences[:, ids.shape[1] :]  # [batch, new]
            if carry_kv:
                cache = getattr(result, self.cache_field)
                gen_mask = (torch.arange(new)[None, :] < torch.tensor(lens)[:, None]).long()
                seq, mask = result.sequences, torch.cat([in_mask, gen_mask], 1)
            for i, session in enumerate(batch):
                answer = gen[i, : lens[i]].tolist()
                sent_s = session.arrival_s if t == 0 and self._from_arrival else sent - start
                # carried KV: everything but the previous answer's last token was computed before
                cached = max(len(histories[i]) - 1, 0) if carry_kv and t > 0 else 0
                out.append(
                    RequestRecord(
                        session.sid, t, prompts[i], answer, sent_s, done - start, None, cached
                    )
                )
                histories[i] = prompts[i] + answer
            bar.update(len(batch))
        return out

    def close(self) -> None:
        del self.model
        gc.collect()
