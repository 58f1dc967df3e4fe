"""ReqToTokenPool: one row of KV slot indices per running request."""

from __future__ import annotations

import numpy as np
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
        # on the CPU, a numpy view of the same memory: reading or writing a piece of a row
        # through it costs a few microseconds, torch's slice, cast and copy several times that
        self._host: np.ndarray | None = (
            self.req_to_token.numpy() if self.device.type == "cpu" else None
        )

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
        end = start + slots.shape[0]
        if self._host is not None and slots.device.type == "cpu":
            self._host[row, start:end] = slots.numpy()
        else:
            self.req_to_token[row, start:end] = slots.to(torch.int32)

    def read(self, row: int, start: int, end: int) -> torch.Tensor:
        """The KV slots of tokens ``start .. end`` of ``row``: an int64 copy."""
        if self._host is not None:
            return torch.from_numpy(self._host[row, start:end].astype(np.int64))
        return self.req_to_token[row, start:end].to(torch.int64)

    def write_spans(
        self, rows: list[int], starts: list[int], lens: list[int], slots: torch.Tensor
    ) -> None:
        """One scatter for a batch: ``slots`` holds ``lens[i]`` slots for tokens
        ``starts[i] ..`` of ``rows[i]``, request after request."""
        n = slots.shape[0]
        if self._host is not None and slots.device.type == "cpu":
            if n == len(rows):  # decode: one token each
                self._host[rows, starts] = slots.numpy()
                return
            lens_a = np.asarray(lens, dtype=np.int64)
            row_idx = np.repeat(np.asarray(rows, dtype=np.int64), lens_a)
            offsets = np.asarray(starts, dtype=np.int64) - (np.cumsum(lens_a) - lens_a)
            cols = np.repeat(offsets, lens_a) + np.arange(n)
            self._host[row_idx, cols] = slots.numpy()
            return
        row_ids = torch.tensor(rows, dtype=torch.int64)
        if n == len(rows):
            t_rows, t_cols = row_ids, torch.tensor(starts, dtype=torch.int64)
        else:
            lens_t = torch.tensor(lens, dtype=torch.int64)
            t_rows = torch.repeat_interleave(row_ids, lens_t, output_size=n)
            t_offsets = torch.tensor(starts, dtype=torch.int64) - (torch.cumsum(lens_t, 0) - lens_t)
            t_cols = torch.repeat_interleave(t_offsets, lens_t, output_size=n) + torch.arange(n)
        table = self.req_to_token
        table[t_rows.to(table.device), t_cols.to(table.device)] = slots.to(table.dtype)

    def clear(self) -> None:
        self._free_rows = list(range(self.size))

    def check_integrity(self) -> None:
        assert len(set(self._free_rows)) == len(self._free_rows), "a request row is free twice"
        assert all(0 <= r < self.size for r in self._free_rows), "a free row is out of range"
