"""A model's CPU weights moved into one buffer backed by transparent huge pages.

Decode at small batch streams every weight once per step. Over 4 KiB pages, that walk misses the
TLB every 4 KiB, and the hardware prefetchers stop at each page's end. Over 2 MiB pages, it does
neither as often. Measured on Zen 3 with AVX2, 2 threads, in one process, interleaved: a batch-1
pass over a 0.5B model's bf16 weights streamed 24.3 GB/s from ordinary memory and 27.1 GB/s from
huge pages. A plain ``sum`` over the same bytes read 30.6 and 31.7 GB/s. (PyTorch has the same
thing for every allocation behind its ``THP_MEM_ALLOC_ENABLE`` environment variable. This asks
for it for the weights only, the memory that is streamed.)

The buffer is a private anonymous ``mmap`` advised ``MADV_HUGEPAGE`` (a shared one would be
shmem, which THP leaves alone by default). That works under the kernel's ``madvise`` and
``always`` THP modes. Where the advice is refused (``never`` mode, a kernel without THP, a
platform without ``madvise``), the weights stay where they are.
"""

from __future__ import annotations

import ctypes
import mmap

import torch
from torch import nn

ALIGN = 64  # bytes: each tensor starts on a cache line


def huge_page_buffer(nbytes: int) -> torch.Tensor | None:
    """An uninitialised uint8 tensor of ``nbytes`` over huge-page-advised memory, or None
    where the system refuses the advice. Its pages are faulted in (as huge pages where the
    kernel can) when first written."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or nbytes <= 0:
        return None
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(advice)
    except OSError:
        region.close()
        return None
    return torch.frombuffer(region, dtype=torch.uint8)  # keeps ``region`` alive


def _movable(t: torch.Tensor) -> bool:
    """A CPU tensor that owns its whole storage (not a view into another tensor's)."""
    return (
        t.device.type == "cpu"
        and t.is_contiguous()
        and t.storage_offset() == 0
        and t.untyped_storage().nbytes() == t.numel() * t.element_size()
        and t.numel() > 0
    )


def _tensors(module: nn.Module) -> list[tuple[str, torch.Tensor, bool]]:
    """(name, tensor, is a parameter) of ``module``'s own parameters and buffers."""
    params = [(n, p, True) for n, p in module.named_parameters(recurse=False)]
    buffers = [(n, b, False) for n, b in module.named_buffers(recurse=False)]
    return params + buffers


def move_to_huge_pages(model: nn.Module) -> int:
    """Copy every parameter and buffer of ``model`` that is the whole of its CPU storage (and
    the only kind of view of it the model holds) into one huge-page buffer and point the
    modules at the copies. Each storage is copied once, so tied weights stay tied, and each
    old one is freed once the last module holding it points at the copy (the peak is the
    weights plus about one tensor). Returns the bytes moved; 0 when nothing was (no such
    tensor, or the system refused huge pages). Call it after loading and quantizing."""
    entries = []  # (module, name, is a parameter, storage address): no tensor is held here
    pinned = set()  # storages some tensor views only in part: a move would split the aliases
    sizes: dict[int, int] = {}
    for module in model.modules():
        for name, t, is_param in _tensors(module):
            key = t.untyped_storage().data_ptr()
            if _movable(t):
                entries.append((module, name, is_param, key))
                sizes[key] = t.untyped_storage().nbytes()
            else:
                pinned.add(key)
    offsets: dict[int, int] = {}  # storage address -> its offset in the buffer
    total = 0
    for key, nbytes in sizes.items():
        if key not in pinned:
            offsets[key] = total
            total += -(-nbytes // ALIGN) * ALIGN
    buffer = huge_page_buffer(total)
    if buffer is None:
        return 0
    copied: set[int] = set()
    for module, name, is_param, key in entries:
        if key not in offsets:
            continue
        t = getattr(module, name)  # a tied Parameter seen before already points at its copy
        start = offsets[key]
        copy = buffer[start : start + sizes[key]].view(t.dtype).view(t.shape)
        if key not in copied:
            copy.copy_(t)
            copied.add(key)
        if is_param:
            t.data = copy  # the same Parameter object: every module that ties it sees the copy
        else:
            setattr(module, name, copy)
    _return_freed_heap()
    return total


def _return_freed_heap() -> None:
    """Hand the heap pages the old copies leave free back to the system (glibc's
    ``malloc_trim``). Tensors of up to 32 MiB live on glibc's heap, which keeps freed pages
    mapped: after moving the int8 weights of a 0.5B model the process held 190 MB more than
    before, and none after this. Elsewhere (no glibc) it does nothing."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)
