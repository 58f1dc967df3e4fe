"""Build and load the CPU kernels extension, one build per ISA variant, never raising.

One C++ source set (``gemv.cpp``, ``gemm.cpp``, ``amx_gemm.cpp``, ``gemm_q8.cpp``,
``attention_kernel.cpp``, ``norm.cpp``,
``pointwise.cpp``, written against the SIMD vocabulary of ``simd.h``, bound in
``bindings.cpp``; each kernel's compute is a header without torch beside its ``.cpp``, the torch
entry: ``gemv.h``, ``gemm.h``, ``attention_kernel.h``, ``norm.h``, ``pointwise.h``) is compiled
once per variant with that variant's ``-m`` flags (like llama.cpp's CPU variants or ATen's CPU
capability dispatch):

- ``avx2``: AVX2 + FMA + F16C (Haswell, Zen 1-3): 8 fp32 lanes;
- ``avx512``: AVX-512 F/BW/VL/DQ (Skylake-X): 16 lanes;
- ``avx512_vnni``: the same plus ``-mavx512vnni`` (Cascade Lake, Ice Lake: AVX-512 VNNI without
  bf16): VPDPBUSD runs the int8 dot products, of the skinny GEMM and of the int8 GEMM;
- ``avx512_bf16``: the same plus ``-mavx512bf16`` (Cooper Lake, Sapphire Rapids, Zen 4: each of
  them has VNNI too);
- ``amx``: the same plus ``-mamx-tile -mamx-int8 -mamx-bf16`` (Sapphire Rapids and later): int8
  products taller than the skinny GEMM's rows run on AMX tiles (``amx_gemm.cpp``);
- ``neon``: aarch64 Advanced SIMD (every 64-bit Arm CPU: Graviton, Ampere, Apple): 4 lanes.

:func:`best_variant` picks the highest one the CPU's flags allow (at most a requested one, so an
AVX-512 machine can run the AVX2 path too). Each build is JIT-compiled with
``torch.utils.cpp_extension.load`` (ninja + the system C++ compiler, two units of a unity build:
about 27 s a variant on 2 vCPUs) into
torch's extensions cache (``TORCH_EXTENSIONS_DIR`` as torch itself reads it); later processes
only re-check it with ninja (~0.2 s). The module name carries the variant and a hash of the
sources, flags, torch version and source directory, so checkouts, variants and torch builds
never share (or fight over, rebuilding in turn) one build directory.

Anything that goes wrong (not x86-64, a CPU without the variant's flags, no compiler or ninja, a
compile error, a read-only cache) makes :func:`load_variant` return ``None`` and log once at
DEBUG level; the callers then keep their torch paths (``F.linear``, the torch-native attention
backend, ``F.rms_norm``). On aarch64 the ``neon`` variant (W = 4) is built; on x86 its compute
headers are built with a cross compiler and run under qemu-user against scalar references
(``tests/models/test_kernel_isas.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

logger = logging.getLogger(__name__)

_DIR = Path(__file__).parent
# The sources compiled as two translation units (a unity build, one per core of a small host):
# ATen's headers cost about 2 s per unit to parse, pybind's 6 s more, so a variant builds in
# about half the time of one unit per file. The units are balanced by code-generation time
# (gemv.cpp and bindings.cpp the largest); every file still compiles alone (the ISA tests check).
UNITS = tuple(
    tuple(_DIR / n for n in unit)
    for unit in (
        ("gemv.cpp", "gemm.cpp", "gemm_q8.cpp", "amx_gemm.cpp", "norm.cpp", "layer.cpp"),
        ("attention_kernel.cpp", "attention_amx.cpp", "pointwise.cpp", "bindings.cpp"),
    )
)
SOURCES = tuple(src for unit in UNITS for src in unit)
HEADERS = tuple(
    _DIR / n
    for n in (
        "simd.h",
        "gemv_lanes.h",
        "linear_problem.h",
        "linear.h",
        "gemv.h",
        "gemm.h",
        "q8_rows.h",
        "gemm_q8.h",
        "amx.h",
        "attention_task.h",
        "attention_decode.h",
        "attention_kernel.h",
        "norm.h",
        "pointwise.h",
    )
)
LDFLAGS = ("-fopenmp",)  # resolves to the libgomp torch already loaded (same soname)
_AVX512 = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c")
_AVX512_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma", "f16c"})


@dataclass(frozen=True, slots=True)
class Variant:
    """One build of the kernels: its name, compiler flags and the CPU flags it needs."""

    name: str
    cflags: tuple[str, ...]
    cpu_flags: frozenset[str]  # as /proc/cpuinfo names them
    machines: tuple[str, ...] = ("x86_64", "amd64")  # platform.machine(), lower-cased


VARIANTS = (  # lowest first
    Variant("avx2", ("-mavx2", "-mfma", "-mf16c"), frozenset({"avx2", "fma", "f16c"})),
    Variant("avx512", _AVX512, _AVX512_FLAGS),
    Variant("avx512_vnni", (*_AVX512, "-mavx512vnni"), _AVX512_FLAGS | {"avx512_vnni"}),
    Variant(
        "avx512_bf16",
        (*_AVX512, "-mavx512bf16", "-mavx512vnni"),
        _AVX512_FLAGS | {"avx512_bf16", "avx512_vnni"},
    ),
    Variant(
        "amx",
        (*_AVX512, "-mavx512bf16", "-mavx512vnni", "-mamx-tile", "-mamx-int8", "-mamx-bf16"),
        _AVX512_FLAGS | {"avx512_bf16", "avx512_vnni", "amx_tile", "amx_int8", "amx_bf16"},
    ),
    # NEON (asimd) is part of every aarch64 CPU: no flag to add
    Variant("neon", (), frozenset({"asimd"}), ("aarch64", "arm64")),
)
VARIANT_NAMES = tuple(v.name for v in VARIANTS)
_BY_NAME = {v.name: v for v in VARIANTS}

_lock = threading.Lock()
_modules: dict[str, ModuleType | None] = {}  # a cache of builds, never a switch
_flags_cache: list[frozenset[str]] = []


def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of this machine from ``/proc/cpuinfo`` (empty if unreadable)."""
    if not _flags_cache:
        flags: frozenset[str] = frozenset()
        try:
            with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith(("flags", "Features")):  # x86 / aarch64
                        flags = frozenset(line.partition(":")[2].split())
                        break
        except OSError:
            pass
        _flags_cache.append(flags)
    return _flags_cache[0]


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512_BF16 or AMX-BF16)."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def can_execute(name: str) -> bool:
    """Whether this CPU can run variant ``name`` (``ValueError`` for an unknown name)."""
    if name not in _BY_NAME:
        raise ValueError(f"unknown CPU kernel variant {name!r}; choose from {VARIANT_NAMES}")
    variant = _BY_NAME[name]
    if platform.machine().lower() not in variant.machines:
        return False
    return variant.cpu_flags <= cpu_flags()


def best_variant(at_most: str | None = None) -> str | None:
    """The highest variant this CPU can run, no higher than ``at_most``; ``None`` if none."""
    if at_most is not None:
        can_execute(at_most)  # validates the name
    top = VARIANT_NAMES.index(at_most) + 1 if at_most is not None else len(VARIANTS)
    runnable = [n for n in VARIANT_NAMES[:top] if can_execute(n)]
    return runnable[-1] if runnable else None


def _module_name(variant: Variant) -> str:
    h = hashlib.sha256()
    for src in (*SOURCES, *HEADERS):
        h.update(src.read_bytes())
    # the source directory too: it is in the build's ninja file (``-I``), so two checkouts of
    # the same sources sharing one build would make ninja rebuild at every alternation
    for part in (*variant.cflags, *LDFLAGS, torch.__version__, str(_DIR.resolve())):
        h.update(b"\0" + part.encode())
    return f"radixserve_cpu_{variant.name}_{h.hexdigest()[:16]}"


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


def _build(variant: Variant) -> ModuleType:
    from torch.utils import cpp_extension

    name = _module_name(variant)
    build_dir = cpp_extension._get_build_directory(name, verbose=False)
    with _build_lock(build_dir):
        module = cpp_extension.load(
            name=name,
            sources=_unit_files(build_dir),
            extra_cflags=["-O3", "-fopenmp", *variant.cflags],
            extra_ldflags=list(LDFLAGS),
            extra_include_paths=[str(_DIR)],
            build_directory=build_dir,
            verbose=False,
        )
    for fn in (
        "try_linear",
        "extend_attention",
        "try_rms_norm",
        "try_silu_mul",
        "try_rotary_",
        "try_split_rope_",
        "try_store_kv",
        "try_decoder_layer",
    ):
        if not hasattr(module, fn):
            raise ImportError(f"{name} lacks {fn}")
    if module.isa != variant.name:
        raise ImportError(f"{name} was built for {module.isa}, not {variant.name}")
    return module


def _unit_files(build_dir: str) -> list[str]:
    """The unity build's sources in ``build_dir``, each including its unit's files; a file is
    rewritten only when its text changes, so that ninja keeps a finished build."""
    paths = []
    for i, unit in enumerate(UNITS):
        path = Path(build_dir) / f"unit_{i}.cpp"
        text = "".join(f'#include "{src.resolve()}"\n' for src in unit)
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
        paths.append(str(path))
    return paths


def load_variant(name: str) -> ModuleType | None:
    """The compiled extension of variant ``name``, or ``None`` when it cannot be used here
    (cached per process; ``ValueError`` for an unknown name)."""
    if not can_execute(name):
        return None
    if name in _modules:
        return _modules[name]
    with _lock:
        if name not in _modules:
            module: ModuleType | None = None
            if not all(src.is_file() for src in (*SOURCES, *HEADERS)):
                logger.debug("CPU kernels disabled: a source is missing from %s", _DIR)
            else:
                try:
                    module = _build(_BY_NAME[name])
                except Exception as e:  # any failure means: use the torch paths
                    logger.debug("CPU kernels (%s) disabled: build failed: %s", name, e)
            _modules[name] = module
    return _modules[name]
