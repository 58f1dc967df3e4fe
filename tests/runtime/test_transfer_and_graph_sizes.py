"""The CPU side of the CUDA path's two helpers: ``radixserve.transfer`` (host-to-device copies
that never wait for the device) and the batch sizes the CUDA graphs are captured at. The
copies' non-blocking path and the graphs themselves run in the `gpu` tests
(``test_device_path.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixserve.config import EngineConfig
from radixserve.runtime.cuda_graph import capture_batch_sizes
from radixserve.transfer import to_device, to_device_packed


def test_packed_parts_come_back_in_order_with_their_values() -> None:
    parts = [[1, 2, 3], np.array([4, 5], dtype=np.int32), torch.tensor([6]), []]
    for device in ("cpu", "meta"):
        out = to_device_packed(parts, device)
        assert [t.shape[0] for t in out] == [3, 2, 1, 0]
        assert {t.dtype for t in out} == {torch.int64}
        assert {t.device.type for t in out} == {device}
    assert [t.tolist() for t in to_device_packed(parts, "cpu")] == [[1, 2, 3], [4, 5], [6], []]


def test_to_device_keeps_shape_and_casts() -> None:
    table = to_device(np.ones((2, 3)), "cpu", torch.float32)
    assert table.shape == (2, 3) and table.dtype == torch.float32
    assert to_device([True, False], "cpu", torch.bool).tolist() == [True, False]
    assert to_device([0.5], "meta", torch.float32).device.type == "meta"


def test_capture_batch_sizes() -> None:
    assert capture_batch_sizes(1) == [1]
    assert capture_batch_sizes(3) == [1, 2, 3]
    assert capture_batch_sizes(16) == [1, 2, 4, 8, 16]
    assert capture_batch_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    sizes = capture_batch_sizes(256)
    assert sizes[-1] == 256 and len(sizes) == 20
    assert max(b - a for a, b in zip(sizes, sizes[1:], strict=False)) == 16  # padding <= 15 rows
    with pytest.raises(ValueError):
        capture_batch_sizes(0)


def test_cuda_graph_options_are_validated() -> None:
    with pytest.raises(ValueError, match="cuda_graph_max_bs"):
        EngineConfig.from_flat(cuda_graph_max_bs=0)
    assert not EngineConfig().execution.disable_cuda_graph


def test_the_cpu_runner_captures_no_graphs(tiny_llama_dir: object) -> None:
    from radixserve.runtime.kv_manager import KVManager
    from radixserve.runtime.model_runner import ModelRunner

    config = EngineConfig(model_path=str(tiny_llama_dir), max_total_tokens=256)
    kv = KVManager.build(config)
    assert kv.kv_cache is not None
    assert ModelRunner(config, kv.kv_cache, kv.req_to_token_pool).graphs is None
