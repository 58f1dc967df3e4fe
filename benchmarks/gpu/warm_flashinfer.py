"""Compile FlashInfer's kernels before anything is timed (``device_gpu.sh``'s jit stage).

FlashInfer builds a kernel the first time it meets a (kind, head size, group, window); on a
fresh GPU machine every one is compiled in this run. This runs one prefill and one decode
through :class:`FlashInferBackend` for each attention shape the `gpu` tests and the benchmarks
use, printing how long each took. ``--device cpu`` runs the same calls through the torch
reference wrappers (the dry run proves the calls, not the kernels).
"""

from __future__ import annotations

import argparse
import time

import torch

from radixserve.memory_pool import KVCache, ReqToTokenPool
from radixserve.models.attention.base import AttentionSpec
from radixserve.models.attention.flashinfer_backend import FlashInferBackend
from radixserve.models.attention.paged_reference import ReferenceWrappers
from radixserve.models.forward_batch import ForwardBatch

# (heads, KV heads, head_dim, window): the tests' families (MQA; GQA groups of 2 and 3; a
# sliding window of 16), the kernel test's (groups of 4, head_dim 128, with and without a
# window of 64), the Qwen2.5-0.5B shape and the Llama-3-8B shape
SHAPES = [
    (4, 1, 64, None),
    (4, 2, 64, None),
    (6, 2, 64, None),
    (4, 2, 64, 16),
    (8, 2, 128, None),
    (8, 2, 128, 64),
    (14, 2, 64, None),
    (32, 8, 128, None),
]
LEN = 40


def warm(heads: int, kv_heads: int, dim: int, window: int | None, device: str) -> None:
    spec = AttentionSpec(heads, kv_heads, dim, dim**-0.5, (window,))
    kv = KVCache(1, 4096, kv_heads, dim, torch.bfloat16, device)
    pool = ReqToTokenPool(4, 512, device)
    pool.req_to_token[0, :LEN] = torch.arange(1, LEN + 1, dtype=torch.int32)
    wrappers = None if device.startswith("cuda") else ReferenceWrappers()
    backend = FlashInferBackend(spec, kv, pool, wrappers=wrappers)
    extend = ForwardBatch.extend(
        list(range(LEN)), [0], [0], [LEN], torch.arange(1, LEN + 1), device
    )
    decode = ForwardBatch.decode([1], [0], [LEN], torch.tensor([LEN]), device)
    for batch in (extend, decode):
        n = batch.input_ids.shape[0]
        q = torch.randn(n, heads, dim, dtype=torch.bfloat16, device=device)
        k = torch.randn(n, kv_heads, dim, dtype=torch.bfloat16, device=device)
        backend.init_forward_metadata(batch)
        run = backend.forward_decode if batch.is_decode else backend.forward_extend
        out = run(q, k, torch.randn_like(k), 0, batch)
        assert out.shape == (n, heads * dim) and bool(out.float().isfinite().all())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    for shape in SHAPES:
        start = time.perf_counter()
        warm(*shape, args.device)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        print(
            f"heads {shape[0]}/{shape[1]}, head_dim {shape[2]}, window {shape[3]}: "
            f"{time.perf_counter() - start:.1f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
