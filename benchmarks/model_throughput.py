"""Model-execution throughput: radixserve's ModelRunner vs Hugging Face transformers, same weights.

On a random model of Qwen2.5-0.5B's (or, ``--model-shape llama3-8b``, Llama-3-8B's) shape, written
once with ``radixserve.models.tiny``, on the CPU or (``--device cuda``) a GPU:

- prefill tokens/s of one ``--prompt-len``-token prompt;
- decode tokens/s at each ``--batch-sizes`` with ``--context-len`` tokens of context (prefilled
  once; each repetition continues the same sequences, so the context grows by
  ``--decode-steps`` per repetition);
- decode at every batch as a fraction of the memory-bandwidth bound (the step's weight bytes
  plus the KV bytes of its batch, over the streaming bandwidth measured here: the best of a big
  tensor copy and sum; on the CPU also in transparent huge pages, where radixserve keeps its
  weights; on a GPU in its HBM). ``--json`` writes every row.

Every side (each ``--configs`` entry of radixserve: a dtype, ``+int8`` for int8 weights; each
``--hf-dtypes`` entry of transformers; each ``--llama-gguf`` entry of llama.cpp, a llama-server
of ``--threads`` threads driven over HTTP, see ``llama_side.py``) runs greedy steps interleaved
repetition by repetition, so host noise hits all alike; each cell is the median over ``--reps``
repetitions with their min and max, printed as soon as its row is measured (``--prompt-len``
takes several lengths: one prefill row each). The header names the CPU kernel variant this
machine runs. Example (short run)::

    python benchmarks/model_throughput.py --configs bfloat16 bfloat16+int8 --hf-dtypes float32 \
        --batch-sizes 1 8 --reps 2

With llama.cpp (a GGUF given as ``TYPE=PATH``, or ``TYPE`` alone: converted on the fly to
``<model-dir>-TYPE.gguf`` from ``$LLAMA_CPP_DIR``'s sources, see ``llamacpp.py``); the ratio
columns then pair rs bfloat16 with llama bf16 and rs bfloat16+int8 with llama q8_0::

    python benchmarks/model_throughput.py --configs bfloat16 bfloat16+int8 --hf-dtypes float32 \
        --llama-server $LLAMA_CPP_DIR/build/bin/llama-server --llama-gguf bf16 q8_0 --threads 2

On CPUs with AMX, llama.cpp's Q8_0 repack can crash llama-server at warm-up (SIGSEGV); the side
then stops with that reason and the remedy, ``--llama-arg=--no-repack`` (``llamacpp.py``).
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from llama_side import (
    LlamaDecodeRun,
    LlamaSide,
    parse_ggufs,
    ratio_cells,
    ratio_columns,
    ratio_header,
)

from radixserve.config import CPU_ISAS, EngineConfig
from radixserve.models.attention.flashinfer_backend import FlashInferBackend
from radixserve.models.decoder import DecoderForCausalLM
from radixserve.models.forward_batch import ForwardBatch
from radixserve.models.huge_pages import huge_page_buffer
from radixserve.models.kernels import _ext
from radixserve.models.lora import LoraBatch
from radixserve.models.tiny import write_llama3_8b_shaped, write_qwen25_05b_shaped
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.model_runner import ModelRunner


def synchronize() -> None:
    """Wait for the GPU's queued work (a no-op without CUDA): timers read the host clock."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


SHAPE_WRITERS = {"qwen25-0.5b": write_qwen25_05b_shaped, "llama3-8b": write_llama3_8b_shaped}


def ensure_shaped_model(model_dir: Path, shape: str, device: str) -> None:
    """Write the ``shape``-shaped random model to ``model_dir`` unless one is there (built on
    ``device`` when it is CUDA, which is faster)."""
    if (model_dir / "config.json").is_file():
        return
    print(f"writing the {shape}-shaped random model to {model_dir} ...", flush=True)
    SHAPE_WRITERS[shape](model_dir, init_device=device if device.startswith("cuda") else "cpu")


def median_time(fn: Callable[[], object], reps: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def stream_bandwidth(
    num_bytes: int = 1 << 30, reps: int = 5, huge: bool = False, device: str = "cpu"
) -> tuple[float, float] | None:
    """Bytes/s of a big float32 tensor copy (read + written bytes) and of a sum (read only), in
    ordinary memory or (``huge``) in transparent huge pages, as radixserve keeps its CPU
    weights (None where the system refuses them)."""
    if huge:
        a, b = huge_page_buffer(num_bytes), huge_page_buffer(num_bytes)
        if a is None or b is None:
            return None
        src, dst = a.view(torch.float32), b.view(torch.float32)
        src.fill_(1.0)
        dst.zero_()
    else:
        src = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
    copy = 2 * num_bytes / median_time(lambda: dst.copy_(src), reps)
    read = num_bytes / median_time(lambda: src.sum(), reps)
    return copy, read


CELL = 22  # characters per table cell: " 1402.3 (1390-1411)"
OPTIONS = ("int8", "eager", "fullplan", "paged", "tc", "fused")


class OurSide:
    """Drives ModelRunner like a scheduler would, with a fixed slot layout: token ``p`` of row
    ``r`` lives in KV slot ``1 + r * ctx + p`` (slot 0 is the padding slot)."""

    def __init__(
        self,
        model_dir: Path,
        config: str,
        max_bs: int,
        ctx: int,
        torch_linear: bool,
        device: str = "cpu",
    ) -> None:
        # +int8: weight-only int8; +eager: no CUDA graphs; on FlashInfer, the baselines of the
        # fast graph plan and the ragged prefill: +fullplan (a graph replay's full plan), +paged
        # (one paged pass, never the ragged kernel), +tc (decode on tensor cores, whatever the
        # GQA group), +fused (FlashInfer's fused add+RMSNorm and SiLU-and-mul); a CPU kernel
        # variant's name (+avx512_vnni): that variant at most, so variants run side by side
        dtype, *options = config.split("+")
        if not set(options) <= {*OPTIONS, *CPU_ISAS}:
            known = ", ".join((*OPTIONS, *CPU_ISAS))
            raise ValueError(f"unknown options in {config!r}: {known} exist")
        isas = [o for o in options if o in CPU_ISAS]
        quantization = "int8" if "int8" in options else None
        cfg = EngineConfig.from_flat(
            model_path=str(model_dir),
            dtype=dtype,
            device=device,
            quantization=quantization,
            disable_cuda_graph="eager" in options,
            flashinfer_decode_tensor_cores=True if "tc" in options else None,
            flashinfer_fused_ops="fused" in options,
            max_total_tokens=max_bs * ctx,
            max_running_requests=max_bs,
            max_context_len=ctx,
            disable_cpu_linear_kernel=torch_linear,
            **({"cpu_isa": isas[0]} if isas else {}),
        )
        self.name = f"rs {config}"
        kv = KVManager.build(cfg)  # the pools are the KVManager's; the runner is handed them
        assert kv.kv_cache is not None
        self.runner = ModelRunner(cfg, kv.kv_cache, kv.req_to_token_pool)
        backend = self.runner.attn_backend
        if {"fullplan", "paged"} & set(options):
            if not isinstance(backend, FlashInferBackend):
                raise ValueError(f"{config!r}: +fullplan and +paged are FlashInfer's options")
            backend.fast_graph_plan = "fullplan" not in options
            if "paged" in options:
                backend.ragged_prefill = "off"
        self.ctx = ctx
        self.pool = self.runner.req_to_token_pool

    def prefill(self, prompts: torch.Tensor, lora: LoraBatch | None = None) -> torch.Tensor:
        """Prefill ``prompts`` [bs, len] into rows 0..bs-1 (``lora``: the adapters of its
        rows, ``lora_throughput.py``); returns next tokens [bs]."""
        bs, n = prompts.shape
        slots = 1 + torch.arange(bs).view(bs, 1) * self.ctx + torch.arange(n).view(1, n)  # [bs, n]
        self.pool.write_spans(list(range(bs)), [0] * bs, [n] * bs, slots.reshape(-1))
        batch = ForwardBatch.extend(
            prompts.reshape(-1),
            list(range(bs)),
            [0] * bs,
            [n] * bs,
            slots.reshape(-1),
            self.runner.device,
        )
        batch.lora = lora
        return self.runner.forward(batch).next_token_logits.argmax(-1)

    def decode(
        self, tokens: torch.Tensor, seq_lens: list[int], lora: LoraBatch | None = None
    ) -> torch.Tensor:
        """One step for rows 0..bs-1 whose KV lengths before the step are ``seq_lens``."""
        bs = len(seq_lens)
        slots = 1 + torch.arange(bs) * self.ctx + torch.tensor(seq_lens)
        self.pool.write_spans(list(range(bs)), seq_lens, [1] * bs, slots)
        batch = ForwardBatch.decode(
            tokens, list(range(bs)), [s + 1 for s in seq_lens], slots, self.runner.device
        )
        batch.lora = lora
        return self.runner.forward(batch).next_token_logits.argmax(-1)


def streamed_bytes(model: DecoderForCausalLM) -> int:
    """Weight bytes one decode step reads: every parameter and weight buffer, except an
    embedding table that is not also the lm_head (only a few of its rows are read)."""
    buffers = {n: b for n, b in model.named_buffers() if "scale" in n or "int8" in n}
    total = sum(t.numel() * t.element_size() for t in [*model.parameters(), *buffers.values()])
    embed = model.embed_tokens
    if model.head_int8 is not None or model.lm_head is not None:
        total -= embed.numel() * embed.element_size()
    return total


def side_bytes(side: OurSide | HFSide) -> int:
    """The weight bytes a decode step of ``side`` reads: its own dtypes (int8 reads half)."""
    if isinstance(side, OurSide):
        return streamed_bytes(side.runner.model)
    model = side.model
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    if model.get_output_embeddings().weight is not embed:  # untied: few embedding rows read
        total -= embed.numel() * embed.element_size()
    return total


class HFSide:
    def __init__(self, model_dir: Path, dtype: torch.dtype, device: str = "cpu") -> None:
        from transformers import AutoModelForCausalLM

        self.name = f"HF {str(dtype).removeprefix('torch.')}"
        self.device = torch.device(device)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        # transformers wraps `to` in functools.wraps(nn.Module.to): the stubs' _Wrapped keeps the
        # unbound signature, so mypy wants `self` as the first argument
        self.model = model.to(self.device).eval()  # type: ignore[arg-type]

    def prefill(self, prompts: torch.Tensor) -> tuple[torch.Tensor, object]:
        from transformers import DynamicCache

        cache = DynamicCache()
        with torch.inference_mode():
            out = self.model(
                prompts.to(self.device), past_key_values=cache, use_cache=True, logits_to_keep=1
            )
        return out.logits[:, -1].argmax(-1), out.past_key_values

    def decode(self, tokens: torch.Tensor, cache: object) -> torch.Tensor:
        with torch.inference_mode():
            out = self.model(tokens.view(-1, 1), past_key_values=cache, use_cache=True)
        return out.logits[:, -1].argmax(-1)


class DecodeRun:
    """A batch prefilled once on one side; :meth:`step_time` times further greedy steps."""

    def __init__(self, side: OurSide | HFSide, prompts: torch.Tensor) -> None:
        self.side = side
        if isinstance(side, OurSide):
            self.tokens = side.prefill(prompts)
            self.lens = [prompts.shape[1]] * prompts.shape[0]
        else:
            self.tokens, self.cache = side.prefill(prompts)

    def step_time(self, steps: int) -> float:
        """Seconds per decode step, over ``steps`` steps."""
        synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            if isinstance(self.side, OurSide):
                self.tokens = self.side.decode(self.tokens, self.lens)
                self.lens = [n + 1 for n in self.lens]
            else:
                self.tokens = self.side.decode(self.tokens, self.cache)
        synchronize()
        return (time.perf_counter() - start) / steps


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def llama_sides(args: argparse.Namespace, slots: int, ctx: int) -> list[LlamaSide]:
    """One llama-server per ``--llama-gguf`` entry (converted first where no path is given)."""
    if not args.llama_gguf:
        return []
    from llamacpp import convert, default_server, gguf_path, llama_cpp_dir

    binary = args.llama_server or default_server(llama_cpp_dir())
    threads = args.threads or torch.get_num_threads()
    sides = []
    for outtype, path in parse_ggufs(args.llama_gguf).items():
        if path is None:
            path = gguf_path(args.model_dir, outtype)
            if not path.is_file():
                print(f"converting {args.model_dir} to {path} ...")
                convert(args.model_dir, outtype, path)
        extra = tuple(args.llama_args)
        sides.append(LlamaSide(binary, outtype, path, free_port(), slots, threads, ctx, extra))
    return sides


def run_all(args: argparse.Namespace, model_dir: Path, bandwidth: float) -> None:
    max_bs = max(args.batch_sizes, default=1)
    # llama.cpp's sequences grow by 2 + decode_steps per repetition (see llama_side.py)
    ctx = max(*args.prompt_len, args.context_len) + (args.reps + 1) * (args.decode_steps + 2) + 8
    torch_linear = args.linear == "torch"
    ours = [OurSide(model_dir, c, max_bs, ctx, torch_linear, args.device) for c in args.configs]
    hf = [HFSide(model_dir, getattr(torch, d), args.device) for d in args.hf_dtypes]
    llama = llama_sides(args, max_bs, ctx)
    try:
        measure(args, ours, hf, llama, bandwidth)
    finally:
        for side in llama:
            side.close()


def measure(
    args: argparse.Namespace,
    ours: list[OurSide],
    hf: list[HFSide],
    llama: list[LlamaSide],
    bandwidth: float,
) -> None:
    sides: list[OurSide | HFSide | LlamaSide] = [*ours, *hf, *llama]
    vocab = ours[0].runner.vocab_size
    gen = torch.Generator().manual_seed(0)
    for rs in ours:
        nbytes = streamed_bytes(rs.runner.model)
        print(
            f"{rs.name}: {rs.runner.dtype}, attention {type(rs.runner.attn_backend).__name__}"
            f", {nbytes / 1e6:.0f} MB read per step -> bound {bandwidth / nbytes:.1f} tok/s at b=1"
        )
    for ls in llama:
        print(f"{ls.name}: {' '.join(ls.server.cmd)}")
    columns = ratio_columns(args.configs, len(hf), [s.outtype for s in llama])
    names = "".join(f" {s.name:>{CELL - 1}s}" for s in sides)  # a space apart, however long
    print(f"{'tokens/s: median (min-max)':28s}{names}{ratio_header(columns)}")

    rows: list[dict[str, object]] = []  # what --json writes

    def report(name: str, samples: list[list[float]]) -> None:
        """One row: each side's median (min-max) of ``samples`` (tokens/s per repetition); the
        ratios are of the medians."""
        values = [statistics.median(v) for v in samples]
        cells = "".join(
            f"{m:.1f} ({min(v):.0f}-{max(v):.0f})".rjust(CELL)
            for m, v in zip(values, samples, strict=True)
        )
        print(f"{name:28s}{cells}{ratio_cells(columns, values)}")
        per_side = {
            s.name: {"min": min(v), "median": m, "max": max(v)}
            for s, m, v in zip(sides, values, samples, strict=True)
        }
        rows.append(
            {
                "row": name,
                "tokens_per_s": {k: d["median"] for k, d in per_side.items()},
                "spread": per_side,
            }
        )

    for prompt_len in args.prompt_len:
        prompt = torch.randint(0, vocab, (1, prompt_len), generator=gen)
        for side in sides:  # warm-up
            side.prefill(prompt)
        times: list[list[float]] = [[] for _ in sides]
        for _ in range(args.reps):  # interleaved, so host noise hits every side alike
            for i, side in enumerate(sides):
                synchronize()
                start = time.perf_counter()
                side.prefill(prompt)
                synchronize()
                times[i].append(time.perf_counter() - start)
        report(f"prefill {prompt_len} tok", [[prompt_len / t for t in ts] for ts in times])

    for bs in args.batch_sizes:
        prompts = torch.randint(0, vocab, (bs, args.context_len), generator=gen)
        runs = [
            LlamaDecodeRun(side, prompts)
            if isinstance(side, LlamaSide)
            else DecodeRun(side, prompts)
            for side in sides
        ]
        for run in runs:  # warm-up
            run.step_time(1)
        times = [[] for _ in sides]
        for _ in range(args.reps):  # the context grows by decode_steps per repetition
            for i, run in enumerate(runs):
                times[i].append(run.step_time(args.decode_steps))
        del runs
        step = [statistics.median(t) for t in times]
        report(f"decode b={bs} ctx={args.context_len}", [[bs / t for t in ts] for ts in times])
        # the bytes a step must read: the weights once, the KV of every token of the batch
        # (the context grows over the repetitions: its middle)
        ctx = args.context_len + (args.reps + 1) * args.decode_steps // 2
        kv_read = kv_bytes_per_token(ours[0].runner) * bs * ctx
        shares = []
        fractions: dict[str, float] = {}  # ours is never empty: the row always gets the key
        rows[-1]["bound_fraction"] = fractions
        for s, t in zip(sides, step, strict=True):
            if isinstance(s, LlamaSide):
                continue
            bound_s = (side_bytes(s) + kv_read) / bandwidth
            shares.append(f"{s.name} {bound_s / t:.0%}")
            fractions[s.name] = bound_s / t
        print(f"{'  of the bandwidth bound':24s}  " + ", ".join(shares))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bandwidth_bytes_per_s": bandwidth, "rows": rows}, f, indent=1)


def kv_bytes_per_token(runner: ModelRunner) -> int:
    """K and V of one token over every layer."""
    kv = runner.kv_cache
    k = kv.k_buffer[0]
    return 2 * kv.num_layers * k[0].numel() * k.element_size()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=Path("bench_out/qwen25_05b_shaped"),
        help="written (bf16 weights) if missing",
    )
    parser.add_argument(
        "--configs",
        nargs="+",
        default=["bfloat16", "bfloat16+int8", "float32"],
        help="radixserve sides: a dtype, optionally +int8 (weight-only int8), on the CPU a kernel "
        "variant (+avx512_vnni: that one at most) and, on CUDA, +eager (no CUDA graphs), "
        "+fullplan (FlashInfer's full plan at each graph replay), +paged (never the ragged "
        "prefill kernel), +tc (FlashInfer's decode on tensor cores), +fused (its fused "
        "add+RMSNorm and SiLU-and-mul)",
    )
    parser.add_argument(
        "--hf-dtypes",
        nargs="*",
        default=["float32", "bfloat16"],
        choices=["bfloat16", "float32"],
        help="transformers sides (none: skip HF)",
    )
    parser.add_argument(
        "--batch-sizes", nargs="*", type=int, default=[1, 8, 32], help="none: prefill only"
    )
    parser.add_argument(
        "--prompt-len", type=int, nargs="+", default=[512], help="one prefill row per length"
    )
    parser.add_argument("--context-len", type=int, default=512)
    parser.add_argument("--decode-steps", type=int, default=16)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch's and llama.cpp's")
    parser.add_argument(
        "--llama-server", type=Path, default=None, help="default: $LLAMA_CPP_DIR/build/bin/..."
    )
    parser.add_argument(
        "--llama-gguf",
        nargs="*",
        default=[],
        metavar="TYPE[=PATH]",
        help="llama.cpp sides: bf16, f32 or q8_0, each a GGUF path or converted if none",
    )
    parser.add_argument(
        "--linear",
        choices=["kernel", "torch"],
        default="kernel",
        help="radixserve's projections and norms through the CPU kernels (kernel) or torch (torch)",
    )
    parser.add_argument(
        "--device", default="cpu", help="of every side but llama.cpp's: cpu, cuda or cuda:N"
    )
    parser.add_argument(
        "--model-shape",
        choices=list(SHAPE_WRITERS),
        default="qwen25-0.5b",
        help="the random model written to --model-dir when it holds none",
    )
    parser.add_argument(
        "--llama-arg",
        dest="llama_args",
        action="append",
        default=[],
        help="one extra llama-server flag or value per use, e.g. --llama-arg=--no-repack",
    )
    parser.add_argument("--json", default=None, help="also write every row here")
    parser.add_argument(
        "--bandwidth-mib", type=int, default=1024, help="the buffer of the bandwidth measurement"
    )
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # stream each row
    if args.threads:
        torch.set_num_threads(args.threads)
    ensure_shaped_model(args.model_dir, args.model_shape, args.device)
    if args.device.startswith("cuda"):
        bw = stream_bandwidth(args.bandwidth_mib << 20, device=args.device)
        assert bw is not None  # only huge pages can be refused
        copy, read = bw
        props = torch.cuda.get_device_properties(args.device)
        print(f"GPU: {props.name}, {props.total_memory / 2**30:.0f} GiB; torch {torch.__version__}")
        print(f"HBM bandwidth: copy {copy / 1e9:.0f} GB/s (read+write), sum {read / 1e9:.0f} GB/s")
        run_all(args, args.model_dir, max(copy, read))
        return
    bw = stream_bandwidth(args.bandwidth_mib << 20)
    assert bw is not None  # only huge pages can be refused
    copy, read = bw
    huge = stream_bandwidth(args.bandwidth_mib << 20, huge=True)
    variant = _ext.best_variant(EngineConfig().execution.cpu_isa)
    flags = sorted(f for f in _ext.cpu_flags() if f.startswith(("avx", "fma", "f16c", "amx")))
    print(
        f"CPU: {platform.processor() or platform.machine()}, ISA flags {' '.join(flags)}; "
        f"kernel variant {variant}; {torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    print(
        f"streaming bandwidth: copy {copy / 1e9:.1f} GB/s (read+write), sum {read / 1e9:.1f} GB/s"
        + ("" if huge is None else f"; on huge pages {huge[0] / 1e9:.1f}, {huge[1] / 1e9:.1f} GB/s")
    )
    run_all(args, args.model_dir, max(copy, read, *(huge or ())))  # the bound: the best of them


if __name__ == "__main__":
    main()
