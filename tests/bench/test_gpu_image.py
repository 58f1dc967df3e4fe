"""The GPU stages import only what the lent GPU machine has: its image's distributions
(``benchmarks/gpu/image.txt``) and the carried wheels (``benchmarks/gpu/wheels.txt``).

A GPU machine is lent for minutes; a module that imports a package the image lacks fails every
stage of ``benchmarks/device_gpu.sh`` there (it happened once, with msgspec). This imports the
modules those stages run, in a fresh interpreter whose every other distribution is hidden: an
optional import (``try: import orjson``) still falls back, as it would there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# what device_gpu.sh's stages import: the engine, the bench CLI and server, the GPU scripts and
# the modules that hold `gpu` tests
MODULES = [
    "radixserve.server.engine",
    "radixserve.bench.cli",
    "radixserve.api.app",
    "model_throughput",
    "prefill_split",
    "overlap_launch",
    "profile_decode",
    "warm_flashinfer",
    "spec_decode",
    "scheduler_idle",
    "test_device_path",
    "test_device_spec",
    "test_verify_attention",
    "test_attention_backends",
    "test_cuda_kernels",
]

PROBE = r"""
import importlib, importlib.abc, importlib.metadata as md, re, sys
from pathlib import Path

repo = Path(sys.argv[1])


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def listed(path):
    lines = (line.strip() for line in path.read_text().splitlines())
    return {norm(re.split(r"[=<>\[ ]", line)[0]) for line in lines if line and line[0] != "#"}


allowed = listed(repo / "benchmarks/gpu/image.txt") | listed(repo / "benchmarks/gpu/wheels.txt")
allowed.add("radixserve")
owners = md.packages_distributions()


class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        dists = owners.get(name.partition(".")[0])
        if dists and not any(norm(d) in allowed for d in dists):
            raise ModuleNotFoundError(f"No module named {name!r} on the GPU image", name=name)
        return None


sys.meta_path.insert(0, Hide())
for folder in ("benchmarks", "benchmarks/gpu", "tests/runtime", "tests/models", "tests"):
    sys.path.insert(0, str(repo / folder))
for module in sys.argv[2:]:
    importlib.import_module(module)
"""


@pytest.mark.timeout(180)
def test_gpu_stages_import_only_the_image_and_the_wheels() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(REPO), *MODULES],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
