"""LoRA adapters through the server: ``lora_path`` on ``/generate``, the adapter as ``model``
with the official ``openai`` client, ``/v1/models``, and the load/unload routes in SGLang's and
vLLM's shapes, against PEFT on transformers; malformed adapters are refused, at run time and at
start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hf_oracle import greedy, load_hf
from serving_harness import Server, serving

pytest.importorskip("peft")

from radixserve.models.tiny_lora import (  # noqa: E402
    MALFORMED,
    write_malformed_lora,
    write_tiny_lora,
)

# slow: a server with three adapters of its own (about 11 s to start); .ci/run runs them after
# the default suite
pytestmark = pytest.mark.slow

MAX_NEW = 8
PROMPT = [11, 250, 37, 990, 4, 61, 700, 13, 88, 5]


@pytest.fixture(scope="module")
def adapters(api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("server-loras")
    return {
        "a": str(write_tiny_lora(api_model_dir, root / "a", r=8, seed=21)),
        "b": str(write_tiny_lora(api_model_dir, root / "b", r=4, seed=22, use_rslora=True)),
        "c": str(write_tiny_lora(api_model_dir, root / "c", r=16, seed=23, lora_alpha=8)),
    }


@pytest.fixture(scope="module")
def lora_server(
    api_model_dir: Path, adapters: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("lora-log") / "server.log"
    args = ["--model", str(api_model_dir), "--dtype", "float32", "--max-total-tokens", "8192"]
    args += [
        "--lora-paths",
        f"a={adapters['a']}",
        f"b={adapters['b']}",
        "--max-loras-per-batch",
        "2",
    ]
    with serving(args, log) as srv:
        yield srv


@pytest.fixture(scope="module")
def peft_tokens(api_model_dir: Path, adapters: dict[str, str]):
    from peft import PeftModel

    def tokens(name: str | None) -> list[int]:
        model: Any = load_hf(api_model_dir)
        if name is not None:
            model = PeftModel.from_pretrained(model, adapters[name])
        return greedy(model, PROMPT, MAX_NEW)

    return {name: tokens(name) for name in (None, "a", "b", "c")}


def generate(client: httpx.Client, lora_path: Any, n: int = 1) -> httpx.Response:
    body = {
        "input_ids": [PROMPT] * n if n > 1 else PROMPT,
        "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True},
        "lora_path": lora_path,
    }
    return client.post("/generate", json=body)


def test_generate_takes_an_adapter_per_batch_item(lora_server, peft_tokens) -> None:
    assert len({tuple(t) for t in peft_tokens.values()}) == 4, "the adapters differ"
    with lora_server.client() as client:
        outs = generate(client, [None, "a", "b", "a"], n=4).json()
        assert [o["output_ids"] for o in outs] == [
            peft_tokens[None],
            peft_tokens["a"],
            peft_tokens["b"],
            peft_tokens["a"],
        ]
        single = generate(client, "b").json()
        assert single["output_ids"] == peft_tokens["b"]
        bad = generate(client, "nope")
        assert bad.status_code == 400 and "not loaded" in bad.json()["error"]["message"]
        # the cache page names each namespace's adapter
        nodes = client.get("/cache_tree").json()["tree"]["nodes"]
        assert {n["adapter"] for n in nodes if n["parent"] is not None} >= {"a", "b", None}
        info = client.get("/get_server_info").json()  # runs the KV and LoRA integrity checks
        assert info["scheduler"]["num_running_reqs"] == 0


def test_openai_clients_name_the_adapter_as_their_model(lora_server, peft_tokens) -> None:
    import openai

    oai = openai.OpenAI(base_url=f"{lora_server.url}/v1", api_key="unused", max_retries=0)
    cards = {m.id: m for m in oai.models.list().data}
    base = next(name for name, card in cards.items() if getattr(card, "parent", None) is None)
    assert {n: getattr(c, "parent", None) for n, c in cards.items() if n != base} == {
        "a": base,
        "b": base,
    }
    with lora_server.client() as client:
        expected = {name: generate(client, name).json()["text"] for name in ("a", "b", None)}
    for model, adapter in [("a", "a"), (f"{base}:b", "b"), (base, None)]:
        out = oai.completions.create(
            model=model,
            prompt=PROMPT,
            max_tokens=MAX_NEW,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        assert out.choices[0].text == expected[adapter]
        assert out.model == (adapter or base)
    chat = oai.chat.completions.create(
        model="a", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert chat.model == "a" and chat.choices[0].message.content is not None
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        oai.completions.create(model="zzz", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="different adapters"):
        oai.completions.create(model="a", prompt="x", max_tokens=1, extra_body={"lora_path": "b"})


def test_adapters_load_and_unload_at_run_time(lora_server, adapters, peft_tokens) -> None:
    with lora_server.client() as client:
        loaded = client.post(
            "/load_lora_adapter", json={"lora_name": "c", "lora_path": adapters["c"]}
        )
        assert loaded.status_code == 200, loaded.text
        body = loaded.json()
        assert body["success"] and body["error_message"] is None
        assert body["loaded_adapters"] == {
            "a": adapters["a"],
            "b": adapters["b"],
            "c": adapters["c"],
        }
        assert generate(client, "c").json()["output_ids"] == peft_tokens["c"]
        again = client.post(
            "/load_lora_adapter", json={"lora_name": "c", "lora_path": adapters["c"]}
        )
        assert again.status_code == 400 and not again.json()["success"]
        assert "already loaded" in again.json()["error_message"]
        missing = client.post("/load_lora_adapter", json={"lora_name": "d", "lora_path": "/no/dir"})
        assert (
            missing.status_code == 400
            and "not a PEFT LoRA adapter" in missing.json()["error_message"]
        )
        gone = client.post("/unload_lora_adapter", json={"lora_name": "c"}).json()
        assert gone["success"] and "c" not in gone["loaded_adapters"]
        refused = generate(client, "c")
        assert refused.status_code == 400 and "not loaded" in refused.json()["error"]["message"]
        # vLLM's routes and answers
        ok = client.post(
            "/v1/load_lora_adapter", json={"lora_name": "c2", "lora_path": adapters["c"]}
        )
        assert ok.status_code == 200 and ok.text == "Success: LoRA adapter 'c2' added successfully."
        assert "c2" in {m["id"] for m in client.get("/v1/models").json()["data"]}
        # the same files as "c" a moment ago: the same cache namespace, so the prompt hits
        hit = generate(client, "c2").json()
        assert hit["output_ids"] == peft_tokens["c"]
        assert hit["meta_info"]["cached_tokens"] == len(PROMPT) - 1
        ok = client.post("/v1/unload_lora_adapter", json={"lora_name": "c2"})
        assert ok.text == "Success: LoRA adapter 'c2' removed successfully."
        unknown = client.post("/v1/unload_lora_adapter", json={"lora_name": "c2"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        client.get("/get_server_info").raise_for_status()


def test_frontend_programs_pick_an_adapter_per_gen(lora_server) -> None:
    """``gen(lora=...)`` and ``run(lora=...)`` over the HTTP backend: the text each adapter
    generates for the same prompt, as /generate gives it."""
    from radixserve.frontend import RuntimeEndpoint, function, gen

    endpoint = RuntimeEndpoint(lora_server.url, timeout=60.0)
    params = {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}
    with lora_server.client() as client:
        expected = {
            name: client.post(
                "/generate", json={"text": "Once", "sampling_params": params, "lora_path": name}
            ).json()["text"]
            for name in ("a", "b", None)
        }
    assert len(set(expected.values())) == 3

    @function
    def two(s):  # type: ignore[no-untyped-def]
        s += "Once"
        s += gen("x", max_tokens=MAX_NEW, lora="b")  # its own adapter over the run's default
        s += gen("y", max_tokens=MAX_NEW)

    state = two.run(backend=endpoint, temperature=0, ignore_eos=True, lora="a")
    assert state["x"] == expected["b"]
    base = two.run(backend=endpoint, temperature=0, ignore_eos=True)
    assert base["x"] == expected["b"]  # gen's own lora
    with lora_server.client() as client:
        after_x = client.post(
            "/generate",
            json={"text": "Once" + expected["b"], "sampling_params": params, "lora_path": "a"},
        ).json()["text"]
    assert state["y"] == after_x
    endpoint.shutdown()


@pytest.mark.timeout(120)
def test_malformed_adapters_are_refused_and_the_server_serves_on(
    lora_server, adapters, peft_tokens, tmp_path
) -> None:
    """Each broken adapter (random bytes, a 0-d tensor, float8 or int weights, a NaN, a FIFO, a
    symlink to /dev/zero) is a 400 naming what is wrong, on SGLang's route and vLLM's; the
    scheduler lives on and serves adapter "a" as PEFT does."""
    with lora_server.client(timeout=20.0) as client:
        for kind, words in MALFORMED.items():
            bad = str(write_malformed_lora(adapters["a"], tmp_path / kind, kind))
            body = {"lora_name": kind, "lora_path": bad}
            refused = client.post("/load_lora_adapter", json=body)
            assert refused.status_code == 400, refused.text
            reply = refused.json()
            assert not reply["success"] and words in reply["error_message"], reply
            assert words in reply["error"]["message"], reply
            assert set(reply["loaded_adapters"]) == {"a", "b"}
            v1 = client.post("/v1/load_lora_adapter", json=body)
            assert v1.status_code == 400 and words in v1.json()["error"]["message"], v1.text
        assert generate(client, "a").json()["output_ids"] == peft_tokens["a"]
        client.get("/get_server_info").raise_for_status()


@pytest.mark.timeout(60)
def test_a_malformed_adapter_at_start_is_one_line_naming_it(
    api_model_dir, adapters, tmp_path, capsys
) -> None:
    """``serve --lora-paths`` with a NaN adapter among good ones: exit 2 and one line naming it,
    before any process starts."""
    from radixserve.launch import cli

    bad = write_malformed_lora(adapters["a"], tmp_path / "nan", "nan")
    argv = ["serve", "--model", str(api_model_dir), "--lora-paths", f"a={adapters['a']}"]
    assert cli.main([*argv, f"x={bad}"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"radixserve serve: --lora-paths x={bad}: ") and "NaN" in line, line
