"""ReqToTokenPool: one row of KV slot indices per running request."""

from __future__ import annotations

import torch


class ReqToTokenPool:
    """An int32 table ``[max_running_reqs, max_context_len]``.

    Row ``r`` holds the KV slot of every token of the request that owns row ``r``:
    ``req_to_token[r, i]`` is the slot of token ``i``. Rows are handed out with
    :meth:`alloc` and returned with :meth:`free`; the pool never looks at the slots.
    """

    def __init__(self, size: int, max_context_len: int, device: str | torch.device = "cpu") -> None:
        if size <= 0 or max_context_len <= 0:
            raise ValueError("ReqToTokenPool needs a positive size and context length")
        self.size = size
        self.max_context_len = max_context_len
        self.device = torch.device(device)
        # [size, max_context_len]
        self.req_to_token = torch.zeros(
            (size, max_context_len), dtype=torch.int32, device=self.device
        )
        self._free_rows: list[int] = list(range(size))

    def available_size(self) -> int:
        return len(self._free_rows)

    def alloc(self, n: int = 1) -> list[int] | None:
        """Take ``n`` free rows, or ``None`` when fewer than ``n`` are free."""
        if n > len(self._free_rows):
            return None
        rows, self._free_rows = self._free_rows[:n], self._free_rows[n:]
        return rows

    def free(self, rows: int | list[int]) -> None:
        """Return rows to the pool. The caller frees the KV slots they point at."""
        if isinstance(rows, int):
            rows = [rows]
        self._free_rows.extend(rows)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Store ``slots`` as the KV slots of tokens ``start .. start+len(slots)`` of ``row``."""
        self.req_to_token[row, start : start + len(slots)] = slots.to(torch.int32)

    def clear(self) -> None:
        self._free_rows = list(range(self.size))

    def check_integrity(self) -> None:
        assert len(set(self._free_rows)) == len(self._free_rows), "a request row is free twice"
        assert all(0 <= r < self.size for r in self._free_rows), "a free row is out of range"
