"""Tensor parallelism layer by layer: two gloo ranks (spawned processes) each load their slice of
a tiny checkpoint; the sharded linears, embedding, MLP, LM head and a whole forward (prefill and
decode over each rank's KV pool) must equal the unsharded model's, which each rank loads too."""

from __future__ import annotations

import datetime
import multiprocessing
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from radixserve.config import EngineConfig
from radixserve.memory_pool import KVCache, ReqToTokenPool
from radixserve.models.attention.registry import create_attention_backend
from radixserve.models.decoder import DecoderForCausalLM
from radixserve.models.forward_batch import ForwardBatch
from radixserve.models.loader import load_model
from radixserve.models.model_config import ModelConfig
from radixserve.models.parallel import SINGLE, TPGroup, check_tp_shapes, local_num_kv_heads
from radixserve.runtime.tp_ranks import make_groups

ATOL = 2e-5  # float32: the sharded sums add the same products in another order


def _forward(model: DecoderForCausalLM, ids: list[int], decode_id: int) -> torch.Tensor:
    """Logits ``[2, vocab]``: after a prefill of ``ids``, then after one decode step."""
    spec = model.attention_spec
    kv = KVCache(len(model.layers), 64, spec.num_kv_heads, spec.head_dim, torch.float32, "cpu")
    rows = ReqToTokenPool(2, 64)
    backend = create_attention_backend("torch_native", spec, kv, rows)
    n = len(ids)
    slots = torch.arange(1, n + 2)
    rows.write(0, 0, slots)
    out = []
    for batch in (
        ForwardBatch.extend(ids, [0], [0], [n], slots[:n]),
        ForwardBatch.decode([decode_id], [0], [n + 1], slots[n:]),
    ):
        backend.init_forward_metadata(batch)
        hidden = model(batch, backend)
        out.append(model.compute_logits(hidden[-1:]))
    return torch.cat(out)


def _check_rank(group: TPGroup, model_dir: str) -> None:
    whole, cfg = load_model(model_dir, torch.float32, progress=False)
    part, _ = load_model(model_dir, torch.float32, progress=False, tp=group)
    r, d = group.rank, cfg.head_dim
    w_attn, p_attn = whole.layers[0].self_attn, part.layers[0].self_attn
    # column-parallel QKV: this rank's query heads, then its KV heads (replicated if fewer)
    q_rows = cfg.q_size // 2
    kv0, nkv = group.kv_heads(cfg.num_kv_heads)
    w_qkv = w_attn.qkv_proj.weight
    k0 = cfg.q_size + kv0 * d
    v0 = cfg.q_size + cfg.kv_size + kv0 * d
    expected = torch.cat(
        [w_qkv[r * q_rows : (r + 1) * q_rows], w_qkv[k0 : k0 + nkv * d], w_qkv[v0 : v0 + nkv * d]]
    )
    assert torch.equal(p_attn.qkv_proj.weight, expected)
    # row-parallel o_proj: its input columns; the bias on rank 0 only
    o_cols = w_attn.o_proj.weight[:, r * q_rows : (r + 1) * q_rows]
    assert torch.equal(p_attn.o_proj.weight, o_cols)
    assert (p_attn.o_proj.bias is not None) == (cfg.o_bias and r == 0)
    # vocab-parallel embedding: exact (one rank contributes each row, the others zeros)
    ids = torch.arange(0, cfg.vocab_size, 5)
    assert torch.equal(part._embed(ids), whole._embed(ids))
    x = torch.randn(7, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    for layer in range(cfg.num_layers):  # column + row parallel MLP, one all-reduce
        mlp_w, mlp_p = whole.layers[layer].mlp, part.layers[layer].mlp
        torch.testing.assert_close(mlp_p(x), mlp_w(x), rtol=0, atol=ATOL)
    # LM head: each rank's columns gathered, the padding past the vocabulary dropped
    torch.testing.assert_close(part.compute_logits(x), whole.compute_logits(x), rtol=0, atol=ATOL)
    prompt = [(i * 37) % cfg.vocab_size for i in range(1, 20)]
    got, want = _forward(part, prompt, 11), _forward(whole, prompt, 11)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def _rank_main(rank: int, port: int, model_dir: str, conn: Connection) -> None:
    try:
        store = dist.TCPStore(
            "127.0.0.1", port, 2, is_master=False, timeout=datetime.timedelta(seconds=60)
        )
        config = EngineConfig.from_flat(model_path=model_dir, tp_size=2, tp_timeout_s=60)
        _check_rank(make_groups(config, rank, store).group, model_dir)
        conn.send(None)
    except BaseException:
        conn.send(traceback.format_exc())


def _run_two_ranks(model_dir: Path) -> None:
    store = dist.TCPStore(
        "127.0.0.1", 0, 2, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    ctx = multiprocessing.get_context("spawn")
    procs: list[Any] = []
    pipes = []
    for rank in range(2):
        reader, writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_rank_main, args=(rank, store.port, str(model_dir), writer))
        proc.start()
        procs.append(proc)
        pipes.append(reader)
    try:
        deadline = time.monotonic() + 100
        for rank, pipe in enumerate(pipes):
            while not pipe.poll(0.2):
                assert time.monotonic() < deadline, f"rank {rank} did not finish"
                assert procs[rank].exitcode is None, f"rank {rank} died ({procs[rank].exitcode})"
            error = pipe.recv()
            assert error is None, f"rank {rank}:\n{error}"
    finally:
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_sharded_layers_equal_unsharded(tiny_model_dirs: dict[str, Path], arch: str) -> None:
    """llama: one KV head (replicated on both ranks), q/k/v/o biases; qwen3: q/k norms, two KV
    heads (one per rank), head_dim != hidden / heads."""
    _run_two_ranks(tiny_model_dirs[arch])


@pytest.mark.timeout(150)
def test_padded_vocab_and_tied_embeddings(tmp_path: Path, tiny_tokenizer: Any) -> None:
    """A vocabulary that does not split evenly (2051 rows: each rank holds 1026, the last row
    of rank 1 is padding) under a tied embedding."""
    from radixserve.models.tiny import write_tiny_model

    model_dir = write_tiny_model(
        tmp_path / "qwen2", "qwen2", tokenizer=tiny_tokenizer, vocab_size=2051,
        tie_word_embeddings=True, num_layers=1, hidden_size=64, intermediate_size=96,
    )  # fmt: skip
    _run_two_ranks(model_dir)


def test_shard_arithmetic() -> None:
    group = TPGroup(1, 2, backend=object())
    assert group.split(10) == (5, 5)
    assert group.vocab_shard(2051) == (1026, 1025, 1026)
    assert TPGroup(0, 2, backend=object()).vocab_shard(2051) == (0, 1026, 1026)
    # fewer KV heads than ranks: replicated, each rank the head its query heads read
    assert [TPGroup(r, 4, backend=object()).kv_heads(2) for r in range(4)] == [
        (0, 1), (0, 1), (1, 1), (1, 1),
    ]  # fmt: skip
    assert TPGroup(1, 2, backend=object()).kv_heads(4) == (2, 2)
    assert local_num_kv_heads(1, 2) == 1 and local_num_kv_heads(8, 2) == 4
    assert SINGLE.split(7) == (0, 7) and not SINGLE.is_parallel
    with pytest.raises(ValueError, match="needs a backend"):
        TPGroup(0, 2)


def test_shapes_that_do_not_split_are_refused(tiny_model_dirs: dict[str, Path]) -> None:
    cfg = ModelConfig.from_dir(tiny_model_dirs["qwen3"])  # 6 heads, 2 KV heads
    check_tp_shapes(cfg, 2)
    with pytest.raises(ValueError, match="num_attention_heads 6"):
        check_tp_shapes(cfg, 4)
    with pytest.raises(ValueError, match="num_key_value_heads 2"):
        check_tp_shapes(cfg, 3)
