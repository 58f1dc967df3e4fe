"""Speculative decoding's figures where operators look: ``/metrics`` (SGLang's accept-length
gauge, vLLM's draft counters), ``/get_server_info``'s ``internal_states[0]`` and the dashboard's
``/cache_tree``, each equal to the scheduler's own figures; a tenant sees none of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving_harness import Server, serving

pytestmark = pytest.mark.timeout(120)

ADMIN, TENANT = "spec-admin-key-3c1f", "spec-tenant-key-8e2a"
PROMPT = "one two three four five six seven eight one two three four five six"
GREEDY = {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True}
VLLM_COUNTERS = {
    "radixserve:spec_decode_num_drafts_total": "num_spec_drafts",
    "radixserve:spec_decode_num_draft_tokens_total": "num_spec_draft_tokens",
    "radixserve:spec_decode_num_accepted_tokens_total": "num_spec_accepted_tokens",
}
PER_POSITION = "radixserve:spec_decode_num_accepted_tokens_per_pos_total"
ACCEPT_LENGTH = "radixserve:spec_accept_length"


@pytest.fixture(scope="module")
def spec_server(api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server that drafts (NGRAM, with the prior cost model: measured on a busy machine, a
    verify can look dear enough that nothing is drafted), an admin key and a tenant's; the same
    prompt sent twice greedily by the admin, so the second drafts from the first's answer in the
    tree and accepts (a tenant's prompts sit in its own part of the tree), and once by the
    tenant."""
    log = tmp_path_factory.mktemp("spec-metrics") / "server.log"
    args = ["--model", str(api_model_dir), "--max-total-tokens", "32768"]
    args += ["--speculative-algorithm", "NGRAM", "--speculative-cost-model", "prior"]
    args += ["--admin-api-key", ADMIN, "--api-key", TENANT]
    with serving(args, log) as srv:
        for key in (ADMIN, ADMIN, TENANT):
            body = {"text": PROMPT, "sampling_params": GREEDY}
            resp = httpx.post(f"{srv.url}/generate", json=body, headers=_bearer(key), timeout=60)
            assert resp.status_code == 200, resp.text
        yield srv


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _get(server: Server, path: str, key: str = ADMIN) -> httpx.Response:
    resp = httpx.get(f"{server.url}{path}", headers=_bearer(key), timeout=30)
    assert resp.status_code == 200, resp.text
    return resp


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Each sample name -> its (labels, value) pairs."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def _scheduler(server: Server) -> dict[str, Any]:
    return dict(_get(server, "/get_server_info").json()["scheduler"])


def test_metrics_carry_the_schedulers_spec_figures(spec_server: Server) -> None:
    figures = _scheduler(spec_server)
    assert figures["num_spec_drafts"] > 0 and figures["num_spec_accepted_tokens"] > 0
    samples = _samples(_get(spec_server, "/metrics").text)
    model = {"model_name": next(iter(samples[ACCEPT_LENGTH]))[0]["model_name"]}
    assert samples[ACCEPT_LENGTH] == [(model, pytest.approx(figures["avg_spec_accept_length"]))]
    for name, key in VLLM_COUNTERS.items():
        assert samples[name] == [(model, figures[key])], name
    per_position = {int(labels.pop("position")): v for labels, v in samples[PER_POSITION]}
    assert all(labels == model for labels, _ in samples[PER_POSITION])
    accepted = figures["spec_accepted_per_position"]
    assert per_position == dict(enumerate(accepted)) and sum(accepted) > 0
    # a tenant's registry counts its own requests only: no scheduler-wide figure
    theirs = _get(spec_server, "/metrics", TENANT).text
    assert "spec_" not in theirs and "radixserve:generation_tokens_total" in theirs


def test_server_info_internal_state_has_the_accept_length(spec_server: Server) -> None:
    info = _get(spec_server, "/get_server_info").json()
    internal = info["internal_states"][0]
    assert internal["avg_spec_accept_length"] == info["scheduler"]["avg_spec_accept_length"] > 1
    tenant = _get(spec_server, "/server_info", TENANT).json()
    assert "avg_spec_accept_length" not in tenant["internal_states"][0]


def test_dashboard_data_carries_the_accept_length(spec_server: Server) -> None:
    data = _get(spec_server, "/cache_tree").json()
    figures = _scheduler(spec_server)
    assert data["speculative"] == {
        "accept_length": figures["avg_spec_accept_length"],
        "num_drafts": figures["num_spec_drafts"],
        "num_draft_tokens": figures["num_spec_draft_tokens"],
        "num_accepted_tokens": figures["num_spec_accepted_tokens"],
    }


def test_a_server_without_speculation_shows_no_draft_figures(client: httpx.Client) -> None:
    assert client.post("/generate", json={"text": PROMPT, "sampling_params": GREEDY}).is_success
    assert "avg_spec_accept_length" not in client.get("/server_info").json()["internal_states"][0]
    samples = _samples(client.get("/metrics").text)
    assert not [name for name in samples if name.startswith("radixserve:spec_decode")]
    assert [v for _, v in samples[ACCEPT_LENGTH]] == [0.0]  # SGLang exports it whatever runs
    assert client.get("/cache_tree").json()["speculative"] is None
