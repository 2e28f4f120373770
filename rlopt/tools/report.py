"""What every tool report (bench, warmup) starts with, so a reader can tell them apart and date them."""

from __future__ import annotations

from pydantic import BaseModel


class ToolReport(BaseModel):
    kind: str
    schema_version: int = 1
    created_at: str
    model_dir: str
