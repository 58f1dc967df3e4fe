"""The cpu_kernel attention backend of every ISA variant against the paged-attention contract.

Reference: ``paged_attention_reference`` in float32 on the same pool (see
test_attention_backends.py). The kernel computes in fp32 throughout (K/V widened from bf16), so
fp32 KV matches to summation order and bf16 KV to the rounding of its output; the torch-native
backend it replaces agrees within bf16 rounding too. In the amx variant, bf16 extends of 16 or
more query rows per request run on AMX tiles, whose probabilities are rounded to bf16 before
P V (as torch's SDPA does in bf16): within one bf16 ulp of the output (measured: at most 0.0156
on these cases, values of magnitude up to ~4), inside the same 2e-2 tolerance.
"""

from __future__ import annotations

import pytest
import torch
from test_attention_backends import BATCHES, SPECS, Setup, _lengths

from radixserve.models.attention.base import AttentionSpec
from radixserve.models.attention.cpu_kernel import CpuKernelBackend
from radixserve.models.attention.torch_native import TorchNativeBackend
from radixserve.models.kernels import CpuKernels

KERNEL_SPECS = {
    **{k: v for k, v in SPECS.items() if v.head_dim % 16 == 0},
    "qwen": AttentionSpec(14, 2, 64, 0.125, (None, 70)),
    "wide": AttentionSpec(4, 4, 128, 128**-0.5, (None, 33)),
    # the most query heads per KV head the decode path takes; d not a multiple of 2 AVX-512
    # vectors; a window long enough for long_decode's keys to split over tasks within it
    "gqa8": AttentionSpec(16, 2, 48, 48**-0.5, (600, None)),
}
# long_decode: a decode batch of few requests whose keys split over tasks (kSplitKeys = 256)
KERNEL_BATCHES = {
    **BATCHES,
    "long_prefix": ([300, 5, 130], [41, 200, 1]),
    "long_decode": ([1100, 700], [1, 1]),
}
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("spec_name", sorted(KERNEL_SPECS))
@pytest.mark.parametrize("batch_name", sorted(KERNEL_BATCHES))
@pytest.mark.parametrize("decode", [False, True], ids=["extend", "decode"])
def test_cpu_attention_kernel_follows_the_contract(
    variant_kernels: CpuKernels, dtype: torch.dtype, spec_name: str, batch_name: str, decode: bool
) -> None:
    """Causal, windows, GQA, ragged batches, several 64-key blocks: against the float32
    reference on the same pool, and close to the torch-native path it replaces."""
    spec = KERNEL_SPECS[spec_name]
    prefix, extend = _lengths(KERNEL_BATCHES[batch_name], decode)
    tol = TOL[dtype]
    for layer in range(2):
        s = Setup(spec, prefix, extend, decode, dtype, num_slots=2048)
        out = s.run(CpuKernelBackend(spec, s.kv, s.pool, variant_kernels), layer)
        assert out.dtype == dtype
        assert torch.equal(s.kv.k_buffer[layer][s.batch.out_cache_loc], s.k)
        ref = s.reference(layer).float()
        torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)
        torch_path = s.run(TorchNativeBackend(spec, s.kv, s.pool), layer)
        torch.testing.assert_close(out.float(), torch_path.float(), rtol=tol, atol=tol)


def test_cpu_attention_kernel_declines_what_it_cannot_run(variant_kernels: CpuKernels) -> None:
    k = variant_kernels
    assert k.attention_kernel(torch.bfloat16, 64) is not None
    assert k.attention_kernel(torch.float16, 64) is None
    assert k.attention_kernel(torch.bfloat16, 8) is None  # head_dim not a multiple of 16
    assert k.attention_kernel(torch.bfloat16, 512) is None
    assert CpuKernels.build(k.variant, attention=False).attention_kernel(torch.float32, 64) is None
    spec = SPECS["mqa"]  # head_dim 8
    s = Setup(spec, [3], [4], False, torch.bfloat16)
    with pytest.raises(ValueError, match="no CPU attention kernel"):
        CpuKernelBackend(spec, s.kv, s.pool, k)
