"""Exclusive, crash-safe locks: flock on a hidden lock file, released by the kernel when the holder dies."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import IO, Iterator

from rlopt.errors import UsageError, located


def _acquire(lock_path: Path, guarded: Path, what: str) -> IO[str]:
    """Lock the file that is at `lock_path` now; retry if a releasing holder unlinked it under us."""
    while True:
        handle = open(lock_path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise UsageError(located(guarded, "", f"another {what} (pid {holder}) is writing it now",
                                     "wait for it to finish or choose another output")) from None
        try:
            same = os.stat(lock_path).st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return handle
        handle.close()


@contextlib.contextmanager
def exclusive_lock(lock_path: Path, guarded: Path, what: str = "rlopt compile") -> Iterator[None]:
    """Hold `lock_path` for the block, or refuse at once naming the holder's pid.

    The lock file is removed on release; one left by a killed holder is simply reused, since flock
    dies with its process.
    """
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    handle = _acquire(lock_path, guarded, what)
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_path)
        handle.close()
