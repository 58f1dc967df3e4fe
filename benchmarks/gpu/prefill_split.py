"""The prefill split, before and after in one run (``device_gpu.sh``'s split stage).

radixserve's FlashInfer backend can split an extend as SGLang's does: the new tokens attend to
one another through the ragged kernel (their K/V as they are, no page table), the cached prefix
through the paged kernel, the two merged with ``merge_state``. This times whole forwards of the
model with that split (``ragged``, ``FlashInferBackend.ragged_prefill = "split"``) against one
causal paged pass over the whole sequence (``paged``, ``"off"``), interleaved, on the same
pools; the default, ``"cold"``, is the faster of the two by these rows (ragged for a batch with
nothing cached, paged for any other):

- ``scratch N``: one prompt of N tokens, nothing cached (the split is the ragged kernel alone);
- ``on C +E``: E new tokens on a cached prefix of C;
- ``Bx(C +E, half cold)``: B requests of E new tokens, every other one on a cached prefix of C.

Each row prints the extend tokens/s of both (median of ``--reps``), their ratio and the largest
difference of their last-token logits. ``--device cpu`` runs the same through the torch
reference wrappers (the dry run proves the calls, not the kernels' speed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from radixserve.models.attention.flashinfer_backend import FlashInferBackend
from radixserve.models.attention.paged_reference import ReferenceWrappers
from radixserve.models.forward_batch import ForwardBatch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from model_throughput import SHAPE_WRITERS, OurSide, ensure_shaped_model, synchronize  # noqa: E402

Case = tuple[str, list[int], list[int]]  # name, prefix lengths, extend lengths


def cases(scratch: int, prefix: int, extend: int, batch: int) -> list[Case]:
    half_cold = [0 if i % 2 else prefix for i in range(batch)]
    return [
        (f"scratch {scratch}", [0], [scratch]),
        (f"on {prefix} +{extend}", [prefix], [extend]),
        (f"{batch}x({prefix} +{extend}, half cold)", half_cold, [extend] * batch),
    ]


def extend_batch(side: OurSide, prefix: list[int], extend: list[int], gen: torch.Generator):
    """Rows 0..B-1: ``extend[i]`` new tokens on the ``prefix[i]`` already in row i's slots."""
    rows = list(range(len(prefix)))
    slots = torch.cat(
        [
            1 + r * side.ctx + torch.arange(p, p + e)
            for r, p, e in zip(rows, prefix, extend, strict=True)
        ]
    )
    side.pool.write_spans(rows, prefix, extend, slots)
    ids = torch.randint(0, side.runner.vocab_size, (int(sum(extend)),), generator=gen)
    return ForwardBatch.extend(ids, rows, prefix, extend, slots, side.runner.device)


def run(args: argparse.Namespace) -> list[dict[str, object]]:
    todo = cases(args.scratch, args.prefix, args.extend, args.batch)
    longest = max(p + e for _, ps, es in todo for p, e in zip(ps, es, strict=True))
    side = OurSide(args.model_dir, args.dtype, args.batch, longest + 8, False, args.device)
    runner = side.runner
    if not args.device.startswith("cuda"):  # the dry run: FlashInfer's contract in torch
        spec = runner.model.attention_spec
        runner.attn_backend = FlashInferBackend(
            spec, runner.kv_cache, runner.req_to_token_pool, wrappers=ReferenceWrappers()
        )
    backend = runner.attn_backend
    assert isinstance(backend, FlashInferBackend)
    gen = torch.Generator().manual_seed(0)
    # every row's prefix in the pool once (it is only read after this)
    side.prefill(torch.randint(0, runner.vocab_size, (args.batch, args.prefix), generator=gen))
    rows: list[dict[str, object]] = []
    print(f"{'extend tokens/s':34s}{'ragged':>12s}{'paged':>12s}{'ragged/paged':>14s}  max|dlogit|")
    for name, prefix, extend in todo:
        batch = extend_batch(side, prefix, extend, gen)
        logits: dict[str, torch.Tensor] = {}
        times: dict[str, list[float]] = {"ragged": [], "paged": []}
        for rep in range(args.reps + 1):  # the first is a warm-up
            for b in times:  # interleaved: the host's noise hits both
                backend.ragged_prefill = "split" if b == "ragged" else "off"
                synchronize()
                start = time.perf_counter()
                out = runner.forward(batch)
                synchronize()
                if rep:
                    times[b].append(time.perf_counter() - start)
                logits[b] = out.next_token_logits.float()
        tps = {b: sum(extend) / statistics.median(t) for b, t in times.items()}
        diff = (logits["ragged"] - logits["paged"]).abs().max().item()
        ratio = tps["ragged"] / tps["paged"]
        print(f"{name:34s}{tps['ragged']:12.0f}{tps['paged']:12.0f}{ratio:13.2f}x  {diff:.3g}")
        rows.append({"row": name, "tokens_per_s": tps, "ratio": ratio, "max_logit_diff": diff})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--model-shape", choices=list(SHAPE_WRITERS), default="qwen25-0.5b")
    parser.add_argument("--scratch", type=int, default=4096, help="tokens of the cold prompt")
    parser.add_argument("--prefix", type=int, default=4096, help="cached tokens under an extend")
    parser.add_argument("--extend", type=int, default=256, help="new tokens of an extend")
    parser.add_argument("--batch", type=int, default=8, help="requests of the mixed row")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dtype", default="bfloat16", help="of the weights and the KV cache")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    ensure_shaped_model(args.model_dir, args.model_shape, args.device)
    rows = run(args)
    if args.json:
        args.json.write_text(json.dumps({"device": args.device, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
