"""Files a MODEL_DIR lists: their record (path, sha256, bytes), the checks before anything is loaded, atomic writes.

Every layer reads and writes these: stages and backends record what they wrote, the manifest lists it, the runtime
checks it before loading. Imports nothing of rlopt but its errors.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from rlopt.errors import ArtifactError, located

MANIFEST_NAME = "manifest.json"


class FileRecord(BaseModel):
    """A file of a MODEL_DIR: its path relative to MODEL_DIR, its sha256 and its size, checked before it is loaded."""

    model_config = ConfigDict(extra="forbid")

    path: str
    sha256: str
    bytes: int


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_record(model_dir: Path, path: Path) -> FileRecord:
    return FileRecord(path=path.relative_to(model_dir).as_posix(), sha256=sha256_file(path), bytes=path.stat().st_size)


def confined(model_dir: Path, relative: str) -> Path:
    """Resolve a manifest path, refusing anything that escapes MODEL_DIR (`../../x.so`, absolute paths, links out)."""
    root = model_dir.resolve()
    candidate = (root / relative).resolve()
    if os.path.isabs(relative) or not candidate.is_relative_to(root):
        raise ArtifactError(
            located(model_dir / MANIFEST_NAME, f"path '{relative}'", "points outside MODEL_DIR",
                    "recompile; never hand-edit manifest paths")
        )
    return candidate


class Listed(Protocol):
    """What `checked_file` needs of a record: a path (None for a record without a file), sha256 and bytes."""

    path: str | None
    sha256: str | None
    bytes: int | None


def checked_file(model_dir: Path, record: Listed) -> Path:
    """The file behind a record, after its size and sha256 match: nothing is loaded before this."""
    if record.path is None:
        raise ArtifactError(located(model_dir / MANIFEST_NAME, "", "a record without a file was opened",
                                    "recompile MODEL_DIR"))
    path = confined(model_dir, record.path)
    if not path.is_file():
        raise ArtifactError(located(path, "", "artifact listed in manifest.json is missing", "recompile MODEL_DIR"))
    if path.stat().st_size != record.bytes or sha256_file(path) != record.sha256:
        raise _mismatch(path)
    return path


def checked_sibling(primary: Path, record: FileRecord) -> Path:
    """A file listed beside an already checked one (a library's companions, found next to it, e.g. in a private
    copy's folder), after its size and sha256 match."""
    name = PurePosixPath(record.path).name
    return checked_file(primary.parent, record.model_copy(update={"path": name}))


def _mismatch(path: Path) -> ArtifactError:
    return ArtifactError(located(path, "sha256", "does not match manifest.json (corrupt or modified)",
                                 "recompile MODEL_DIR"))


def checked_private_copy(model_dir: Path, record: Listed, folder: Path) -> Path:
    """Copy a native artifact (.so, engine) into `folder` and check the COPY's sha256.

    What gets loaded is then exactly what was hashed: no window between check and load, and
    rewriting the file in MODEL_DIR later cannot change code that a process has mapped.
    """
    source = checked_file(model_dir, record)
    data = source.read_bytes()
    if hashlib.sha256(data).hexdigest() != record.sha256:
        raise _mismatch(source)
    copy = folder / source.name
    copy.write_bytes(data)
    return copy


def atomic_write_text(path: Path, text: str) -> None:
    """Write a text file atomically (temp file in the same folder, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def write_json(path: Path, document: Any) -> None:
    """Write a JSON file atomically."""
    atomic_write_text(path, json.dumps(document, indent=2, sort_keys=False) + "\n")


__all__ = ["MANIFEST_NAME", "FileRecord", "atomic_write_text", "checked_file", "checked_private_copy",
           "checked_sibling", "confined", "file_record", "sha256_file", "write_json"]
