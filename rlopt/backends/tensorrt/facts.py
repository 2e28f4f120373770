"""What the TensorRT build records (artifact facts of backend `tensorrt`): its plan plus the builder's results.

A TensorRT skipped on a machine without a GPU records its plan too (the settings a build here would have used).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rlopt.facts import ArtifactFacts


class TensorRTFacts(ArtifactFacts):
    """A TensorRT engine: the plan it was built from and what the builder reported."""

    profiles: list[dict[str, dict[str, list[int]]]] = Field(default_factory=list)
    precision: str | None = None
    precision_source: str | None = None
    workspace_mb: int | None = None
    refittable: bool | None = None
    builder_optimization_level: int | None = None
    timing_cache: str | None = None
    time_budget_s: float | None = None
    tf32: bool | None = Field(None, description="whether fp32 layers may run in TF32 (tensorrt.tf32)")
    tensorrt: str | None = None
    major: int | None = None
    typing: str | None = None
    phases: list[Any] | None = None
    build_seconds: float | None = None
    onnx: str | None = None
    prepared: dict[str, Any] | None = None
    refitted_weights: int | None = Field(None, description="weights `rlopt refit` replaced in the engine")
    refit: str | None = Field(None, description="how `rlopt refit` replaced them (trt.OnnxParserRefitter)")


__all__ = ["TensorRTFacts"]
