"""The recipe's `tensorrt` section."""

from __future__ import annotations

from pydantic import Field

from rlopt.spec import Precision, Strict


class TensorRTConfig(Strict):
    precision: Precision = "fp32"
    # TensorRT lets fp32 layers run in TF32 unless told not to; true allows it (recorded, gated like reduced precision)
    tf32: bool = False
    refittable: bool = False
    workspace_mb: int = Field(default=1024, gt=0)
    builder_optimization_level: int = Field(default=3, ge=0, le=5)
    timing_cache: str | None = None
    build_timeout_s: float = Field(default=1800.0, gt=0)


__all__ = ["TensorRTConfig"]
