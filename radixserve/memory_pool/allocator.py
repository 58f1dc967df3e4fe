"""TokenToKVPoolAllocator: the free list of KV slots, in pages of ``page_size`` slots."""

from __future__ import annotations

import numpy as np
import torch


class TokenToKVPoolAllocator:
    """Hands out KV slot indices. Page 0 (slot 0 with ``page_size == 1``) is reserved for padding.

    Slots are grouped in pages: page ``p`` owns slots ``p * page_size .. (p + 1) * page_size - 1``.
    Allocation is page-aligned; freeing any slot of a page frees the whole page, so callers free
    whole pages (a request frees its partial last page together with the rest).

    Query/commit: :meth:`available_size` says what :meth:`alloc` can give; ``alloc`` returns
    ``None`` instead of a partial result when short.
    """

    def __init__(
        self, num_slots: int, page_size: int = 1, device: str | torch.device = "cpu"
    ) -> None:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        if num_slots % page_size != 0 or num_slots < 2 * page_size:
            raise ValueError(
                f"num_slots ({num_slots}) must be a multiple of page_size ({page_size}) and hold 2+ pages"
            )
        self.num_slots = num_slots
        self.page_size = page_size
        self.device = torch.device(device)
        self.num_pages = num_slots // page_size
        self.clear()

    # ---- queries -------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Usable slots: every slot but the reserved page 0."""
        return (self.num_pages - 1) * self.page_size

    def available_size(self) -> int:
        return (self._free_pages.shape[0] + self._num_released) * self.page_size

    # ---- commits -------------------------------------------------------------------------
    def alloc(self, n: int) -> torch.Tensor | None:
        """``n`` slots (int64), or ``None`` when short. With ``page_size > 1``, ``n`` must be a
        whole number of pages and the slots come as whole pages in order."""
        if n % self.page_size != 0:
            raise ValueError(f"alloc({n}) is not a whole number of pages of {self.page_size}")
        pages = self._take_pages(n // self.page_size)
        if pages is None:
            return None
        return self._page_slots(pages)

    def alloc_extend(
        self, prefix_lens: list[int], seq_lens: list[int], last_locs: list[int]
    ) -> torch.Tensor | None:
        """Slots for tokens ``prefix_len .. seq_len`` of each request, concatenated in order.

        ``last_locs[i]`` is the slot of token ``prefix_len - 1`` of request ``i`` (ignored when
        ``prefix_len == 0``). With ``page_size > 1`` the free tail of that page is filled first, so
        token ``j`` always sits at offset ``j % page_size`` of its page. Returns ``None`` when short,
        having allocated nothing.
        """
        total = sum(s - p for p, s in zip(prefix_lens, seq_lens, strict=True))
        ps = self.page_size
        if ps == 1:
            pages = self._take_pages(total)
            return None if pages is None else pages
        num_new_pages = sum(
            -(-s // ps) - -(-p // ps) for p, s in zip(prefix_lens, seq_lens, strict=True)
        )
        pages = self._take_pages(num_new_pages)
        if pages is None:
            return None
        out: list[torch.Tensor] = []
        cursor = 0
        for p, s, last in zip(prefix_lens, seq_lens, last_locs, strict=True):
            tail = min(s, -(-p // ps) * ps) - p  # tokens that fit in the partial last page
            if tail > 0:
                out.append(torch.arange(last + 1, last + 1 + tail, dtype=torch.int64))
            n_pages = -(-s // ps) - -(-p // ps)
            if n_pages:
                slots = self._page_slots(pages[cursor : cursor + n_pages])
                out.append(slots[: s - p - tail])
                cursor += n_pages
        return (
            torch.cat(out).to(self.device)
            if out
            else torch.empty(0, dtype=torch.int64, device=self.device)
        )

    def free(self, slots: torch.Tensor) -> None:
        """Return the pages that ``slots`` lie in. Freeing a free page is a bug (AssertionError)."""
        if slots.numel() == 0:
            return
        pages = slots.to(torch.int64).cpu()
        if self.page_size > 1:
            pages = torch.unique(pages // self.page_size)
        idx = pages.numpy()
        assert idx.min() > 0, "the reserved padding page was freed"
        assert not self._is_free[idx].any(), "a KV page was freed twice"
        self._is_free[idx] = True
        self._released.append(pages)
        self._num_released += pages.shape[0]

    def clear(self) -> None:
        self._free_pages = torch.arange(1, self.num_pages, dtype=torch.int64)
        self._released: list[torch.Tensor] = []
        self._num_released = 0
        self._is_free = np.ones(self.num_pages, dtype=bool)
        self._is_free[0] = False

    def claim(self, slots: torch.Tensor) -> None:
        """Take the pages that ``slots`` lie in off the free list (a restored owner holds them).
        Claiming a page that is not free is a bug (AssertionError)."""
        if slots.numel() == 0:
            return
        pages = torch.unique(slots.to(torch.int64).cpu() // self.page_size).numpy()
        assert pages.min() > 0, "the reserved padding page was claimed"
        assert self._is_free[pages].all(), "a claimed KV page is not free"
        self._is_free[pages] = False
        free = torch.cat([self._free_pages, *self._released])
        self._free_pages = free[torch.from_numpy(self._is_free[free.numpy()])]
        self._released = []
        self._num_released = 0

    def check_integrity(self, held_slots: torch.Tensor | None = None) -> None:
        """No page both free and held, none lost, the padding page never free.

        With ``held_slots`` (every slot that the tree or a request holds), also checks that the
        held pages and the free pages partition the usable pages exactly.
        """
        free = torch.cat([self._free_pages, *self._released]).numpy()
        assert (free > 0).all(), "the padding page is in the free list"
        mask = np.zeros(self.num_pages, dtype=bool)
        mask[free] = True
        # a page listed twice marks one entry of the mask: O(pages), where np.unique sorted
        # (2 s for a pool of 2M pages, on every /get_server_info)
        assert np.count_nonzero(mask) == len(free), "a free page appears twice in the free list"
        assert (mask == self._is_free).all(), "the free list and the free mask disagree"
        if held_slots is not None:
            held = held_slots.to(torch.int64).cpu().numpy() // self.page_size
            assert not mask[held].any(), "a held KV slot is also free"
            assert (held > 0).all(), "a request or the tree holds the padding slot"
            covered = mask.copy()
            covered[held] = True
            lost = np.flatnonzero(~covered[1:]) + 1
            assert len(lost) == 0, f"{len(lost)} KV pages are neither free nor held (leaked)"

    # ---- internals -----------------------------------------------------------------------
    def _take_pages(self, n: int) -> torch.Tensor | None:
        if n > self._free_pages.shape[0] + self._num_released:
            return None
        if n > self._free_pages.shape[0]:
            self._free_pages = torch.cat([self._free_pages, *self._released])
            self._released, self._num_released = [], 0
        pages, self._free_pages = self._free_pages[:n], self._free_pages[n:]
        self._is_free[pages.numpy()] = False
        return pages

    def _page_slots(self, pages: torch.Tensor) -> torch.Tensor:
        if self.page_size == 1:
            return pages.to(self.device)
        offsets = torch.arange(self.page_size, dtype=torch.int64)
        return (pages[:, None] * self.page_size + offsets).reshape(-1).to(self.device)
