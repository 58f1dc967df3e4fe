"""Build and load the AVX-512 CPU kernels extension, never raising.

One module holds the skinny GEMM (``gemv_avx512.cpp``), the paged attention
(``attention_avx512.cpp``) and RMSNorm (``norm_avx512.cpp``), bound in ``bindings.cpp``. The C++
sources are JIT-compiled once with ``torch.utils.cpp_extension.load`` (ninja + the system C++
compiler, 9-20 s on 2 vCPUs) into torch's extensions cache (``~/.cache/torch_extensions/...``,
or ``TORCH_EXTENSIONS_DIR`` as torch itself reads it); later processes only import
``cpp_extension`` and re-check the build with ninja (~0.15 s). The module name carries a hash of
the sources, the flags and the torch version, so different checkouts or torch builds never share
(or fight over) one build directory.

Everything that can go wrong (no x86-64 AVX-512 CPU, no compiler or ninja, a compile error, a
read-only cache) makes :func:`load_extension` return ``None`` and log once at DEBUG level; the
callers then keep their torch paths (``F.linear``, the torch attention, ``F.rms_norm``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

logger = logging.getLogger(__name__)

SOURCES = tuple(
    Path(__file__).with_name(n)
    for n in ("gemv_avx512.cpp", "attention_avx512.cpp", "norm_avx512.cpp", "bindings.cpp")
)
CFLAGS = ("-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma")
LDFLAGS = ("-fopenmp",)  # resolves to the libgomp torch already loaded (same soname)
_REQUIRED_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "fma"})

_lock = threading.Lock()
_state: dict[str, ModuleType | None] = {}
_flags_cache: list[frozenset[str]] = []


def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of this machine from ``/proc/cpuinfo`` (empty if unreadable)."""
    if not _flags_cache:
        flags: frozenset[str] = frozenset()
        try:
            with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith("flags"):
                        flags = frozenset(line.partition(":")[2].split())
                        break
        except OSError:
            pass
        _flags_cache.append(flags)
    return _flags_cache[0]


def dtype_mask(dtypes: frozenset[torch.dtype]) -> int:
    """The ``dtypes`` bit mask of ``try_linear``: 1 for bfloat16, 2 for float32."""
    return (1 if torch.bfloat16 in dtypes else 0) | (2 if torch.float32 in dtypes else 0)


def supported_dtypes() -> frozenset[torch.dtype]:
    """Weight dtypes this CPU can run through the extension (before trying to build it)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return frozenset()
    flags = cpu_flags()
    if not _REQUIRED_FLAGS <= flags:
        return frozenset()
    if "avx512_bf16" in flags:
        return frozenset({torch.float32, torch.bfloat16})
    return frozenset({torch.float32})


def _module_name() -> str:
    h = hashlib.sha256()
    for src in SOURCES:
        h.update(src.read_bytes())
    for part in (*CFLAGS, *LDFLAGS, torch.__version__):
        h.update(b"\0" + part.encode())
    return f"radixserve_gemv_{h.hexdigest()[:16]}"


@contextlib.contextmanager
def _build_lock(build_dir: str) -> Iterator[None]:
    """Serialise builders across processes with ``flock`` (freed by the OS if a builder dies).

    torch's own lock file is not freed when a builder is killed, and every later ``load`` would
    then wait on it forever; under our lock any such file is stale, so it is removed.
    """
    import fcntl

    fd = os.open(os.path.join(build_dir, "radixserve.flock"), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(build_dir, "lock"))
        yield
    finally:
        os.close(fd)  # releases the flock


def _build() -> ModuleType:
    from torch.utils import cpp_extension

    name = _module_name()
    build_dir = cpp_extension._get_build_directory(name, verbose=False)
    with _build_lock(build_dir):
        module = cpp_extension.load(
            name=name,
            sources=[str(s) for s in SOURCES],
            extra_cflags=list(CFLAGS),
            extra_ldflags=list(LDFLAGS),
            build_directory=build_dir,
            verbose=False,
        )
    for fn in ("try_linear", "extend_attention", "try_rms_norm"):
        if not hasattr(module, fn):
            raise ImportError(f"{name} lacks {fn}")
    return module


def loaded_extension() -> ModuleType | None:
    """The extension if :func:`load_extension` already loaded it (never builds)."""
    return _state.get("module")


def load_extension() -> ModuleType | None:
    """The compiled extension module, or ``None`` when it cannot be used here (cached)."""
    if "module" in _state:
        return _state["module"]
    with _lock:
        if "module" not in _state:
            module: ModuleType | None = None
            if not supported_dtypes():
                logger.debug("CPU kernels disabled: CPU lacks AVX-512 (or not x86-64)")
            elif not all(src.is_file() for src in SOURCES):
                logger.debug("CPU kernels disabled: a source is missing from %s", SOURCES[0].parent)
            else:
                try:
                    module = _build()
                except Exception as e:  # any failure means: use F.linear
                    logger.debug("CPU kernels disabled: build failed: %s", e)
            _state["module"] = module
    return _state["module"]
