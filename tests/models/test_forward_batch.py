from __future__ import annotations

import pytest
import torch

from radixserve.models.forward_batch import ForwardBatch, ForwardMode


def test_extend_positions_and_lengths() -> None:
    b = ForwardBatch.extend([9, 8, 7, 6, 5, 4], [2, 0, 1], [0, 5, 2], [3, 1, 2], torch.arange(1, 7))
    assert b.forward_mode is ForwardMode.EXTEND and not b.is_decode
    assert b.positions.tolist() == [0, 1, 2, 5, 2, 3]
    assert b.seq_lens.tolist() == b.seq_lens_list == [3, 6, 4]
    assert b.extend_prefix_lens.tolist() == [0, 5, 2] and b.extend_seq_lens.tolist() == [3, 1, 2]
    assert b.batch_size == 3 and b.num_tokens == 6
    assert {
        t.dtype for t in (b.input_ids, b.positions, b.req_pool_indices, b.seq_lens, b.out_cache_loc)
    } == {torch.int64}


def test_decode_positions_and_lengths() -> None:
    b = ForwardBatch.decode(
        torch.tensor([3, 4]), [1, 0], [10, 1], torch.tensor([7, 8], dtype=torch.int32)
    )
    assert b.is_decode and b.positions.tolist() == [9, 0]
    assert b.extend_prefix_lens_list == [9, 0] and b.extend_seq_lens_list == [1, 1]
    assert b.out_cache_loc.dtype == torch.int64


@pytest.mark.parametrize(
    "args",
    [
        ([1, 2], [0], [0], [3], torch.arange(2)),  # 2 ids for 3 tokens
        ([1], [0], [0], [0], torch.arange(1)),  # empty extend
        ([1], [0], [-1], [1], torch.arange(1)),  # negative prefix
        ([1], [0, 1], [0], [1], torch.arange(1)),  # rows and lengths disagree
        ([1, 2], [0], [0], [2], torch.arange(3)),  # wrong number of slots
    ],
)
def test_extend_validation(args: tuple) -> None:
    with pytest.raises(ValueError):
        ForwardBatch.extend(*args)


def test_input_logprob_start_validation() -> None:
    ok = ForwardBatch.extend(
        [1, 2, 3], [0, 1], [0, 4], [2, 1], torch.arange(3), input_logprob_start=[1, None]
    )
    assert ok.input_logprob_start == [1, None]
    with pytest.raises(ValueError):
        ForwardBatch.extend(
            [1, 2, 3], [0, 1], [0, 4], [2, 1], torch.arange(3), input_logprob_start=[2, None]
        )


def test_decode_validation() -> None:
    with pytest.raises(ValueError):
        ForwardBatch.decode([1], [0], [0], torch.arange(1))
    with pytest.raises(ValueError):
        ForwardBatch.decode([1, 2], [0], [3], torch.arange(1))
