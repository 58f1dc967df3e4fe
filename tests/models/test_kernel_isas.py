"""Every ISA variant of the CPU kernels, including those this machine cannot run.

- ``simd_check.cpp`` checks each operation of ``simd.h`` against scalar C++: built and run
  natively for the x86 variants the CPU executes, and for aarch64 NEON with Debian's cross
  compiler (``g++-aarch64-linux-gnu``), run under ``qemu-aarch64`` (``qemu-user``).
- (slow) the kernel sources compile for every variant, with torch's headers: the AVX-512
  variants on an AVX2 machine, NEON on x86. Compiling is not running: the numerical tests of
  the kernels (``test_kernels.py``) cover the variants the CPU executes.
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from radixserve.models.kernels import _ext

CHECK = Path(__file__).with_name("simd_check.cpp")
KERNELS = Path(_ext.__file__).parent
CROSS = "aarch64-linux-gnu-g++"
X86 = [v for v in _ext.VARIANTS if "x86_64" in v.machines]
NEON = next(v for v in _ext.VARIANTS if v.name == "neon")


def _compiler(variant: _ext.Variant) -> str:
    cxx = "g++" if variant in X86 else CROSS
    if shutil.which(cxx) is None:
        pytest.skip(f"{cxx} is not installed: the {variant.name} variant cannot be built here")
    return cxx


def _build_check(variant: _ext.Variant, out: Path) -> Path:
    exe = out / f"simd_check_{variant.name}"
    static = ["-static"] if variant is NEON else []
    cmd = [_compiler(variant), "-std=c++20", "-O2", *variant.cflags, *static, f"-I{KERNELS}"]
    subprocess.run([*cmd, str(CHECK), "-o", str(exe)], check=True, capture_output=True, timeout=120)
    return exe


@pytest.mark.parametrize("variant", X86, ids=lambda v: v.name)
def test_simd_vocabulary_on_x86(variant: _ext.Variant, tmp_path: Path) -> None:
    exe = _build_check(variant, tmp_path)  # building checks the branch compiles, run or not
    if not _ext.can_execute(variant.name):
        pytest.skip(f"this CPU cannot execute {variant.name} (lscpu): built, not run")
    run = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout
    assert run.stdout.startswith(f"ok {variant.name} ")


def test_simd_vocabulary_on_neon(tmp_path: Path) -> None:
    exe = _build_check(NEON, tmp_path)
    qemu = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
    if _ext.can_execute("neon"):
        qemu = None  # an aarch64 host runs it directly
    elif qemu is None:
        pytest.skip("qemu-aarch64 (qemu-user) is not installed: the NEON check was built, not run")
    run = subprocess.run(
        [*([qemu] if qemu else []), exe], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout
    assert run.stdout.startswith("ok neon ")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("variant", _ext.VARIANTS, ids=lambda v: v.name)
def test_kernel_sources_compile_for_every_variant(variant: _ext.Variant) -> None:
    from torch.utils import cpp_extension

    cxx = _compiler(variant)
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    includes += [f"-I{sysconfig.get_paths()['include']}", f"-I{KERNELS}"]
    for src in _ext.SOURCES:
        cmd = [cxx, "-std=c++20", "-fsyntax-only", "-fopenmp", *variant.cflags, *includes, str(src)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{src.name} ({variant.name}):\n{done.stderr[-4000:]}"
