"""radixserve: an SGLang-style LLM serving runtime (radix prefix cache, cache-aware scheduling).

``from radixserve import Engine`` loads the runtime lazily, so ``import radixserve.frontend``
works without torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Engine"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from radixserve.server.engine import Engine

        return Engine
    raise AttributeError(f"module 'radixserve' has no attribute {name!r}")
