"""The graph runners' logic on CPU: verify and decode batches through
:class:`VerifyGraphRunner` and :class:`CudaGraphRunner`, their graphs stood in for by
:class:`EagerGraph` (each replay runs the captured forward again over the graphs' fixed inputs),
FlashInfer's wrappers by the torch reference wrappers in CUDA-graph mode (their tables in fixed
buffers, FlashInfer's rules on batch size and query rows enforced). The replayed logits and the
K/V written equal an eager forward's, at captured and padded sizes, a smaller batch after a
larger one. The graphs themselves run in the ``gpu`` tests (``test_device_spec.py``,
``test_device_path.py``)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from test_model_parity import Driver, Seq, make_runner

from radixserve.config import EngineConfig
from radixserve.models.attention.flashinfer_backend import FlashInferBackend
from radixserve.models.attention.paged_reference import ReferenceWrappers
from radixserve.models.forward_batch import ForwardBatch
from radixserve.runtime.cuda_graph import CudaGraphRunner, capture_eagerly
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.model_runner import ModelRunner
from radixserve.runtime.spec_calibrate import measure_step_costs
from radixserve.runtime.verify_graph import VerifyGraphRunner, padded_layout

pytestmark = pytest.mark.timeout(180)

DRAFT_TOKENS = 5  # a request's last token and up to four drafts


def test_padded_layout_gives_every_padding_request_a_token() -> None:
    # two real requests in a graph of 4 (5 requests, 4 * 5 + 1 = 21 tokens)
    qo, kv = padded_layout([5, 1], [30, 12], 4, 21)
    assert qo == [5, 1, 1, 1, 13] and kv == [30, 12, 1, 1, 13]
    assert sum(qo) == 21
    qo, kv = padded_layout([5] * 4, [9] * 4, 4, 21)  # full: the last request keeps one token
    assert qo == [5, 5, 5, 5, 1] and kv == [9, 9, 9, 9, 1]
    qo, kv = padded_layout([], [], 2, 11)  # the capture's batch: padding alone
    assert qo == [1, 1, 9] and kv == [1, 1, 9]
    with pytest.raises(ValueError):
        padded_layout([1, 1, 1], [4, 4, 4], 2, 11)  # more requests than the graph's size
    with pytest.raises(ValueError):
        padded_layout([6, 5], [9, 9], 2, 11)  # more tokens than it holds


def reference_runner(model_dir: Path) -> tuple[ModelRunner, FlashInferBackend]:
    """A float32 CPU runner whose attention is FlashInfer's backend over the reference
    wrappers."""
    runner = make_runner(model_dir)
    backend = FlashInferBackend(
        runner.model.attention_spec,
        runner.kv_cache,
        runner.req_to_token_pool,
        wrappers=ReferenceWrappers(),
    )
    runner.attn_backend = backend
    return runner, backend


def prefilled(driver: Driver, n: int, seed: str) -> list[Seq]:
    rng = random.Random(seed)
    seqs = [
        driver.new_seq([rng.randrange(5, 1000) for _ in range(rng.randrange(10, 40))])
        for _ in range(n)
    ]
    driver.extend(seqs, [len(s.tokens) for s in seqs])
    return seqs


def both_ways(
    runner: ModelRunner, batch: ForwardBatch, attr: str, graphs: object
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch``'s logits eagerly, then through ``runner.<attr>`` (``graphs``); the K/V the
    replay writes must be the eager run's (it is wiped in between)."""
    setattr(runner, attr, None)
    eager = runner.forward(batch).next_token_logits
    slots = batch.out_cache_loc
    k_eager = runner.kv_cache.k_buffer[0][slots].clone()
    runner.kv_cache.k_buffer[0][slots] = 0
    setattr(runner, attr, graphs)
    replayed = runner.forward(batch).next_token_logits
    torch.testing.assert_close(runner.kv_cache.k_buffer[0][slots], k_eager)
    return replayed, eager


def check_verify_replays(runner: ModelRunner, graphs: VerifyGraphRunner, tol: float) -> None:
    """Verify batches of 3, 4, 1 and 2 requests (padded and exact sizes, smaller after larger),
    each request 1 to ``DRAFT_TOKENS`` tokens on its cached prefix: replayed as computed."""
    driver = Driver(runner)
    seqs = prefilled(driver, 6, "verify")
    rng = random.Random(1)
    for bs in (3, 4, 1, 2):
        part = rng.sample(seqs, bs)
        lens = [rng.randrange(1, DRAFT_TOKENS + 1) for _ in part]  # 0 to 4 drafts each
        slots = driver.allocator.alloc(sum(lens))
        assert slots is not None
        rows = []  # per request: its new token, then its drafts
        off = 0
        for seq, n in zip(part, lens, strict=True):
            driver.pool.write(seq.row, seq.kv_len, slots[off : off + n])
            rows.append([rng.randrange(5, 1000) for _ in range(n)])
            off += n
        ids = [t for row in rows for t in row]
        prefix = [s.kv_len for s in part]
        batch = ForwardBatch.verify(ids, [s.row for s in part], prefix, lens, slots, runner.device)
        assert graphs.can_run(batch)
        replayed, eager = both_ways(runner, batch, "verify_graphs", graphs)
        assert replayed.shape == (sum(lens), runner.vocab_size)
        torch.testing.assert_close(replayed, eager, rtol=tol, atol=tol)
        for seq, row in zip(part, rows, strict=True):  # as if every draft was accepted
            seq.tokens += row
            seq.kv_len += len(row)


def test_verify_replays_equal_the_eager_verify(tiny_model_dirs: dict[str, Path]) -> None:
    runner, backend = reference_runner(tiny_model_dirs["llama"])
    graphs = VerifyGraphRunner(
        runner.model,
        backend,
        max_bs=4,
        tokens_per_request=DRAFT_TOKENS,
        max_context_len=runner.max_context_len,
        device=runner.device,
        capture=capture_eagerly,
    )
    assert graphs.sizes == [1, 2, 4]
    check_verify_replays(runner, graphs, 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral"])
def test_verify_graphs_on_gpu(arch: str, device: str, device_model_dirs: dict[str, Path]) -> None:
    """The same on a GPU: CUDA graphs of FlashInfer's paged prefill in graph mode, bf16 (a
    sliding window: mistral; tensor-core decode graphs beside: qwen3)."""
    if not device.startswith("cuda"):
        pytest.skip("CUDA graphs need a CUDA GPU (--device cpu: there are none to replay)")
    runner = make_runner(device_model_dirs[arch], dtype="bfloat16", device=device)
    assert isinstance(runner.attn_backend, FlashInferBackend)
    graphs = VerifyGraphRunner(
        runner.model,
        runner.attn_backend,
        4,
        DRAFT_TOKENS,
        runner.max_context_len,
        runner.device,
    )
    check_verify_replays(runner, graphs, 3e-2)


def test_verify_graphs_refuse_what_they_do_not_hold(tiny_model_dirs: dict[str, Path]) -> None:
    runner, backend = reference_runner(tiny_model_dirs["llama"])
    graphs = VerifyGraphRunner(
        runner.model, backend, 2, DRAFT_TOKENS, runner.max_context_len, runner.device,
        capture=capture_eagerly,
    )  # fmt: skip

    def verify(lens: list[int]) -> ForwardBatch:
        n = sum(lens)
        slots = torch.arange(1, n + 1)
        return ForwardBatch.verify([7] * n, list(range(len(lens))), [3] * len(lens), lens, slots)

    assert graphs.can_run(verify([DRAFT_TOKENS, 1]))
    assert not graphs.can_run(verify([DRAFT_TOKENS + 1]))  # a longer row than captured
    assert not graphs.can_run(verify([1, 1, 1]))  # more requests than the largest size
    decode = ForwardBatch.decode([7], [0], [4], torch.tensor([1]))
    assert not graphs.can_run(decode)


def test_the_cost_model_is_measured_through_the_verify_graphs(
    tiny_model_dirs: dict[str, Path],
) -> None:
    """At start, with verify graphs, the calibration times a verify of each graph's size (what
    a verify of that many requests then costs, whatever it drafts); they hold the plan."""
    config = EngineConfig.from_flat(
        model_path=str(tiny_model_dirs["llama"]), max_total_tokens=2048, max_context_len=256
    )
    kv = KVManager.build(config)
    assert kv.kv_cache is not None
    runner = ModelRunner(config, kv.kv_cache, kv.req_to_token_pool)
    backend = FlashInferBackend(
        runner.model.attention_spec, kv.kv_cache, kv.req_to_token_pool, ReferenceWrappers()
    )
    runner.attn_backend = backend
    runner.verify_graphs = VerifyGraphRunner(
        runner.model, backend, 4, DRAFT_TOKENS, 256, runner.device, capture=capture_eagerly
    )
    free = kv.allocator.available_size()
    costs = measure_step_costs(runner, kv, 4, 4 * DRAFT_TOKENS)
    assert costs is not None and costs.graph_sizes == (1, 2, 4)
    assert all(b >= a > 0 for a, b in zip(costs.graph_s, costs.graph_s[1:], strict=False))
    assert costs.verify_step(3, 5, 0) == costs.graph_s[2]  # 3 requests: the graph of 4
    assert kv.allocator.available_size() == free  # the scratch slots came back


def test_decode_replays_equal_the_eager_decode(tiny_model_dirs: dict[str, Path]) -> None:
    runner, backend = reference_runner(tiny_model_dirs["qwen3"])
    graphs = CudaGraphRunner(
        runner.model, backend, 4, runner.max_context_len, runner.device, capture=capture_eagerly
    )
    driver = Driver(runner)
    seqs = prefilled(driver, 5, "decode")
    for bs in (3, 4, 1):
        part = seqs[:bs]
        slots = driver.allocator.alloc(bs)
        assert slots is not None
        for seq, slot in zip(part, slots, strict=True):
            driver.pool.write(seq.row, seq.kv_len, slot.view(1))
        batch = ForwardBatch.decode(
            [s.tokens[-1] for s in part], [s.row for s in part], [s.kv_len + 1 for s in part], slots
        )
        replayed, eager = both_ways(runner, batch, "graphs", graphs)
        torch.testing.assert_close(replayed, eager, rtol=1e-4, atol=1e-4)
        for seq, row in zip(part, eager, strict=True):
            seq.kv_len += 1
            seq.tokens.append(int(row.argmax()))
