"""lm-evaluation-harness, unchanged, against a real radixserve server (slow: lm-eval's start-up
and imports alone take tens of seconds).

``lm_eval --model local-completions`` (``/v1/completions``, the prompt as token ids, ``echo`` +
``logprobs: 1`` + ``max_tokens: 1`` for each loglikelihood) runs two tasks defined from local
JSONL files in a temp dir (``dataset_path: json`` with ``data_files``; no hub): a
multiple-choice task, whose per-choice loglikelihoods must equal transformers' on the same
float32 weights, and a ``generate_until`` task, whose answers must be the server's own greedy
completions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from serving_harness import Server
from test_evaluation import eval_server, hf_model, hf_tokenizer  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ATOL = 2e-3  # float32 on both sides (summed over a choice's few tokens)
MC_DOCS = [
    {"question": "Q: 2 + 2 =", "choices": ["4", "5", "22"], "answer": 0},
    {"question": "def add(a, b):\n    return", "choices": ["a + b", "a - b"], "answer": 0},
]
GEN_DOCS = [{"question": "for i in range(", "answer": "10"}, {"question": "x = [", "answer": "1"}]


def _task_files(root: Path) -> Path:
    """Two lm-eval tasks over JSONL files in ``root``: ``rs_mc`` and ``rs_gen``."""
    for name, docs in (("mc", MC_DOCS), ("gen", GEN_DOCS)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    common = "dataset_path: json\ntest_split: test\ndoc_to_text: '{{question}}'\n"
    (root / "rs_mc.yaml").write_text(
        "task: rs_mc\n"
        + common
        + f"dataset_kwargs:\n  data_files:\n    test: {root / 'mc.jsonl'}\n"
        "output_type: multiple_choice\ndoc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\n"
        "metric_list:\n  - metric: acc\n"
    )
    (root / "rs_gen.yaml").write_text(
        "task: rs_gen\n"
        + common
        + f"dataset_kwargs:\n  data_files:\n    test: {root / 'gen.jsonl'}\n"
        "output_type: generate_until\ndoc_to_target: '{{answer}}'\n"
        "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 6\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n"
    )
    return root


def _samples(out: Path, task: str) -> list[dict[str, Any]]:
    [path] = out.rglob(f"samples_{task}_*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def test_lm_eval_local_completions(
    eval_server: Server,  # noqa: F811
    api_model_dir: Path,
    hf_model: Any,  # noqa: F811
    hf_tokenizer: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    lm_eval = shutil.which("lm_eval", path=str(Path(sys.executable).parent))
    if lm_eval is None:
        pytest.skip("lm-eval is not installed (the test extra)")
    tasks, out = _task_files(tmp_path), tmp_path / "out"
    model_args = (
        f"model={api_model_dir},base_url={eval_server.url}/v1/completions,"
        f"tokenizer={api_model_dir},tokenizer_backend=huggingface,num_concurrent=1,max_retries=1"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HOME": str(tmp_path)}
    cmd = [lm_eval, "--model", "local-completions", "--model_args", model_args]
    cmd += ["--tasks", "rs_mc,rs_gen", "--include_path", str(tasks)]
    cmd += ["--output_path", str(out), "--log_samples"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=540)
    assert done.returncode == 0, done.stderr[-4000:]

    mc = _samples(out, "rs_mc")
    assert len(mc) == len(MC_DOCS)
    for sample in mc:
        arguments = sample["arguments"]  # {"gen_args_0": {"arg_0", "arg_1"}, ...} or a list
        arguments = list(arguments.values()) if isinstance(arguments, dict) else arguments
        for args, resp in zip(arguments, sample["resps"], strict=True):
            context, continuation = _pair(args)
            got = float(resp[0][0])
            assert got == pytest.approx(
                _hf_loglik(hf_model, hf_tokenizer, context, continuation), abs=ATOL
            )

    gen = _samples(out, "rs_gen")
    assert len(gen) == len(GEN_DOCS)
    with eval_server.client() as http:
        for sample in gen:
            body = {"prompt": sample["doc"]["question"], "max_tokens": 6, "temperature": 0}
            text = http.post("/v1/completions", json={**body, "stop": ["\n"]}).json()
            assert sample["resps"][0][0] == text["choices"][0]["text"]


def _pair(args: Any) -> tuple[str, str]:
    """A logged loglikelihood request's (context, continuation), whichever way lm-eval logs it."""
    if isinstance(args, dict):
        return str(args["arg_0"]), str(args["arg_1"])
    return str(args[0]), str(args[1])


def _hf_loglik(model: Any, tok: Any, context: str, continuation: str) -> float:
    """log P(continuation | context) as lm-eval's API models tokenize it: the whole text and the
    context without special tokens, the continuation the whole's tokens past the context's."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tok(context + continuation, add_special_tokens=False).input_ids
    ctxlen = len(tok(context, add_special_tokens=False).input_ids)
    with torch.no_grad():
        logits = model(torch.tensor([whole])).logits[0].float()
    logprobs = torch.log_softmax(logits[:-1], dim=-1)
    chosen = logprobs.gather(1, torch.tensor(whole[1:])[:, None]).squeeze(1)
    return float(chosen[ctxlen - 1 :].sum())
