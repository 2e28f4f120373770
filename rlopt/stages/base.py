"""What every stage returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class StageOutput:
    """An artifact a stage wrote (or None) and the facts it wants in the manifest."""

    artifact: Path | None
    facts: dict[str, Any] = field(default_factory=dict)
