"""Tensor parallelism over several machines: the config's checks and where the ranks meet
(the run across two network namespaces is ``tests/api/test_multi_host.py``, slow)."""

from __future__ import annotations

import pytest

from radixserve.config import EngineConfig
from radixserve.runtime.tp_ranks import gloo_hostname, rank_config, store_address


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        (dict(tp_size=2, nnodes=2), "dist_init_addr"),
        (dict(tp_size=3, nnodes=2, dist_init_addr="10.0.0.1:29500"), "divide"),
        (dict(tp_size=2, nnodes=2, node_rank=2, dist_init_addr="10.0.0.1:29500"), "node_rank"),
        (dict(tp_size=2, nnodes=2, dist_init_addr="10.0.0.1"), "HOST:PORT"),
    ],
)
def test_bad_node_configs_are_refused(fields: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        EngineConfig.from_flat(**fields)


def test_where_the_ranks_meet() -> None:
    one = EngineConfig.from_flat(tp_size=2)
    assert store_address(one) == ("127.0.0.1", 0) and gloo_hostname(one) == "127.0.0.1"
    two = EngineConfig.from_flat(tp_size=4, nnodes=2, node_rank=1, dist_init_addr="127.0.0.1:29511")
    assert store_address(two) == ("127.0.0.1", 29511)
    assert gloo_hostname(two) == "127.0.0.1"  # the address this machine reaches node 0 from
    gpu = EngineConfig.from_flat(
        tp_size=4, nnodes=2, dist_init_addr="127.0.0.1:29511", device="cuda"
    )
    assert rank_config(gpu, 3).device == "cuda:1"  # rank 3 is node 1's second GPU
