"""The KV owner stands free of the model: importing it loads no decoder, no model runner.

(Cycles between modules are `make lint`'s: import-linter's acyclic contract in pyproject.toml.)
"""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("radixserve.models.decoder", "radixserve.models.loader", "radixserve.runtime.model_runner")


@pytest.mark.parametrize(
    "module", ["radixserve.runtime.kv_manager", "radixserve.runtime.kv_layout"]
)
def test_the_kv_owner_imports_no_model(module: str) -> None:
    code = f"import sys, {module}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
