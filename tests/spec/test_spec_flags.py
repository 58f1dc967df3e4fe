"""``serve``'s speculative flags (SGLang's names) reach the EngineConfig; bad values are one
ValueError at the edge."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixserve.config import EngineConfig
from radixserve.launch.cli import build_parser, make_server_config

pytestmark = pytest.mark.timeout(60)


def test_flags_reach_the_engine_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXSERVE_DEFAULT_MODEL_DIR", str(tmp_path / "model"))
    off = make_server_config(build_parser().parse_args(["serve"])).engine
    assert off.speculative.speculative_algorithm is None  # off by default
    argv = ["serve", "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "5"]
    argv += ["--speculative-ngram-min-match-window-size", "3"]
    argv += ["--speculative-ngram-max-batch-size", "4", "--speculative-cost-model", "prior"]
    engine = make_server_config(build_parser().parse_args(argv)).engine
    assert engine.speculative.speculative_algorithm == "NGRAM"
    assert engine.speculative.speculative_num_draft_tokens == 5
    assert engine.speculative.speculative_ngram_min_match_window_size == 3
    assert engine.speculative.speculative_ngram_max_batch_size == 4
    assert engine.speculative.speculative_cost_model == "prior"
    assert off.speculative.speculative_cost_model == "measured"
    with pytest.raises(SystemExit):  # argparse's choices
        build_parser().parse_args(["serve", "--speculative-algorithm", "EAGLE"])


@pytest.mark.parametrize(
    "fields",
    [
        dict(speculative_algorithm="EAGLE"),
        dict(speculative_num_draft_tokens=1),
        dict(speculative_ngram_min_match_window_size=5, speculative_ngram_max_match_window_size=2),
        dict(speculative_ngram_capacity=0),
        dict(speculative_ngram_max_batch_size=0),
        dict(speculative_cost_model="fast"),
    ],
)
def test_bad_values_are_value_errors(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="speculative"):
        EngineConfig.from_flat(**fields)  # type: ignore[arg-type]
