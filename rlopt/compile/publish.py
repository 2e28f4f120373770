"""The atomic publish of MODEL_DIR: built in a hidden sibling, renamed into place, the old one removed last."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from rlopt.manifest import MANIFEST_NAME


def is_model_dir_or_empty(path: Path) -> bool:
    return not path.exists() or (path.is_dir() and ((path / MANIFEST_NAME).exists() or not any(path.iterdir())))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def staging_dir(out_dir: Path) -> Path:
    """A fresh hidden sibling of `out_dir`, named with this pid so a later compile can tell it is stale."""
    staging = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}-{secrets.token_hex(3)}"
    staging.mkdir()
    return staging


def remove_stale_partials(out_dir: Path) -> None:
    """Partial builds left by a killed compile (their pid is gone) are removed."""
    for leftover in out_dir.parent.glob(f".{out_dir.name}.partial-*"):
        try:
            pid = int(leftover.name.rsplit("-", 2)[-2])
        except ValueError:
            continue
        if not _pid_alive(pid):
            shutil.rmtree(leftover, ignore_errors=True)


def publish(staging: Path, out_dir: Path) -> None:
    """Swap the finished build into place; the previous MODEL_DIR is removed only after."""
    old: Path | None = None
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}-{secrets.token_hex(3)}"
        os.rename(out_dir, old)
    os.rename(staging, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
