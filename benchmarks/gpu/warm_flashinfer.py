"""Compile FlashInfer's kernels before anything is timed (``device_gpu.sh``'s jit stage).

FlashInfer builds a kernel the first time it meets a (kind, head size, group, window); on a
fresh GPU machine every one is compiled in this run. This runs two extends (from scratch, and
on a cached prefix: the ragged kernel, the prefix's paged pass and ``merge_state``) and one
decode (on CUDA cores where the group allows, and on tensor cores) through
:class:`FlashInferBackend` for each attention shape the `gpu` tests and the benchmarks use, then
the fused norm and activation kernels (``CudaKernels``), printing how long each took.
``--device cpu`` runs the same calls through the torch reference wrappers (the dry run proves
the calls, not the kernels).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import torch

from radixserve.memory_pool import KVCache, ReqToTokenPool
from radixserve.models.attention.base import AttentionSpec
from radixserve.models.attention.flashinfer_backend import FlashInferBackend
from radixserve.models.attention.paged_reference import ReferenceWrappers
from radixserve.models.forward_batch import ForwardBatch
from radixserve.models.kernels import CudaKernels

# (heads, KV heads, head_dim, window), grouped by the kernels FlashInfer builds for them: one
# prefill module and one decode module per (head_dim, sliding window or not); group sizes other
# than 1/2/4/8 decode through the prefill module. The tests' families (MQA; GQA groups of 2 and
# 3; a window of 16), the kernel test's (groups of 4, a window of 64), the Qwen2.5-0.5B shape,
# the Llama-3-8B shape. `--parallel` builds the groups at once, one process each: a module's
# build is a few nvcc processes, so one group at a time leaves most of 16 cores idle.
GROUPS: dict[str, list[tuple[int, int, int, int | None]]] = {
    "hd64": [(4, 1, 64, None), (4, 2, 64, None), (6, 2, 64, None), (14, 2, 64, None)],
    "hd64-window": [(4, 2, 64, 16), (8, 2, 64, 64)],
    "hd128": [(32, 8, 128, None)],
}
FUSED = "fused"  # the norm and activation kernels of CudaKernels (one module each, any width)
LEN = 40


def warm(heads: int, kv_heads: int, dim: int, window: int | None, device: str) -> None:
    spec = AttentionSpec(heads, kv_heads, dim, dim**-0.5, (window,))
    kv = KVCache(1, 4096, kv_heads, dim, torch.bfloat16, device)
    pool = ReqToTokenPool(4, 512, device)
    pool.req_to_token[0, : 2 * LEN] = torch.arange(1, 2 * LEN + 1, dtype=torch.int32)
    wrappers = None if device.startswith("cuda") else ReferenceWrappers()
    # the split extend (ragged + paged prefix + merge_state) and the paged passes all build here
    split = FlashInferBackend(spec, kv, pool, wrappers=wrappers, ragged_prefill="split")
    extend = ForwardBatch.extend(
        list(range(LEN)), [0], [0], [LEN], torch.arange(1, LEN + 1), device
    )
    # on a cached prefix: the prefix's paged pass (not causal) and merge_state build too
    on_prefix = ForwardBatch.extend(
        list(range(LEN)), [0], [LEN], [LEN], torch.arange(LEN + 1, 2 * LEN + 1), device
    )
    decode = ForwardBatch.decode([1], [0], [LEN], torch.tensor([LEN]), device)
    # decode on tensor cores too (ExecutionConfig.flashinfer_decode_tensor_cores, the +tc side)
    tc = FlashInferBackend(spec, kv, pool, wrappers=wrappers, decode_tensor_cores=True)
    for batch, backend in ((extend, split), (on_prefix, split), (decode, split), (decode, tc)):
        n = batch.input_ids.shape[0]
        q = torch.randn(n, heads, dim, dtype=torch.bfloat16, device=device)
        k = torch.randn(n, kv_heads, dim, dtype=torch.bfloat16, device=device)
        backend.init_forward_metadata(batch)
        run = backend.forward_decode if batch.is_decode else backend.forward_extend
        out = run(q, k, torch.randn_like(k), 0, batch)
        assert out.shape == (n, heads * dim) and bool(out.float().isfinite().all())


def warm_fused(device: str) -> None:
    """FlashInfer's fused add+RMSNorm, RMSNorm and SiLU-and-mul (``CudaKernels``)."""
    if not device.startswith("cuda"):
        return  # the CPU's tests run them through a stand-in (tests/models/test_cuda_kernels.py)
    kernels = CudaKernels.flashinfer()
    x = torch.randn(4, 896, dtype=torch.bfloat16, device=device)
    w = torch.ones(896, dtype=torch.bfloat16, device=device)
    kernels.rms_norm(x.clone(), w, 1e-6)
    kernels.rms_norm(x.clone(), w, 1e-6, x.clone())
    kernels.silu_mul(torch.randn(4, 2 * 896, dtype=torch.bfloat16, device=device))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    groups = [*GROUPS, FUSED]
    parser.add_argument("--groups", nargs="+", choices=groups, default=groups)
    parser.add_argument("--parallel", action="store_true", help="one process per group")
    args = parser.parse_args()
    if args.parallel:
        procs = [
            subprocess.Popen([sys.executable, __file__, "--device", args.device, "--groups", g])
            for g in args.groups
        ]
        sys.exit(max(p.wait() for p in procs))
    for group in args.groups:
        if group == FUSED:
            start = time.perf_counter()
            warm_fused(args.device)
            print(f"[{FUSED}] norms and SiLU-and-mul: {time.perf_counter() - start:.1f} s")
            continue
        for shape in GROUPS[group]:
            start = time.perf_counter()
            warm(*shape, args.device)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            print(
                f"[{group}] heads {shape[0]}/{shape[1]}, head_dim {shape[2]}, window {shape[3]}: "
                f"{time.perf_counter() - start:.1f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
