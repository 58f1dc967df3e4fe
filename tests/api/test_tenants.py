"""Tenants on a real server: the digit probe learns nothing across tenants,
``cache_salt`` splits a tenant's cache, ``--shared-prefix-cache`` opts back into one, and the
operator routes want an admin key."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from serving_harness import serving

from radixserve.api.access.tenants import Tenants

pytestmark = pytest.mark.timeout(180)

A, B, ADMIN = "key-of-a", "key-of-b", "key-of-ops"
SECRET = "Internal memo, do not share. The vault PIN is "


def completion(url: str, key: str, prompt: str, **extra: object) -> dict:
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, **extra}
    resp = httpx.post(
        f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def cached(url: str, key: str, prompt: str, **extra: object) -> int:
    usage = completion(url, key, prompt, **extra)["usage"]
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def probe(url: str, key: str) -> list[int]:
    """The digit probe: the secret's prefix followed by each digit; the cached length of each."""
    return [cached(url, key, SECRET + f"{d} 3 9 1") for d in range(10)]


@pytest.fixture(scope="module")
def tenants_server(api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(f"# tenant key\nteam-b {B}\nteam-b {B}-second\n")
    args = ["--model", str(api_model_dir), "--api-key", A, "--api-keys-file", str(keys)]
    args += ["--admin-api-key", ADMIN, "--tenant-header", "X-Tenant-Id"]
    with serving(args, tmp_path_factory.mktemp("tenants") / "server.log", api_key=A) as server:
        yield server


def test_the_digit_probe_learns_nothing_across_tenants(tenants_server) -> None:
    url = tenants_server.url
    completion(url, A, SECRET + "7 3 9 1")  # tenant A's secret, now cached for A
    other = probe(url, B)
    assert len(set(other[1:])) == 1 and other[7] == other[1], other  # no digit stands out
    assert cached(url, A, SECRET + "7 3 9 1") > other[7]  # A itself hits its own prompt
    # the same tenant's second key shares its cache: it is one tenant
    assert cached(url, f"{B}-second", SECRET + "5 3 9 1") == cached(url, B, SECRET + "5 3 9 1")


def test_cache_salt_splits_a_tenant_and_never_reaches_another(tenants_server) -> None:
    url = tenants_server.url
    prompt = "A salted prompt that only its salt may hit, repeated to be long enough. " * 3
    completion(url, A, prompt, cache_salt="s1")
    assert cached(url, A, prompt, cache_salt="s1") > 0
    assert cached(url, A, prompt, cache_salt="s2") == 0
    assert cached(url, A, prompt) == 0
    assert cached(url, B, prompt, cache_salt="s1") == 0  # the same salt in another tenant
    native = httpx.post(
        f"{url}/generate",
        json={"text": prompt, "cache_salt": "s1", "sampling_params": {"max_new_tokens": 1}},
        headers={"Authorization": f"Bearer {A}"},
        timeout=60,
    )
    assert native.json()["meta_info"]["cached_tokens"] > 0


def test_operator_routes_want_the_admin_key(tenants_server) -> None:
    url = tenants_server.url
    for path in ("/cache_tree", "/dashboard", "/flush_cache"):
        resp = httpx.get(url + path, headers={"Authorization": f"Bearer {A}"}, timeout=30)
        assert resp.status_code == 403, (path, resp.text)
        assert resp.json()["error"]["code"] == "admin_key_required"
    for path in ("/load_lora_adapter", "/v1/load_lora_adapter", "/unload_lora_adapter"):
        body = {"lora_name": "x", "lora_path": "/nonexistent"}
        resp = httpx.post(url + path, json=body, headers={"Authorization": f"Bearer {A}"})
        assert resp.status_code == 403, (path, resp.text)
    tree = httpx.get(f"{url}/cache_tree", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    assert any(n["text"] for n in tree["tree"]["nodes"] if n["parent"] is not None)
    # the tenants' ordinary routes do not take the admin's key as theirs: it is its own tenant
    assert (
        httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
    )


def test_who_is_an_operator() -> None:
    """The cache page's text and the operator routes: an admin key; without admin keys, the
    one tenant of a single-tenant server or anyone on an open server; with several tenants
    and no admin key, nobody."""
    from types import SimpleNamespace

    def caller(tenant: str | None, admin: bool = False) -> SimpleNamespace:
        return SimpleNamespace(tenant=tenant, admin=admin)

    assert Tenants().is_operator(caller(None))
    assert Tenants(keys=(("a", A),)).is_operator(caller("a"))
    two = Tenants(keys=(("a", A), ("b", B)))
    assert not two.is_operator(caller("a")) and not two.may_see_text(caller("a"))
    with_admin = Tenants(keys=(("a", A),), admin_keys=(ADMIN,))
    assert with_admin.is_operator(caller("admin", True))
    assert not with_admin.is_operator(caller("a"))


@pytest.mark.slow
def test_without_admin_keys_several_tenants_have_no_cache_page(
    api_model_dir: Path, tmp_path: Path
) -> None:
    args = ["--model", str(api_model_dir), "--api-key", B]
    with serving(args, tmp_path / "server.log", api_key=A) as server:
        completion(server.url, A, SECRET + "7 3 9 1")
        for key in (A, B):
            tree = httpx.get(
                f"{server.url}/cache_tree", headers={"Authorization": f"Bearer {key}"}, timeout=30
            )
            assert tree.status_code == 403


@pytest.mark.slow
def test_a_shared_prefix_cache_is_shared(api_model_dir: Path, tmp_path: Path) -> None:
    args = ["--model", str(api_model_dir), "--api-key", A, "--api-key", B]
    args += ["--shared-prefix-cache"]
    with serving(args, tmp_path / "server.log", api_key=A) as server:
        completion(server.url, A, SECRET + "7 3 9 1")
        other = probe(server.url, B)
        assert other[7] > max(other[:7] + other[8:]), other  # the leak the default closes


def test_a_trusted_gateway_header_names_the_tenant(tenants_server) -> None:
    """Behind a gateway that forwards one key and writes the tenant into a header: each header
    value is a tenant of its own; without the header the key's tenant serves."""
    memo = "Gateway " + SECRET

    def hits(tenant: str | None) -> int:
        headers = {"Authorization": f"Bearer {A}"} | ({"x-tenant-id": tenant} if tenant else {})
        body = {"prompt": memo + "7 3 9 1", "max_tokens": 1, "temperature": 0}
        resp = httpx.post(f"{tenants_server.url}/v1/completions", json=body, headers=headers)
        details = resp.json()["usage"].get("prompt_tokens_details") or {}
        return int(details.get("cached_tokens") or 0)

    hits("alice")
    assert hits("alice") > 0
    assert hits("bob") == 0 and hits(None) == 0  # neither another tenant nor the key's
    assert hits(None) > 0  # the key's own tenant caches for itself
