"""ReqToTokenPool's host mirror: on a device other than the CPU the scheduler's reads never
touch the device table (on a GPU each would synchronize with the forward in flight).

``meta`` stands in for the device here: a table there holds no values at all, so every read
that passes can only have come from the host mirror."""

from __future__ import annotations

import torch

from radixserve.memory_pool import ReqToTokenPool


def test_a_device_table_is_read_from_its_host_mirror() -> None:
    pool = ReqToTokenPool(4, 16, "meta")
    assert pool.req_to_token.device.type == "meta"
    pool.write_spans([1, 2], [0, 3], [2, 3], torch.arange(10, 15))  # an extend
    pool.write(3, 1, torch.tensor([7, 8]))
    pool.write_spans([1, 2], [2, 6], [1, 1], torch.tensor([20, 21]))  # a decode step
    assert pool.read(1, 0, 3).tolist() == [10, 11, 20]
    assert pool.read(2, 3, 7).tolist() == [12, 13, 14, 21]
    assert pool.read(3, 0, 3).tolist() == [0, 7, 8]
    assert pool.read(1, 0, 3).device.type == "cpu" and pool.read(1, 0, 3).dtype == torch.int64


def test_on_the_cpu_the_mirror_is_the_table() -> None:
    pool = ReqToTokenPool(2, 8)
    pool.write_spans([0, 1], [0, 2], [3, 1], torch.tensor([5, 6, 7, 9]))
    pool.write(1, 0, torch.tensor([1, 2]))
    assert pool.req_to_token.tolist() == [[5, 6, 7, 0, 0, 0, 0, 0], [1, 2, 9, 0, 0, 0, 0, 0]]
    assert pool.read(1, 0, 3).tolist() == [1, 2, 9]
