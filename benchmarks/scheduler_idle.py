"""How long a GPU would sit idle behind radixserve's scheduler.

The scheduler process runs for real: ``SchedulerLoop.run_once`` (the zmq poll for requests,
``Scheduler.step`` with its policy, admission, KV bookkeeping and batch building, output
processing, the pickled outputs pushed to a detokenizer socket that a thread drains) and the
real ``ModelWorker`` (its sampling info, the sampler, the result's host copies). Only the
``ModelRunner`` is modelled: its forward sleeps, releasing the GIL as a GPU would, for the time
an H100 needs to stream the step's bytes, ``(weight bytes + KV bytes read) / 3 TB/s``, and hands
back logits over a small vocabulary (the sampler's work is a GPU's too).

Each row fills a decode batch of ``B`` requests with ``--context`` tokens of prompt each
(prefill not measured), then times ``--steps`` decode steps at that batch, for each variant:
overlap off; on, with a worker thread that waits for each step (``thread sync``) or only
launches it (``thread``, the default); on, launched from the scheduler thread itself as on a
CUDA stream (``stream``, ``--overlap-launch stream``). ``--launch-ms`` is the host's time to
launch a step (a CUDA graph's replay and its plan), spent holding the GIL. ``idle`` is the share of the window's wall time when no forward was running: with
overlap off it is the whole CPU time of a step; with overlap on the scheduler prepares step N+1
while N runs, and only what it cannot hide shows. The target: under 5% at B = 64 and
256 with overlap on, on the Llama-3-8B shape. On the 0.5B shape a step is ~0.33 ms: no Python
scheduler hides its time there; the figure to watch is the CPU time per step.

    python benchmarks/scheduler_idle.py                        # both shapes, B = 1 64 256
    python benchmarks/scheduler_idle.py --shapes llama3-8b --batches 64 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, cast

import torch
import zmq

from radixserve.config import EngineConfig
from radixserve.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from radixserve.models.forward_batch import ForwardBatch
from radixserve.radix import RadixCache
from radixserve.runtime.io_struct import GenerateRequest
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.model_runner import LogitsOutput, ModelRunner
from radixserve.runtime.model_worker import BatchResult, ModelWorker
from radixserve.runtime.schedule_batch import ScheduleBatch
from radixserve.runtime.scheduler import Scheduler
from radixserve.server.ipc import ParentWatch
from radixserve.server.scheduler_process import SchedulerLoop
from radixserve.types import SamplingParams

HBM_BYTES_PER_S = 3.0e12  # H100 SXM, a device-to-device copy as measured on the lent machine
BF16_FLOPS = 600e12  # a prefill's matrix products, dense bf16 (prefill is not measured)
VOCAB = 64  # the sampler's input: argmax over this many logits per row


@dataclass(frozen=True)
class Shape:
    """What one forward of a bf16 model reads: every weight once (the embedding table only by
    the rows it looks up, so not counted unless tied to the lm_head) plus the KV of every
    token of the batch."""

    name: str
    weight_bytes: float
    kv_bytes_per_token: int  # layers x KV heads x head_dim x (K and V) x 2 bytes
    params: float

    def step_seconds(self, fb: ForwardBatch) -> float:
        kv_read = self.kv_bytes_per_token * sum(fb.seq_lens_list)
        memory = (self.weight_bytes + kv_read) / HBM_BYTES_PER_S
        if fb.is_decode:
            return memory
        return max(memory, 2 * self.params * int(fb.input_ids.shape[0]) / BF16_FLOPS)


SHAPES = {
    # 8.03e9 parameters; the 128256 x 4096 embedding table is not the lm_head: 15.0 GB read
    "llama3-8b": Shape("llama3-8b", 2 * (8.03e9 - 128256 * 4096), 32 * 8 * 128 * 2 * 2, 8.03e9),
    # 0.494e9 parameters, the embedding tied to the lm_head (read whole every step)
    "qwen25-0.5b": Shape("qwen25-0.5b", 2 * 0.494e9, 24 * 2 * 64 * 2 * 2, 0.494e9),
}


def sleep_until(deadline: float) -> None:
    """Sleep (the GIL released) until ``deadline`` on ``time.perf_counter``'s clock."""
    time.sleep(max(0.0, deadline - time.perf_counter()))
    while time.perf_counter() < deadline:  # sleep may wake a little early
        time.sleep(0)


class ModelledRunner:
    """What ``ModelWorker`` needs of a ``ModelRunner``. ``forward`` puts the step on a
    modelled GPU's stream: it starts when the stream is free (or now, if it is idle) and takes
    :meth:`Shape.step_seconds`. With ``sync`` the forward then sleeps until the step is done
    (a worker thread that waits for the GPU); without, it returns at once, as a CUDA launch
    does, and :class:`ModelledWorker` sleeps until then where the real one waits for the copy
    of the sampled ids (``_HostCopy.wait``, on the scheduler thread)."""

    def __init__(self, config: EngineConfig, shape: Shape, sync: bool, launch_s: float) -> None:
        self.config = config
        self.shape = shape
        self.sync = sync
        self.launch_s = launch_s  # the host's work to launch a step, holding the GIL
        self.device = torch.device("cpu")
        self.vocab_size = VOCAB
        self.model_config = argparse.Namespace(eos_token_ids=())
        self.busy: list[tuple[float, float, bool, int]] = []  # start, end, decode, batch size
        self.free_at = 0.0  # when the stream's last step ends
        self.done_at: dict[int, float] = {}  # id(forward batch) -> when its step ends
        self._logits = torch.randn(4096, VOCAB)

    def forward(self, fb: ForwardBatch) -> LogitsOutput:
        launched = time.perf_counter() + self.launch_s
        while time.perf_counter() < launched:  # Python launching kernels: the GIL held
            pass
        start = max(time.perf_counter(), self.free_at)
        self.free_at = start + self.shape.step_seconds(fb)
        self.busy.append((start, self.free_at, fb.is_decode, len(fb.seq_lens_list)))
        self.done_at[id(fb)] = self.free_at
        if self.sync:
            sleep_until(self.free_at)
        return LogitsOutput(self._logits[: len(fb.seq_lens_list)])

    def wait(self, fb: ForwardBatch) -> None:
        sleep_until(self.done_at.pop(id(fb)))

    def check_alive(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class ModelledWorker(ModelWorker):
    """The real worker; finishing a batch first waits for its modelled step to end."""

    def __init__(self, runner: ModelledRunner, max_rows: int, overlap: bool, launch: str) -> None:
        # ModelWorker is typed for a ModelRunner; ModelledRunner has the part of one it uses
        super().__init__(cast(ModelRunner, runner), max_rows, overlap, launch)
        self.modelled = runner

    def _finish(self, batch: ScheduleBatch, launched: Any) -> BatchResult:  # type: ignore[override]
        assert batch.forward_batch is not None
        self.modelled.wait(batch.forward_batch)
        return ModelWorker._finish(batch, launched)


class Drain:
    """The detokenizer's end of the socket: a thread that receives and drops each message."""

    def __init__(self, context: zmq.Context, endpoint: str) -> None:
        self.sock = context.socket(zmq.PULL)
        self.sock.bind(endpoint)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while True:
                self.sock.recv(copy=False)
        except zmq.ZMQError:  # the context was terminated
            self.sock.close(linger=0)


def add_decoders(
    scheduler: Scheduler, batch: int, context: int, new_tokens: int, ids: tuple[int, int]
) -> None:
    """``batch`` greedy requests of ``context`` random prompt tokens (ids in ``[ids[0],
    ids[1])``) that each decode ``new_tokens`` tokens."""
    gen = torch.Generator().manual_seed(batch)
    for i in range(batch):
        prompt = torch.randint(ids[0], ids[1], (context,), generator=gen).tolist()
        params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        scheduler.add_request(GenerateRequest(f"r{i}", prompt, params))


def drive(scheduler: Scheduler, mark: Callable[[], tuple[float, ...]]) -> list[tuple[float, ...]]:
    """Run the scheduler process's loop (``SchedulerLoop.run_once``: the zmq poll, a step, the
    outputs pushed to a socket that a :class:`Drain` empties) until the scheduler has no work;
    ``mark()`` after each iteration. Shuts the scheduler's worker down."""
    zctx = zmq.Context()
    endpoint = f"ipc:///tmp/radixserve-idle-{os.getpid()}"
    drain = Drain(zctx, endpoint)
    send, recv = zctx.socket(zmq.PUSH), zctx.socket(zmq.PULL)
    send.connect(endpoint)
    recv.bind(f"{endpoint}-in")
    loop = SchedulerLoop(scheduler, recv, send, ParentWatch(os.getppid()))
    marks: list[tuple[float, ...]] = []
    try:
        while scheduler.has_work:
            loop.run_once(0)
            marks.append(mark())
    finally:
        scheduler.worker.shutdown()
        send.close(linger=0)
        recv.close(linger=0)
        zctx.term()  # the drain's recv raises ETERM; it closes its own socket
        drain.thread.join()
        for path in (endpoint, f"{endpoint}-in"):
            if os.path.exists(path.removeprefix("ipc://")):
                os.unlink(path.removeprefix("ipc://"))
    return marks


@dataclass
class Row:
    shape: str
    batch: int
    overlap: bool
    launch: str  # where an overlapped step is launched from: the worker thread, or this one
    sync: bool  # the worker thread waits for each step (else only the scheduler's finish does)
    launch_ms: float  # the modelled host time to launch a step
    modelled_ms: float  # median modelled step of the window
    step_ms: float  # wall time per step over the window
    idle: float  # share of the window's wall time with no step on the modelled GPU
    cpu_ms_per_step: float  # the scheduler thread's CPU time per loop iteration in the window


@dataclass(frozen=True)
class Variant:
    overlap: bool
    launch: str = "thread"  # ModelWorker's: "thread" or "stream"
    sync: bool = False

    @property
    def label(self) -> str:
        if not self.overlap:
            return "off"
        return f"{self.launch}{' sync' if self.sync else ''}"


# overlap off; the worker thread waiting for each step (for comparison); the thread
# launching only (the CPU's overlap); the scheduler thread launching on the stream (CUDA's)
VARIANTS = (
    Variant(False),
    Variant(True, "thread", sync=True),
    Variant(True, "thread"),
    Variant(True, "stream"),
)


def measure(
    shape: Shape,
    batch: int,
    variant: Variant,
    launch_ms: float,
    context: int,
    steps: int,
    warmup: int,
) -> Row:
    overlap, sync = variant.overlap, variant.sync
    ctx = context + warmup + steps + 8
    config = EngineConfig.from_flat(
        max_running_requests=batch,
        disable_overlap_schedule=not overlap,
        chunked_prefill_size=16384,
        max_prefill_tokens=16384,
    )
    kv = KVManager(
        ReqToTokenPool(batch, ctx),
        TokenToKVPoolAllocator(batch * ctx + 2, 1),
        RadixCache(1),
        None,
    )
    runner = ModelledRunner(config, shape, sync, launch_ms / 1e3)
    worker = ModelledWorker(runner, batch, overlap, variant.launch)
    scheduler = Scheduler(config, kv=kv, worker=worker)
    add_decoders(scheduler, batch, context, warmup + steps + 4, (VOCAB, 50_000))
    marks = drive(scheduler, lambda: (time.perf_counter(), time.thread_time()))
    full = [b for b in runner.busy if b[2] and b[3] == batch]
    window = full[warmup : warmup + steps]
    if len(window) < steps:
        raise RuntimeError(f"only {len(window)} decode steps at batch {batch}")
    wall = window[-1][1] - window[0][0]
    busy = sum(end - start for start, end, _, _ in window)
    inside = [m for m in marks if window[0][0] <= m[0] <= window[-1][1]]
    cpu = (inside[-1][1] - inside[0][1]) / max(1, len(inside) - 1)
    modelled = statistics.median(end - start for start, end, _, _ in window)
    return Row(
        shape.name,
        batch,
        overlap,
        variant.launch,
        sync,
        launch_ms,
        1e3 * modelled,
        1e3 * wall / steps,
        1 - busy / wall,
        1e3 * cpu,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 64, 256])
    parser.add_argument("--context", type=int, default=512, help="prompt tokens per request")
    parser.add_argument("--steps", type=int, default=100, help="decode steps timed per row")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument(
        "--launch-ms",
        type=float,
        nargs="+",
        default=[0.5],
        help="the modelled host time to launch a step (a CUDA graph's replay and its plan)",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=[v.label for v in VARIANTS],
        choices=[v.label for v in VARIANTS],
    )
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args()
    rows: list[Row] = []
    print(
        f"{'shape':12s} {'B':>4s} {'launch':>6s} {'overlap':>12s} {'step (GPU)':>10s}"
        f" {'step (wall)':>11s} {'idle':>6s} {'sched CPU':>9s}   (ms)",
        flush=True,
    )
    variants = [v for v in VARIANTS if v.label in args.variants]
    for name in args.shapes:
        for batch in args.batches:
            for launch_ms in args.launch_ms:
                for variant in variants:
                    row = measure(
                        SHAPES[name],
                        batch,
                        variant,
                        launch_ms,
                        args.context,
                        args.steps,
                        args.warmup,
                    )
                    rows.append(row)
                    print(
                        f"{row.shape:12s} {row.batch:4d} {launch_ms:6.2f} {variant.label:>12s}"
                        f" {row.modelled_ms:10.2f} {row.step_ms:11.2f}"
                        f" {row.idle:6.1%} {row.cpu_ms_per_step:9.2f}",
                        flush=True,
                    )
    if args.json:
        report: dict[str, Any] = {
            "hbm_bytes_per_s": HBM_BYTES_PER_S,
            "cpu": os.uname().machine,
            "rows": [asdict(r) for r in rows],
        }
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
