"""SGLang's ``/update_weights_from_disk`` on a real server (``runtime/weight_update.py``): after
it the server generates what Hugging Face transformers generates with the new checkpoint and
``/get_model_info`` names it; SGLang's body and replies (200 ``success`` true, 400 ``success``
false with why); a running request refuses it unless ``abort_all_requests``; the served
weights stay when it is refused. (Who may call it: ``test_authorization.py``'s matrix. The
cases one by one: ``tests/runtime/test_weight_update.py``.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hf_oracle import greedy, load_hf
from safetensors.torch import load_file
from serving_harness import Server, paused_while_running, serving, write_api_model

pytestmark = pytest.mark.timeout(240)
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
LONG = {"max_new_tokens": 900, "temperature": 0, "ignore_eos": True}
PROMPT = [5, 17, 42, 9, 33, 71, 2, 64]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: object) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("update-weights")
    return write_api_model(root / "a", tiny_tokenizer), write_api_model(
        root / "b", tiny_tokenizer, seed=4
    )


@pytest.fixture(scope="module")
def server(models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("update-weights-log") / "server.log"
    args = ["--model", str(models[0]), "--dtype", "float32", "--weight-version", "v0"]
    with serving(args, log) as srv:
        yield srv


def hf_greedy(model_dir: Path, n: int = 8) -> list[int]:
    return greedy(load_hf(model_dir), PROMPT, n)


def generate(client: httpx.Client) -> dict:
    resp = client.post("/generate", json={"input_ids": PROMPT, "sampling_params": GREEDY})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_an_update_serves_the_new_checkpoint(
    client: httpx.Client, models: tuple[Path, Path]
) -> None:
    a, b = models
    first = generate(client)
    assert first["output_ids"] == hf_greedy(a)
    assert first["meta_info"]["weight_version"] == "v0"  # --weight-version
    resp = client.post(
        "/update_weights_from_disk", json={"model_path": str(b), "weight_version": "step-1"}
    )
    assert resp.status_code == 200
    assert resp.json() == {
        "success": True,
        "message": "Succeeded to update model weights. Weight version updated to step-1.",
        "num_paused_requests": 0,
    }
    after = generate(client)
    assert after["output_ids"] == hf_greedy(b) != hf_greedy(a)
    assert after["meta_info"]["cached_tokens"] == 0
    assert after["meta_info"]["weight_version"] == "step-1"
    assert client.get("/get_weight_version").json() == {"weight_version": "step-1"}
    name = "model.layers.0.mlp.up_proj.weight"
    got = client.post("/get_weights_by_name", json={"name": name, "truncate_size": 2})
    assert (
        got.status_code == 200
        and got.json() == load_file(b / "model.safetensors")[name][:2].tolist()
    )
    unknown = client.post("/get_weights_by_name", json={"name": "model.no.weight"})
    assert (
        unknown.status_code == 400 and "holds no weight named" in unknown.json()["error"]["message"]
    )
    info = client.get("/get_model_info").json()
    assert (info["model_path"], info["weight_version"]) == (str(b.resolve()), "step-1")
    # SGLang's other fields are taken; back to the first weights
    body = {"model_path": str(a), "load_format": "auto", "is_async": False, "token_step": 3}
    assert client.post("/update_weights_from_disk", json=body).json()["success"]
    assert generate(client)["output_ids"] == hf_greedy(a)
    assert client.get("/get_server_info").json()["integrity_ok"] is True
    # SGLang's relabel alone
    resp = client.post("/update_weight_version", json={"new_version": "v0"})
    want = {"success": True, "message": "Weight version updated to v0", "new_version": "v0"}
    assert resp.json() == want
    assert generate(client)["meta_info"]["weight_version"] == "v0"
    assert client.post("/update_weight_version", json={}).status_code == 400


def test_refusals_keep_the_served_weights(
    client: httpx.Client, models: tuple[Path, Path], tmp_path: Path, tiny_tokenizer: object
) -> None:
    a, _ = models
    before = generate(client)["output_ids"]
    wider = write_api_model(tmp_path / "wider", tiny_tokenizer, intermediate_size=256)
    for body, why in [
        ({"model_path": str(tmp_path / "nowhere")}, "not a model directory"),
        ({"model_path": str(wider)}, "its config differs in ['intermediate_size']"),
        ({"model_path": str(a), "load_format": "gguf"}, "load_format must be auto"),
    ]:
        resp = client.post("/update_weights_from_disk", json=body)
        assert resp.status_code == 400, resp.text
        reply = resp.json()
        assert (reply["success"], reply["num_paused_requests"]) == (False, 0)
        assert why in reply["message"]
    for body in [{}, {"model_path": str(a), "unknown_field": 1}, {"model_path": 7}]:
        resp = client.post("/update_weights_from_disk", json=body)
        assert resp.status_code == 400 and "error" in resp.json(), resp.text  # the error shape
    assert generate(client)["output_ids"] == before


def test_a_running_request_refuses_it_unless_all_are_aborted(
    client: httpx.Client, models: tuple[Path, Path]
) -> None:
    a, b = models
    with paused_while_running(client, {"input_ids": PROMPT, "sampling_params": LONG}) as events:
        refused = client.post("/update_weights_from_disk", json={"model_path": str(b)})
        assert refused.status_code == 400
        assert "1 request(s) are running" in refused.json()["message"]
        update = {"model_path": str(b), "abort_all_requests": True}
        assert client.post("/update_weights_from_disk", json=update).json()["success"]
        last = list(events)[-1]
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert generate(client)["output_ids"] == hf_greedy(b)
    assert client.post("/update_weights_from_disk", json={"model_path": str(a)}).json()["success"]
