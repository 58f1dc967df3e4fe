"""ReqToTokenPool: one row of KV slot indices per running request."""

from __future__ import annotations

import numpy as np
import torch

from radixserve.transfer import to_device


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
        # the table on the host, which the scheduler reads (a request's slots when it finishes,
        # is retracted or cached): on the CPU a numpy view of the same memory (a few
        # microseconds a piece, torch's slice, cast and copy several times that); on a GPU a
        # mirror written beside the device table, so no read waits for the device
        self._host: np.ndarray = (
            self.req_to_token.numpy()
            if self.device.type == "cpu"
            else np.zeros((size, max_context_len), dtype=np.int32)
        )
        self._mirrored = self.device.type != "cpu"

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
        self._host[row, start:end] = slots.numpy(force=True)
        if self._mirrored:
            self.req_to_token[row, start:end] = to_device(slots, self.device, torch.int32)

    def read(self, row: int, start: int, end: int) -> torch.Tensor:
        """The KV slots of tokens ``start .. end`` of ``row``: an int64 copy on the host."""
        return torch.from_numpy(self._host[row, start:end].astype(np.int64))

    def write_spans(
        self, rows: list[int], starts: list[int], lens: list[int], slots: torch.Tensor
    ) -> None:
        """One scatter for a batch: ``slots`` holds ``lens[i]`` slots for tokens
        ``starts[i] ..`` of ``rows[i]``, request after request."""
        n = slots.shape[0]
        values = slots.numpy(force=True)
        if n == len(rows):  # decode: one token each
            row_idx, cols = np.asarray(rows, dtype=np.int64), np.asarray(starts, dtype=np.int64)
        else:
            lens_a = np.asarray(lens, dtype=np.int64)
            row_idx = np.repeat(np.asarray(rows, dtype=np.int64), lens_a)
            offsets = np.asarray(starts, dtype=np.int64) - (np.cumsum(lens_a) - lens_a)
            cols = np.repeat(offsets, lens_a) + np.arange(n)
        self._host[row_idx, cols] = values
        if self._mirrored:  # the same scatter on the device: indices and values in one copy
            packed = np.stack([row_idx, cols, values.astype(np.int64)])
            idx = to_device(packed, self.device)
            self.req_to_token[idx[0], idx[1]] = idx[2].to(torch.int32)

    def clear(self) -> None:
        self._free_rows = list(range(self.size))

    def check_integrity(self) -> None:
        assert len(set(self._free_rows)) == len(self._free_rows), "a request row is free twice"
        assert all(0 <= r < self.size for r in self._free_rows), "a free row is out of range"
