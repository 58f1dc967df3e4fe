"""The coding agents, unchanged (from npm), against a radixserve server (slow): Claude Code
through the Messages door and OpenAI's Codex CLI through the Responses door, each a headless
turn and the conversation continued, as their users point them at a local server. They send
what coding agents send (prompts of 15k-30k tokens and a score of tools; Claude Code a system
message inside ``messages``, adaptive thinking, context editing and 32,000 new tokens asked for,
hence ``--allow-auto-truncate``; Codex tools grouped in a namespace, a hosted web search, its
own metadata, ``store: false`` with the whole history re-sent), and the continued turn's prompt
is read from the radix cache.

The packages are installed once with npm under ``~/.cache/radixserve/test-npm``; without npm,
or when an install fails, the test skips saying why.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serving_harness import Server, serving, write_api_model
from tool_template import QWEN_TOOLS_TEMPLATE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CLAUDE_CODE = ("@anthropic-ai/claude-code@2.1.197", "claude")
CODEX = ("@openai/codex@0.171.0", "codex")
MODEL = "agent-tiny"
CONTEXT = 65536  # Claude Code's system prompt and tools alone are about 30k tokens


def _npm_binary(package: str, name: str) -> Path:
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.skip(f"needs node and npm (Debian's nodejs and npm) to install {package}")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = cache / "radixserve" / "test-npm" / package.replace("/", "_")
    binary = root / "node_modules" / ".bin" / name
    if not binary.exists():
        root.mkdir(parents=True, exist_ok=True)
        cmd = [npm, "install", "--silent", "--prefix", str(root), package]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not binary.exists():
            pytest.skip(f"cannot install {package}: {done.stderr[-500:]}")
    return binary


@pytest.fixture(scope="module")
def agent_server(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Any) -> Iterator[Server]:
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = QWEN_TOOLS_TEMPLATE
    path = write_api_model(
        tmp_path_factory.mktemp("agent-model") / MODEL, tok, max_position_embeddings=CONTEXT
    )
    args = ["--model", str(path), "--served-model-name", MODEL]
    args += ["--max-total-tokens", "200000", "--allow-auto-truncate"]
    with serving(args, tmp_path_factory.mktemp("agent-log") / "server.log") as server:
        yield server


def _run(cmd: list[str], env: dict[str, str], home: Path) -> str:
    env = {**os.environ, "HOME": str(home), **env}  # their settings and sessions: the test's
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=home)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


def test_claude_code_runs_a_turn_and_continues_from_the_cache(
    agent_server: Server, tmp_path: Path
) -> None:
    claude = str(_npm_binary(*CLAUDE_CODE))
    env = {
        "ANTHROPIC_BASE_URL": agent_server.url,
        "ANTHROPIC_API_KEY": "sk-unused",
        "ANTHROPIC_MODEL": MODEL,
        "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    flags = ["--max-turns", "2", "--output-format", "json"]
    usage = []
    for turn in (["-p", "Say hi."], ["--continue", "-p", "And again."]):
        result = json.loads(_run([claude, *turn, *flags], env, tmp_path))
        assert result["is_error"] is False, result
        usage.append(result["usage"])
    first, second = usage
    assert first["input_tokens"] > 10_000, first  # its system prompt and tools, uncached
    # the continued conversation's prompt starts with the whole first prompt: read from the
    # cache (but for the last few tokens, which the answer's text may merge with)
    assert second["cache_read_input_tokens"] >= first["input_tokens"] - 3, (first, second)


def test_codex_runs_a_turn_and_resumes_from_the_cache(agent_server: Server, tmp_path: Path) -> None:
    codex = str(_npm_binary(*CODEX))
    config = tmp_path / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text(
        f'model = "{MODEL}"\nmodel_provider = "radixserve"\n\n'
        "[model_providers.radixserve]\n"
        f'name = "radixserve"\nbase_url = "{agent_server.url}/v1"\n'
        'wire_api = "responses"\nenv_key = "RADIXSERVE_KEY"\n'
    )
    env = {"RADIXSERVE_KEY": "unused"}
    usage = []
    for turn in (["Say hi."], ["resume", "--last", "And again."]):
        cmd = [codex, "exec", "--json", "--skip-git-repo-check", *turn]
        events = [json.loads(line) for line in _run(cmd, env, tmp_path).splitlines() if line]
        done = [e for e in events if e.get("type") == "turn.completed"]
        assert len(done) == 1 and not [e for e in events if e.get("type") == "error"], events
        usage.append(done[0]["usage"])
    first, second = usage
    assert first["input_tokens"] > 5_000, first  # its instructions and tools
    # resumed, it sends the whole history again (store: false): read from the cache
    assert second["cached_input_tokens"] >= first["input_tokens"] - 3, (first, second)
