"""The live cache page: ``/cache_tree`` against the requests that built the tree, the page's
files, and (slow) the page itself in headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import httpx
import pytest
from serving_harness import Server

from radixserve.api.operator.dashboard import StatsHistory, kv_usage

PREFIX = "The shared system prompt of every request on this page, long enough to be a node: "
SUFFIXES = ["alpha one", "bravo two", "charlie three"]


def _shared_prefix_tree(client: httpx.Client) -> dict:
    assert client.post("/flush_cache").status_code == 200
    for suffix in SUFFIXES:
        body = {"text": PREFIX + suffix, "sampling_params": {"max_new_tokens": 3}}
        assert client.post("/generate", json=body).status_code == 200
    resp = client.get("/cache_tree", params={"max_nodes": 50})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_cache_tree_shows_a_shared_prefix_as_one_node_with_its_children(
    client: httpx.Client,
) -> None:
    data = _shared_prefix_tree(client)
    nodes = data["tree"]["nodes"]
    root = nodes[0]
    assert root["parent"] is None
    (shared,) = [n for n in nodes if n["parent"] == root["id"]]
    assert shared["text"].strip().startswith(PREFIX[:40].strip())
    children = [n for n in nodes if n["parent"] == shared["id"]]
    assert len(children) == len(SUFFIXES)
    assert sorted(SUFFIXES) == sorted(
        next(s for s in SUFFIXES if s.split()[0] in c["text"]) for c in children
    )
    assert all(c["evictable"] and not c["locked"] for c in children)  # nothing runs now
    tree = data["tree"]
    assert tree["total_tokens"] == sum(n["num_tokens"] for n in nodes)
    assert tree["shown_nodes"] == tree["total_nodes"] == len(nodes) - 1
    kv = data["kv"]
    assert kv["cached"] == tree["total_tokens"] and kv["in_use"] == 0
    assert data["running"] == data["waiting"] == 0
    # a bound smaller than the tree keeps the heaviest node and says what it leaves out
    small = client.get("/cache_tree", params={"max_nodes": 1}).json()["tree"]
    (kept,) = small["nodes"][1:]
    assert kept["id"] == shared["id"] and kept["hidden_children"] == len(SUFFIXES)
    assert kept["hidden_tokens"] == sum(c["subtree_tokens"] for c in children)


def test_cache_tree_bounds_and_page_files(client: httpx.Client) -> None:
    for bad in (0, 10**6, "x"):
        resp = client.get("/cache_tree", params={"max_nodes": bad})
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"].endswith("max_nodes")
    page = client.get("/dashboard")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "/dashboard/static/" in page.text
    for name in ("dashboard.js", "echarts.min.js"):
        assert client.get(f"/dashboard/static/{name}").status_code == 200
    for name in ("dashboard.html", "..%2Fapp.py", "ECHARTS-LICENSE"):
        assert client.get(f"/dashboard/static/{name}").status_code == 404


def test_the_grafana_dashboard_reads_metrics_the_server_exports(client: httpx.Client) -> None:
    dashboard = json.loads((Path(__file__).parents[2] / "docs/grafana/radixserve.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    names = set(re.findall(r"radixserve:[a-z0-9_]+", " ".join(exprs)))
    assert len(names) >= 12
    client.post("/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 2}})
    exported = client.get("/metrics").text
    missing = [n for n in sorted(names) if not re.search(rf"^{n}[{{ ]", exported, re.M)]
    assert not missing, f"the dashboard reads metrics /metrics does not export: {missing}"


def test_stats_history_turns_counters_into_rates() -> None:
    now = [100.0]
    history = StatsHistory(window_s=10, min_interval_s=1, clock=lambda: now[0])

    def stats(cached: int, computed: int, generated: int) -> dict:
        return {
            "num_cached_prompt_tokens": cached,
            "num_prefill_tokens": computed,
            "num_generated_tokens": generated,
            "num_running_reqs": 1,
            "num_waiting_reqs": 2,
        }

    history.add(stats(0, 0, 0))
    now[0] += 0.5
    history.add(stats(5, 5, 5))  # too soon: ignored
    now[0] += 1.5
    history.add(stats(30, 10, 8))
    (point,) = history.points()
    assert point["hit_rate"] == 0.75 and point["prompt_tokens_per_s"] == 20
    assert point["generated_tokens_per_s"] == 4 and point["waiting"] == 2
    now[0] += 2
    history.add(stats(30, 10, 8))  # idle: no prompt, no hit rate
    assert history.points()[-1]["hit_rate"] is None
    now[0] += 20
    history.add(stats(30, 10, 8))
    assert len(history.points()) == 1  # the window forgets the old points
    assert kv_usage({"num_free_tokens": 10, "num_evictable_tokens": 5, "max_total_tokens": 20}) == {
        "free": 10,
        "cached": 5,
        "in_use": 5,
    }


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt install chromium)"
)
def test_dashboard_in_headless_chromium(
    server: Server, client: httpx.Client, tmp_path_factory: pytest.TempPathFactory
) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    _shared_prefix_tree(client)
    out: Path = tmp_path_factory.mktemp("dashboard")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(server.url + "/dashboard")
            page.wait_for_selector("body[data-ready='1']", timeout=30_000)
            # what the tree chart draws: root -> one shared node -> one child per suffix
            shape = page.evaluate(
                """() => {
                    const chart = echarts.getInstanceByDom(document.getElementById('tree'));
                    const root = chart.getOption().series[0].data[0];
                    return root.children.map((c) => ({
                        text: c.node.text, children: c.children.map((g) => g.node.text)}));
                }"""
            )
            assert len(shape) == 1 and shape[0]["text"].strip().startswith(PREFIX[:40].strip())
            assert len(shape[0]["children"]) == len(SUFFIXES)
            assert page.locator("#tree svg text").count() >= 1 + len(SUFFIXES)
            assert page.inner_text("#hit-rate").endswith("%")
            page.screenshot(path=str(out / "dashboard.png"), full_page=True)
        finally:
            browser.close()
    assert (out / "dashboard.png").stat().st_size > 10_000
