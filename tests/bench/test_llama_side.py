"""``benchmarks/llama_side.py``'s table math and ``--llama-gguf`` parsing (no llama.cpp needed:
nothing here starts a server or converts a model)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def llama_side(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # benchmarks/ import each other by name
    import llama_side

    return llama_side


def test_ratio_columns_pair_each_storage(llama_side: ModuleType) -> None:
    configs = ["bfloat16", "bfloat16+int8", "float32"]
    # sides: rs bf16, rs int8, rs fp32 | HF fp32, HF bf16 | llama q8_0, llama bf16
    values = [12.0, 24.0, 6.0, 4.0, 5.0, 20.0, 10.0]
    columns = llama_side.ratio_columns(configs, 2, ["q8_0", "bf16"])
    labels = [label for label, _, _ in columns]
    assert labels == [
        "rs bfloat16/best HF",
        "rs bfloat16+int8/best HF",
        "rs float32/best HF",
        "rs bfloat16/llama bf16",
        "rs bfloat16+int8/llama q8_0",
    ]  # no f32 GGUF side: no float32 pair
    cells = llama_side.ratio_cells(columns, values).split()
    assert cells == [f"{r:.2f}x" for r in (12 / 5, 24 / 5, 6 / 5, 12 / 10, 24 / 20)]
    header = llama_side.ratio_header(columns)
    assert len(header) == len(llama_side.ratio_cells(columns, values))  # each cell under its label


def test_ratio_columns_without_other_sides(llama_side: ModuleType) -> None:
    assert llama_side.ratio_columns(["bfloat16"], 0, []) == []
    assert llama_side.ratio_cells([], [1.0]) == ""


def test_parse_ggufs(llama_side: ModuleType) -> None:
    parsed = llama_side.parse_ggufs(["bf16", "q8_0=/x/m-q8.gguf"])
    assert parsed == {"bf16": None, "q8_0": Path("/x/m-q8.gguf")}
    with pytest.raises(SystemExit, match="q4_k"):
        llama_side.parse_ggufs(["q4_k=/x.gguf"])


FAKE_SERVER = """#!{python}
# A stand-in for llama-server: without --no-repack it dies of SIGSEGV at warm-up ({crash}),
# as llama.cpp's AMX repack of Q8_0 weights does; with it, it serves /health and /completion.
import http.server, json, os, signal, sys
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
if "--no-repack" not in args and "{crash}" == "start":
    os.kill(os.getpid(), signal.SIGSEGV)
class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{{}}")
    def do_POST(self):
        if "--no-repack" not in args:
            os.kill(os.getpid(), signal.SIGSEGV)
        body = json.dumps({{"tokens": [1], "timings": {{"prompt_n": 1}}}}).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def _fake_server(tmp_path: Path, crash: str) -> Path:
    import sys

    path = tmp_path / f"llama-server-{crash}"
    path.write_text(FAKE_SERVER.format(python=sys.executable, crash=crash))
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("crash", ["start", "request"])
def test_a_repack_crash_names_the_remedy(
    llama_side: ModuleType, tmp_path: Path, crash: str
) -> None:
    """A llama-server killed by SIGSEGV, at warm-up or during a request, raises with the AMX
    repack remedy; with --no-repack passed through as an extra flag, the same server serves."""
    import socket

    import llamacpp

    def port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    binary = _fake_server(tmp_path, crash)
    gguf = tmp_path / "m.gguf"
    with pytest.raises(RuntimeError, match="(?s)killed by signal 11.*LLAMA_ARG_REPACK=0"):
        with llamacpp.LlamaServer(binary, gguf, port(), slots=1) as server:
            server.complete([1, 2], 1)
    with llamacpp.LlamaServer(binary, gguf, port(), 1, 2, 64, ("--no-repack",)) as server:
        assert "--no-repack" in server.cmd
        assert server.complete([1, 2], 1)["tokens"] == [1]
    message = llamacpp.crash_message(-11, ["llama-server", "--no-repack"], "log")
    assert "LLAMA_ARG_REPACK" not in message  # already off: no advice to turn it off
    assert llamacpp.crash_message(1, ["llama-server"], "log").startswith("llama-server exited")
