"""Host-to-device copies that never wait for the device.

A plain copy from pageable host memory to a CUDA tensor (``torch.tensor(..., device="cuda")``,
``t.to("cuda")``) synchronizes the stream: it waits for every kernel queued before it, so a
batch built while the previous forward runs would wait for that forward, and overlap
scheduling would overlap nothing. Here the numbers go through pinned memory (torch's caching
host allocator keeps each buffer until its copy is done) and are copied non-blocking.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

Numbers = Sequence[int] | Sequence[float] | Sequence[bool] | np.ndarray | torch.Tensor


def to_device(
    values: Numbers, device: torch.device | str, dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """``values`` (any shape) as a ``dtype`` tensor on ``device``; one already there is cast."""
    device = torch.device(device)
    if isinstance(values, torch.Tensor) and values.device.type == device.type != "cpu":
        return values.to(device, dtype)
    host = _host_tensor(values, dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def to_device_packed(
    parts: Sequence[Numbers], device: torch.device | str, dtype: torch.dtype = torch.int64
) -> list[torch.Tensor]:
    """Each of ``parts`` (1-D) on ``device``; on CUDA the host parts in ONE pinned buffer and one
    copy (each copy is a launch), the parts already on the device cast where they are."""
    device = torch.device(device)
    out: list[torch.Tensor | None] = [None] * len(parts)
    host: list[tuple[int, torch.Tensor]] = []
    for i, p in enumerate(parts):
        if isinstance(p, torch.Tensor) and p.device.type == device.type != "cpu":
            out[i] = p.to(device, dtype)
        else:
            host.append((i, _host_tensor(p, dtype)))
    if host and device.type != "cuda":
        for i, t in host:
            out[i] = t.to(device)
    elif host:
        sizes = [t.shape[0] for _, t in host]
        staged = torch.empty(sum(sizes), dtype=dtype, pin_memory=True)
        torch.cat([t for _, t in host], out=staged)
        moved = staged.to(device, non_blocking=True).split(sizes)
        for (i, _), t in zip(host, moved, strict=True):
            out[i] = t
    return out  # type: ignore[return-value]


def _host_tensor(values: Numbers, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        return values.to("cpu", dtype)
    if isinstance(values, np.ndarray):
        return torch.from_numpy(values).to(dtype)
    return torch.tensor(list(values), dtype=dtype)
