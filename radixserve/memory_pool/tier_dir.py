"""The directory of a file KV tier: whether a path can hold one, and one owner at a time.

Two servers on one directory would each serve KV the other wrote, under an index that does not
describe it. :func:`lock_tier_dir` takes an exclusive ``flock`` on ``DIR/lock`` and returns the
descriptor that holds it: the tier's owner keeps it open for as long as it uses the directory.
The kernel drops a lock with its process, so a crash never blocks the next server; the file
stays (deleting it would let two processes each lock a file of their own). The holder writes its
pid into the file, for the message the next one gets.

A path that cannot hold a tier (a file, a directory it may not write, a path under ``/proc``)
and a directory another owner holds raise :class:`TierUnavailable`, a ``ValueError`` whose text
names the path and the reason in one line.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK = "lock"


class TierUnavailable(ValueError):
    """``path`` cannot hold this process's KV tier: ``str()`` names both in one line."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"KV tier directory {path}: {reason}")
        self.path = path
        self.reason = reason


def lock_tier_dir(path: str | os.PathLike[str]) -> int:
    """Create the directory ``path`` if needed and lock it for this owner; returns the
    descriptor that holds the lock (closing it lets the directory go). Raises
    :class:`TierUnavailable` when the path cannot hold a tier or another owner holds it."""
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise TierUnavailable(directory, "not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TierUnavailable(directory, f"cannot create it ({e.strerror or e})") from None
    try:
        fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise TierUnavailable(directory, f"cannot write in it ({e.strerror or e})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise TierUnavailable(
            directory, f"{holder} holds it (one process per tier directory)"
        ) from None
    except OSError as e:
        os.close(fd)
        raise TierUnavailable(directory, f"cannot lock it ({e.strerror or e})") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        os.close(fd)
        raise TierUnavailable(directory, "not writable")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def check_tier_dir(path: str | os.PathLike[str]) -> None:
    """Whether ``path`` can hold a tier now (creating it if needed): :class:`TierUnavailable`
    if not. The lock is taken and let go again: the owner takes it for good later."""
    os.close(lock_tier_dir(path))


def _holder(fd: int) -> str:
    """Who holds the lock on ``fd``'s file, as its pid file says."""
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    if not text.isdigit():
        return "another process"
    if int(text) == os.getpid():
        return f"another KV tier of this process (pid {text})"
    return f"another process (pid {text})"
