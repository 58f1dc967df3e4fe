"""A VERIFY batch through every attention backend: each request's last token and its drafts,
rows of different lengths (9, 1, 2: eight drafts, none, one) on cached prefixes, causal over the
chain and the prefix. The contract's reference computes the same rows as an extend; every
backend must reproduce it: torch-native, FlashInfer (through the torch reference wrappers here,
its own kernels on a GPU) and the CPU kernel of each ISA variant this CPU runs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from test_attention_backends import SPECS, Setup, _needs_flashinfer

from radixserve.models.attention.base import AttentionSpec
from radixserve.models.attention.cpu_kernel import CpuKernelBackend
from radixserve.models.attention.flashinfer_backend import RAGGED_MODES, FlashInferBackend
from radixserve.models.attention.paged_reference import ReferenceWrappers
from radixserve.models.attention.torch_native import TorchNativeBackend
from radixserve.models.forward_batch import ForwardBatch
from radixserve.models.kernels import CpuKernels

pytestmark = pytest.mark.timeout(120)

PREFIX, VERIFY = [14, 3, 40], [9, 1, 2]
KERNEL_SPEC = AttentionSpec(4, 2, 32, 32**-0.5, (None, 5))  # the CPU kernel: head_dim % 16 == 0
GPU_SPEC = AttentionSpec(8, 2, 64, 64**-0.5, (None, 64))  # a head size FlashInfer builds


def verify_setup(spec: AttentionSpec, dtype: torch.dtype, device: str = "cpu") -> Setup:
    """``Setup``'s pool and tensors, its batch laid out as a VERIFY."""
    s = Setup(spec, PREFIX, VERIFY, False, dtype, device=device, num_slots=1024)
    e = s.batch
    s.batch = ForwardBatch.verify(e.input_ids, s.rows, PREFIX, VERIFY, e.out_cache_loc, device)
    assert s.batch.is_verify and not s.batch.is_decode
    return s


def check(
    spec: AttentionSpec, make: Callable[[Setup], object], dtype: torch.dtype, tol: float
) -> None:
    """``make(setup)`` -> a backend: its VERIFY output is the contract's, its K/V written."""
    for layer in range(2):
        s = verify_setup(spec, dtype)
        out = s.run(make(s), layer)
        assert torch.equal(s.kv.k_buffer[layer][s.batch.out_cache_loc], s.k)
        torch.testing.assert_close(out.float(), s.reference(layer).float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("spec_name", sorted(SPECS))
def test_torch_native_and_flashinfer_verify_as_the_contract_says(spec_name: str) -> None:
    spec = SPECS[spec_name]
    check(spec, lambda s: TorchNativeBackend(spec, s.kv, s.pool), torch.float32, 1e-5)
    for ragged in RAGGED_MODES:  # the split extend (ragged + paged prefix), one paged pass, ...
        check(
            spec,
            lambda s, r=ragged: FlashInferBackend(
                spec, s.kv, s.pool, wrappers=ReferenceWrappers(), ragged_prefill=r
            ),
            torch.float32,
            1e-5,
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cpu_kernel_verifies_as_the_contract_says(
    variant_kernels: CpuKernels, dtype: torch.dtype
) -> None:
    tol = 2e-5 if dtype is torch.float32 else 2e-2
    check(
        KERNEL_SPEC,
        lambda s: CpuKernelBackend(KERNEL_SPEC, s.kv, s.pool, variant_kernels),
        dtype,
        tol,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("ragged", ["split", "off"], ids=["ragged", "paged"])
def test_flashinfer_verifies_as_the_contract_says_on_gpu(ragged: str, device: str) -> None:
    _needs_flashinfer(device)
    for layer in range(2):
        s = verify_setup(GPU_SPEC, torch.bfloat16, device)
        out = s.run(FlashInferBackend(GPU_SPEC, s.kv, s.pool, ragged_prefill=ragged), layer)
        torch.testing.assert_close(
            out.float().cpu(), s.reference(layer).float(), rtol=2e-2, atol=2e-2
        )
