"""A model worker that computes nothing: the scheduler, policy, radix tree and KVManager run for
real around it, with no model (in the spirit of mini-sglang's ``test_cache_allocate.py``).

Its next token is a pure function of the tokens so far, so a request's output does not depend
on how it was batched, chunked, cached, retracted or preempted: a run with a tiny pool must give
exactly the outputs of a run with a large one.

Given a ``KVCache`` (``fake_scheduler(tier_tokens=...)`` or ``speculative_algorithm=...``, one
layer of one value per slot), it also plays the KV: each computed position's slot gets
:func:`kv_code` of the tokens up to it, and every forward checks that the slots of the
positions it reads (the cached prefix, loaded back from a KV tier or not) hold exactly those
codes. A VERIFY batch is verified greedily against the same "model": a drafted token is kept
while it equals the model's token there (so a rejected draft's KV, were it ever cached, would
fail the check of a later forward).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

import torch

from radixserve.config import EngineConfig
from radixserve.memory_pool import KVCache, ReqToTokenPool, TokenToKVPoolAllocator
from radixserve.memory_pool.kv_tier import TierLayout, host_tier
from radixserve.radix import NoPrefixCache, PrefixCache, RadixCache
from radixserve.radix.tiered_cache import TieredRadixCache
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.model_worker import BatchResult
from radixserve.runtime.schedule_batch import ScheduleBatch
from radixserve.runtime.scheduler import Scheduler
from radixserve.runtime.spec_verify import VerifyResult

VOCAB = 1000


def next_token(tokens: list[int]) -> int:
    """Deterministic, content-only "model"."""
    h = len(tokens)
    for t in tokens[-8:]:
        h = (h * 1_000_003 + t) % 2_147_483_647
    return h % VOCAB


def kv_codes(tokens: list[int]) -> torch.Tensor:
    """The fake KV of each position: a code of the position and the tokens up to it (exact in
    float32)."""
    codes = []
    for p in range(len(tokens)):
        h = p
        for t in tokens[max(0, p - 7) : p + 1]:
            h = (h * 1_000_003 + t) % 2_147_483_647
        codes.append(h % (1 << 20))
    return torch.tensor(codes, dtype=torch.float32)


class FakeWorker:
    """Checks what a real forward relies on, then "samples" :func:`next_token`: every token of
    the sequence has a KV slot in the request's row, and the slots of the batch are distinct."""

    def __init__(
        self, kv: KVManager, overlap: bool = False, model: Callable[[list[int]], int] = next_token
    ) -> None:
        self.kv = kv
        self.model = model
        self.overlap = overlap
        self.device = torch.device("cpu")
        self.vocab_size = VOCAB
        self.eos_token_ids: frozenset[int] = frozenset()
        self.num_forwards = 0
        self.computed: dict[str, int] = {}  # rid -> tokens computed over all its forwards

    def run(self, batch: ScheduleBatch) -> BatchResult:
        fb = batch.forward_batch
        assert fb is not None
        self.num_forwards += 1
        if batch.is_verify:
            return self._verify(batch)
        slots = fb.out_cache_loc.tolist()
        assert len(set(slots)) == len(slots) and 0 not in slots, "a slot given twice or slot 0"
        new = set(slots)
        tokens: list[int | None] = []
        for i, req in enumerate(batch.reqs):
            row = self.kv.req_to_token_pool.req_to_token[fb.req_pool_indices[i]]
            seq_len = int(fb.seq_lens[i])
            assert bool((row[:seq_len] > 0).all()), "a token without a KV slot"
            if not req.is_finished:
                self._play_kv(req.fill_ids[:seq_len].tolist(), row[:seq_len], new)
                computed = sum(1 for s in row[:seq_len].tolist() if s in new)
                self.computed[req.rid] = self.computed.get(req.rid, 0) + computed
            if not batch.samples[i]:
                tokens.append(None)
                continue
            if req.is_finished:  # finished in the batch before (overlap): its token is dropped
                tokens.append(0)
                continue
            # the sequence this forward sees: the request's tokens up to seq_len
            tokens.append(self.model(req.fill_ids[:seq_len].tolist()))
        n = len(batch.reqs)
        return BatchResult(tokens, [None] * n, [[] for _ in range(n)], [None] * n)

    def _verify(self, batch: ScheduleBatch) -> BatchResult:
        """Each request's last token and drafts computed; the drafts kept while they equal
        the model's tokens, then the model's next one."""
        fb = batch.forward_batch
        assert fb is not None
        new = set(fb.out_cache_loc.tolist())
        assert len(new) == fb.num_tokens and 0 not in new, "a slot given twice or slot 0"
        verified = VerifyResult(len(batch.reqs))
        for i, req in enumerate(batch.reqs):
            draft = batch.drafts[i].tolist()
            seq = [*req.fill_ids.tolist(), *draft]
            seq_len = int(fb.seq_lens[i])
            assert seq_len == len(seq), "a verify computes the request's tokens and its drafts"
            row = self.kv.req_to_token_pool.req_to_token[fb.req_pool_indices[i]][:seq_len]
            assert bool((row > 0).all()), "a token without a KV slot"
            self._play_kv(seq, row, new)
            self.computed[req.rid] = self.computed.get(req.rid, 0) + 1 + len(draft)
            base = seq_len - len(draft)
            for j in range(len(draft) + 1):
                verified.tokens[i].append(self.model(seq[: base + j]))
                if j == len(draft) or draft[j] != verified.tokens[i][-1]:
                    break
            verified.num_accepted[i] = len(verified.tokens[i]) - 1
        n = len(batch.reqs)
        last = [ts[-1] for ts in verified.tokens]
        result = BatchResult(last, [None] * n, [[] for _ in range(n)], [None] * n)
        result.verified = verified
        return result

    def _play_kv(self, tokens: list[int], row: torch.Tensor, new: set[int]) -> None:
        """Write the codes of the positions computed now; check those read from the cache."""
        kv = self.kv.kv_cache
        if kv is None:
            return
        k, _ = kv.get_kv(0)
        codes = kv_codes(tokens)
        is_new = torch.tensor([s in new for s in row.tolist()])
        slots = row.to(torch.int64)
        cached = slots[~is_new]
        assert torch.equal(k[cached, 0, 0], codes[~is_new]), "a cached slot holds another KV"
        k[slots[is_new], 0, 0] = codes[is_new]

    def submit(self, batch: ScheduleBatch) -> Future[BatchResult]:
        """Overlap: the forward "runs" when its result is asked for, after the scheduler has
        processed the batch before (whose sampled tokens a real decode reads on the device)."""
        return _Deferred(lambda: self.run(batch))

    def check_alive(self) -> None:
        pass

    def update_weights_from_disk(self, model_path: str) -> None:
        raise ValueError("a fake model has no weights to update")

    def weight_by_name(self, hf_name: str) -> torch.Tensor:
        raise ValueError("a fake model has no weights")

    def shutdown(self) -> None:
        pass


class _Deferred(Future[BatchResult]):
    def __init__(self, fn: Callable[[], BatchResult]) -> None:
        super().__init__()
        self._fn = fn

    def result(self, timeout: float | None = None) -> BatchResult:
        if not self.done():
            self.set_result(self._fn())
        return super().result(timeout)


def fake_scheduler(
    page_size: int = 1,
    capacity: int = 4096,
    *,
    max_running: int = 16,
    max_context_len: int = 512,
    radix: bool = True,
    overlap: bool = False,
    tier_tokens: int | None = None,
    model: Callable[[list[int]], int] = next_token,
    **config: object,
) -> tuple[Scheduler, FakeWorker]:
    """A Scheduler over ``capacity`` usable KV slots (whole pages) with a :class:`FakeWorker`
    running ``model``; ``tier_tokens``: with a host KV tier of that many tokens under the tree
    (and a fake KV, as with speculative decoding on)."""
    engine_config = EngineConfig.from_flat(
        page_size=page_size,
        max_running_requests=max_running,
        disable_radix_cache=not radix,
        disable_overlap_schedule=not overlap,
        enable_hierarchical_cache=tier_tokens is not None,
        **config,  # type: ignore[arg-type]
    )
    tree: PrefixCache = RadixCache(page_size) if radix else NoPrefixCache(page_size)
    slots = (-(-capacity // page_size) + 1) * page_size
    kv_cache = None
    if tier_tokens is not None or engine_config.speculative.speculative_algorithm is not None:
        kv_cache = KVCache(1, slots, 1, 1, torch.float32, "cpu")
    if tier_tokens is not None:
        assert kv_cache is not None
        tier = host_tier(TierLayout.of(kv_cache, page_size), tier_tokens)
        tree = TieredRadixCache(
            page_size, tier, kv_cache, engine_config.kv_tier.kv_tier_write_policy
        )
    kv = KVManager(
        ReqToTokenPool(max_running, max_context_len),
        TokenToKVPoolAllocator(slots, page_size),
        tree,
        kv_cache,
    )
    worker = FakeWorker(kv, overlap, model)
    return Scheduler(engine_config, kv=kv, worker=worker), worker
