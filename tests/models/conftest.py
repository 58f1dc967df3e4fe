"""Fixtures of the model tests: the CPU kernels of every ISA variant this machine can run."""

from __future__ import annotations

import pytest

from radixserve.models.kernels import CpuKernels, _ext


@pytest.fixture(params=_ext.VARIANT_NAMES)
def variant_kernels(request: pytest.FixtureRequest) -> CpuKernels:
    """:class:`CpuKernels` of one variant; skipped (naming it) where this CPU cannot run it."""
    name = request.param
    if not _ext.can_execute(name):
        pytest.skip(f"this CPU cannot execute the {name} kernel variant")
    kernels = CpuKernels.build(name)
    assert kernels.variant == name, f"the {name} variant failed to build (see _ext's log)"
    return kernels
