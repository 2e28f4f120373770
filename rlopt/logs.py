"""Native library output goes to a log file, not the terminal.

TVM, ONNX Runtime and friends write warnings straight to file descriptor 2 from C/C++ when they load
or run (e.g. TVM's "Fast mode segfaults when there are out-of-bounds indices"), past Python's
`sys.stderr`. `native_output_to_log` points descriptor 2 at a log file under the cache directory
(`$RLOPT_CACHE`, else `$XDG_CACHE_HOME/rlopt`, else `~/.cache/rlopt`; subfolder logs/) for a while,
and restores it after. Python's own `sys.stderr` (rlopt's progress and messages, rich's live display)
keeps writing to the terminal: it is re-pointed at a copy of the original descriptor meanwhile.
Child processes started inside inherit the log as their descriptor 2.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rlopt.machine import cache_root

KEEP_LOGS = 20  # per command: older logs are removed when a new one is made


def log_dir() -> Path:
    return cache_root() / "logs"


@dataclass
class NativeLog:
    """Where native output went; `path` is None when no log could be made (descriptor 2 was left alone)."""

    path: Path | None

    def has_output(self) -> bool:
        try:
            return self.path is not None and self.path.stat().st_size > 0
        except OSError:
            return False


def _prune(folder: Path, command: str) -> None:
    logs = sorted(folder.glob(f"{command}-*.log"), key=lambda p: p.stat().st_mtime if p.exists() else 0)
    for old in logs[:-KEEP_LOGS]:
        with contextlib.suppress(OSError):
            old.unlink()


@contextlib.contextmanager
def native_output_to_log(command: str) -> Iterator[NativeLog]:
    """Inside: descriptor 2 writes to cache/logs/<command>-<time>-<random>.log; `sys.stderr` still reaches the terminal.

    An empty log is removed on the way out. When the log cannot be created (a read-only cache), nothing is
    redirected: the run matters more than the noise.
    """
    folder = log_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _prune(folder, command)
        log_fd, name = tempfile.mkstemp(prefix=f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".log",
                                        dir=folder)
    except OSError:
        yield NativeLog(None)
        return
    path = Path(name)
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    saved = os.dup(2)
    python_stderr = sys.stderr
    terminal = None
    try:
        uses_fd_2 = python_stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):  # replaced by a test harness or an embedding application
        uses_fd_2 = False
    try:
        os.dup2(log_fd, 2)
        os.close(log_fd)
        if uses_fd_2:
            terminal = os.fdopen(os.dup(saved), "w", buffering=1, encoding=python_stderr.encoding,
                                 errors="backslashreplace")
            sys.stderr = terminal
        yield NativeLog(path)
    finally:
        if terminal is not None:
            with contextlib.suppress(OSError):
                terminal.flush()
            sys.stderr = python_stderr
            terminal.close()
        os.dup2(saved, 2)
        os.close(saved)
        with contextlib.suppress(OSError):
            if path.stat().st_size == 0:
                path.unlink()


__all__ = ["NativeLog", "log_dir", "native_output_to_log", "stdout_kept_for_json"]


@contextlib.contextmanager
def stdout_kept_for_json() -> Iterator[None]:
    """Inside: descriptor 1 writes to descriptor 2, so what a native library prints while a `--json` command works
    cannot end up in the one JSON document on stdout."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
