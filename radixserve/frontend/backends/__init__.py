"""Backends a program runs on: :class:`Runtime` (in-process Engine) and
:class:`RuntimeEndpoint` (a server's native HTTP API). Importing this package loads neither
torch nor the runtime."""

from __future__ import annotations

from radixserve.frontend.backends.base import (
    Backend,
    GenChunk,
    get_default_backend,
    set_default_backend,
)
from radixserve.frontend.backends.endpoint import RuntimeEndpoint
from radixserve.frontend.backends.runtime import Runtime

__all__ = [
    "Backend",
    "GenChunk",
    "Runtime",
    "RuntimeEndpoint",
    "get_default_backend",
    "set_default_backend",
]
