"""Speculative decoding on the device path in bf16: on a CUDA GPU a verify runs FlashInfer's
extend kernels between CUDA-graph decode steps, eagerly or replayed from graphs of its own
(``--cuda-graph-verify``); with ``--device cpu`` the same test is the dry run here. Greedy outputs with drafts equal those without, except after a near tie: in bf16 a
verify and a decode step round differently, so where the plain run's two best tokens are within
``TIE`` the two runs may part (the test then checks that margin at the step where they do).

Marked ``gpu``: deselected by default, run by ``pytest -m gpu [--device cpu]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_device_path import TIE
from test_spec_decode import repetitive_prompts

from radixserve import Engine

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

PARAMS = {"max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True}


def generate(
    model: Path, device: str, spec: str | None, verify_graphs: bool = False
) -> tuple[list[Any], dict[str, Any]]:
    """Each prompt twice (the second time drafts from the tree too), greedy, top-2 logprobs;
    ``verify_graphs``: verifies replayed from CUDA graphs (``--cuda-graph-verify``)."""
    from radixserve.spec import StepCosts

    prompts = repetitive_prompts(7)
    config = dict(
        dtype="bfloat16", device=device, max_total_tokens=4096, cuda_graph_verify=verify_graphs
    )
    with Engine(str(model), speculative_algorithm=spec, **config) as engine:
        if spec:  # the prior cost model: what is drafted depends on the texts, not the machine
            engine.scheduler.spec.cost = StepCosts.prior()  # type: ignore[attr-defined]
        outs = [
            engine.generate(
                input_ids=prompts, sampling_params=PARAMS, return_logprob=True, top_logprobs_num=2
            )
            for _ in range(2)
        ]
        engine.check_integrity()
        return [o for round_ in outs for o in round_], engine.get_stats()


@pytest.mark.parametrize("verify_graphs", [False, True], ids=["eager_verify", "graph_verify"])
@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral"])
def test_greedy_with_drafts_equals_without_on_device(
    arch: str, verify_graphs: bool, device: str, device_model_dirs: dict[str, Path]
) -> None:
    plain, _ = generate(device_model_dirs[arch], device, None)
    spec, stats = generate(device_model_dirs[arch], device, "NGRAM", verify_graphs)
    assert stats["num_spec_accepted_tokens"] > 0, stats  # drafts were verified and kept
    for p, s in zip(plain, spec, strict=True):
        a, b = p["output_ids"], s["output_ids"]
        assert len(a) == len(b) == PARAMS["max_new_tokens"]
        step = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
        if step is not None:
            (lp1, _, _), (lp2, _, _) = p["meta_info"]["output_top_logprobs"][step][:2]
            assert lp1 - lp2 < TIE, f"parted at step {step} with a margin of {lp1 - lp2:.3f}"
