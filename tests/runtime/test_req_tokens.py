"""A request's int32 token buffer holds exactly what numpy's conversion of its ids gives, for
every form of ids a caller passes (the list fast path goes through ``struct``)."""

from __future__ import annotations

import numpy as np
import pytest

from radixserve.types import Req


@pytest.mark.parametrize(
    "ids",
    [
        [5, 0, 2**31 - 1, 17],
        (3, 4, 5),
        np.array([9, 8, 7], dtype=np.int64),
        [np.int64(4), np.int32(6), True],
        list(range(1000)),
    ],
)
def test_fill_ids_are_numpys_int32_conversion(ids: object) -> None:
    req = Req(rid="r", origin_input_ids=ids)  # type: ignore[arg-type]
    expected = np.asarray(ids, dtype=np.int32)
    assert req.fill_ids.dtype == np.int32
    assert req.fill_ids.tolist() == expected.tolist()
    req.append_output(11)
    req.output_ids.append(12)  # by hand: the buffer is rebuilt from the lists
    assert req.fill_ids.tolist() == [*expected.tolist(), 11, 12]


def test_ids_out_of_int32_fail_as_numpy_does() -> None:
    with pytest.raises(OverflowError):
        np.asarray([2**40], dtype=np.int32)
    with pytest.raises(OverflowError):
        Req(rid="r", origin_input_ids=[1, 2**40])
