"""Fast CPU kernels for decode-shaped products, with ``F.linear`` as the reference path."""

from radixserve.models.kernels.linear import (
    MAX_M,
    is_available,
    is_enabled,
    linear,
    set_enabled,
    skinny_linear,
    warmup,
)

__all__ = [
    "MAX_M",
    "is_available",
    "is_enabled",
    "linear",
    "set_enabled",
    "skinny_linear",
    "warmup",
]
