"""Every ISA variant of the CPU kernels, including those this machine cannot run.

- ``simd_check.cpp`` checks each operation of ``simd.h`` against scalar C++;
- ``kernel_check/kernel_check.cpp`` checks the kernels against scalar references: the skinny
  and packed GEMMs with fp32, bf16 and int8 weights, the paged attention, RMSNorm, SiLU-and-mul
  and RoPE. It builds their compute headers (``gemv.h``, ``gemm.h``, ``attention_kernel.h``,
  ``norm.h``, ``pointwise.h``) without torch, with a stand-in for ``ATen/Parallel.h``.

Both run natively for the x86 variants the CPU executes, and for aarch64 NEON built with
Debian's cross compiler (``g++-aarch64-linux-gnu``), statically linked, under ``qemu-aarch64``
(``qemu-user``): ``make cross-tools``, a step of ``make test``, installs the two; without them
the NEON tests skip and say what is missing. Not run here: the AMX kernels (``amx_gemm.cpp``,
``attention_amx.cpp``) on a CPU without AMX, and the torch entry points (the ``.cpp`` files'
operand checks, ``layer.cpp``'s chaining, the KV store), which ``test_kernels.py`` and its
neighbours test against torch on the variants the CPU executes.

(slow) The kernel sources compile for every variant, with torch's headers: the AVX-512
variants on an AVX2 machine, NEON on x86.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

from radixserve.config.server import cache_dir
from radixserve.models.kernels import _ext

HERE = Path(__file__).parent
SIMD_CHECK = HERE / "simd_check.cpp"
KERNEL_CHECK = HERE / "kernel_check" / "kernel_check.cpp"
SOURCES = (SIMD_CHECK, KERNEL_CHECK)
KERNELS = Path(_ext.__file__).parent
CROSS = "aarch64-linux-gnu-g++"
X86 = [v for v in _ext.VARIANTS if "x86_64" in v.machines]
NEON = next(v for v in _ext.VARIANTS if v.name == "neon")
MISSING = "(make cross-tools installs it)"
CACHE = Path(cache_dir()) / "kernel_isas"  # built checks, named by what they were built from


def _compiler(variant: _ext.Variant) -> str | None:
    cxx = "g++" if variant in X86 else CROSS
    return cxx if shutil.which(cxx) else None


def _flags(source: Path, variant: _ext.Variant) -> list[str]:
    flags = ["-std=c++20", *variant.cflags, *(["-static"] if variant is NEON else [])]
    if source != KERNEL_CHECK:
        return [*flags, "-O2"]
    # the kernels with OpenMP and the stand-in ATen/Parallel.h; NEON at the extension's -O3
    # (no other test builds it), x86 at -O1 (its extension is tested at -O3 against torch; this
    # run checks the checker): 14 s and 5 s of compiler
    opt = "-O3" if variant is NEON else "-O1"
    return [*flags, opt, "-fopenmp", f"-I{KERNEL_CHECK.parent}"]


def _built_here(source: Path, variant: _ext.Variant) -> bool:
    """Whether ``source`` is built for ``variant`` here (given its compiler): where it can run,
    and simd_check for an x86 variant the CPU cannot run too (building it checks it compiles)."""
    return variant is NEON or _ext.can_execute(variant.name) or source == SIMD_CHECK


def _cached(cmd: list[str], source: Path, variant: _ext.Variant) -> Path:
    """Where the build of ``source`` by ``cmd`` is kept: named by a hash of the compiler (its
    file), the command and every source and header it can read, so a change to any rebuilds."""
    h = hashlib.sha256("\0".join(cmd).encode())
    compiler = Path(shutil.which(cmd[0]) or cmd[0]).resolve()
    h.update(f"{compiler} {compiler.stat().st_size} {compiler.stat().st_mtime_ns}".encode())
    for path in sorted([source, *KERNELS.glob("*.h"), *KERNEL_CHECK.parent.rglob("*.h")]):
        h.update(path.read_bytes())
    return CACHE / f"{source.stem}_{variant.name}-{h.hexdigest()[:16]}"


class Builds:
    """The builds of the selected tests, kept in radixserve's cache between runs; those missing
    there all start at once, the compilers side by side (on 2 cores, about half the time of one
    after another), and each test waits for its own."""

    def __init__(self, wanted: set[tuple[Path, str]]) -> None:
        # (source, variant name) -> (the compiler still to wait for or None, its output, exe)
        self._builds: dict[tuple[Path, str], tuple[subprocess.Popen[bytes] | None, Path, Path]] = {}
        for source in SOURCES:
            for variant in (*X86, NEON):
                cxx = _compiler(variant)
                if (source, variant.name) not in wanted or cxx is None:
                    continue
                if not _built_here(source, variant):
                    continue
                cmd = [cxx, *_flags(source, variant), f"-I{KERNELS}", str(source), "-o"]
                exe = _cached(cmd, source, variant)
                tmp = exe.with_name(f"{exe.name}.{os.getpid()}")
                proc = None
                if not exe.is_file():
                    CACHE.mkdir(parents=True, exist_ok=True)
                    with Path(f"{tmp}.log").open("wb") as log:  # a file: no pipe to fill
                        proc = subprocess.Popen([*cmd, str(tmp)], stdout=log, stderr=log)
                self._builds[source, variant.name] = (proc, tmp, exe)

    def get(self, source: Path, variant: _ext.Variant) -> Path:
        """The binary, once built (a failed build fails the test); skips without a compiler."""
        if _compiler(variant) is None:
            cxx = "g++" if variant in X86 else CROSS
            pytest.skip(f"{cxx} is not installed {MISSING}: {variant.name} cannot be built")
        proc, tmp, exe = self._builds[source, variant.name]
        if proc is not None:
            log = Path(f"{tmp}.log")
            rc = proc.wait(timeout=300)
            self._builds[source, variant.name] = (None, tmp, exe)
            output = log.read_text(errors="replace")
            log.unlink()
            if rc != 0:
                tmp.unlink(missing_ok=True)
                pytest.fail(f"{source.name} ({variant.name}) did not build:\n{output[-4000:]}")
            for old in CACHE.glob(f"{source.stem}_{variant.name}-*"):
                if "." not in old.name:  # an earlier source's build (not one being written)
                    old.unlink(missing_ok=True)
            os.replace(tmp, exe)  # whole or absent, for a pytest beside this one too
        return exe

    def close(self) -> None:
        for proc, tmp, _ in self._builds.values():
            if proc is not None:  # never waited for: a test deselected late, or interrupted
                proc.kill()
                proc.wait()
                tmp.unlink(missing_ok=True)
                Path(f"{tmp}.log").unlink(missing_ok=True)


@pytest.fixture(scope="module")
def builds(request: pytest.FixtureRequest) -> Iterator[Builds]:
    """The builds of this module's selected tests (``-k`` and friends start no others)."""
    wanted = set()
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if getattr(item, "module", None) is request.module and callspec is not None:
            params = callspec.params
            if "source" in params:
                wanted.add((params["source"], params["variant"].name))
    b = Builds(wanted)
    yield b
    b.close()


def _runner(variant: _ext.Variant) -> list[str]:
    """What runs a binary of ``variant`` here: nothing (natively) or qemu-user; skips otherwise."""
    if _ext.can_execute(variant.name):
        return []
    if variant is not NEON:
        pytest.skip(f"this CPU cannot execute {variant.name} (lscpu)")
    qemu = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
    if qemu is None:
        pytest.skip(f"qemu-aarch64 (qemu-user) is not installed {MISSING}: NEON built, not run")
    return [qemu]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
@pytest.mark.parametrize("variant", [*X86, NEON], ids=lambda v: v.name)
def test_checks_pass_on_every_variant(variant: _ext.Variant, source: Path, builds: Builds) -> None:
    """simd_check and kernel_check, built for ``variant`` and run (under qemu-user for NEON, with
    two OpenMP threads) print "ok <isa> <number of checks>"."""
    if not _built_here(source, variant):
        pytest.skip(f"this CPU cannot execute {variant.name} (lscpu): not built")
    exe = builds.get(source, variant)
    runner = _runner(variant)  # after the build: a variant the CPU cannot run is still built
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    run = subprocess.run([*runner, exe], capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith(f"ok {variant.name} "), run.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("variant", _ext.VARIANTS, ids=lambda v: v.name)
def test_kernel_sources_compile_for_every_variant(variant: _ext.Variant) -> None:
    from torch.utils import cpp_extension

    cxx = _compiler(variant)
    if cxx is None:
        pytest.skip(f"no compiler for {variant.name} {MISSING}")
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    includes += [f"-I{sysconfig.get_paths()['include']}", f"-I{KERNELS}"]
    for src in _ext.SOURCES:
        cmd = [cxx, "-std=c++20", "-fsyntax-only", "-fopenmp", *variant.cflags, *includes, str(src)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{src.name} ({variant.name}):\n{done.stderr[-4000:]}"
