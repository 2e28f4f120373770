"""Exclusive, crash-safe locks: flock on a hidden lock file, released by the kernel when the holder dies."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator

from rlopt.errors import UsageError, located


@contextlib.contextmanager
def exclusive_lock(lock_path: Path, guarded: Path, what: str = "rlopt compile") -> Iterator[None]:
    """Hold `lock_path` for the block, or refuse at once naming the holder's pid.

    A killed holder needs no cleanup: flock dies with its process, so a stale lock file is simply reused.
    """
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(lock_path, "a+", encoding="utf-8")
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise UsageError(located(guarded, "", f"another {what} (pid {holder}) is writing it now",
                                     "wait for it to finish or choose another output")) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        handle.close()
