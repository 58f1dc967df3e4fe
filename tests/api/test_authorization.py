"""Who may call what: every HTTP route and every gRPC method of a keyed server, with no key,
each tenant's key and the admin's; no response holds a key or a digest of one."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import message_factory
from keyed_harness import KEYS, KeyedServer, bearer, secrets
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb

from radixserve.api.access.routes import RouteTable, facts_of, routes_of
from radixserve.api.grpc.auth import GATEWAY_METHODS, OPEN_METHODS, TENANT_METHODS
from radixserve.api.operator.server_info import server_args
from radixserve.config import EngineConfig, ServerConfig

pytestmark = pytest.mark.timeout(240)

OPEN, TENANT, OPERATOR = "open", "tenant", "operator"
GEN = {"max_new_tokens": 1}
# every route of the app: (method, path) -> (who may call it, a body)
ROUTES: dict[tuple[str, str], tuple[str, Any]] = {
    ("GET", "/health"): (OPEN, None),
    ("POST", "/generate"): (TENANT, {"text": "hi", "sampling_params": GEN}),
    ("POST", "/v1/completions"): (TENANT, {"prompt": "hi", "max_tokens": 1}),
    ("POST", "/v1/chat/completions"): (
        TENANT,
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    ),
    ("POST", "/v1/messages"): (
        TENANT,
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    ),
    ("POST", "/v1/messages/count_tokens"): (
        TENANT,
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    ),
    ("POST", "/v1/responses"): (TENANT, {"model": "m", "input": "hi", "max_output_tokens": 1}),
    ("GET", "/v1/responses/{response_id}"): (TENANT, None),
    ("DELETE", "/v1/responses/{response_id}"): (TENANT, None),
    ("GET", "/v1/responses/{response_id}/input_items"): (TENANT, None),
    ("POST", "/v1/responses/input_tokens"): (TENANT, {"model": "m", "input": "hi"}),
    ("POST", "/v1/responses/compact"): (
        TENANT,
        {"model": "m", "input": "hi", "max_output_tokens": 1},
    ),
    ("POST", "/v1/conversations"): (TENANT, {}),
    ("GET", "/v1/conversations/{conversation_id}"): (TENANT, None),
    ("POST", "/v1/conversations/{conversation_id}"): (TENANT, {"metadata": {}}),
    ("DELETE", "/v1/conversations/{conversation_id}"): (TENANT, None),
    ("POST", "/v1/conversations/{conversation_id}/items"): (
        TENANT,
        {"items": [{"role": "user", "content": "hi"}]},
    ),
    ("GET", "/v1/conversations/{conversation_id}/items"): (TENANT, None),
    ("GET", "/v1/conversations/{conversation_id}/items/{item_id}"): (TENANT, None),
    ("DELETE", "/v1/conversations/{conversation_id}/items/{item_id}"): (TENANT, None),
    ("GET", "/v1/models"): (TENANT, None),
    ("GET", "/v1/models/{model:path}"): (TENANT, None),
    ("GET", "/get_model_info"): (TENANT, None),
    ("GET", "/get_weight_version"): (TENANT, None),
    ("GET", "/model_info"): (TENANT, None),
    ("GET", "/get_server_info"): (TENANT, None),
    ("GET", "/server_info"): (TENANT, None),
    ("GET", "/health_generate"): (TENANT, None),
    ("GET", "/get_load"): (TENANT, None),
    ("POST", "/abort_request"): (TENANT, {"rid": "no-such-request"}),
    ("POST", "/tokenize"): (TENANT, {"prompt": "hi"}),
    ("POST", "/detokenize"): (TENANT, {"tokens": [1, 2]}),
    ("GET", "/metrics"): (TENANT, None),
    ("GET", "/openapi.json"): (TENANT, None),
    ("GET", "/docs"): (TENANT, None),
    ("GET", "/docs/oauth2-redirect"): (TENANT, None),
    ("GET", "/redoc"): (TENANT, None),
    ("GET", "/cache_tree"): (OPERATOR, None),
    ("GET", "/dashboard"): (OPERATOR, None),
    ("GET", "/dashboard/static/{name}"): (OPERATOR, None),
    ("GET", "/flush_cache"): (OPERATOR, None),
    ("POST", "/flush_cache"): (OPERATOR, None),
    # in place, and at once continued: the server serves on for the routes after these
    ("POST", "/pause_generation"): (OPERATOR, {"mode": "in_place"}),
    ("POST", "/continue_generation"): (OPERATOR, None),
    ("POST", "/update_weights_from_disk"): (OPERATOR, {"model_path": "/nonexistent"}),
    ("POST", "/update_weight_version"): (OPERATOR, {"new_version": "v1"}),
    ("POST", "/get_weights_by_name"): (OPERATOR, {"name": "model.norm.weight", "truncate_size": 1}),
    ("POST", "/load_lora_adapter"): (OPERATOR, {"lora_name": "x", "lora_path": "/nonexistent"}),
    ("POST", "/unload_lora_adapter"): (OPERATOR, {"lora_name": "x"}),
    ("POST", "/v1/load_lora_adapter"): (OPERATOR, {"lora_name": "x", "lora_path": "/nonexist"}),
    ("POST", "/v1/unload_lora_adapter"): (OPERATOR, {"lora_name": "x"}),
}


def declared_access(tokenizer: object) -> dict[tuple[str, str], str]:
    """(method, path) -> the access each route of the app declares (HEAD aside)."""
    from radixserve.api.app import create_app

    config = ServerConfig(EngineConfig(model_path="/nonexistent"))
    tm = SimpleNamespace(config=config, prompts=SimpleNamespace(tokenizer=tokenizer))
    app = create_app(tm, config)  # type: ignore[arg-type]
    found = {}
    for route in routes_of(app.routes):
        facts = facts_of(route)
        assert facts is not None, f"{route.path} declares no access"
        found.update({(m, route.path): facts.access.value for m in route.methods - {"HEAD"}})
    return found


def test_every_route_declares_who_may_call_it(tiny_tokenizer: object) -> None:
    """The app's declarations are the matrix's: a route added without one, or declared
    otherwise than this test expects, fails here."""
    assert declared_access(tiny_tokenizer) == {k: v[0] for k, v in ROUTES.items()}


def test_a_route_that_declares_nothing_is_refused() -> None:
    from fastapi import FastAPI

    app = FastAPI()
    app.get("/forgotten")(lambda: {})
    with pytest.raises(ValueError, match="/forgotten declares no access"):
        RouteTable.of(app)


def assert_no_secret(text: str, where: str) -> None:
    for secret in secrets():
        assert secret not in text, f"{where} shows {secret!r}"


@pytest.mark.parametrize("who", [None, "a", "b", "admin"])
def test_http_matrix(keyed_server: KeyedServer, who: str | None) -> None:
    with httpx.Client(base_url=keyed_server.url, headers=bearer(who), timeout=60) as client:
        for (method, path), (access, body) in ROUTES.items():
            url = path.replace("{name}", "dashboard.js").replace("{response_id}", "resp_none")
            url = url.replace("{model:path}", "org/no-such-model")
            url = url.replace("{conversation_id}", "conv_none").replace("{item_id}", "msg_none")
            resp = client.request(method, url, json=body)
            where = f"{method} {path} as {who}"
            if access == OPEN:
                assert resp.status_code == 200, where
            elif who is None:
                assert resp.status_code == 401, where
            elif access == OPERATOR and who != "admin":
                assert resp.status_code == 403, (where, resp.text)
            else:
                assert resp.status_code not in (401, 403), (where, resp.text)
            assert_no_secret(resp.text, where)
            assert_no_secret(str(resp.headers), where)


def test_the_cache_page_takes_no_tenant_key_as_a_query(keyed_server: KeyedServer) -> None:
    url = f"{keyed_server.url}/cache_tree"
    assert httpx.get(url, params={"api_key": KEYS["a"]}).status_code == 403
    assert httpx.get(url, params={"api_key": KEYS["admin"]}).status_code == 200


def _grpc_call(channel: grpc.Channel, method: Any, who: str | None) -> grpc.StatusCode:
    """The status of one call of ``method`` (a default request of its type)."""
    request_class = message_factory.GetMessageClass(method.input_type)
    path = f"/{method.containing_service.full_name}/{method.name}"
    codec = {
        "request_serializer": request_class.SerializeToString,
        "response_deserializer": lambda data: data,
    }
    metadata = [("authorization", f"Bearer {KEYS[who]}")] if who else []
    try:
        if method.server_streaming:
            for data in channel.unary_stream(path, **codec)(
                request_class(), metadata=metadata, timeout=3
            ):
                assert_no_secret(str(data), method.name)
        else:
            data = channel.unary_unary(path, **codec)(
                request_class(), metadata=metadata, timeout=10
            )
            assert_no_secret(str(data), method.name)
    except grpc.RpcError as exc:
        assert_no_secret(str(exc.details()), method.name)
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@pytest.mark.parametrize("who", [None, "a", "b", "admin"])
def test_grpc_matrix(keyed_server: KeyedServer, who: str | None) -> None:
    service = pb.DESCRIPTOR.services_by_name["SglangScheduler"]
    assert {m.name for m in service.methods} >= OPEN_METHODS | TENANT_METHODS | GATEWAY_METHODS
    refused = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
    with keyed_server.channel() as channel:
        for method in service.methods:
            code = _grpc_call(channel, method, who)
            if method.name in OPEN_METHODS:
                assert code == grpc.StatusCode.OK, method.name
            elif who is None:
                assert code == grpc.StatusCode.UNAUTHENTICATED, method.name
            elif who != "admin" and method.name not in TENANT_METHODS:
                assert code == grpc.StatusCode.PERMISSION_DENIED, method.name
            else:
                assert code not in refused, (method.name, who, code)


def test_no_setting_shows_a_key() -> None:
    """Every secret field, and a key held by a field that is not named as one."""
    config = ServerConfig(
        EngineConfig.from_flat(model_path="/m", dist_init_addr="tcp://k3y-in-an-address:1"),
        tenant_keys=(("t", "k3y-in-an-address"), ("key-0123456789", "other-key")),
        admin_api_keys=("admin-secret",),
        gateway_api_keys=("gateway-secret",),
    )
    text = str(server_args(config))
    for secret in ("k3y-in-an-address", "other-key", "admin-secret", "gateway-secret"):
        assert secret not in text
    assert "key-0123456789" not in text  # a lone key's tenant: a digest of the key
