"""``linear(x, weight, bias)``: a drop-in for ``F.linear`` that picks the fastest route on CPU.

Decode-shaped products (``M = x.numel() // K`` rows, ``1 <= M <= MAX_M``) with bfloat16 or
float32 CPU tensors go to an AVX-512 skinny-GEMM kernel (``gemv_avx512.cpp``) that streams the
weight once in its native ``[N, K]`` layout at memory bandwidth (~35-40 GB/s measured; oneDNN's
F.linear reaches about half of that). Everything else, and any call the kernel cannot take (CUDA,
fp16, autograd, a weight whose rows are not dense, torch.compile tracing, a CPU without
AVX512_BF16, no compiler), goes to ``F.linear`` unchanged. Results match ``F.linear`` up to fp32
summation order (both accumulate in fp32 and round once).

The extension is built on first use (10-20 s once, then cached on disk; ~0.15 s to load in a new
process; needs ``ninja`` on PATH and a C++ compiler); call :func:`warmup` at model load to take
that cost there, and :func:`set_enabled` to switch the kernel off.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import torch
import torch.nn.functional as F

from radixserve.models.kernels import _ext

logger = logging.getLogger(__name__)

MAX_M = 16
"""Most rows of ``x`` sent to the kernel; above that the product is compute-bound (F.linear)."""

MIN_TASK_BYTES = 64 * 1024
"""Weight bytes per thread task; a smaller product runs on one thread."""

_Impl = Callable[
    [torch.Tensor, torch.Tensor, "torch.Tensor | None", int, int, int], "torch.Tensor | None"
]

_lock = threading.Lock()
_enabled = True
_float32 = True
_loaded = False  # the extension was looked for (found or not)
_impl: _Impl | None = None  # the extension's try_linear while enabled and usable
_dtypes = 0  # try_linear's dtype mask: 1 bf16, 2 fp32


def _refresh() -> None:
    """Point ``_impl``/``_dtypes`` at the loaded extension and the switches (never builds)."""
    global _impl, _dtypes
    module = _ext.loaded_extension()
    allowed = _ext.supported_dtypes() if _enabled else frozenset()
    if not _float32:
        allowed = allowed - {torch.float32}
    _dtypes = _ext.dtype_mask(allowed)
    _impl = module.try_linear if module is not None and _dtypes else None


def _load() -> _Impl | None:
    """Build or load the extension once per process (never raises); returns ``_impl``."""
    global _loaded
    with _lock:
        if not _loaded:
            _loaded = True
            _ext.load_extension()
            _refresh()
            if _impl is None:
                logger.debug("skinny linear kernel unavailable: every product uses F.linear")
    return _impl


def set_enabled(enabled: bool, float32: bool = True) -> None:
    """Switch the kernel on or off for this process (off: every call is exactly ``F.linear``).

    ``float32=False`` keeps fp32 products on F.linear (bit-exact with reference code that uses
    F.linear) while bf16 products still take the kernel.
    """
    global _enabled, _float32
    with _lock:
        _enabled, _float32 = bool(enabled), bool(float32)
        _refresh()


def is_enabled() -> bool:
    """Whether :func:`set_enabled` left the kernel on (it may still be unavailable here)."""
    return _enabled


def warmup() -> bool:
    """Build or load the extension now rather than on the first product; True if usable."""
    return _load() is not None if _enabled else False


def is_available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether ``dtype`` products can take the kernel here (builds/loads the extension)."""
    return (
        dtype in (torch.bfloat16, torch.float32)
        and dtype in _ext.supported_dtypes()
        and _ext.load_extension() is not None
    )


def skinny_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, max_m: int = 1 << 30
) -> torch.Tensor:
    """The kernel alone, for any ``M <= max_m`` (for benchmarks and tests); raises if unusable."""
    module = _ext.load_extension()
    if module is None:
        raise RuntimeError("the skinny linear extension is not available on this machine")
    mask = _ext.dtype_mask(_ext.supported_dtypes())
    y = module.try_linear(x, weight, bias, max_m, mask, MIN_TASK_BYTES)
    if y is None:
        raise ValueError("skinny_linear cannot take these tensors (see linear() for the rules)")
    return y


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` for ``x`` ``[..., in]`` and ``weight`` ``[out, in]``.

    Same contract as ``F.linear``; small-``M`` bf16/fp32 CPU products on an AVX-512 machine take
    the bandwidth-bound kernel, everything else ``F.linear``.
    """
    impl = _impl
    if impl is None and not _loaded and _enabled and x.is_cpu:
        impl = _load()
    if impl is not None and x.is_cpu and not torch.compiler.is_compiling():
        y = impl(x, weight, bias, MAX_M, _dtypes, MIN_TASK_BYTES)
        if y is not None:
            return y
    return F.linear(x, weight, bias)
