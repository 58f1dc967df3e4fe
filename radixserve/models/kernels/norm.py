"""``rms_norm``: RMSNorm (optionally fused with the residual add) with a one-call CPU route.

bf16 CPU rows go to ``norm_avx512.cpp`` while the linear kernel is enabled (the dense layers'
switch, :func:`radixserve.models.kernels.set_enabled`) and the CPU kernels extension is loaded
(the model runner loads it; it is never built from here); the result equals
``F.rms_norm`` bit for bit on decode-sized inputs (fp32 math, one rounding; only the summation
order of very long batches can move an ulp). Everything else is ``F.rms_norm``. Worth ~15 us per
call in decode, where torch's composite runs ~8 ops per row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixserve.models.kernels import _ext
from radixserve.models.kernels.linear import is_enabled


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(s) * weight, s)`` with ``s = x + residual`` (``s`` is ``x`` without one)."""
    module = _ext.loaded_extension()
    if module is not None and is_enabled() and x.is_cpu and not torch.compiler.is_compiling():
        done = module.try_rms_norm(x, weight, residual, eps)
        if done is not None:
            out, s = done
            return out, s
    s = x if residual is None else x + residual
    return F.rms_norm(s, (weight.shape[0],), weight, eps), s
