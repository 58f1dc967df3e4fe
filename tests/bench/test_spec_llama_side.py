"""``benchmarks/spec_llama_side.py``'s flags for llama-server, without a llama-server: the
synthetic acceptance each drafter is given, and what the JSON says of each drafter."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def side(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # run as a script there
    import spec_llama_side

    return spec_llama_side


def runner(side: ModuleType) -> object:
    draft = Path("/models/qwen-draft-bf16.gguf")
    return side.LlamaSpecRunner(Path("/bin/llama-server"), Path("/m.gguf"), draft, 2, 7, 4096)


@pytest.mark.parametrize("length", [1.0, 1.86, 3.96, 7.92, 8.0])
def test_geometric_rates_keep_the_accept_length(side: ModuleType, length: float) -> None:
    rates = side.geometric_rates(length, 7)
    assert len(rates) == 7
    assert 1.0 + sum(rates) == pytest.approx(length, abs=1e-6)
    assert all(a >= b for a, b in zip(rates, rates[1:], strict=False))


def test_ngram_cache_gets_the_others_acceptance_over_its_longer_drafts(side: ModuleType) -> None:
    llama = runner(side)
    assert llama.synth_flags("ngram-mod", 9.5) == ("--spec-synth-len", "8.0000")  # clamped
    flag, value = llama.synth_flags("ngram-cache", 3.96)
    rates = [float(r) for r in value.split(",")]
    assert flag == "--spec-synth-rates" and len(rates) == side.NGRAM_CACHE_DRAFT
    assert rates[7] == 0.0  # its eighth draft token is never kept: at most 8 tokens a step
    assert rates[:7] == pytest.approx(side.geometric_rates(3.96, 7), abs=1e-6)


def test_each_drafter_has_flags_and_names_no_path(side: ModuleType) -> None:
    llama = runner(side)
    for drafter in side.DRAFTERS:
        assert "--spec-type" in llama.drafter_flags(drafter)
        assert "/" not in llama.described(drafter)
    assert "--spec-ngram-simple-size-m 7" in llama.described("ngram-simple")
    assert "qwen-draft-bf16.gguf" in llama.described("model")
    with pytest.raises(ValueError, match="sent again"):
        llama.real("ngram-simple", [[1, 2]], 4)  # stateless: nothing of a first request
