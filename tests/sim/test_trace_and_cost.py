"""JSONL traces round-trip; a cost model is fitted back from steps it generated."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from radixserve.bench.workload import SharedPrefixSpec, make_shared_prefix
from radixserve.sim.cost_model import (
    H100_SXM,
    QWEN25_05B,
    CostModel,
    fit,
    from_roofline,
)
from radixserve.sim.trace import from_bench_sessions, read_jsonl, write_jsonl


def test_jsonl_round_trip_of_ids() -> None:
    spec = SharedPrefixSpec(
        num_groups=2, prompts_per_group=3, system_len=20, question_len=5, request_rate=4.0
    )
    sessions = from_bench_sessions(make_shared_prefix(spec, 3, 900))
    buf = io.StringIO()
    assert write_jsonl(sessions, buf) == 6
    back = read_jsonl(io.StringIO(buf.getvalue()))
    order = sorted(sessions, key=lambda s: (s.arrival_s, s.sid))
    for a, b in zip(order, back, strict=True):
        assert b.arrival_s == a.arrival_s
        assert b.turns[0].output_len == a.turns[0].output_len
        full_a = np.concatenate([a.prefix_ids, a.turns[0].user_ids]).tolist()
        assert np.concatenate([b.prefix_ids, b.turns[0].user_ids]).tolist() == full_a
    buf2 = io.StringIO()
    write_jsonl(back, buf2)
    assert buf2.getvalue() == buf.getvalue()


def test_jsonl_lengths_with_prefix_groups_share_their_prefix() -> None:
    lines = [
        {"arrival_s": 0, "prompt_len": 100, "prefix_group": 7, "prefix_len": 60, "output_len": 4},
        {"arrival_s": 1.5, "prompt_len": 80, "prefix_group": 7, "prefix_len": 40, "output_len": 2},
        {"arrival_s": 2, "prompt_len": 30, "output_len": 1},
    ]
    text = "\n".join(json.dumps(x) for x in lines) + "\n"
    a, b, c = read_jsonl(io.StringIO(text), seed=3)
    assert len(a.prefix_ids) + len(a.turns[0].user_ids) == 100
    assert b.prefix_ids.tolist() == a.prefix_ids[:40].tolist()
    assert len(c.prefix_ids) == 0 and len(c.turns[0].user_ids) == 30
    again = read_jsonl(io.StringIO(text), seed=3)
    assert again[0].turns[0].user_ids.tolist() == a.turns[0].user_ids.tolist()  # reproducible


@pytest.mark.parametrize(
    "line,message",
    [
        ("not json", "not JSON"),
        ('{"arrival_s": 0, "output_len": 3}', "missing 'prompt_len'"),
        ('{"arrival_s": -1, "input_ids": [1], "output_len": 3}', "arrival_s must be"),
        ('{"arrival_s": 0, "input_ids": [], "output_len": 3}', "non-empty"),
        ('{"arrival_s": 0, "input_ids": ["a"], "output_len": 3}', "token ids"),
        (
            '{"arrival_s": 0, "prompt_len": 5, "prefix_group": 1, "prefix_len": 5, "output_len": 1}',
            "prefix_len < prompt_len",
        ),
        ("[1, 2]", "JSON object"),
    ],
)
def test_bad_jsonl_lines_are_value_errors_naming_the_line(line: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        read_jsonl(io.StringIO('{"arrival_s": 0, "input_ids": [5], "output_len": 1}\n' + line))
    assert ":2:" in str(info.value)


def test_fit_recovers_a_known_cost_model() -> None:
    true = CostModel(
        prefill_base=0.02,
        prefill_per_req=0.003,
        prefill_per_token=2e-4,
        prefill_per_attn=3e-8,
        decode_base=0.015,
        decode_per_req=8e-4,
        decode_per_ctx=2e-6,
    )
    rng = np.random.default_rng(0)
    prefill = []
    for bs, n, c in [
        (1, 16, 0),
        (1, 256, 0),
        (1, 512, 1024),
        (4, 64, 0),
        (2, 128, 2048),
        (1, 64, 512),
    ]:
        t = true.prefill_s([n] * bs, [c] * bs) * (1 + rng.normal(0, 0.01))
        prefill.append(([n] * bs, [c] * bs, t))
    decode = []
    for bs, ctx in [(1, 64), (8, 64), (32, 64), (4, 2048), (32, 1024)]:
        decode.append(([ctx] * bs, true.decode_s([ctx] * bs) * (1 + rng.normal(0, 0.01))))
    got = fit(prefill, decode)
    for name in (
        "prefill_base",
        "prefill_per_token",
        "decode_base",
        "decode_per_req",
        "decode_per_ctx",
    ):
        assert getattr(got, name) == pytest.approx(getattr(true, name), rel=0.15), name
    # what matters: predicted step times within a few percent over the measured range
    for e, p, t in prefill:
        assert got.prefill_s(e, p) == pytest.approx(t, rel=0.05)
    for s, t in decode:
        assert got.decode_s(s) == pytest.approx(t, rel=0.05)
    assert got.meta["fit_rel_err"]["decode_max"] < 0.05


def test_cost_model_files_and_bad_values(tmp_path: object) -> None:
    import pathlib

    path = pathlib.Path(str(tmp_path)) / "c.json"
    model = CostModel(decode_base=0.01, meta={"note": "x"})
    model.save(path)
    assert CostModel.load(path) == model
    with pytest.raises(ValueError, match=">= 0"):
        CostModel(decode_base=-1.0)
    with pytest.raises(ValueError, match="unknown cost model fields"):
        CostModel.from_dict({"decode_bas": 1.0})
    with pytest.raises(ValueError, match="no cost model file"):
        CostModel.load("no-such-model")
    assert CostModel.load("tiny-cpu").decode_base > 0  # a shipped one
    # the 0.5B-shaped default: a bigger model costs more a step than the tiny one
    big, tiny = CostModel.load("qwen25-05b-cpu"), CostModel.load("tiny-cpu")
    assert big.decode_base > tiny.decode_base and big.prefill_per_token > tiny.prefill_per_token


def test_roofline_h100_is_memory_bound_at_small_batch() -> None:
    h100 = from_roofline(QWEN25_05B, H100_SXM)
    one = h100.decode_s([1024])
    assert 1e-3 < one < 3e-3  # ~1 GB of bf16 weights at ~2.3 TB/s, plus 1 ms of overhead
    assert h100.decode_s([1024] * 8) < 1.1 * one  # batching is nearly free there


def test_jsonl_carries_each_requests_lora_adapter() -> None:
    line = {"arrival_s": 0.0, "input_ids": [5, 6, 7], "output_len": 2, "lora": "sql"}
    [session] = read_jsonl(io.StringIO(json.dumps(line)))
    assert session.lora == "sql"
    out = io.StringIO()
    write_jsonl([session], out)
    assert json.loads(out.getvalue())["lora"] == "sql"
    with pytest.raises(ValueError, match="'lora' must be an adapter's name"):
        read_jsonl(io.StringIO(json.dumps({**line, "lora": 3})))
