"""Claude Code, Anthropic's coding agent, unchanged (from npm), against a radixserve server
through the Messages door (slow): a headless turn and the conversation continued, as its users
point it at a local server (``ANTHROPIC_BASE_URL``). It sends what coding agents send (a 30k-token
system prompt and 24 tools, a system message inside ``messages``, adaptive thinking, context
editing, 32,000 new tokens asked for: ``--allow-auto-truncate``), and the continued turn's prompt
is read from the radix cache.

The package is installed once with npm under ``~/.cache/radixserve/test-npm``; without npm, or
when the install fails, the test skips saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from serving_harness import serving, write_api_model
from tool_template import QWEN_TOOLS_TEMPLATE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.197"
CONTEXT = 65536  # the system prompt and tools alone are about 30k tokens


def _claude() -> Path:
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.skip("needs node and npm (Debian's nodejs and npm) to install Claude Code")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = cache / "radixserve" / "test-npm" / CLAUDE_CODE.replace("/", "_")
    binary = root / "node_modules" / ".bin" / "claude"
    if not binary.exists():
        root.mkdir(parents=True, exist_ok=True)
        cmd = [npm, "install", "--silent", "--prefix", str(root), CLAUDE_CODE]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not binary.exists():
            pytest.skip(f"cannot install {CLAUDE_CODE}: {done.stderr[-500:]}")
    return binary


@pytest.fixture(scope="module")
def claude_model(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Any) -> Path:
    import copy

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = QWEN_TOOLS_TEMPLATE
    path = tmp_path_factory.mktemp("claude-model") / "claude-tiny"
    return write_api_model(path, tok, max_position_embeddings=CONTEXT)


def _turn(claude: Path, url: str, home: Path, *args: str) -> dict[str, Any]:
    env = {
        **os.environ,
        "HOME": str(home),  # its settings and sessions: the test's own
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "sk-unused",
        "ANTHROPIC_MODEL": "claude-tiny",
        "ANTHROPIC_SMALL_FAST_MODEL": "claude-tiny",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    cmd = [str(claude), *args, "--max-turns", "2", "--output-format", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=home)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    result: dict[str, Any] = json.loads(done.stdout)
    assert result["is_error"] is False, result
    return result


def test_claude_code_runs_a_turn_and_continues_from_the_cache(
    claude_model: Path, tmp_path: Path
) -> None:
    claude = _claude()
    args = ["--model", str(claude_model), "--served-model-name", "claude-tiny"]
    args += ["--max-total-tokens", "200000", "--allow-auto-truncate"]
    with serving(args, tmp_path / "server.log") as server:
        home = tmp_path / "home"
        home.mkdir()
        first = _turn(claude, server.url, home, "-p", "Say hi.")["usage"]
        second = _turn(claude, server.url, home, "--continue", "-p", "And again.")["usage"]
    assert first["input_tokens"] > 10_000, first  # its system prompt and tools, uncached
    # the continued conversation's prompt starts with the whole first prompt: read from the
    # cache (but for the last few tokens, which the answer's text may merge with)
    assert second["cache_read_input_tokens"] >= first["input_tokens"] - 3, (first, second)
