"""The authorization matrix through ``--dp-size``: two tenants and an admin behind the real
gateway (smg), each key working as on one server, each tenant's cache its own, no route of the
gateway or the workers showing a key or another tenant's figures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from keyed_harness import ADMIN, A, B, bearer
from serving_harness import Server, model_name, start_server, stop_server
from test_authorization import OPEN, OPERATOR, ROUTES, assert_no_secret

pytestmark = pytest.mark.timeout(400)
# what smg itself answers with no key, by its design (its public routes): the model's name,
# its readiness, and the workers' metrics as the gateway's own key sees them (none of a tenant)
GATEWAY_PUBLIC = {"/health", "/v1/models", "/engine_metrics", "/liveness", "/readiness"}


@pytest.fixture(scope="module")
def dp_keyed(api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    pytest.importorskip("smg", reason="needs radixserve[router] (smg)")
    log = tmp_path_factory.mktemp("dp-keyed") / "dp.log"
    args = ["--model", str(api_model_dir), "--dp-size", "2", "--threads-per-worker", "1"]
    args += ["--router", "smg", "--max-total-tokens", "8192"]
    args += ["--api-key", A, "--api-key", B, "--admin-api-key", ADMIN]
    server = start_server(args, log)
    yield server
    assert stop_server(server, timeout=30) == 0, server.log()[-4000:]
    assert_no_secret(server.log(), "the launcher's log")


# slow: two workers and the gateway (about 40 s); .ci/run runs them after the default suite
@pytest.mark.slow
@pytest.mark.parametrize("who", [None, "a", "b", "admin"])
def test_matrix_through_the_gateway(dp_keyed: Server, who: str | None) -> None:
    name = model_name(Server(dp_keyed.url, dp_keyed.proc, dp_keyed.log_path, A))
    paths = [*ROUTES.items(), (("GET", "/engine_metrics"), (OPEN, None))]
    # a connection per request: smg at times closes a kept-alive connection as the next
    # request goes out on it ("Server disconnected without sending a response", 1 run in 3)
    fresh = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(
        base_url=dp_keyed.url, headers=bearer(who), timeout=60, limits=fresh
    ) as client:
        for (method, path), (access, body) in paths:
            if isinstance(body, dict) and path in ("/generate", "/v1/completions"):
                body = {**body, "model": name}  # the gateway routes by model
            if isinstance(body, dict) and path == "/v1/chat/completions":
                body = {**body, "model": name}
            url = path.replace("{name}", "dashboard.js").replace("{response_id}", "resp_none")
            resp = client.request(method, url, json=body)
            where = f"{method} {path} as {who} through the gateway"
            assert_no_secret(resp.text, where)
            if path in GATEWAY_PUBLIC:
                continue
            if who is None or (access == OPERATOR and who != "admin"):
                assert not resp.is_success, (where, resp.status_code)
            elif path in ("/generate", "/v1/completions", "/v1/chat/completions"):
                assert resp.status_code == 200, (where, resp.text)


@pytest.mark.slow
def test_each_tenant_keeps_its_cache_through_the_gateway(dp_keyed: Server) -> None:
    name = model_name(Server(dp_keyed.url, dp_keyed.proc, dp_keyed.log_path, A))
    prompt = "A memo of tenant a only, long enough to fill a page or two of the cache: 7 3 9 1"

    def cached(who: str) -> int:
        body = {"model": name, "text": prompt, "sampling_params": {"max_new_tokens": 1}}
        resp = httpx.post(f"{dp_keyed.url}/generate", json=body, headers=bearer(who), timeout=60)
        assert resp.status_code == 200, resp.text
        return int(resp.json()["meta_info"]["cached_tokens"])

    cached("a")
    assert cached("a") > 0
    assert cached("b") == 0 and cached("admin") == 0
    gateway_view = httpx.get(f"{dp_keyed.url}/engine_metrics", timeout=30).text
    totals = [
        float(line.rsplit(" ", 1)[1])
        for line in gateway_view.splitlines()
        if line.startswith("radixserve:prompt_tokens_total")
    ]
    assert totals and not any(totals)  # no tenant's traffic in what smg shows without a key


@pytest.mark.slow
def test_a_tenants_stored_response_is_its_own_on_every_worker(dp_keyed: Server) -> None:
    """A chained turn, sent through the gateway to whichever worker, is forwarded to the one
    that holds the response with the caller's own key: it goes on for its tenant and is a 404
    to the other. (smg answers ``GET /v1/responses/{id}`` itself, from a store of its own.)"""
    name = model_name(Server(dp_keyed.url, dp_keyed.proc, dp_keyed.log_path, A))
    fresh = httpx.Limits(max_keepalive_connections=0)  # as above: smg and kept-alive connections
    with httpx.Client(base_url=dp_keyed.url, timeout=60, limits=fresh) as client:
        body = {"model": name, "input": "a memo of tenant a", "max_output_tokens": 2}
        made = client.post("/v1/responses", json=body, headers=bearer("a"))
        assert made.status_code == 200, made.text
        rid = made.json()["id"]
        assert rid.startswith(("resp_w0_", "resp_w1_"))
        for turn in range(4):  # the gateway sends each to either worker
            chained = {**body, "previous_response_id": rid, "input": f"turn {turn}"}
            refused = client.post("/v1/responses", json=chained, headers=bearer("b"))
            assert refused.status_code == 404, refused.text
            assert_no_secret(refused.text, "another tenant's chained turn")
            kept = client.post("/v1/responses", json=chained, headers=bearer("a"))
            assert kept.status_code == 200, kept.text
            assert kept.json()["id"][:8] == rid[:8]  # made by the worker that holds the chain


def test_the_gateway_gets_every_key_or_refuses() -> None:
    from radixserve.config import EngineConfig, ServerConfig
    from radixserve.launch.gateway_keys import gateway_access

    config = ServerConfig(
        EngineConfig(model_path="/m"),
        tenant_keys=(("team:a", A), ("b", B)),
        admin_api_keys=(ADMIN,),
    )
    access = gateway_access(config, "smg")
    flags = " ".join(access.flags)
    assert f"team_a:{A}" in flags and f"b:{B}" in flags and f"admin:{ADMIN}" in flags
    gateway = access.workers.gateway_api_keys[0]
    assert access.flags[0] == f"--api-key={gateway}" and gateway not in (A, B, ADMIN)
    assert access.control_key == ADMIN  # smg's control plane: the operators' keys
    with pytest.raises(ValueError, match="--router smg"):
        gateway_access(config, "sglang-router")
    one = ServerConfig(EngineConfig(model_path="/m"), api_key=A)
    assert gateway_access(one, "sglang-router").flags == [f"--api-key={A}"]
    with pytest.raises(ValueError, match="--worker-transport http"):
        gateway_access(one, "smg", "grpc")  # smg's gRPC mode sends its workers no key


@pytest.mark.parametrize("router", ["smg", "sglang-router"])
def test_the_router_reads_keys_that_begin_with_a_dash(router: str) -> None:
    """``token_urlsafe`` begins one key in 64 with ``-``: the router's own parser must read it
    as the key, not as a flag (it once refused to start, 1 run in 64)."""
    from radixserve.config import EngineConfig, ServerConfig
    from radixserve.launch.data_parallel import ROUTER_MODULES
    from radixserve.launch.gateway_keys import gateway_access

    launcher = pytest.importorskip(ROUTER_MODULES[router], reason="needs radixserve[router]")
    dash = "-x9_" + A
    if router == "smg":
        config = ServerConfig(
            EngineConfig(model_path="/m"), tenant_keys=(("a", dash),), admin_api_keys=("-" + ADMIN,)
        )
    else:
        config = ServerConfig(EngineConfig(model_path="/m"), api_key=dash)
    access = gateway_access(config, router)
    parsed = launcher.parse_router_args([*access.flags, "--worker-urls", "http://127.0.0.1:1"])
    if router == "smg":
        assert parsed.api_key == access.workers.gateway_api_keys[0]
        assert ("a", dash) in parsed.tenant_api_keys
        assert ("admin", "-" + ADMIN) in parsed.tenant_api_keys
        assert [k[2] for k in parsed.control_plane_api_keys] == ["-" + ADMIN]
    else:
        assert parsed.api_key == dash
