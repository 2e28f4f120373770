"""The stage cache: an output is reused only when everything that could change it is unchanged.

An entry is keyed by sha256 of its normalized key components (upstream artifact identity, the
stage's slice of the recipe, target, tool versions). Entries are written to a temporary sibling and
renamed into place, and every file is checked against its recorded sha256 when read: a corrupt
entry is a miss with a warning, never a wrong artifact. A miss is explained by diffing the key
components against the last ones seen for the same recipe, network and stage.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rlopt.machine import cache_root
from rlopt.manifest import sha256_file, write_json

ENTRY_NAME = "entry.json"


def canonical(components: dict[str, Any]) -> str:
    return json.dumps(components, sort_keys=True, default=str, separators=(",", ":"))


def cache_key(components: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(components).encode()).hexdigest()


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, inner in value.items():
            flat.update(_flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def explain_change(previous: dict[str, Any] | None, current: dict[str, Any]) -> str:
    """'onnx 1.23.2 -> 1.24.0', 'recipe.tvm.target changed', ...: what differs between two key components."""
    if previous is None:
        return "first compile of this stage"
    old, new = _flatten(previous), _flatten(current)
    reasons = []
    for name in sorted(set(old) | set(new)):
        if old.get(name) == new.get(name):
            continue
        if name.startswith("versions.") and max(len(str(old.get(name))), len(str(new.get(name)))) <= 24:
            reasons.append(f"{name.removeprefix('versions.')} {old.get(name)} -> {new.get(name)}")
        elif name.startswith("versions."):
            reasons.append(f"{name.removeprefix('versions.')} changed")
        elif name.startswith("upstream") and name.endswith((".weights", ".graph")):
            reasons.append(f"model {name.rsplit('.', 1)[1]} changed")
        elif name.startswith("upstream"):
            reasons.append(f"{name} changed (upstream artifact)")
        elif name == "code":
            reasons.append("the stage's code changed")
        else:
            reasons.append(f"{name.removeprefix('config.')} changed")
    reasons = list(dict.fromkeys(reasons))
    return "; ".join(reasons) if reasons else "same inputs, but the entry is gone (cleared or corrupt)"


@dataclass
class CacheHit:
    files: dict[str, Path]
    facts: dict[str, Any]


@dataclass
class StageCache:
    """A content-addressed folder of stage outputs. `enabled=False` makes every lookup a miss; a stage named in
    `refresh` is run again and its entry replaced (`rlopt compile --retime`: the `auto` stage measures again)."""

    root: Path = field(default_factory=cache_root)
    enabled: bool = True
    warnings: list[str] = field(default_factory=list)
    refresh: frozenset[str] = frozenset()

    def _entry_dir(self, stage: str, key: str) -> Path:
        return self.root / stage / key[:32]

    def _index_path(self, scope: str, stage: str) -> Path:
        return self.root / "index" / re.sub(r"[^A-Za-z0-9_.-]+", "_", scope) / f"{stage}.json"

    def lookup(self, stage: str, components: dict[str, Any]) -> CacheHit | None:
        if not self.enabled or stage in self.refresh:
            return None
        entry = self._entry_dir(stage, cache_key(components))
        record_path = entry / ENTRY_NAME
        if not record_path.is_file():
            return None
        try:
            record = json.loads(record_path.read_text(encoding="utf-8"))
            files = {name: entry / name for name in record["files"]}
            corrupt = [name for name, sha in record["files"].items()
                       if not files[name].is_file() or sha256_file(files[name]) != sha]
            if record.get("key") != cache_key(components):
                corrupt.append(ENTRY_NAME)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            corrupt = [f"{ENTRY_NAME} ({exc})"]
            files, record = {}, {}
        if corrupt:
            self.warnings.append(f"cache entry {entry} is corrupt ({', '.join(corrupt)}): rebuilt")
            shutil.rmtree(entry, ignore_errors=True)
            return None
        return CacheHit(files=files, facts=record.get("facts", {}))

    def store(self, stage: str, components: dict[str, Any], files: dict[str, Path], facts: dict[str, Any]) -> None:
        if not self.enabled:
            return
        key = cache_key(components)
        entry = self._entry_dir(stage, key)
        if (entry / ENTRY_NAME).is_file() and stage not in self.refresh:
            return
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = entry.parent / f".{entry.name}.tmp-{os.getpid()}-{secrets.token_hex(3)}"
        staging.mkdir()
        try:
            for name, source in files.items():
                shutil.copyfile(source, staging / name)
            write_json(staging / ENTRY_NAME, {
                "key": key, "stage": stage, "components": components, "facts": facts,
                "files": {name: sha256_file(staging / name) for name in files},
                "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            })
            if entry.exists():  # refreshed: the old entry goes once the new one is complete
                old = entry.parent / f".{entry.name}.old-{os.getpid()}-{secrets.token_hex(3)}"
                os.rename(entry, old)
                shutil.rmtree(old, ignore_errors=True)
            os.rename(staging, entry)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            if not (entry / ENTRY_NAME).is_file():
                raise

    def explain_miss(self, scope: str, stage: str, components: dict[str, Any]) -> str:
        path = self._index_path(scope, stage)
        try:
            previous = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        except (OSError, ValueError):
            previous = None
        return explain_change(previous, components)

    def remember(self, scope: str, stage: str, components: dict[str, Any]) -> None:
        if not self.enabled:
            return
        path = self._index_path(scope, stage)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, json.loads(canonical(components)))

    def info(self) -> dict[str, Any]:
        entries: dict[str, int] = {}
        total = 0
        if self.root.is_dir():
            for stage_dir in sorted(p for p in self.root.iterdir() if p.is_dir() and p.name != "index"):
                entries[stage_dir.name] = sum(1 for e in stage_dir.iterdir() if (e / ENTRY_NAME).is_file())
            total = sum(f.stat().st_size for f in self.root.rglob("*") if f.is_file())
        return {"root": str(self.root), "entries": entries, "bytes": total}

    def prune(self, is_current: Callable[[str, dict[str, Any]], bool]) -> int:
        """Remove every entry whose key components `is_current(stage, components)` rejects, and unreadable ones."""
        removed = 0
        if not self.root.is_dir():
            return 0
        for stage_dir in sorted(p for p in self.root.iterdir() if p.is_dir() and p.name != "index"):
            for entry in sorted(p for p in stage_dir.iterdir() if p.is_dir()):
                try:
                    record = json.loads((entry / ENTRY_NAME).read_text(encoding="utf-8"))
                    keep = is_current(str(record["stage"]), dict(record["components"]))
                except (OSError, ValueError, KeyError, TypeError):
                    keep = False
                if not keep:
                    shutil.rmtree(entry, ignore_errors=True)
                    removed += 1
        return removed

    def clear(self) -> int:
        removed = sum(self.info()["entries"].values())
        if self.root.is_dir():
            shutil.rmtree(self.root)
        return removed
